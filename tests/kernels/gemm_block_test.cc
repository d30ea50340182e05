// The CPU reference of the block-scaled FP8 GEMM (kernels/gemm.h, GemmScaleMode
// kBlock1D / kBlock2D): operands from QuantizeBlockScaling decode to exactly
// DequantizeBlock's copies, so the product is bit for bit the FP32 GEMM of the
// dequantized copies (what Linear computed before it read block-scaled codes), in
// Linear's three layouts (fprop x W^T, dgrad dy W, wgrad dy^T x), with K and the outer
// dimensions off the 128 grid; scales in cuBLASLt's layout give the same bits as the
// quantizer's; BF16 output and the bias epilogue; every rejected combination names its
// field; and the device rule (Hopper, cuBLASLt >= 12.9).
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/gemm.h"
#include "tests/kernels/quantized_operands.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;

QuantizedTensor Quantize(const Tensor& x, bool two_d) {
  BlockScalingQuantizeOptions options;
  options.rowwise = true;
  options.columnwise = true;
  options.two_d = two_d;
  return QuantizeBlockScaling(Context::Cpu(), x, options).value();
}

// One copy of q as a GEMM operand, scales as the quantizer made them.
GemmOperand Operand(const QuantizedTensor& q, Copy copy, bool transpose) {
  return testing_kernels::OperandOf(q, copy, transpose);
}

// The same operand with its scales in cuBLASLt's layout.
GemmOperand GemmLayout(GemmOperand o) {
  o.scale_inv = BlockScalesGemmLayout(Context::Cpu(), o.scale_inv, o.scale_mode == GemmScaleMode::kBlock2D).value();
  o.scale_layout = GemmScaleLayout::kGemm;
  return o;
}

Tensor Dequantized(const QuantizedTensor& q, Copy copy) { return DequantizeBlock(Context::Cpu(), q, copy).value(); }

struct Layout {
  const char* name;
  int64_t m, n, k;
};

// Linear's GEMMs under the block recipe (x, dy 1D; W 2D), D FP32, against the FP32 GEMM
// of the dequantized copies: identical bits, with beta 1 (wgrad accumulates) too. Each
// of tokens, in and out is the k of one of the three GEMMs, so all are multiples of 16.
class BlockGemmCpu : public ::testing::TestWithParam<Layout> {};

