// The block-scaled FP8 GEMM on cuBLASLt (VEC128_32F / BLK128x128_32F scale modes)
// against the CPU reference on the same operands (tests/kernels/gemm_block_test.cc
// shows that reference equals the FP32 GEMM of the dequantized copies):
//   - Linear's three layouts under the block recipe: fprop x (1D) W^T (2D), dgrad
//     dy (1D) W^T-copy (2D), wgrad dy^T (1D) x^T (1D), and 2D x 1D;
//   - m and n off the 128 grid, k a multiple of 128 and not (partial k blocks);
//   - FP32 and BF16 D, beta = 1 accumulation, the bias epilogue, scales in the
//     quantizer's layout (converted on the device) and in cuBLASLt's;
//   - the device rule (UNIMPLEMENTED off Hopper or below cuBLASLt 12.9), the errors;
//   - a Linear under the block recipe on the GPU computes exactly (bit for bit) the
//     native GEMM of its quantized operands, i.e. the native path is the one that runs.
//
// Tolerance: the FP8 row of tests/kernels/tolerances.h (atol 1e-2, rtol 1e-2, TE's FP8
// GEMM tolerance) relative to sum_k |a_ik b_kj| of the decoded operands. The products
// of FP8 codes are exact on both sides; the GPU accumulates each 128-deep k block in the
// tensor cores' reduced-precision accumulator and promotes it to FP32 with its two
// block scales, the CPU sums in FP32 sgemm order, so results differ by accumulation
// rounding, far below 1e-2 of the terms' magnitude. A BF16 D adds its one rounding
// (2^-8 relative, inside the same row).
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/gemm.h"
#include "layers/linear.h"
#include "recipes/recipe.h"
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
using ::teserve::testing_kernels::RandomTensor;

constexpr DType kF32 = DType::kFloat32, kBF16 = DType::kBFloat16;

// Skips a test where the device has no block-scaled GEMMs (the support test covers
// what such a device answers).
#define SKIP_WITHOUT_BLOCK_GEMMS()                                                  \
  do {                                                                              \
    TESERVE_SKIP_WITHOUT_GPU();                                                     \
    const absl::Status support = BlockScaledGemmSupport(testing::GpuContext());     \
    if (!support.ok()) GTEST_SKIP() << support;                                     \
  } while (0)

QuantizedTensor Quantize(const Tensor& x, bool two_d) {
  BlockScalingQuantizeOptions options;
  options.rowwise = true;
  options.columnwise = true;
  options.two_d = two_d;
  return QuantizeBlockScaling(Context::Cpu(), x, options).value();
}

GemmOperand HostOperand(const QuantizedTensor& q, Copy copy, bool transpose, GemmScaleLayout layout) {
  GemmOperand o = testing_kernels::OperandOf(q, copy, transpose);
  if (layout == GemmScaleLayout::kGemm) {
    o.scale_inv = BlockScalesGemmLayout(Context::Cpu(), o.scale_inv, o.scale_mode == GemmScaleMode::kBlock2D).value();
    o.scale_layout = GemmScaleLayout::kGemm;
  }
  return o;
}

// sum_k |op(A)_ik op(B)_kj| of the decoded operands (CPU, FP32), plus 1e-3.
std::vector<double> TermMagnitude(const QuantizedTensor& qa, Copy ca, const QuantizedTensor& qb, Copy cb,
                                  const Tensor& d, float alpha) {
  auto abs_copy = [](const QuantizedTensor& q, Copy c) {
    Tensor v = DequantizeBlock(Context::Cpu(), q, c).value();
    for (float& x : v.mutable_floats()) x = std::fabs(x);
    return v;
  };
  Tensor out = Tensor::Zeros(kF32, d.shape()).value();
  EXPECT_TRUE(Gemm(Context::Cpu(), abs_copy(qa, ca), false, abs_copy(qb, cb), true, 1.0f, 0.0f, &out).ok());
  std::vector<double> magnitude;
  for (float v : out.floats()) magnitude.push_back(std::fabs(alpha) * v + 1e-3);
  return magnitude;
}

enum class Pass { kFprop, kDgrad, kWgrad };

