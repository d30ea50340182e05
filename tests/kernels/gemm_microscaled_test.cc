// The CPU reference of the MXFP8 and NVFP4 GEMMs (kernels/gemm.h, GemmScaleMode kMxfp8,
// kNvfp4_1D / kNvfp4_2D): MXFP8 operands from QuantizeMxfp8 decode to exactly
// DequantizeBlock's copies, so the product is bit for bit the FP32 GEMM of the dequantized
// copies (what an emulated Linear multiplies), in Linear's three layouts; NVFP4 operands
// decode to code x block scale, so with the per-tensor decode scales in alpha the product
// is bit for bit the FP32 GEMM of those values (what the emulated Linear multiplies as
// BF16) and close to the fully dequantized copies' product; swizzled (kGemm) scales give
// the same bits as the quantizer's; BF16 output with the bias epilogue; every rejected
// combination names its field; and the device rule (Blackwell, cuBLASLt >= 12.8).
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/gemm.h"
#include "kernels/nvfp4.h"
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

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr absl::StatusCode kUnimplemented = absl::StatusCode::kUnimplemented;

GemmOperand Swizzled(GemmOperand o) {
  o.scale_inv = SwizzleMxfp8Scales(Context::Cpu(), o.scale_inv).value();
  o.scale_layout = GemmScaleLayout::kGemm;
  return o;
}

Tensor Dequantized(const QuantizedTensor& q, Copy copy) { return DequantizeBlock(Context::Cpu(), q, copy).value(); }

Tensor Zeros(int64_t rows, int64_t cols, DType dtype = DType::kFloat32) {
  return Tensor::Zeros(dtype, {rows, cols}).value();
}

struct Layout {
  const char* name;
  int64_t tokens, in, out;
};

class Mxfp8GemmCpu : public ::testing::TestWithParam<Layout> {};

TEST_P(Mxfp8GemmCpu, EqualsTheFp32GemmOfTheDequantizedCopies) {
  const Layout& l = GetParam();
  const QuantizedTensor x = QuantizeMxfp8Copies(RandomTensor({l.tokens, l.in}, -3.0f, 3.0f, 1));
  const QuantizedTensor w = QuantizeMxfp8Copies(RandomTensor({l.out, l.in}, -0.5f, 0.5f, 2));
  const QuantizedTensor dy = QuantizeMxfp8Copies(RandomTensor({l.tokens, l.out}, -1e-2f, 1e-2f, 3), DType::kFloat8E5M2);
  const Context cpu = Context::Cpu();

  Tensor y = Zeros(l.tokens, l.out), y_ref = Zeros(l.tokens, l.out);
  ASSERT_OK(Gemm(cpu, OperandOf(x, Copy::kRowwise, false), OperandOf(w, Copy::kRowwise, true), &y));
  ASSERT_OK(Gemm(cpu, Dequantized(x, Copy::kRowwise), false, Dequantized(w, Copy::kRowwise), true, 1.0f, 0.0f, &y_ref));
  EXPECT_TRUE(BitwiseEqual(y, y_ref)) << "fprop";

  Tensor dx = Zeros(l.tokens, l.in), dx_ref = Zeros(l.tokens, l.in);
  ASSERT_OK(Gemm(cpu, OperandOf(dy, Copy::kRowwise, false), OperandOf(w, Copy::kColumnwise, true), &dx));
  ASSERT_OK(Gemm(cpu, Dequantized(dy, Copy::kRowwise), false, Dequantized(w, Copy::kColumnwise), true, 1.0f, 0.0f,
                 &dx_ref));
  EXPECT_TRUE(BitwiseEqual(dx, dx_ref)) << "dgrad";

  const Tensor start = RandomTensor({l.out, l.in}, -1.0f, 1.0f, 4);
  Tensor dw = start.Clone().value(), dw_ref = start.Clone().value();
  GemmOptions accumulate;
  accumulate.beta = 1.0f;
  ASSERT_OK(Gemm(cpu, OperandOf(dy, Copy::kColumnwise, false), OperandOf(x, Copy::kColumnwise, true), &dw, accumulate));
  ASSERT_OK(Gemm(cpu, Dequantized(dy, Copy::kColumnwise), false, Dequantized(x, Copy::kColumnwise), true, 1.0f, 1.0f,
                 &dw_ref));
  EXPECT_TRUE(BitwiseEqual(dw, dw_ref)) << "wgrad";

  Tensor y_swizzled = Zeros(l.tokens, l.out);
  ASSERT_OK(Gemm(cpu, Swizzled(OperandOf(x, Copy::kRowwise, false)), Swizzled(OperandOf(w, Copy::kRowwise, true)),
                 &y_swizzled));
  EXPECT_TRUE(BitwiseEqual(y_swizzled, y)) << "fprop, swizzled scales";
  Tensor dw_swizzled = start.Clone().value();
  ASSERT_OK(Gemm(cpu, Swizzled(OperandOf(dy, Copy::kColumnwise, false)), Swizzled(OperandOf(x, Copy::kColumnwise, true)),
                 &dw_swizzled, accumulate));
  EXPECT_TRUE(BitwiseEqual(dw_swizzled, dw)) << "wgrad, swizzled scales";
}

