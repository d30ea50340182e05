// CUDA cross entropy and MSE (kernels/loss.h) against the CPU reference (FP64 sums, FP32
// outputs). The CUDA kernels do FP32 math, so results agree within the FP32 kernel
// tolerance (tests/kernels/tolerances.h: atol 1e-6, rtol 5e-6) applied to the size of
// the terms each output is computed from:
//   per-token loss: (1 - s)(|lse| + |x_y|) + s(|lse| + mean_j |x_j|); the mean loss:
//   the mean of those; lse: |lse| + 1 (the log of the FP32 exp sum);
//   dx_j: scale (p_j (1 + |x_j| + |lse|) + target_j), with p_j = exp(x_j - lse).
// The backward is given the CPU's lse on both sides, so it is compared on its own.
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/loss_math.h"
#include "kernels/loss.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/tolerances.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

using kernels::CrossEntropyOptions;
using testing_kernels::AllClose;

struct Case {
  std::string name;
  Shape logits_shape;  // [..., V]
  float label_smoothing;
  double ignored_fraction;  // of the tokens, labelled ignore_index
  DType label_type;
  float logit_scale;  // stddev; some rows also get +-40 offsets
};

Tensor Labels(const Case& c, int64_t ignore_index) {
  const Shape leading(c.logits_shape.begin(), c.logits_shape.end() - 1);
  const int64_t v = c.logits_shape.back();
  Tensor t = Tensor::Zeros(c.label_type, leading).value();
  std::mt19937 rng(12);
  std::uniform_int_distribution<int64_t> cls(0, v - 1);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t r = 0; r < t.numel(); ++r) {
    const int64_t label = u(rng) < c.ignored_fraction ? ignore_index : cls(rng);
    if (c.label_type == DType::kInt32) {
      t.data<int32_t>()[r] = static_cast<int32_t>(label);
    } else {
      t.data<int64_t>()[r] = label;
    }
  }
  return t;
}

class CrossEntropyGpuTest : public ::testing::TestWithParam<Case> {};

#if TESERVE_WITH_CUDA
using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

Tensor Logits(const Case& c) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, c.logit_scale);
  Tensor t = Tensor::Zeros(DType::kFloat32, c.logits_shape).value();
  const int64_t v = c.logits_shape.back();
  std::vector<float> offsets = {0.0f, 40.0f, -40.0f, 3.0f};
  for (int64_t k = 0; k < t.numel(); ++k) t.data<float>()[k] = normal(rng) + offsets[(k / v) % offsets.size()];
  return t;
}

std::vector<float> Floats(const Tensor& t) { return std::vector<float>(t.floats().begin(), t.floats().end()); }