struct Case {
  const char* name;
  Pass pass;
  bool a_two_d, b_two_d;
  // fprop: m = tokens, n = out, k = in; dgrad: m = tokens, n = in, k = out;
  // wgrad: m = out, n = in, k = tokens.
  int64_t tokens, in, out;
  DType d;
  GemmScaleLayout layout;
  float beta;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class BlockGemmGpu : public ::testing::TestWithParam<Case> {};

TEST_P(BlockGemmGpu, MatchesTheCpuReference) {
  SKIP_WITHOUT_BLOCK_GEMMS();
  const Case& c = GetParam();
  // The operands of the pass, quantized on the host (bit-identical to the GPU quantizer).
  QuantizedTensor qa, qb;
  Copy ca = Copy::kRowwise, cb = Copy::kRowwise;
  int64_t m = 0, n = 0;
  switch (c.pass) {
    case Pass::kFprop:  // y = x W^T
      qa = Quantize(RandomTensor({c.tokens, c.in}, -4.0f, 4.0f, 1), c.a_two_d);
      qb = Quantize(RandomTensor({c.out, c.in}, -0.2f, 0.2f, 2), c.b_two_d);
      m = c.tokens, n = c.out;
      break;
    case Pass::kDgrad:  // dx = dy W: W's columnwise copy [in, out]
      qa = Quantize(RandomTensor({c.tokens, c.out}, -1.0f, 1.0f, 3), c.a_two_d);
      qb = Quantize(RandomTensor({c.out, c.in}, -0.2f, 0.2f, 4), c.b_two_d);
      cb = Copy::kColumnwise;
      m = c.tokens, n = c.in;
      break;
    case Pass::kWgrad:  // dW = dy^T x: columnwise copies [out, tokens] and [in, tokens]
      qa = Quantize(RandomTensor({c.tokens, c.out}, -1.0f, 1.0f, 5), c.a_two_d);
      qb = Quantize(RandomTensor({c.tokens, c.in}, -4.0f, 4.0f, 6), c.b_two_d);
      ca = cb = Copy::kColumnwise;
      m = c.out, n = c.in;
      break;
  }
  const GemmOperand a = HostOperand(qa, ca, false, c.layout);
  const GemmOperand b = HostOperand(qb, cb, true, c.layout);
  GemmOptions options;
  options.alpha = 0.75f;
  options.beta = c.beta;
  const Tensor start = CastFromFloat32(Context::Cpu(), RandomTensor({m, n}, -1.0f, 1.0f, 7), c.d).value();
  Tensor d_cpu = start.Clone().value();
  ASSERT_OK(Gemm(Context::Cpu(), a, b, &d_cpu, options));
  Tensor d_gpu = testing::OnDevice(start);
  ASSERT_OK(Gemm(testing::GpuContext(), testing::OnDevice(a), testing::OnDevice(b), &d_gpu, options));

  std::vector<double> magnitude = TermMagnitude(qa, ca, qb, cb, d_cpu, options.alpha);
  const std::vector<float> start_values = testing::Floats(start);
  for (size_t i = 0; i < magnitude.size(); ++i) magnitude[i] += std::fabs(c.beta * start_values[i]);
  const std::vector<float> want = testing::Floats(d_cpu);
  EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()), DType::kFloat8E4M3,
                       magnitude));
}

constexpr GemmScaleLayout kQuantizerLayout = GemmScaleLayout::kQuantizer, kGemmLayout = GemmScaleLayout::kGemm;

INSTANTIATE_TEST_SUITE_P(
    Linear, BlockGemmGpu,
    ::testing::Values(
        // The recipe's pairs (x, dy 1D; W 2D), k a multiple of 128 and m, n off the grid.
        Case{"fprop_1Dx2D_f32", Pass::kFprop, false, true, 264, 384, 200, kF32, kQuantizerLayout, 0.0f},
        Case{"fprop_1Dx2D_bf16", Pass::kFprop, false, true, 256, 512, 392, kBF16, kQuantizerLayout, 0.0f},
        Case{"dgrad_1Dx2D_bf16", Pass::kDgrad, false, true, 136, 200, 256, kBF16, kQuantizerLayout, 0.0f},
        Case{"dgrad_1Dx2D_f32", Pass::kDgrad, false, true, 128, 264, 384, kF32, kQuantizerLayout, 0.0f},
        Case{"wgrad_1Dx1D_f32_accumulate", Pass::kWgrad, false, false, 512, 136, 200, kF32, kQuantizerLayout,
             1.0f},
        Case{"wgrad_1Dx1D_bf16", Pass::kWgrad, false, false, 384, 256, 128, kBF16, kQuantizerLayout, 0.0f},
        // k off the 128 grid: partial k blocks (k = 80, 208, 336).
        Case{"fprop_1Dx2D_k80", Pass::kFprop, false, true, 64, 80, 128, kF32, kQuantizerLayout, 0.0f},
        Case{"fprop_1Dx2D_k336_bf16", Pass::kFprop, false, true, 200, 336, 136, kBF16, kQuantizerLayout, 0.0f},
        Case{"wgrad_1Dx1D_k208", Pass::kWgrad, false, false, 208, 264, 136, kF32, kQuantizerLayout, 0.0f},
        // 1D x 1D and 2D x 1D fprops; a 2D a takes an m off the multiple-of-8 grid.
        Case{"fprop_1Dx1D_f32", Pass::kFprop, false, false, 128, 256, 264, kF32, kQuantizerLayout, 0.0f},
        Case{"fprop_2Dx1D_m100", Pass::kFprop, true, false, 100, 256, 136, kF32, kQuantizerLayout, 0.0f},
        // Scales already in cuBLASLt's layout.
        Case{"fprop_1Dx2D_gemm_layout", Pass::kFprop, false, true, 264, 384, 200, kBF16, kGemmLayout, 0.0f},
        Case{"wgrad_1Dx1D_gemm_layout", Pass::kWgrad, false, false, 512, 136, 200, kF32, kGemmLayout, 1.0f}),
    CaseName);

