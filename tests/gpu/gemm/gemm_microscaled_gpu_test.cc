// The MXFP8 and NVFP4 GEMMs on cuBLASLt (VEC32_UE8M0 / VEC16_UE4M3 scale modes) against the
// CPU reference (tests/kernels/gemm_microscaled_test.cc relates that reference to the FP32
// GEMM of the dequantized copies):
//   - the device rule: UNIMPLEMENTED below compute capability 10.0 (Hopper, where Linear
//     emulates both), OK on Blackwell with this toolkit's cuBLASLt;
//   - on Blackwell, Linear's three layouts with FP32 and BF16 D, beta = 1, scales in the
//     quantizer's layout (swizzled on the device; NVFP4 2D weights' rows repeated) and
//     already swizzled, NVFP4's per-tensor scales in alpha. These cases skip on other
//     devices.
// Tolerance as for the FP8 block GEMM (gemm_block_gpu_test.cc): the FP8 row of
// tests/kernels/tolerances.h relative to sum_k |a_ik b_kj| of the decoded operands; the
// products are exact on both sides and the sums differ by accumulation order only.
#include <cmath>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/gemm.h"
#include "kernels/nvfp4.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/quantized_operands.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::OperandOf;
using ::teserve::testing_kernels::QuantizeMxfp8Copies;
using ::teserve::testing_kernels::QuantizeNvfp4Copies;
using ::teserve::testing_kernels::RandomTensor;

constexpr DType kF32 = DType::kFloat32, kBF16 = DType::kBFloat16;

GemmOperand HostOperand(const QuantizedTensor& q, Copy copy, bool transpose, GemmScaleLayout layout) {
  GemmOperand o = OperandOf(q, copy, transpose);
  if (layout == GemmScaleLayout::kGemm) {
    o.scale_inv = SwizzleMxfp8Scales(Context::Cpu(), o.scale_inv).value();
    o.scale_layout = GemmScaleLayout::kGemm;
  }
  return o;
}

TEST(MicroscaledGemmGpu, SupportFollowsTheDevice) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DeviceInfo info = QueryDeviceInfo();
  const absl::Status support = MicroScaledGemmSupport(testing::GpuContext());
  const QuantizedTensor x = QuantizeMxfp8Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 1));
  const QuantizedTensor w = QuantizeMxfp8Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 2));
  Tensor d = testing::OnDevice(Tensor::Zeros(kF32, {32, 32}).value());
  const absl::Status run = Gemm(testing::GpuContext(), testing::OnDevice(HostOperand(x, Copy::kRowwise, false, {})),
                                testing::OnDevice(HostOperand(w, Copy::kRowwise, true, {})), &d);
  const QuantizedTensor x4 = QuantizeNvfp4Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 7), false);
  const QuantizedTensor w4 = QuantizeNvfp4Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 8), true);
  Tensor d4 = testing::OnDevice(Tensor::Zeros(kF32, {32, 32}).value());
  const absl::Status run4 = Gemm(testing::GpuContext(), testing::OnDevice(OperandOf(x4, Copy::kRowwise, false)),
                                 testing::OnDevice(OperandOf(w4, Copy::kRowwise, true)), &d4);
  if (info.cc_major >= 10) {
    EXPECT_TRUE(support.ok()) << support;
    EXPECT_TRUE(run.ok()) << run;
    EXPECT_TRUE(run4.ok()) << run4;
  } else {
    for (const absl::Status& s : {support, run, run4}) {
      EXPECT_THAT(s, HasError(absl::StatusCode::kUnimplemented, "run only on compute capability 10.0+"));
    }
  }
}

struct Case {
  const char* name;
  int pass;  // 0 fprop x W^T, 1 dgrad dy W, 2 wgrad dy^T x
  int64_t tokens, in, out;
  DType d;
  GemmScaleLayout layout;
  float beta;
};

class Mxfp8GemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(Mxfp8GemmGpu, MatchesTheCpuReference) {
  TESERVE_SKIP_WITHOUT_GPU();
  const absl::Status support = MicroScaledGemmSupport(testing::GpuContext());
  if (!support.ok()) GTEST_SKIP() << support;
  const Case& c = GetParam();
  const QuantizedTensor x = QuantizeMxfp8Copies(RandomTensor({c.tokens, c.in}, -4.0f, 4.0f, 3));
  const QuantizedTensor w = QuantizeMxfp8Copies(RandomTensor({c.out, c.in}, -0.2f, 0.2f, 4));
  const QuantizedTensor dy = QuantizeMxfp8Copies(RandomTensor({c.tokens, c.out}, -1.0f, 1.0f, 5));
  const QuantizedTensor* qa[] = {&x, &dy, &dy};
  const QuantizedTensor* qb[] = {&w, &w, &x};
  const Copy ca = c.pass == 2 ? Copy::kColumnwise : Copy::kRowwise;
  const Copy cb = c.pass == 0 ? Copy::kRowwise : Copy::kColumnwise;
  const int64_t m = c.pass == 2 ? c.out : c.tokens;
  const int64_t n = c.pass == 0 ? c.out : c.in;
  const GemmOperand a = HostOperand(*qa[c.pass], ca, false, c.layout);
  const GemmOperand b = HostOperand(*qb[c.pass], cb, true, c.layout);
  GemmOptions options;
  options.alpha = 0.75f;
  options.beta = c.beta;
  const Tensor start = CastFromFloat32(Context::Cpu(), RandomTensor({m, n}, -1.0f, 1.0f, 6), c.d).value();
  Tensor d_cpu = start.Clone().value();
  ASSERT_OK(Gemm(Context::Cpu(), a, b, &d_cpu, options));
  Tensor d_gpu = testing::OnDevice(start);
  ASSERT_OK(Gemm(testing::GpuContext(), testing::OnDevice(a), testing::OnDevice(b), &d_gpu, options));

