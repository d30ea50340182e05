// CUDA scaled softmax (kernels/softmax.h) against the CPU reference (FP64 row sums, FP32
// outputs), every variant. The CUDA kernels do FP32 math, so results agree within the
// FP32 kernel tolerance (tests/kernels/tolerances.h: atol 1e-6, rtol 5e-6) applied to
// the size of the terms each output is computed from:
//   y_j:  y_j (2 + |scale x_j| + max_k |scale x_k| + log2(sk)) (rounding of the scaled
//         score, the max, and the FP32 exp sum);
//   dx_j: |scale| y_j (|dy_j| + sum_k |dy_k y_k|) (the FP32 dot product).
// The backward is given the CPU's y on both sides, so it is compared on its own.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/softmax.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

using kernels::SoftmaxMask;
using testing_kernels::AllClose;
using testing_kernels::RandomTensor;

struct Case {
  std::string name;
  Shape shape;  // [batches, heads, sq, sk]
  float scale;
  SoftmaxMask kind;
  float range;  // scores uniform in [-range, range)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class ScaledSoftmaxGpuTest : public ::testing::TestWithParam<Case> {};

#if TESERVE_WITH_CUDA
using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

// BOOL [b, 1, sq, sk], about a quarter masked; row 0 of every batch fully masked.
Tensor PaddingMask(const Shape& shape) {
  const int64_t b = shape[0], sq = shape[2], sk = shape[3];
  Tensor m = Tensor::Zeros(DType::kBool, {b, 1, sq, sk}).value();
  uint8_t* v = m.data<uint8_t>();
  std::mt19937 rng(7);
  std::bernoulli_distribution masked(0.25);
  for (int64_t k = 0; k < m.numel(); ++k) v[k] = masked(rng) ? 1 : 0;
  for (int64_t n = 0; n < b; ++n) {
    for (int64_t j = 0; j < sk; ++j) v[n * sq * sk + j] = 1;
  }
  return m;
}

std::vector<float> Floats(const Tensor& t) { return std::vector<float>(t.floats().begin(), t.floats().end()); }

TEST_P(ScaledSoftmaxGpuTest, ForwardAndBackwardWithinFp32TolerancesOfCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const int64_t sk = c.shape[3];
  const Tensor x = RandomTensor(c.shape, -c.range, c.range, 31);
  const Tensor dy = RandomTensor(c.shape, -1.0f, 1.0f, 32);
  const Tensor mask = c.kind == SoftmaxMask::kPadding ? PaddingMask(c.shape) : Tensor();
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor d_x = CopyToDevice(gpu, x, gpu.device).value();
  const Tensor d_mask = mask.defined() ? CopyToDevice(gpu, mask, gpu.device).value() : Tensor();

  auto want_y = kernels::ScaledSoftmaxForward(Context::Cpu(), x, c.scale, c.kind, mask);
  ASSERT_TRUE(want_y.ok()) << want_y.status();
  auto got_y = kernels::ScaledSoftmaxForward(gpu, d_x, c.scale, c.kind, d_mask);
  ASSERT_TRUE(got_y.ok()) << got_y.status();
  const auto xv = x.floats();
  const auto yv = want_y->floats();
  std::vector<double> want(yv.begin(), yv.end()), mag(yv.size());
  for (size_t r = 0; r * sk < yv.size(); ++r) {
    double row_max = 0.0;
    for (int64_t j = 0; j < sk; ++j) row_max = std::max(row_max, std::fabs(double{c.scale} * xv[r * sk + j]));
    for (int64_t j = 0; j < sk; ++j) {
      const size_t k = r * sk + j;
      mag[k] = yv[k] * (2.0 + std::fabs(double{c.scale} * xv[k]) + row_max + std::log2(static_cast<double>(sk)));
    }
  }
  EXPECT_TRUE(AllClose(Floats(CopyToHost(gpu, *got_y).value()), want, DType::kFloat32, mag)) << "y";

  // Backward from the same (CPU) y.
  auto want_dx = kernels::ScaledSoftmaxBackward(Context::Cpu(), *want_y, dy, c.scale);
  ASSERT_TRUE(want_dx.ok()) << want_dx.status();
  const Tensor d_y = CopyToDevice(gpu, *want_y, gpu.device).value();
  const Tensor d_dy = CopyToDevice(gpu, dy, gpu.device).value();
  auto got_dx = kernels::ScaledSoftmaxBackward(gpu, d_y, d_dy, c.scale);
  ASSERT_TRUE(got_dx.ok()) << got_dx.status();
  const auto g = dy.floats();
  std::vector<double> want_g(want_dx->floats().begin(), want_dx->floats().end()), mag_g(yv.size());
  for (size_t r = 0; r * sk < yv.size(); ++r) {
    double dot_abs = 0.0;
    for (int64_t j = 0; j < sk; ++j) dot_abs += std::fabs(double{g[r * sk + j]} * yv[r * sk + j]);
    for (int64_t j = 0; j < sk; ++j) {
      const size_t k = r * sk + j;
      mag_g[k] = std::fabs(double{c.scale}) * yv[k] * (std::fabs(g[k]) + dot_abs);
    }
  }
  EXPECT_TRUE(AllClose(Floats(CopyToHost(gpu, *got_dx).value()), want_g, DType::kFloat32, mag_g)) << "dx";
}
#endif  // TESERVE_WITH_CUDA

TEST_P(ScaledSoftmaxGpuTest, CudaContextWithoutCudaBuildIsAnError) {
#if TESERVE_WITH_CUDA
  GTEST_SKIP() << "built with CUDA: the GPU comparison covers this configuration";
#else
  const Case& c = GetParam();
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(nullptr, DType::kFloat32, c.shape, gpu.device);
  const Tensor mask = c.kind == SoftmaxMask::kPadding
                          ? Tensor::Borrow(nullptr, DType::kBool, {c.shape[0], 1, c.shape[2], c.shape[3]},
                                           gpu.device)
                          : Tensor();
  auto y = kernels::ScaledSoftmaxForward(gpu, x, c.scale, c.kind, mask);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kUnimplemented) << y.status();
  EXPECT_NE(y.status().message().find("ScaledSoftmaxForward has no kernel for cuda:0"), std::string::npos);
  auto dx = kernels::ScaledSoftmaxBackward(gpu, x, x, c.scale);
  EXPECT_EQ(dx.status().code(), absl::StatusCode::kUnimplemented) << dx.status();
  EXPECT_NE(dx.status().message().find("ScaledSoftmaxBackward has no kernel for cuda:0"), std::string::npos);
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Variants, ScaledSoftmaxGpuTest,
    ::testing::Values(Case{"plain_one_score", {1, 1, 1, 1}, 1.0f, SoftmaxMask::kNone, 3.0f},
                      Case{"plain_one_row", {1, 1, 1, 300}, 0.5f, SoftmaxMask::kNone, 4.0f},
                      Case{"plain_257x259", {1, 1, 257, 259}, 0.0625f, SoftmaxMask::kNone, 16.0f},
                      Case{"plain_negative_scale", {2, 3, 5, 9}, -0.5f, SoftmaxMask::kNone, 3.0f},
                      Case{"plain_sk4096", {2, 2, 8, 4096}, 0.088f, SoftmaxMask::kNone, 20.0f},
                      Case{"plain_128x129", {1, 1, 128, 129}, 0.25f, SoftmaxMask::kNone, 8.0f},
                      Case{"plain_16384x8192", {1, 1, 16384, 8192}, 0.088f, SoftmaxMask::kNone, 20.0f},
                      Case{"padding_2x3x17x33", {2, 3, 17, 33}, 1.0f, SoftmaxMask::kPadding, 2.0f},
                      Case{"padding_257x259", {1, 2, 257, 259}, 0.125f, SoftmaxMask::kPadding, 8.0f},
                      Case{"padding_128x129", {2, 1, 128, 129}, 0.125f, SoftmaxMask::kPadding, 8.0f},
                      Case{"causal_bottom_right_4x2048x8192", {1, 4, 2048, 8192}, 0.088f,
                           SoftmaxMask::kCausalBottomRight, 20.0f},
                      Case{"causal_top_left_257x259", {1, 2, 257, 259}, 0.125f, SoftmaxMask::kCausalTopLeft,
                           8.0f},
                      Case{"causal_top_left_sq_gt_sk", {2, 2, 65, 31}, 1.0f, SoftmaxMask::kCausalTopLeft, 3.0f},
                      Case{"causal_bottom_right_257x259", {1, 2, 257, 259}, 0.125f,
                           SoftmaxMask::kCausalBottomRight, 8.0f},
                      Case{"causal_bottom_right_sq_gt_sk_fully_masked_rows", {2, 2, 65, 31}, 1.0f,
                           SoftmaxMask::kCausalBottomRight, 3.0f},
                      Case{"causal_bottom_right_many_rows", {4, 16, 1100, 64}, 0.125f,
                           SoftmaxMask::kCausalBottomRight, 8.0f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace teserve