TEST(BlockGemmGpuEpilogue, Bf16BiasMatchesTheCpu) {
  SKIP_WITHOUT_BLOCK_GEMMS();
  const int64_t m = 128, n = 256, k = 384;
  const QuantizedTensor x = Quantize(RandomTensor({m, k}, -4.0f, 4.0f, 11), false);
  const QuantizedTensor w = Quantize(RandomTensor({n, k}, -0.2f, 0.2f, 12), true);
  const GemmOperand a = HostOperand(x, Copy::kRowwise, false, kQuantizerLayout);
  const GemmOperand b = HostOperand(w, Copy::kRowwise, true, kQuantizerLayout);
  const Tensor bias = CastFromFloat32(Context::Cpu(), RandomTensor({n}, -1.0f, 1.0f, 13), kBF16).value();
  const Tensor bias_gpu = testing::OnDevice(bias);
  // A BF16 D with a BF16 bias (kernels/gemm.h: a bias is FP32 or D's dtype; cuBLASLt's
  // FP8 kernels take a 16-bit D's bias in its dtype).
  for (DType out : {kBF16}) {
    SCOPED_TRACE(DTypeName(out));
    GemmOptions cpu_options, gpu_options;
    cpu_options.epilogue = gpu_options.epilogue = GemmEpilogue::kBias;
    cpu_options.bias = &bias;
    gpu_options.bias = &bias_gpu;
    Tensor d_cpu = Tensor::Zeros(out, {m, n}).value();
    Tensor d_gpu = Tensor::Zeros(out, {m, n}, Device::Cuda(0)).value();
    ASSERT_OK(Gemm(Context::Cpu(), a, b, &d_cpu, cpu_options));
    ASSERT_OK(Gemm(testing::GpuContext(), testing::OnDevice(a), testing::OnDevice(b), &d_gpu, gpu_options));
    std::vector<double> magnitude = TermMagnitude(x, Copy::kRowwise, w, Copy::kRowwise, d_cpu, 1.0f);
    for (double& v : magnitude) v += 1.0;  // |bias| <= 1
    const std::vector<float> want = testing::Floats(d_cpu);
    EXPECT_TRUE(AllClose(testing::Floats(d_gpu), std::vector<double>(want.begin(), want.end()), DType::kFloat8E4M3,
                         magnitude));
  }
}

TEST(BlockGemmGpu, SupportFollowsTheDeviceAndLibrary) {
  TESERVE_SKIP_WITHOUT_GPU();
  const DeviceInfo info = QueryDeviceInfo();
  const absl::Status support = BlockScaledGemmSupport(testing::GpuContext());
  const QuantizedTensor x = Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 21), false);
  const QuantizedTensor w = Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 22), true);
  Tensor d = testing::OnDevice(Tensor::Zeros(kF32, {16, 16}).value());
  const absl::Status run =
      Gemm(testing::GpuContext(), testing::OnDevice(HostOperand(x, Copy::kRowwise, false, kQuantizerLayout)),
           testing::OnDevice(HostOperand(w, Copy::kRowwise, true, kQuantizerLayout)), &d);
  if (info.cc_major == 9) {
    // H100 / H200 with this toolkit's cuBLASLt (13.x): native.
    EXPECT_TRUE(support.ok()) << support;
    EXPECT_TRUE(run.ok()) << run;
  } else {
    EXPECT_THAT(support, HasError(absl::StatusCode::kUnimplemented, "run only on compute capability 9.x"));
    EXPECT_THAT(run, HasError(absl::StatusCode::kUnimplemented, "run only on compute capability 9.x"));
  }
}