TEST_P(BlockGemmCpu, EqualsTheFp32GemmOfTheDequantizedCopies) {
  const Layout& l = GetParam();
  // tokens = m, in = k, out = n for the fprop; the backward reuses the same tensors.
  const int64_t tokens = l.m, in = l.k, out = l.n;
  const QuantizedTensor x = Quantize(RandomTensor({tokens, in}, -3.0f, 3.0f, 1), false);
  const QuantizedTensor w = Quantize(RandomTensor({out, in}, -0.5f, 0.5f, 2), true);
  const QuantizedTensor dy = Quantize(RandomTensor({tokens, out}, -1e-2f, 1e-2f, 3), false);
  const Context cpu = Context::Cpu();

  // fprop y [tokens, out] = x W^T.
  Tensor y = Tensor::Zeros(DType::kFloat32, {tokens, out}).value();
  ASSERT_OK(Gemm(cpu, Operand(x, Copy::kRowwise, false), Operand(w, Copy::kRowwise, true), &y));
  Tensor y_ref = Tensor::Zeros(DType::kFloat32, {tokens, out}).value();
  ASSERT_OK(Gemm(cpu, Dequantized(x, Copy::kRowwise), false, Dequantized(w, Copy::kRowwise), true, 1.0f, 0.0f, &y_ref));
  EXPECT_TRUE(BitwiseEqual(y, y_ref)) << "fprop";

  // dgrad dx [tokens, in] = dy W, W's columnwise copy [in, out] transposed.
  Tensor dx = Tensor::Zeros(DType::kFloat32, {tokens, in}).value();
  ASSERT_OK(Gemm(cpu, Operand(dy, Copy::kRowwise, false), Operand(w, Copy::kColumnwise, true), &dx));
  Tensor dx_ref = Tensor::Zeros(DType::kFloat32, {tokens, in}).value();
  ASSERT_OK(Gemm(cpu, Dequantized(dy, Copy::kRowwise), false, Dequantized(w, Copy::kColumnwise), true, 1.0f, 0.0f,
                 &dx_ref));
  EXPECT_TRUE(BitwiseEqual(dx, dx_ref)) << "dgrad";

  // wgrad dW [out, in] += dy^T x from the columnwise copies [out, tokens], [in, tokens].
  const Tensor start = RandomTensor({out, in}, -1.0f, 1.0f, 4);
  Tensor dw = start.Clone().value();
  GemmOptions accumulate;
  accumulate.beta = 1.0f;
  ASSERT_OK(Gemm(cpu, Operand(dy, Copy::kColumnwise, false), Operand(x, Copy::kColumnwise, true), &dw, accumulate));
  Tensor dw_ref = start.Clone().value();
  ASSERT_OK(Gemm(cpu, Dequantized(dy, Copy::kColumnwise), false, Dequantized(x, Copy::kColumnwise), true, 1.0f, 1.0f,
                 &dw_ref));
  EXPECT_TRUE(BitwiseEqual(dw, dw_ref)) << "wgrad";

  // Scales already in cuBLASLt's layout: the same bits.
  Tensor y_gemm_layout = Tensor::Zeros(DType::kFloat32, {tokens, out}).value();
  ASSERT_OK(Gemm(cpu, GemmLayout(Operand(x, Copy::kRowwise, false)), GemmLayout(Operand(w, Copy::kRowwise, true)),
                 &y_gemm_layout));
  EXPECT_TRUE(BitwiseEqual(y_gemm_layout, y)) << "fprop, kGemm scales";
  Tensor dw_gemm_layout = start.Clone().value();
  ASSERT_OK(Gemm(cpu, GemmLayout(Operand(dy, Copy::kColumnwise, false)),
                 GemmLayout(Operand(x, Copy::kColumnwise, true)), &dw_gemm_layout, accumulate));
  EXPECT_TRUE(BitwiseEqual(dw_gemm_layout, dw)) << "wgrad, kGemm scales";
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockGemmCpu,
                         ::testing::Values(Layout{"aligned", 128, 256, 256},      // whole blocks
                                           Layout{"k_tail", 144, 208, 336},       // k = 2 blocks + 80
                                           Layout{"short_k", 64, 96, 64},         // one partial block
                                           Layout{"outer_tails", 272, 400, 128}),  // m, n off the grid
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// A double-precision product of the dequantized copies: the BF16 output rounds once,
// the bias is added before that rounding.
TEST(BlockGemmCpuOutput, Bf16WithBias) {
  const int64_t m = 40, n = 48, k = 160;
  const QuantizedTensor x = Quantize(RandomTensor({m, k}, -2.0f, 2.0f, 5), false);
  const QuantizedTensor w = Quantize(RandomTensor({n, k}, -1.0f, 1.0f, 6), true);
  const Tensor bias = CastFromFloat32(Context::Cpu(), RandomTensor({n}, -1.0f, 1.0f, 7), DType::kBFloat16).value();
  GemmOptions options;
  options.epilogue = GemmEpilogue::kBias;
  options.bias = &bias;
  options.alpha = 0.5f;
  Tensor d = Tensor::Zeros(DType::kBFloat16, {m, n}).value();
  ASSERT_OK(Gemm(Context::Cpu(), Operand(x, Copy::kRowwise, false), Operand(w, Copy::kRowwise, true), &d, options));

  const Tensor xd = Dequantized(x, Copy::kRowwise);
  const Tensor wd = Dequantized(w, Copy::kRowwise);
  const Tensor bias_f = ToFloat32(Context::Cpu(), bias).value();
  std::vector<double> want(m * n), magnitude(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double sum = 0.0, mag = 0.0;
      for (int64_t l = 0; l < k; ++l) {
        const double t = static_cast<double>(xd.floats()[i * k + l]) * wd.floats()[j * k + l];
        sum += t;
        mag += std::fabs(t);
      }
      want[i * n + j] = 0.5 * sum + bias_f.floats()[j];
      magnitude[i * n + j] = 0.5 * mag + std::fabs(bias_f.floats()[j]);
    }
  }
  const Tensor got = ToFloat32(Context::Cpu(), d).value();
  EXPECT_TRUE(AllClose(got.floats(), want, DType::kBFloat16, magnitude));
}

