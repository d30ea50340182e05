// CUDA RoPE (kernels/rope.h) against the CPU reference. Both evaluate cos and sin of the
// same FP32 frequency table in double and round the two-term sum to FP32, so they agree
// within the FP32 kernel tolerance (tests/kernels/tolerances.h) applied to the size of
// the terms, |x[j]| + |x[partner(j)]| (channels >= r and thd padding are copied, where
// that bound is exact up to the copy itself). Cases cover sbhd, bshd and ragged thd
// (an empty sequence, tail padding), halves and interleaved pairs, partial rotary dims,
// one token, odd element counts (257 x 259-like) that leave a partial last block, and
// 134M-element sbhd and thd tensors (16384 positions).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/rope.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

using kernels::RopeFormat;
using testing_kernels::AllClose;

struct Case {
  std::string name;
  RopeFormat format;
  Shape shape;  // of t
  int64_t r;    // rotary dim
  bool interleaved;
  std::vector<int32_t> cu_seqlens;  // thd only
};

class RopeGpuTest : public ::testing::TestWithParam<Case> {};

#if TESERVE_WITH_CUDA
using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

Tensor Random(const Shape& shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  for (float& v : t.mutable_floats()) v = normal(rng);
  return t;
}

// Rows of freqs needed: the s dimension, or the longest thd sequence.
int64_t Positions(const Case& c) {
  if (c.format == RopeFormat::kSbhd) return c.shape[0];
  if (c.format == RopeFormat::kBshd) return c.shape[1];
  int64_t longest = 0;
  for (size_t k = 0; k + 1 < c.cu_seqlens.size(); ++k) {
    longest = std::max<int64_t>(longest, c.cu_seqlens[k + 1] - c.cu_seqlens[k]);
  }
  return longest;
}

// |x[j]| + |x[partner(j)]| for rotary channels, |x[j]| for the rest.
std::vector<double> Magnitudes(const Tensor& x, int64_t r, bool interleaved) {
  const int64_t d = x.dim(-1);
  const float* v = x.data<float>();
  std::vector<double> m(x.numel());
  for (int64_t e = 0; e < x.numel(); ++e) {
    const int64_t j = e % d;
    m[e] = std::fabs(v[e]);
    if (j >= r) continue;
    const int64_t partner = interleaved ? (j % 2 == 0 ? j + 1 : j - 1) : (j < r / 2 ? j + r / 2 : j - r / 2);
    m[e] += std::fabs(v[e - j + partner]);
  }
  return m;
}

std::vector<double> Doubles(const Tensor& t) { return std::vector<double>(t.floats().begin(), t.floats().end()); }

TEST_P(RopeGpuTest, ForwardAndBackwardWithinFp32ToleranceOfCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  kernels::RotaryOptions options;
  options.dim = c.r;
  options.interleaved = c.interleaved;
  const Tensor freqs = kernels::RotaryFrequencies(options, Positions(c) + 3, /*offset=*/5).value();
  const Tensor t = Random(c.shape, 21u);
  const Tensor dy = Random(c.shape, 22u);
  Tensor cu;
  const Tensor* cu_ptr = nullptr;
  if (c.format == RopeFormat::kThd) {
    cu = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(c.cu_seqlens.size())}).value();
    for (size_t k = 0; k < c.cu_seqlens.size(); ++k) cu.data<int32_t>()[k] = c.cu_seqlens[k];
    cu_ptr = &cu;
  }
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor d_t = CopyToDevice(gpu, t, gpu.device).value();
  const Tensor d_dy = CopyToDevice(gpu, dy, gpu.device).value();
  const Tensor d_freqs = CopyToDevice(gpu, freqs, gpu.device).value();

  auto want_fwd = kernels::RopeForward(Context::Cpu(), t, freqs, c.format, c.interleaved, cu_ptr);
  ASSERT_TRUE(want_fwd.ok()) << want_fwd.status();
  auto got_fwd = kernels::RopeForward(gpu, d_t, d_freqs, c.format, c.interleaved, cu_ptr);
  ASSERT_TRUE(got_fwd.ok()) << got_fwd.status();
  ASSERT_EQ(got_fwd->shape(), c.shape);
  const Tensor fwd = CopyToHost(gpu, *got_fwd).value();
  EXPECT_TRUE(AllClose(fwd.floats(), Doubles(*want_fwd), DType::kFloat32, Magnitudes(t, c.r, c.interleaved)))
      << "forward";

  auto want_bwd = kernels::RopeBackward(Context::Cpu(), dy, freqs, c.format, c.interleaved, cu_ptr);
  ASSERT_TRUE(want_bwd.ok()) << want_bwd.status();
  auto got_bwd = kernels::RopeBackward(gpu, d_dy, d_freqs, c.format, c.interleaved, cu_ptr);
  ASSERT_TRUE(got_bwd.ok()) << got_bwd.status();
  const Tensor bwd = CopyToHost(gpu, *got_bwd).value();
  EXPECT_TRUE(AllClose(bwd.floats(), Doubles(*want_bwd), DType::kFloat32, Magnitudes(dy, c.r, c.interleaved)))
      << "backward";
}