  // sum_k |op(A)_ik op(B)_kj| of the decoded operands, plus |beta * start| and 1e-3.
  auto abs_copy = [](const QuantizedTensor& q, Copy copy) {
    Tensor v = DequantizeBlock(Context::Cpu(), q, copy).value();
    for (float& e : v.mutable_floats()) e = std::fabs(e);
    return v;
  };
  Tensor terms = Tensor::Zeros(kF32, {m, n}).value();
  ASSERT_OK(Gemm(Context::Cpu(), abs_copy(*qa[c.pass], ca), false, abs_copy(*qb[c.pass], cb), true, 1.0f, 0.0f,
                 &terms));
  const std::vector<float> start_values = testing::Floats(start);
  std::vector<double> magnitude;
  for (size_t i = 0; i < start_values.size(); ++i) {
    magnitude.push_back(options.alpha * terms.floats()[i] + std::fabs(c.beta * start_values[i]) + 1e-3);
  }
  const std::vector<float> want = testing::Floats(d_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()), DType::kFloat8E4M3,
                       magnitude));
}

constexpr GemmScaleLayout kQuantizerLayout = GemmScaleLayout::kQuantizer, kGemmLayout = GemmScaleLayout::kGemm;

INSTANTIATE_TEST_SUITE_P(
    Linear, Mxfp8GemmGpu,
    ::testing::Values(Case{"fprop_f32", 0, 256, 384, 224, kF32, kQuantizerLayout, 0.0f},
                      Case{"fprop_bf16", 0, 96, 160, 224, kBF16, kQuantizerLayout, 0.0f},
                      Case{"dgrad_bf16", 1, 128, 224, 96, kBF16, kQuantizerLayout, 0.0f},
                      Case{"wgrad_f32_accumulate", 2, 288, 96, 160, kF32, kQuantizerLayout, 1.0f},
                      Case{"fprop_swizzled", 0, 256, 384, 224, kBF16, kGemmLayout, 0.0f},
                      Case{"wgrad_swizzled", 2, 288, 96, 160, kF32, kGemmLayout, 1.0f}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// NVFP4 on Blackwell: x (1D) W^T (2D) and the wgrad dy^T (1D) x^T (1D), the per-tensor decode
// scales in alpha, against the CPU reference of the same call.
TEST(Nvfp4GemmGpu, MatchesTheCpuReference) {
  TESERVE_SKIP_WITHOUT_GPU();
  const absl::Status support = MicroScaledGemmSupport(testing::GpuContext());
  if (!support.ok()) GTEST_SKIP() << support;
  const QuantizedTensor x = QuantizeNvfp4Copies(RandomTensor({256, 384}, -4.0f, 4.0f, 11), false);
  const QuantizedTensor w = QuantizeNvfp4Copies(RandomTensor({224, 384}, -0.2f, 0.2f, 12), true);
  const QuantizedTensor dy = QuantizeNvfp4Copies(RandomTensor({256, 224}, -1.0f, 1.0f, 13), false);
  struct Pass {
    const QuantizedTensor *a, *b;
    Copy ca, cb;
    int64_t m, n;
    DType d;
  };
  for (const Pass& p : {Pass{&x, &w, Copy::kRowwise, Copy::kRowwise, 256, 224, kBF16},
                        Pass{&dy, &x, Copy::kColumnwise, Copy::kColumnwise, 224, 384, kF32}}) {
    GemmOptions options;
    options.alpha = (1.0f / p.a->global_encode_scale) * (1.0f / p.b->global_encode_scale);
    const GemmOperand a = OperandOf(*p.a, p.ca, false), b = OperandOf(*p.b, p.cb, true);
    Tensor d_cpu = Tensor::Zeros(p.d, {p.m, p.n}).value();
    ASSERT_OK(Gemm(Context::Cpu(), a, b, &d_cpu, options));
    Tensor d_gpu = testing::OnDevice(d_cpu);
    ASSERT_OK(Gemm(testing::GpuContext(), testing::OnDevice(a), testing::OnDevice(b), &d_gpu, options));
    Tensor terms = Tensor::Zeros(kF32, {p.m, p.n}).value();
    auto abs_copy = [](const QuantizedTensor& q, Copy c) {
      Tensor v = DequantizeNvfp4(Context::Cpu(), q, c).value();
      for (float& e : v.mutable_floats()) e = std::fabs(e);
      return v;
    };
    ASSERT_OK(Gemm(Context::Cpu(), abs_copy(*p.a, p.ca), false, abs_copy(*p.b, p.cb), true, 1.0f, 0.0f, &terms));
    std::vector<double> magnitude;
    for (float v : terms.floats()) magnitude.push_back(v + 1e-3);
    const std::vector<float> want = testing::Floats(d_cpu);
    EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()), DType::kFloat8E4M3,
                         magnitude));
  }
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