// Outer dimensions and k off the 128 x 4 swizzle tiles (padding read as nothing).
INSTANTIATE_TEST_SUITE_P(Shapes, Mxfp8GemmCpu,
                         ::testing::Values(Layout{"aligned", 128, 256, 128}, Layout{"off_tiles", 96, 160, 224},
                                           Layout{"one_block", 32, 32, 64}),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

TEST(Mxfp8GemmCpuOutput, Bf16WithBiasEqualsTheFp32ProductRoundedOnce) {
  const QuantizedTensor x = QuantizeMxfp8Copies(RandomTensor({64, 96}, -2.0f, 2.0f, 5));
  const QuantizedTensor w = QuantizeMxfp8Copies(RandomTensor({96, 96}, -1.0f, 1.0f, 6));
  const Tensor bias = RandomTensor({96}, -1.0f, 1.0f, 7);
  Tensor y = Zeros(64, 96, DType::kBFloat16);
  GemmOptions options;
  options.epilogue = GemmEpilogue::kBias;
  options.bias = &bias;
  ASSERT_OK(Gemm(Context::Cpu(), OperandOf(x, Copy::kRowwise, false), OperandOf(w, Copy::kRowwise, true), &y, options));
  Tensor y32 = Zeros(64, 96);
  GemmOptions fp32_bias = options;
  ASSERT_OK(Gemm(Context::Cpu(), OperandOf(x, Copy::kRowwise, false), OperandOf(w, Copy::kRowwise, true), &y32,
                 fp32_bias));
  EXPECT_TRUE(BitwiseEqual(y, CastFromFloat32(Context::Cpu(), y32, DType::kBFloat16).value()));
}

TEST(Mxfp8GemmCpuErrors, NamesTheField) {
  const Context cpu = Context::Cpu();
  const QuantizedTensor x = QuantizeMxfp8Copies(RandomTensor({64, 64}, -1.0f, 1.0f, 8));
  const QuantizedTensor w = QuantizeMxfp8Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 9));
  const GemmOperand a = OperandOf(x, Copy::kRowwise, false);
  const GemmOperand b = OperandOf(w, Copy::kRowwise, true);
  Tensor y = Zeros(64, 32);

  GemmOperand per_tensor_b = b;
  per_tensor_b.scale_mode = GemmScaleMode::kPerTensor;
  per_tensor_b.scale_inv = Tensor::FromFloats({1.0f}, {1}).value();
  EXPECT_THAT(Gemm(cpu, a, per_tensor_b, &y), HasError(kInvalid, "b.scale_mode: expected kMxfp8 to pair"));

  GemmOperand fp32_scales = b;
  fp32_scales.scale_inv = Tensor::Zeros(DType::kFloat32, b.scale_inv.shape()).value();
  EXPECT_THAT(Gemm(cpu, a, fp32_scales, &y), HasError(kInvalid, "b.scale_inv"));

  GemmOperand swizzle_claimed = b;  // row-major scales declared as swizzled: wrong shape
  swizzle_claimed.scale_layout = GemmScaleLayout::kGemm;
  EXPECT_THAT(Gemm(cpu, a, swizzle_claimed, &y), HasError(kInvalid, "b.scale_inv"));

  GemmOperand k48{Tensor::Zeros(DType::kFloat8E4M3, {64, 48}).value(), false,
                  Tensor::Zeros(DType::kFloat8E8M0, {64, 1}).value()};  // k % 32 != 0
  k48.scale_mode = GemmScaleMode::kMxfp8;
  GemmOperand b48{Tensor::Zeros(DType::kFloat8E4M3, {32, 48}).value(), true,
                  Tensor::Zeros(DType::kFloat8E8M0, {32, 1}).value()};
  b48.scale_mode = GemmScaleMode::kMxfp8;
  EXPECT_THAT(Gemm(cpu, k48, b48, &y), HasError(kInvalid, "a.data.shape[1]: expected a multiple of 32"));

  Tensor y16 = Zeros(64, 32, DType::kFloat16);
  EXPECT_THAT(Gemm(cpu, a, b, &y16), HasError(kInvalid, "d.dtype: expected FLOAT32 or BFLOAT16"));
  GemmOptions fast;
  fast.accumulation = GemmAccumulation::kFast;
  EXPECT_THAT(Gemm(cpu, a, b, &y, fast), HasError(kInvalid, "options.accumulation"));
  Tensor y_rows = Zeros(60, 32);
  GemmOperand a60{Tensor::Zeros(DType::kFloat8E4M3, {60, 64}).value(), false,
                  Tensor::Zeros(DType::kFloat8E8M0, {60, 2}).value()};
  a60.scale_mode = GemmScaleMode::kMxfp8;
  EXPECT_THAT(Gemm(cpu, a60, b, &y_rows), HasError(kInvalid, "d.shape[0]: expected m a multiple of 8 when a is kMxfp8"));
}