TEST(RopeGpu, RejectsHostTensorsAndDeviceCuSeqlens) {
  TESERVE_SKIP_WITHOUT_GPU();
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor t = Random({4, 2, 8}, 1u);
  kernels::RotaryOptions options;
  options.dim = 8;
  const Tensor freqs = kernels::RotaryFrequencies(options, 4).value();
  const Tensor d_t = CopyToDevice(gpu, t, gpu.device).value();
  const Tensor d_freqs = CopyToDevice(gpu, freqs, gpu.device).value();
  Tensor cu = Tensor::Zeros(DType::kInt32, {2}).value();
  cu.data<int32_t>()[1] = 4;
  const Tensor d_cu = CopyToDevice(gpu, cu, gpu.device).value();
  auto host_freqs = kernels::RopeForward(gpu, d_t, freqs, RopeFormat::kThd, false, &cu);
  EXPECT_THAT(host_freqs, testing_kernels::HasError(absl::StatusCode::kInvalidArgument, "freqs.device"));
  auto device_cu = kernels::RopeForward(gpu, d_t, d_freqs, RopeFormat::kThd, false, &d_cu);
  EXPECT_THAT(device_cu, testing_kernels::HasError(absl::StatusCode::kInvalidArgument, "cu_seqlens.device"));
}
#else
TEST_P(RopeGpuTest, ForwardAndBackwardWithinFp32ToleranceOfCpu) { TESERVE_SKIP_WITHOUT_GPU(); }
#endif

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (bool interleaved : {false, true}) {
    const std::string mode = interleaved ? "_Interleaved" : "_Halves";
    cases.push_back({"Sbhd_OneToken_1x1x1x8_r8" + mode, RopeFormat::kSbhd, {1, 1, 1, 8}, 8, interleaved, {}});
    cases.push_back({"Sbhd_16x3x4x64_r64" + mode, RopeFormat::kSbhd, {16, 3, 4, 64}, 64, interleaved, {}});
    cases.push_back({"Sbhd_9x2x3x40_r24Partial" + mode, RopeFormat::kSbhd, {9, 2, 3, 40}, 24, interleaved, {}});
    cases.push_back({"Bshd_3x16x4x64_r64" + mode, RopeFormat::kBshd, {3, 16, 4, 64}, 64, interleaved, {}});
    cases.push_back({"Bshd_Tail_1x257x1x259_r256" + mode, RopeFormat::kBshd, {1, 257, 1, 259}, 256, interleaved, {}});
    cases.push_back({"Sbhd_Tail_257x1x1x259_r258" + mode, RopeFormat::kSbhd, {257, 1, 1, 259}, 258, interleaved, {}});
    cases.push_back({"Thd_9x2x8_r8_ThreeSeqs" + mode, RopeFormat::kThd, {9, 2, 8}, 8, interleaved, {0, 3, 5, 9}});
    cases.push_back({"Thd_40x3x10_r6_EmptySeqAndTailPadding" + mode, RopeFormat::kThd, {40, 3, 10}, 6,
                     interleaved, {0, 17, 17, 18, 31}});
    cases.push_back({"Thd_1x1x4_r4_OneToken" + mode, RopeFormat::kThd, {1, 1, 4}, 4, interleaved, {0, 1}});
    cases.push_back({"Thd_5x2x8_r8_NoSequences" + mode, RopeFormat::kThd, {5, 2, 8}, 8, interleaved, {0}});
    cases.push_back({"Thd_Ragged_300x2x66_r64" + mode, RopeFormat::kThd, {300, 2, 66}, 64, interleaved,
                     {0, 1, 130, 257, 259, 296}});
  }
  // The benchmark size: 16384 positions x 64 heads x 128 channels (134M elements).
  cases.push_back({"Sbhd_Large_16384x1x64x128_r128_Halves", RopeFormat::kSbhd, {16384, 1, 64, 128}, 128, false, {}});
  cases.push_back({"Thd_Large_16384x64x128_r64_Interleaved", RopeFormat::kThd, {16384, 64, 128}, 64, true,
                   {0, 4096, 4097, 12000, 16384}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, RopeGpuTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace teserve
