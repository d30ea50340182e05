// kernels/elementwise.h and kernels/l2_norm.h on CUDA against the CPU reference: the
// layer glue of GPU sessions. The copies and the bias-dropout-add are exact (the same
// bits as the CPU, dropout and drop-path masks included); L2 normalization sums in
// double on both sides and agrees within the FP32 tolerance.
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/l2_norm.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace {

using testing_kernels::AllClose;
using testing_kernels::RandomTensor;

Context Gpu() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

Tensor ToGpu(const Tensor& t) { return kernels::CopyTo(Gpu(), t, Device::Cuda(0)).value(); }
Tensor ToCpu(const Tensor& t) { return kernels::CopyTo(Gpu(), t, Device::Cpu()).value(); }

std::vector<double> Doubles(const Tensor& t) { return std::vector<double>(t.floats().begin(), t.floats().end()); }

TEST(ElementwiseGpu, CopyColumnsMovesTheSameBytesAsTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor src = RandomTensor({37, 96}, -1.0f, 1.0f, 1);
  Tensor want = RandomTensor({37, 64}, -1.0f, 1.0f, 2);
  Tensor got = ToGpu(want);
  ASSERT_TRUE(kernels::CopyColumns(Context::Cpu(), src, 40, &want, 8, 48).ok());
  const Tensor src_gpu = ToGpu(src);
  ASSERT_TRUE(kernels::CopyColumns(Gpu(), src_gpu, 40, &got, 8, 48).ok());
  EXPECT_TRUE(BitwiseEqual(ToCpu(got), want));

  // Out-of-range columns are refused naming the argument.
  const absl::Status bad = kernels::CopyColumns(Gpu(), src_gpu, 60, &got, 0, 48);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("src_col"), std::string::npos) << bad;
}

struct BdaCase {
  std::string name;
  Shape shape;
  bool bias;
  float dropout;
  float drop_path;
  bool sbhd;
};

void PrintTo(const BdaCase& c, std::ostream* os) { *os << c.name; }

class BiasDropoutAddGpu : public ::testing::TestWithParam<BdaCase> {};

TEST_P(BiasDropoutAddGpu, EqualsTheCpuBitForBit) {
  TESERVE_SKIP_WITHOUT_GPU();
  const BdaCase& c = GetParam();
  const Tensor h = RandomTensor(c.shape, -2.0f, 2.0f, 3);
  const Tensor residual = RandomTensor(c.shape, -2.0f, 2.0f, 4);
  const Tensor bias = c.bias ? RandomTensor({c.shape.back()}, -1.0f, 1.0f, 5) : Tensor();
  kernels::ResidualDropout d;
  d.seed = 77;
  d.stream = 12345;
  d.dropout = c.dropout;
  d.drop_path = c.drop_path;
  d.dropout_site = 3;
  d.drop_path_site = 4;
  d.sbhd = c.sbhd;
  d.batch = c.sbhd ? c.shape[1] : c.shape[0];
  d.seq = c.sbhd ? c.shape[0] : c.shape[1];

  auto want = kernels::BiasDropoutAdd(Context::Cpu(), h, bias, residual, d);
  auto got = kernels::BiasDropoutAdd(Gpu(), ToGpu(h), c.bias ? ToGpu(bias) : Tensor(), ToGpu(residual), d);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(BitwiseEqual(ToCpu(*got), *want));

  Tensor dy = RandomTensor(c.shape, -1.0f, 1.0f, 6);
  Tensor dy_gpu = ToGpu(dy);
  ASSERT_TRUE(kernels::DropoutScale(Context::Cpu(), d, &dy).ok());
  ASSERT_TRUE(kernels::DropoutScale(Gpu(), d, &dy_gpu).ok());
  EXPECT_TRUE(BitwiseEqual(ToCpu(dy_gpu), dy));

  if (d.active()) {
    // Something was dropped (the mask is not all ones) and something kept.
    int64_t zeros = 0;
    for (float v : dy.floats()) zeros += v == 0.0f;
    EXPECT_GT(zeros, 0);
    EXPECT_LT(zeros, dy.numel());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BiasDropoutAddGpu,
    ::testing::Values(BdaCase{"plain_no_bias", {16, 3, 40}, false, 0.0f, 0.0f, true},
                      BdaCase{"bias", {16, 3, 40}, true, 0.0f, 0.0f, true},
                      BdaCase{"dropout_sbhd", {33, 4, 72}, true, 0.1f, 0.0f, true},
                      BdaCase{"drop_path_bshd", {8, 21, 64}, true, 0.0f, 0.4f, false},
                      BdaCase{"both_sbhd", {21, 8, 64}, false, 0.25f, 0.3f, true},
                      BdaCase{"both_bshd", {5, 64, 128}, true, 0.1f, 0.2f, false}),
    [](const ::testing::TestParamInfo<BdaCase>& info) { return info.param.name; });

TEST(L2NormGpu, ForwardAndBackwardMatchTheCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{1, 1}, Shape{300, 64}, Shape{7, 1000}}) {
    SCOPED_TRACE(ShapeToString(shape));
    const Tensor x = RandomTensor(shape, -3.0f, 3.0f, 7);
    const Tensor dy = RandomTensor(shape, -1.0f, 1.0f, 8);
    auto want = kernels::L2NormalizationForward(Context::Cpu(), x, 1e-6f);
    auto got = kernels::L2NormalizationForward(Gpu(), ToGpu(x), 1e-6f);
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_TRUE(AllClose(ToCpu(got->y).floats(), Doubles(want->y), DType::kFloat32));
    EXPECT_TRUE(AllClose(ToCpu(got->rsigma).floats(), Doubles(want->rsigma), DType::kFloat32));
    auto want_dx = kernels::L2NormalizationBackward(Context::Cpu(), dy, x, want->rsigma);
    auto got_dx = kernels::L2NormalizationBackward(Gpu(), ToGpu(dy), ToGpu(x), got->rsigma);
    ASSERT_TRUE(want_dx.ok() && got_dx.ok()) << got_dx.status();
    std::vector<double> magnitude;
    for (float v : want_dx->floats()) magnitude.push_back(std::fabs(v) + 1e-3);
    EXPECT_TRUE(AllClose(ToCpu(*got_dx).floats(), Doubles(*want_dx), DType::kFloat32, magnitude));
  }
}

}  // namespace
}  // namespace teserve