// One copy's values without the per-tensor decode scale: code x block scale (x 1).
Tensor BlockValues(QuantizedTensor q, Copy copy) {
  q.global_encode_scale = 1.0f;
  return DequantizeNvfp4(Context::Cpu(), q, copy).value();
}

// Per-row swizzled E4M3 scales of an operand (a 2D operand's rows repeated): kGemm layout.
GemmOperand Fp4Swizzled(GemmOperand o) {
  Tensor per_row = o.scale_inv;
  if (o.scale_mode == GemmScaleMode::kNvfp4_2D) {
    const int64_t rows = o.data.dim(0), cols = o.scale_inv.dim(1);
    per_row = Tensor::Zeros(DType::kFloat8E4M3, {rows, cols}).value();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        per_row.data<uint8_t>()[r * cols + c] = o.scale_inv.data<uint8_t>()[(r / 16) * cols + c];
      }
    }
  }
  // The swizzle is a byte permutation: MXFP8's E8M0 routine serves E4M3 bytes as well.
  const Tensor bytes = Tensor::Borrow(per_row.raw_data(), DType::kFloat8E8M0, per_row.shape());
  const Tensor swizzled = SwizzleMxfp8Scales(Context::Cpu(), bytes).value();
  o.scale_inv = Tensor::Zeros(DType::kFloat8E4M3, swizzled.shape()).value();
  std::memcpy(o.scale_inv.raw_data(), swizzled.raw_data(), swizzled.nbytes());
  o.scale_layout = GemmScaleLayout::kGemm;
  return o;
}

class Nvfp4GemmCpu : public ::testing::TestWithParam<Layout> {};