TEST_P(CrossEntropyGpuTest, ForwardAndBackwardWithinFp32TolerancesOfCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  CrossEntropyOptions options;
  options.label_smoothing = c.label_smoothing;
  options.ignore_index = -100;
  const Tensor logits = Logits(c);
  const Tensor labels = Labels(c, options.ignore_index);
  const int64_t v = c.logits_shape.back();
  const int64_t n = logits.numel() / v;
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor d_logits = CopyToDevice(gpu, logits, gpu.device).value();

  auto cpu = kernels::CrossEntropyForward(Context::Cpu(), logits, labels, options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto got = kernels::CrossEntropyForward(gpu, d_logits, labels, options);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->num_valid, cpu->num_valid);

  const float* x = logits.data<float>();
  const float* lse = cpu->lse.data<float>();
  std::vector<double> want_loss(n), loss_mag(n), want_lse(n), lse_mag(n);
  double mean_mag = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    want_loss[r] = cpu->per_token_loss.data<float>()[r];
    want_lse[r] = lse[r];
    lse_mag[r] = std::fabs(lse[r]) + 1.0;
    const int64_t label = kernels::loss_math::LabelAt(labels, r);
    if (label == options.ignore_index) continue;
    double mean_abs = 0.0;
    for (int64_t j = 0; j < v; ++j) mean_abs += std::fabs(x[r * v + j]) / v;
    const double s = c.label_smoothing;
    loss_mag[r] = (1 - s) * (std::fabs(lse[r]) + std::fabs(x[r * v + label])) + s * (std::fabs(lse[r]) + mean_abs);
    mean_mag += loss_mag[r];
  }
  if (cpu->num_valid > 0) mean_mag /= cpu->num_valid;
  EXPECT_TRUE(AllClose(Floats(CopyToHost(gpu, got->lse).value()), want_lse, DType::kFloat32, lse_mag)) << "lse";
  EXPECT_TRUE(AllClose(Floats(CopyToHost(gpu, got->per_token_loss).value()), want_loss, DType::kFloat32, loss_mag))
      << "per_token_loss";
  EXPECT_TRUE(AllClose({got->loss}, {static_cast<double>(cpu->loss)}, DType::kFloat32, {mean_mag})) << "loss";

  // Backward from the same (CPU) lse.
  const float grad_loss = 1.7f;
  auto want_dx = kernels::CrossEntropyBackward(Context::Cpu(), logits, labels, cpu->lse, cpu->num_valid, options,
                                               grad_loss);
  ASSERT_TRUE(want_dx.ok()) << want_dx.status();
  const Tensor d_lse = CopyToDevice(gpu, cpu->lse, gpu.device).value();
  auto dx = kernels::CrossEntropyBackward(gpu, d_logits, labels, d_lse, cpu->num_valid, options, grad_loss);
  ASSERT_TRUE(dx.ok()) << dx.status();
  std::vector<double> want(logits.numel()), mag(logits.numel());
  const double scale = cpu->num_valid == 0 ? 0.0 : grad_loss / static_cast<double>(cpu->num_valid);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t label = kernels::loss_math::LabelAt(labels, r);
    for (int64_t j = 0; j < v; ++j) {
      const int64_t k = r * v + j;
      want[k] = want_dx->data<float>()[k];
      if (label == options.ignore_index) continue;
      const double p = std::exp(static_cast<double>(x[k]) - lse[r]);
      const double target = c.label_smoothing / v + (j == label ? 1.0 - c.label_smoothing : 0.0);
      mag[k] = scale * (p * (1.0 + std::fabs(x[k]) + std::fabs(lse[r])) + target);
    }
  }
  EXPECT_TRUE(AllClose(Floats(CopyToHost(gpu, *dx).value()), want, DType::kFloat32, mag)) << "dx";
}
// MSE on the device: the gradient equals the CPU reference's bit for bit (the same
// double expression per element), the loss within FP32 rounding (both sum in double, in
// another order); empty tensors give 0 and an empty gradient.
TEST(MseGpu, GradientEqualsTheCpuBitForBitAndTheLossWithinFp32Rounding) {
  TESERVE_SKIP_WITHOUT_GPU();
  Context gpu;
  gpu.device = Device::Cuda(0);
  for (const Shape& shape : {Shape{0}, Shape{1}, Shape{3, 5}, Shape{257, 259}, Shape{4096, 8192}}) {
    SCOPED_TRACE(ShapeToString(shape));
    std::mt19937 rng(static_cast<uint32_t>(shape.back()));
    std::normal_distribution<float> normal(0.0f, 3.0f);
    Tensor y = Tensor::Zeros(DType::kFloat32, shape).value();
    Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
    for (int64_t k = 0; k < y.numel(); ++k) {
      y.data<float>()[k] = normal(rng);
      t.data<float>()[k] = normal(rng);
    }
    const Tensor dy_dev = CopyToDevice(gpu, y, gpu.device).value();
    const Tensor dt_dev = CopyToDevice(gpu, t, gpu.device).value();
    auto cpu_loss = kernels::MseForward(Context::Cpu(), y, t);
    auto gpu_loss = kernels::MseForward(gpu, dy_dev, dt_dev);
    ASSERT_TRUE(cpu_loss.ok()) << cpu_loss.status();
    ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
    EXPECT_EQ(gpu_loss->num_elements, y.numel());
    EXPECT_NEAR(gpu_loss->loss, cpu_loss->loss, 1e-6 * std::fabs(cpu_loss->loss));
    auto cpu_grad = kernels::MseBackward(Context::Cpu(), y, t, 0.75f);
    auto gpu_grad = kernels::MseBackward(gpu, dy_dev, dt_dev, 0.75f);
    ASSERT_TRUE(cpu_grad.ok()) << cpu_grad.status();
    ASSERT_TRUE(gpu_grad.ok()) << gpu_grad.status();
    EXPECT_EQ(gpu_grad->device(), gpu.device);
    EXPECT_TRUE(BitwiseEqual(CopyToHost(gpu, *gpu_grad).value(), *cpu_grad));
  }
}
#endif  // TESERVE_WITH_CUDA

TEST_P(CrossEntropyGpuTest, CudaContextWithoutCudaBuildIsAnError) {
#if TESERVE_WITH_CUDA
  GTEST_SKIP() << "built with CUDA: the GPU comparison covers this configuration";
#else
  const Case& c = GetParam();
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor logits = Tensor::Borrow(nullptr, DType::kFloat32, c.logits_shape, gpu.device);
  auto got = kernels::CrossEntropyForward(gpu, logits, Labels(c, -100), CrossEntropyOptions());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnimplemented) << got.status();
  EXPECT_NE(got.status().message().find("CrossEntropyForward has no kernel for cuda:0"), std::string::npos);
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CrossEntropyGpuTest,
    ::testing::Values(Case{"one_token_one_class", {1, 1}, 0.0f, 0.0, DType::kInt64, 1.0f},
                      Case{"v5_odd_no_smoothing", {3, 5}, 0.0f, 0.0, DType::kInt64, 2.0f},
                      Case{"v259_smoothing0_1_int32", {257, 259}, 0.1f, 0.2, DType::kInt32, 2.0f},
                      Case{"v129_smoothing1", {128, 129}, 1.0f, 0.1, DType::kInt64, 1.0f},
                      Case{"sbh_v1024_ignored_half", {4, 7, 1024}, 0.05f, 0.5, DType::kInt64, 3.0f},
                      Case{"all_ignored", {6, 64}, 0.1f, 1.0, DType::kInt64, 1.0f},
                      Case{"v32000_tokens64", {64, 32000}, 0.1f, 0.05, DType::kInt64, 4.0f},
                      Case{"v8192_tokens16384", {16384, 8192}, 0.1f, 0.05, DType::kInt64, 4.0f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace teserve