TEST(BlockGemmGpuErrors, NamedFieldsAsOnTheCpu) {
  SKIP_WITHOUT_BLOCK_GEMMS();
  const QuantizedTensor x2 = Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 31), true);
  const QuantizedTensor w2 = Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 32), true);
  const QuantizedTensor x1 = Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 33), false);
  Tensor d = testing::OnDevice(Tensor::Zeros(kF32, {16, 16}).value());
  EXPECT_THAT(Gemm(testing::GpuContext(), testing::OnDevice(HostOperand(x2, Copy::kRowwise, false, kQuantizerLayout)),
                   testing::OnDevice(HostOperand(w2, Copy::kRowwise, true, kQuantizerLayout)), &d),
              HasError(absl::StatusCode::kInvalidArgument, "b.scale_mode: expected kBlock1D when a is kBlock2D"));
  GemmOptions fast;
  fast.accumulation = GemmAccumulation::kFast;
  EXPECT_THAT(Gemm(testing::GpuContext(), testing::OnDevice(HostOperand(x1, Copy::kRowwise, false, kQuantizerLayout)),
                   testing::OnDevice(HostOperand(w2, Copy::kRowwise, true, kQuantizerLayout)), &d, fast),
              HasError(absl::StatusCode::kInvalidArgument, "options.accumulation: expected kSplit"));

  // kGemm scales are read where they are: they must be 16-byte aligned.
  const GemmOperand a = testing::OnDevice(HostOperand(x1, Copy::kRowwise, false, kGemmLayout));
  const GemmOperand b = testing::OnDevice(HostOperand(w2, Copy::kRowwise, true, kGemmLayout));
  Tensor padded = testing::OnDevice(Tensor::Zeros(kF32, {a.scale_inv.numel() + 1}).value());
  GemmOperand misaligned = a;
  misaligned.scale_inv = Tensor::Borrow(static_cast<float*>(padded.raw_data()) + 1, kF32, a.scale_inv.shape(),
                                        Device::Cuda(0));
  EXPECT_THAT(Gemm(testing::GpuContext(), misaligned, b, &d),
              HasError(absl::StatusCode::kInvalidArgument, "a.scale_inv: expected a 16-byte aligned address"));
  ASSERT_OK(Gemm(testing::GpuContext(), a, b, &d));
}

// A Linear under the block recipe on the GPU: its forward output is bit for bit the
// native block-scaled GEMM of its quantized x and W (the same cuBLASLt algorithm on the
// same bytes), and not the dequantize-then-FP32 GEMM, so the native path is what runs.
TEST(BlockGemmGpuLinear, ForwardRunsTheNativeGemm) {
  SKIP_WITHOUT_BLOCK_GEMMS();
  const int64_t tokens = 128, in = 256, out = 136;
  recipes::Recipe recipe;
  recipe.config = recipes::BlockScalingConfig();  // x 1D, W 2D, E4M3, power-of-2 scales
  layers::LinearOptions options;
  options.in_features = in;
  options.out_features = out;
  options.bias = false;
  options.init_std = 0.05f;
  auto linear = layers::Linear::Create("fc", options, recipe);
  ASSERT_TRUE(linear.ok()) << linear.status();
  layers::Parameter* weight = (*linear)->Parameters()[0];
  const Tensor w_host = weight->value;
  weight->value = testing::OnDevice(w_host);
  weight->grad = testing::OnDevice(weight->grad);

  const Tensor x_host = RandomTensor({tokens, in}, -2.0f, 2.0f, 41);
  const Context ctx = testing::GpuContext();
  auto y = (*linear)->Forward(ctx, {testing::OnDevice(x_host)}, layers::ForwardOptions{false});
  ASSERT_TRUE(y.ok()) << y.status();

  // The same quantization (the GPU quantizer is bit-identical to the CPU one) and GEMM.
  const QuantizedTensor qx = Quantize(x_host, false);
  const QuantizedTensor qw = Quantize(w_host, true);
  Tensor native = Tensor::Zeros(kF32, {tokens, out}, Device::Cuda(0)).value();
  ASSERT_OK(Gemm(ctx, testing::OnDevice(HostOperand(qx, Copy::kRowwise, false, kQuantizerLayout)),
                 testing::OnDevice(HostOperand(qw, Copy::kRowwise, true, kQuantizerLayout)), &native));
  EXPECT_EQ(testing::Bytes(y->outputs[0]), testing::Bytes(native));

  Tensor emulated = Tensor::Zeros(kF32, {tokens, out}, Device::Cuda(0)).value();
  ASSERT_OK(Gemm(ctx, testing::OnDevice(DequantizeBlock(Context::Cpu(), qx, Copy::kRowwise).value()), false,
                 testing::OnDevice(DequantizeBlock(Context::Cpu(), qw, Copy::kRowwise).value()), true, 1.0f, 0.0f,
                 &emulated));
  EXPECT_NE(testing::Bytes(y->outputs[0]), testing::Bytes(emulated)) << "the dequantize + FP32 path ran";
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