// ---- What both backends refuse (each names the field, expected vs got). ----

struct ErrorOperands {
  QuantizedTensor x1, w2, x2;
  GemmOperand a1() const { return Operand(x1, Copy::kRowwise, false); }
  GemmOperand a2() const { return Operand(x2, Copy::kRowwise, false); }
  GemmOperand b2() const { return Operand(w2, Copy::kRowwise, true); }
};

ErrorOperands MakeErrorOperands(int64_t m, int64_t n, int64_t k) {
  return {Quantize(RandomTensor({m, k}, -1.0f, 1.0f, 8), false), Quantize(RandomTensor({n, k}, -1.0f, 1.0f, 9), true),
          Quantize(RandomTensor({m, k}, -1.0f, 1.0f, 10), true)};
}

TEST(BlockGemmCpuErrors, ModePairs) {
  const ErrorOperands o = MakeErrorOperands(16, 16, 128);
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), o.a2(), o.b2(), &d),
              HasError(kInvalid, "b.scale_mode: expected kBlock1D when a is kBlock2D (2D x 2D"));
  GemmOperand per_tensor{o.w2.rowwise_data, true, Tensor::FromFloats({1.0f}, {1}).value()};
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), per_tensor, &d),
              HasError(kInvalid, "b.scale_mode: expected kBlock1D or kBlock2D to pair with a block-scaled a"));
  GemmOperand f32{RandomTensor({16, 128}, -1.0f, 1.0f, 11)};
  f32.scale_mode = GemmScaleMode::kBlock1D;
  EXPECT_THAT(Gemm(Context::Cpu(), f32, GemmOperand{RandomTensor({16, 128}, -1.0f, 1.0f, 12), true}, &d),
              HasError(kInvalid, "a.scale_mode: expected kPerTensor for a FLOAT32 operand, got kBlock1D"));
  GemmOperand gemm_layout_per_tensor = per_tensor;
  gemm_layout_per_tensor.scale_layout = GemmScaleLayout::kGemm;
  EXPECT_THAT(Gemm(Context::Cpu(), GemmOperand{o.x1.rowwise_data, false, Tensor::FromFloats({1.0f}, {1}).value()},
                   gemm_layout_per_tensor, &d),
              HasError(kInvalid, "b.scale_layout: expected kQuantizer for a per-tensor scale_inv"));
  GemmOperand transposed = o.a1();
  transposed.transpose = true;
  EXPECT_THAT(Gemm(Context::Cpu(), transposed, o.b2(), &d), HasError(kInvalid, "a.transpose / b.transpose"));
}

TEST(BlockGemmCpuErrors, ScaleShapes) {
  const ErrorOperands o = MakeErrorOperands(16, 16, 208);  // ceil(208 / 128) = 2 k blocks
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  GemmOperand short_scales = o.a1();
  short_scales.scale_inv = Tensor::Zeros(DType::kFloat32, {16, 1}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), short_scales, o.b2(), &d),
              HasError(kInvalid, "a.scale_inv.shape: expected [16, 2], got [16, 1]"));
  GemmOperand unconverted = o.b2();
  unconverted.scale_layout = GemmScaleLayout::kGemm;  // [1, 2] is not [1, 4]
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), unconverted, &d),
              HasError(kInvalid, "b.scale_inv.shape: expected [1, 4], got [1, 2]"));
  GemmOperand one_d_unconverted = o.a1();
  one_d_unconverted.scale_layout = GemmScaleLayout::kGemm;  // [16, 2] is not [2, 16]
  EXPECT_THAT(Gemm(Context::Cpu(), one_d_unconverted, o.b2(), &d),
              HasError(kInvalid, "a.scale_inv.shape: expected [2, 16], got [16, 2]"));
}