TEST_P(Nvfp4GemmCpu, EqualsTheFp32GemmOfTheBlockValuesWithTheGlobalScalesInAlpha) {
  const Layout& l = GetParam();
  const QuantizedTensor x = QuantizeNvfp4Copies(RandomTensor({l.tokens, l.in}, -3.0f, 3.0f, 21), false);
  const QuantizedTensor w = QuantizeNvfp4Copies(RandomTensor({l.out, l.in}, -0.5f, 0.5f, 22), true);
  const QuantizedTensor dy = QuantizeNvfp4Copies(RandomTensor({l.tokens, l.out}, -1e-2f, 1e-2f, 23), false);
  const Context cpu = Context::Cpu();
  auto alpha = [](const QuantizedTensor& a, const QuantizedTensor& b) {
    GemmOptions o;
    o.alpha = (1.0f / a.global_encode_scale) * (1.0f / b.global_encode_scale);
    return o;
  };
  struct Pass {
    const char* name;
    const QuantizedTensor *a, *b;
    Copy ca, cb;
    int64_t m, n;
  };
  const Pass passes[] = {{"fprop", &x, &w, Copy::kRowwise, Copy::kRowwise, l.tokens, l.out},
                         {"dgrad", &dy, &w, Copy::kRowwise, Copy::kColumnwise, l.tokens, l.in},
                         {"wgrad", &dy, &x, Copy::kColumnwise, Copy::kColumnwise, l.out, l.in}};
  for (const Pass& p : passes) {
    SCOPED_TRACE(p.name);
    const GemmOptions options = alpha(*p.a, *p.b);
    Tensor d = Zeros(p.m, p.n), d_ref = Zeros(p.m, p.n), d_swizzled = Zeros(p.m, p.n), d_deq = Zeros(p.m, p.n);
    ASSERT_OK(Gemm(cpu, OperandOf(*p.a, p.ca, false), OperandOf(*p.b, p.cb, true), &d, options));
    ASSERT_OK(Gemm(cpu, BlockValues(*p.a, p.ca), false, BlockValues(*p.b, p.cb), true, options.alpha, 0.0f, &d_ref));
    EXPECT_TRUE(BitwiseEqual(d, d_ref));
    ASSERT_OK(Gemm(cpu, Fp4Swizzled(OperandOf(*p.a, p.ca, false)), Fp4Swizzled(OperandOf(*p.b, p.cb, true)),
                   &d_swizzled, options));
    EXPECT_TRUE(BitwiseEqual(d_swizzled, d)) << "swizzled scales";
    // The fully dequantized copies' FP32 GEMM: the same products, the decode scales
    // applied per element instead of once.
    const Tensor deq_a = DequantizeNvfp4(cpu, *p.a, p.ca).value(), deq_b = DequantizeNvfp4(cpu, *p.b, p.cb).value();
    ASSERT_OK(Gemm(cpu, deq_a, false, deq_b, true, 1.0f, 0.0f, &d_deq));
    // Within FP32 rounding of sum_k |a_ik b_kj|.
    Tensor abs_a = deq_a.Clone().value(), abs_b = deq_b.Clone().value(), terms = Zeros(p.m, p.n);
    for (float& v : abs_a.mutable_floats()) v = std::fabs(v);
    for (float& v : abs_b.mutable_floats()) v = std::fabs(v);
    ASSERT_OK(Gemm(cpu, abs_a, false, abs_b, true, 1.0f, 0.0f, &terms));
    const std::vector<double> want(d_deq.floats().begin(), d_deq.floats().end());
    const std::vector<double> magnitude(terms.floats().begin(), terms.floats().end());
    EXPECT_TRUE(AllClose(d.floats(), want, DType::kFloat32, magnitude));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Nvfp4GemmCpu,
                         ::testing::Values(Layout{"aligned", 128, 256, 128}, Layout{"off_tiles", 96, 160, 224}),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

TEST(Nvfp4GemmCpuErrors, NamesTheField) {
  const Context cpu = Context::Cpu();
  const QuantizedTensor x = QuantizeNvfp4Copies(RandomTensor({64, 64}, -1.0f, 1.0f, 31), false);
  const QuantizedTensor w = QuantizeNvfp4Copies(RandomTensor({32, 64}, -1.0f, 1.0f, 32), true);
  const GemmOperand a = OperandOf(x, Copy::kRowwise, false);
  const GemmOperand b = OperandOf(w, Copy::kRowwise, true);
  Tensor y = Zeros(64, 32);
  ASSERT_OK(Gemm(cpu, a, b, &y));

  GemmOperand wrong_mode = b;
  wrong_mode.scale_mode = GemmScaleMode::kMxfp8;
  EXPECT_THAT(Gemm(cpu, a, wrong_mode, &y), HasError(kInvalid, "b.scale_mode: expected kNvfp4_1D or kNvfp4_2D"));
  GemmOperand fp8_data = b;
  fp8_data.data = Tensor::Zeros(DType::kFloat8E4M3, b.data.shape()).value();
  EXPECT_THAT(Gemm(cpu, a, fp8_data, &y), HasError(kInvalid, "b.data.dtype: expected FLOAT4_E2M1 for kNvfp4_2D"));
  GemmOperand k16{Tensor::Zeros(DType::kFloat4E2M1, {64, 16}).value(), false,
                  Tensor::Zeros(DType::kFloat8E4M3, {64, 1}).value()};
  k16.scale_mode = GemmScaleMode::kNvfp4_1D;
  EXPECT_THAT(Gemm(cpu, k16, b, &y), HasError(kInvalid, "a.data.shape[1]: expected a multiple of 32"));
  GemmOperand rows24{Tensor::Zeros(DType::kFloat4E2M1, {24, 64}).value(), true,
                     Tensor::Zeros(DType::kFloat8E4M3, {1, 4}).value()};
  rows24.scale_mode = GemmScaleMode::kNvfp4_2D;
  Tensor y24 = Zeros(64, 24);
  EXPECT_THAT(Gemm(cpu, a, rows24, &y24), HasError(kInvalid, "b.data.shape[0]: expected a multiple of 16"));
}

TEST(Mxfp8GemmSupport, BlackwellWithCublasLt128OrNewer) {
  EXPECT_TRUE(MicroScaledGemmSupport(Context::Cpu()).ok()) << "the CPU reference";
  EXPECT_TRUE(MicroScaledGemmSupportFor(10, 0, 120800).ok());
  EXPECT_TRUE(MicroScaledGemmSupportFor(12, 0, 130100).ok());
  EXPECT_THAT(MicroScaledGemmSupportFor(10, 0, 120699), HasError(kUnimplemented, "need cuBLASLt >= 12.8"));
  EXPECT_THAT(MicroScaledGemmSupportFor(9, 0, 130100), HasError(kUnimplemented, "this device is sm_90"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