TEST(BlockGemmCpuErrors, OutputsShapesAndOptions) {
  const ErrorOperands o = MakeErrorOperands(16, 16, 128);
  Tensor f16 = Tensor::Zeros(DType::kFloat16, {16, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), o.b2(), &f16),
              HasError(kInvalid, "d.dtype: expected FLOAT32 or BFLOAT16 for block-scaled operands, got FLOAT16"));
  Tensor d = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  GemmOptions fast;
  fast.accumulation = GemmAccumulation::kFast;
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), o.b2(), &d, fast),
              HasError(kInvalid, "options.accumulation: expected kSplit for block-scaled operands"));
  Tensor amax = Tensor::Zeros(DType::kFloat32, {1}).value();
  GemmOptions with_amax;
  with_amax.d_amax = &amax;
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), o.b2(), &d, with_amax),
              HasError(kInvalid, "options.d_amax: expected nullptr for block-scaled operands"));
  const Tensor bias = RandomTensor({16}, -1.0f, 1.0f, 13);
  Tensor aux = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  GemmOptions gelu;
  gelu.epilogue = GemmEpilogue::kGeluAuxBias;
  gelu.bias = &bias;
  gelu.aux = &aux;
  EXPECT_THAT(Gemm(Context::Cpu(), o.a1(), o.b2(), &d, gelu),
              HasError(kInvalid, "options.epilogue: expected kNone or kBias for block-scaled operands, got kGeluAuxBias"));

  // n (b's rows) a multiple of 8; m too when a is 1D, any m when a is 2D.
  const ErrorOperands odd = MakeErrorOperands(20, 12, 128);
  Tensor d_odd = Tensor::Zeros(DType::kFloat32, {20, 12}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), odd.a1(), odd.b2(), &d_odd),
              HasError(kInvalid, "d.shape[1]: expected n a multiple of 8 for block-scaled operands"));
  const ErrorOperands odd_m = MakeErrorOperands(20, 16, 128);
  Tensor d_odd_m = Tensor::Zeros(DType::kFloat32, {20, 16}).value();
  EXPECT_THAT(Gemm(Context::Cpu(), odd_m.a1(), odd_m.b2(), &d_odd_m),
              HasError(kInvalid, "d.shape[0]: expected m a multiple of 8 when a is kBlock1D"));
  GemmOperand b1 = Operand(Quantize(RandomTensor({16, 128}, -1.0f, 1.0f, 14), false), Copy::kRowwise, true);
  ASSERT_OK(Gemm(Context::Cpu(), odd_m.a2(), b1, &d_odd_m));  // 2D a: m = 20 is fine
  EXPECT_TRUE(CheckGemmArguments(Context::Cpu(), odd_m.a2(), b1, &d_odd_m).ok());
  EXPECT_THAT(CheckGemmArguments(Context::Cpu(), odd_m.a1(), odd_m.b2(), &d_odd_m), HasError(kInvalid, "d.shape[0]"));
}

TEST(BlockGemmSupport, HopperWithCublasLt129OrNewer) {
  EXPECT_TRUE(BlockScaledGemmSupport(Context::Cpu()).ok()) << "the CPU reference";
  EXPECT_TRUE(BlockScaledGemmSupportFor(9, 0, 120900).ok());
  EXPECT_TRUE(BlockScaledGemmSupportFor(9, 0, 130100).ok());
  EXPECT_THAT(BlockScaledGemmSupportFor(9, 0, 120804), HasError(kUnimplemented, "need cuBLASLt >= 12.9"));
  EXPECT_THAT(BlockScaledGemmSupportFor(8, 9, 130100), HasError(kUnimplemented, "this device is sm_89"));
  EXPECT_THAT(BlockScaledGemmSupportFor(10, 0, 130100), HasError(kUnimplemented, "this device is sm_100"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
