// Checked entry points of kernels/gemm.h: validate metadata (dtypes, ranks, the m/n/k
// agreement of the operands, devices, layouts; errors name the argument and say
// expected vs got), then run the CPU reference or the CUDA backend (cuBLASLt and
// kernels/cuda/gemm). The FP32 Gemm of the layers is the general GEMM with FP32
// operands on CUDA.
#include "kernels/gemm.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/gemm_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/gemm/gemm_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

absl::Status CheckFloatTensor(absl::string_view name, const Tensor& t, int rank, const Context& ctx) {
  return CheckTensor(name, t, DType::kFloat32, rank, ctx);
}

absl::Status CheckOutput(absl::string_view name, const Tensor* t, int rank, const Context& ctx) {
  if (t == nullptr) return InvalidField(name, "an allocated output tensor", "nullptr");
  return CheckFloatTensor(name, *t, rank, ctx);
}

std::string Described(const Tensor& t, bool transposed) {
  return absl::StrCat(ShapeToString(t.shape()), transposed ? " (transposed)" : "");
}

absl::Status CheckGemmShapes(const Tensor& a, bool transpose_a, const Tensor& b, bool transpose_b,
                             const Tensor& c) {
  const int64_t m = transpose_a ? a.dim(1) : a.dim(0);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  const int64_t kb = transpose_b ? b.dim(1) : b.dim(0);
  const int64_t n = transpose_b ? b.dim(0) : b.dim(1);
  if (kb != k) {
    return InvalidField("b.shape", absl::StrCat("op(b) with ", k, " rows to match op(a) = ",
                                                Described(a, transpose_a), " [m, k]"),
                        Described(b, transpose_b));
  }
  if (c.dim(0) != m || c.dim(1) != n) {
    return InvalidField("c.shape", ShapeToString({m, n}), ShapeToString(c.shape()));
  }
  if (c.numel() > 0 && (c.raw_data() == a.raw_data() || c.raw_data() == b.raw_data())) {
    return InvalidField("c", "a buffer distinct from a and b", "an aliased buffer");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Gemm(const Context& ctx, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c) {
  RETURN_IF_ERROR(CheckFloatTensor("a", a, 2, ctx));
  RETURN_IF_ERROR(CheckFloatTensor("b", b, 2, ctx));
  RETURN_IF_ERROR(CheckOutput("c", c, 2, ctx));
  RETURN_IF_ERROR(CheckGemmShapes(a, transpose_a, b, transpose_b, *c));
  ScopedKernelTimer timer(ctx, KernelOp::kGemm);
  return Dispatch("Gemm", ctx, [&] { return cpu::Gemm(ctx, a, transpose_a, b, transpose_b, alpha, beta, c); },
                  TESERVE_CUDA_KERNEL([&] {
                    GemmOptions options;
                    options.alpha = alpha;
                    options.beta = beta;
                    return cuda::Gemm(ctx, GemmOperand{a, transpose_a}, GemmOperand{b, transpose_b}, c, options);
                  }));
}

absl::Status AddBias(const Context& ctx, const Tensor& bias, Tensor* y) {
  RETURN_IF_ERROR(CheckFloatTensor("bias", bias, 1, ctx));
  RETURN_IF_ERROR(CheckOutput("y", y, 2, ctx));
  if (bias.dim(0) != y->dim(1)) {
    return InvalidField("bias.shape", ShapeToString({y->dim(1)}), ShapeToString(bias.shape()));
  }
  return Dispatch("AddBias", ctx, [&] { return cpu::AddBias(ctx, bias, y); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::AddBias(ctx, bias, y); }));
}

absl::Status ColumnSum(const Context& ctx, const Tensor& x, bool accumulate, Tensor* out) {
  RETURN_IF_ERROR(CheckFloatTensor("x", x, 2, ctx));
  RETURN_IF_ERROR(CheckOutput("out", out, 1, ctx));
  if (out->dim(0) != x.dim(1)) {
    return InvalidField("out.shape", ShapeToString({x.dim(1)}), ShapeToString(out->shape()));
  }
  return Dispatch("ColumnSum", ctx, [&] { return cpu::ColumnSum(ctx, x, accumulate, out); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::ColumnSum(ctx, x, accumulate, out); }));
}

// ---------------------------------------------------------------------------------------
// The general GEMM.

namespace {

constexpr int64_t kFloat8LeadingMultiple = 16;  // cuBLASLt FP8: 16-byte aligned rows
// Block-scaled FP8: n (and m when a is 1D) multiples of 8, D's rows 16-byte aligned at
// BF16; cuBLASLt refuses other shapes with these scale modes.
constexpr int64_t kBlockScaledOuterMultiple = 8;
// Padding of the contiguous dimension of GEMM-layout block scales (as
// kernels/block_quantize.h's kBlockScalesGemmAlignment).
constexpr int64_t kBlockScalesGemmAlignment = 4;
// Packed FP4 rows are 16-byte aligned at 32 codes.
constexpr int64_t kNvfp4LeadingMultiple = 32;
// The swizzled MXFP8 / NVFP4 scales' padding (kernels/block_quantize.h's kMxfp8SwizzleTile*).
constexpr int64_t kMxfp8SwizzleRows = 128;
constexpr int64_t kMxfp8SwizzleCols = 4;

bool IsGemmHighPrecision(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

const char* ScaleModeName(GemmScaleMode mode) {
  switch (mode) {
    case GemmScaleMode::kPerTensor: return "kPerTensor";
    case GemmScaleMode::kBlock1D: return "kBlock1D";
    case GemmScaleMode::kBlock2D: return "kBlock2D";
    case GemmScaleMode::kMxfp8: return "kMxfp8";
    case GemmScaleMode::kNvfp4_1D: return "kNvfp4_1D";
    case GemmScaleMode::kNvfp4_2D: return "kNvfp4_2D";
  }
  return "unknown";
}

bool IsNvfp4Mode(GemmScaleMode mode) {
  return mode == GemmScaleMode::kNvfp4_1D || mode == GemmScaleMode::kNvfp4_2D;
}

// Codes that carry scales: FP8, and NVFP4's packed E2M1.
bool IsScaledType(DType dtype) { return IsFloat8(dtype) || dtype == DType::kFloat4E2M1; }

// Operands pair within one family: per-tensor, FP8 block scaling (1D / 2D) or MXFP8.
int ScaleFamily(GemmScaleMode mode) {
  switch (mode) {
    case GemmScaleMode::kPerTensor: return 0;
    case GemmScaleMode::kBlock1D:
    case GemmScaleMode::kBlock2D: return 1;
    case GemmScaleMode::kMxfp8: return 2;
    case GemmScaleMode::kNvfp4_1D:
    case GemmScaleMode::kNvfp4_2D: return 3;
  }
  return 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// The scale_inv shape an FP8 operand's mode and layout call for (kernels/gemm.h), from
// the stored data [R, C] (C = k for the TN layout block scaling requires).
Shape ExpectedScaleShape(const GemmOperand& operand) {
  const int64_t rows = operand.data.dim(0);
  const int64_t col_blocks = CeilDiv(operand.data.dim(1), kGemmBlockSize);
  const bool gemm_layout = operand.scale_layout == GemmScaleLayout::kGemm;
  switch (operand.scale_mode) {
    case GemmScaleMode::kPerTensor:
      return {1};
    case GemmScaleMode::kBlock1D:
      if (gemm_layout) return {col_blocks, RoundUp(rows, kBlockScalesGemmAlignment)};
      return {rows, col_blocks};
    case GemmScaleMode::kBlock2D:
      if (gemm_layout) return {CeilDiv(rows, kGemmBlockSize), RoundUp(col_blocks, kBlockScalesGemmAlignment)};
      return {CeilDiv(rows, kGemmBlockSize), col_blocks};
    case GemmScaleMode::kMxfp8: {
      const int64_t mx_blocks = operand.data.dim(1) / kGemmMxfp8BlockSize;
      if (gemm_layout) return {RoundUp(rows, kMxfp8SwizzleRows), RoundUp(mx_blocks, kMxfp8SwizzleCols)};
      return {rows, mx_blocks};
    }
    case GemmScaleMode::kNvfp4_1D:
    case GemmScaleMode::kNvfp4_2D: {
      const int64_t nv_blocks = operand.data.dim(1) / kGemmNvfp4BlockSize;
      if (gemm_layout) return {RoundUp(rows, kMxfp8SwizzleRows), RoundUp(nv_blocks, kMxfp8SwizzleCols)};
      if (operand.scale_mode == GemmScaleMode::kNvfp4_2D) return {rows / kGemmNvfp4BlockSize, nv_blocks};
      return {rows, nv_blocks};
    }
  }
  return {1};
}

absl::Status CheckOperand(absl::string_view name, const GemmOperand& operand, const Context& ctx) {
  const std::string data = absl::StrCat(name, ".data");
  RETURN_IF_ERROR(CheckDefined(data, operand.data));
  RETURN_IF_ERROR(CheckRank(data, operand.data, 2));
  RETURN_IF_ERROR(CheckDevice(data, operand.data, ctx));
  const DType dtype = operand.data.dtype();
  if (!IsGemmHighPrecision(dtype) && !IsScaledType(dtype)) {
    return InvalidField(absl::StrCat(data, ".dtype"),
                        "one of FLOAT32, BFLOAT16, FLOAT16, FLOAT8_E4M3, FLOAT8_E5M2, FLOAT4_E2M1", DTypeName(dtype));
  }
  if (dtype == DType::kFloat4E2M1 && !IsNvfp4Mode(operand.scale_mode)) {
    return InvalidField(absl::StrCat(name, ".scale_mode"), "kNvfp4_1D or kNvfp4_2D for FLOAT4_E2M1 codes",
                        ScaleModeName(operand.scale_mode));
  }
  if (dtype != DType::kFloat4E2M1 && IsNvfp4Mode(operand.scale_mode)) {
    return InvalidField(absl::StrCat(data, ".dtype"),
                        absl::StrCat("FLOAT4_E2M1 for ", ScaleModeName(operand.scale_mode)), DTypeName(dtype));
  }
  const std::string scale = absl::StrCat(name, ".scale_inv");
  const bool block = operand.scale_mode != GemmScaleMode::kPerTensor;
  if (!IsScaledType(dtype)) {
    if (operand.scale_inv.defined()) {
      return InvalidField(scale, absl::StrCat("no scale_inv for a ", DTypeName(dtype), " operand"),
                          "a tensor");
    }
    if (block) {
      return InvalidField(absl::StrCat(name, ".scale_mode"),
                          absl::StrCat("kPerTensor for a ", DTypeName(dtype), " operand"),
                          ScaleModeName(operand.scale_mode));
    }
    return absl::OkStatus();
  }
  if (!block && operand.scale_layout != GemmScaleLayout::kQuantizer) {
    return InvalidField(absl::StrCat(name, ".scale_layout"), "kQuantizer for a per-tensor scale_inv", "kGemm");
  }
  if (operand.scale_mode == GemmScaleMode::kMxfp8 && operand.data.dim(1) % kGemmMxfp8BlockSize != 0) {
    return InvalidField(absl::StrCat(data, ".shape[1]"),
                        absl::StrCat("a multiple of ", kGemmMxfp8BlockSize, " (whole 1x32 MXFP8 blocks along k)"),
                        operand.data.dim(1));
  }
  if (IsNvfp4Mode(operand.scale_mode)) {
    if (operand.data.dim(1) % kNvfp4LeadingMultiple != 0) {
      return InvalidField(absl::StrCat(data, ".shape[1]"),
                          absl::StrCat("a multiple of ", kNvfp4LeadingMultiple,
                                       " (16-byte rows of packed FP4 codes, whole 1x16 blocks)"),
                          operand.data.dim(1));
    }
    if (operand.scale_mode == GemmScaleMode::kNvfp4_2D && operand.data.dim(0) % kGemmNvfp4BlockSize != 0) {
      return InvalidField(absl::StrCat(data, ".shape[0]"),
                          absl::StrCat("a multiple of ", kGemmNvfp4BlockSize, " for kNvfp4_2D (whole 16x16 blocks)"),
                          operand.data.dim(0));
    }
  }
  const DType scale_dtype = operand.scale_mode == GemmScaleMode::kMxfp8 ? DType::kFloat8E8M0
                            : IsNvfp4Mode(operand.scale_mode)          ? DType::kFloat8E4M3
                                                                       : DType::kFloat32;
  RETURN_IF_ERROR(CheckTensorOfShape(scale, operand.scale_inv, scale_dtype, ExpectedScaleShape(operand), ctx));
  if (operand.data.dim(1) % kFloat8LeadingMultiple != 0) {
    return InvalidField(absl::StrCat(data, ".shape[1]"),
                        absl::StrCat("a multiple of ", kFloat8LeadingMultiple,
                                     " (the stored row length of an FP8 GEMM operand)"),
                        operand.data.dim(1));
  }
  return absl::OkStatus();
}

absl::Status CheckOperandPair(const GemmOperand& a, const GemmOperand& b) {
  const DType ta = a.data.dtype();
  const DType tb = b.data.dtype();
  if (IsScaledType(ta) != IsScaledType(tb) || (!IsScaledType(ta) && ta != tb)) {
    return InvalidField("b.data.dtype", absl::StrCat("a dtype to pair with a.data's ", DTypeName(ta)),
                        DTypeName(tb));
  }
  if (!IsScaledType(ta)) return absl::OkStatus();
  if (ScaleFamily(a.scale_mode) != ScaleFamily(b.scale_mode)) {
    const char* expected[] = {"kPerTensor to pair with a per-tensor a (no block-scaled mix)",
                              "kBlock1D or kBlock2D to pair with a block-scaled a (no per-tensor or MXFP8 mix)",
                              "kMxfp8 to pair with an MXFP8 a", "kNvfp4_1D or kNvfp4_2D to pair with an NVFP4 a"};
    return InvalidField("b.scale_mode", expected[ScaleFamily(a.scale_mode)], ScaleModeName(b.scale_mode));
  }
  if (a.scale_mode == GemmScaleMode::kBlock2D && b.scale_mode == GemmScaleMode::kBlock2D) {
    return InvalidField("b.scale_mode", "kBlock1D when a is kBlock2D (2D x 2D block scaling has no kernel)",
                        "kBlock2D");
  }
  if (ta == DType::kFloat8E5M2 && tb == DType::kFloat8E5M2) {
    return InvalidField("b.data.dtype", "FLOAT8_E4M3 when a.data is FLOAT8_E5M2 (E5M2 x E5M2 has no kernel)",
                        DTypeName(tb));
  }
  if (a.transpose || !b.transpose) {
    return InvalidField("a.transpose / b.transpose",
                        "false / true for FP8 operands (k contiguous in both: pass columnwise copies)",
                        absl::StrCat(a.transpose ? "true" : "false", " / ", b.transpose ? "true" : "false"));
  }
  return absl::OkStatus();
}

absl::Status CheckVector(absl::string_view name, const Tensor* t, int64_t length, DType d_dtype,
                         const Context& ctx) {
  if (t == nullptr) return InvalidField(name, absl::StrCat("a [", length, "] tensor"), "nullptr");
  RETURN_IF_ERROR(CheckDefined(name, *t));
  // A vector beside an FP8 D is FP32 or BF16 (FP8 codes would carry no scale).
  const DType other = IsFloat8(d_dtype) ? DType::kBFloat16 : d_dtype;
  if (t->dtype() != DType::kFloat32 && t->dtype() != other) {
    return InvalidField(absl::StrCat(name, ".dtype"), absl::StrCat("FLOAT32 or ", DTypeName(other)),
                        DTypeName(t->dtype()));
  }
  RETURN_IF_ERROR(CheckDevice(name, *t, ctx));
  return CheckShape(name, *t, {length});
}

absl::Status CheckGemmOutput(const GemmOperand& a, const GemmOperand& b, const Tensor* d,
                             const GemmOptions& options, const Context& ctx) {
  if (d == nullptr) return InvalidField("d", "an allocated output tensor", "nullptr");
  RETURN_IF_ERROR(CheckDefined("d", *d));
  RETURN_IF_ERROR(CheckRank("d", *d, 2));
  RETURN_IF_ERROR(CheckDevice("d", *d, ctx));
  const bool fp8_inputs = IsScaledType(a.data.dtype());
  if (!IsGemmHighPrecision(d->dtype()) && !(fp8_inputs && IsFloat8(d->dtype()))) {
    return InvalidField("d.dtype",
                        fp8_inputs ? "one of FLOAT32, BFLOAT16, FLOAT16, FLOAT8_E4M3, FLOAT8_E5M2"
                                   : "one of FLOAT32, BFLOAT16, FLOAT16 (FP8 output needs FP8 operands)",
                        DTypeName(d->dtype()));
  }
  if (!fp8_inputs && d->dtype() != a.data.dtype() && d->dtype() != DType::kFloat32) {
    return InvalidField("d.dtype", absl::StrCat(DTypeName(a.data.dtype()), " or FLOAT32"),
                        DTypeName(d->dtype()));
  }
  RETURN_IF_ERROR(CheckGemmShapes(a.data, a.transpose, b.data, b.transpose, *d));
  if (d->dtype() == DType::kFloat8E5M2 && a.data.dtype() == DType::kFloat8E4M3 &&
      b.data.dtype() == DType::kFloat8E4M3) {
    return InvalidField("d.dtype", "FLOAT8_E4M3 or a high-precision type for E4M3 x E4M3 (an E5M2 d needs an "
                        "E5M2 operand)", DTypeName(d->dtype()));
  }
  if (IsFloat8(d->dtype())) {
    if (options.d_scale == nullptr) return InvalidField("options.d_scale", "an FP32 [1] tensor for an FP8 d", "nullptr");
    RETURN_IF_ERROR(CheckTensorOfShape("options.d_scale", *options.d_scale, DType::kFloat32, {1}, ctx));
    if (options.beta != 0.0f) return InvalidField("options.beta", "0 for an FP8 d", options.beta);
  } else if (options.d_scale != nullptr) {
    return InvalidField("options.d_scale", "nullptr for a high-precision d", "a tensor");
  }
  if (options.d_amax != nullptr) {
    if (!fp8_inputs) return InvalidField("options.d_amax", "nullptr for high-precision operands", "a tensor");
    RETURN_IF_ERROR(CheckTensorOfShape("options.d_amax", *options.d_amax, DType::kFloat32, {1}, ctx));
  }
  return absl::OkStatus();
}

absl::Status CheckEpilogue(const GemmOperand& a, const Tensor& d, const GemmOptions& options,
                           const Context& ctx) {
  const int64_t m = d.dim(0);
  const int64_t n = d.dim(1);
  const int64_t k = a.transpose ? a.data.dim(0) : a.data.dim(1);
  const bool wants_bias = options.epilogue == GemmEpilogue::kBias || options.epilogue == GemmEpilogue::kGeluAuxBias;
  const bool wants_aux = options.epilogue == GemmEpilogue::kGeluAuxBias || options.epilogue == GemmEpilogue::kDGeluBGrad;
  const bool wants_bias_grad =
      options.epilogue == GemmEpilogue::kDGeluBGrad || options.epilogue == GemmEpilogue::kBGradB;
  if (wants_bias) {
    RETURN_IF_ERROR(CheckVector("options.bias", options.bias, n, d.dtype(), ctx));
  } else if (options.bias != nullptr) {
    return InvalidField("options.bias", "nullptr for this epilogue", "a tensor");
  }
  if (wants_aux) {
    if (options.aux == nullptr) return InvalidField("options.aux", "an [m, n] tensor", "nullptr");
    if (IsFloat8(d.dtype())) return InvalidField("d.dtype", "a high-precision d with a GELU epilogue", DTypeName(d.dtype()));
    RETURN_IF_ERROR(CheckTensorOfShape("options.aux", *options.aux, d.dtype(), {m, n}, ctx));
  } else if (options.aux != nullptr) {
    return InvalidField("options.aux", "nullptr for this epilogue", "a tensor");
  }
  if (wants_bias_grad) {
    const int64_t length = options.epilogue == GemmEpilogue::kBGradB ? m : n;
    RETURN_IF_ERROR(CheckVector("options.bias_grad", options.bias_grad, length, d.dtype(), ctx));
  } else if (options.bias_grad != nullptr) {
    return InvalidField("options.bias_grad", "nullptr for this epilogue", "a tensor");
  }
  // kBGradB writes bias_grad apart from D, so D may accumulate (the wgrad onto a
  // gradient): D = op(A) op(B) + beta D, bias_grad as always.
  if (options.epilogue != GemmEpilogue::kNone && options.epilogue != GemmEpilogue::kBGradB && options.beta != 0.0f) {
    return InvalidField("options.beta", "0 with an epilogue other than kBGradB", options.beta);
  }
  if ((options.epilogue != GemmEpilogue::kNone || options.d_amax != nullptr) && (m == 0 || n == 0 || k == 0)) {
    return InvalidField("options.epilogue", "no epilogue and no d_amax for an empty product",
                        absl::StrCat("m=", m, " n=", n, " k=", k));
  }
  return absl::OkStatus();
}

// What block-scaled FP8 operands add to the general checks (kernels/gemm.h): cuBLASLt's
// VEC128 / BLK128x128 kernels, enforced on every backend so that a call valid on the
// CPU reference is valid on a GPU too.
absl::Status CheckBlockScaling(const GemmOperand& a, const Tensor& d, const GemmOptions& options) {
  if (a.scale_mode == GemmScaleMode::kPerTensor) return absl::OkStatus();
  if (d.dtype() != DType::kFloat32 && d.dtype() != DType::kBFloat16) {
    return InvalidField("d.dtype", "FLOAT32 or BFLOAT16 for block-scaled operands", DTypeName(d.dtype()));
  }
  const int64_t m = d.dim(0);
  const int64_t n = d.dim(1);
  if (n % kBlockScaledOuterMultiple != 0) {
    return InvalidField("d.shape[1]",
                        absl::StrCat("n a multiple of ", kBlockScaledOuterMultiple,
                                     " for block-scaled operands (the rows of b and of d)"),
                        n);
  }
  if ((a.scale_mode == GemmScaleMode::kBlock1D || a.scale_mode == GemmScaleMode::kMxfp8 ||
       IsNvfp4Mode(a.scale_mode)) &&
      m % kBlockScaledOuterMultiple != 0) {
    return InvalidField("d.shape[0]",
                        absl::StrCat("m a multiple of ", kBlockScaledOuterMultiple, " when a is ",
                                     ScaleModeName(a.scale_mode), " (the rows of a and d; a 2D a takes any m)"),
                        m);
  }
  if (options.accumulation != GemmAccumulation::kSplit) {
    return InvalidField("options.accumulation",
                        "kSplit for block-scaled operands (their kernels always promote per 128-deep k block)",
                        "kFast");
  }
  if (options.epilogue != GemmEpilogue::kNone && options.epilogue != GemmEpilogue::kBias) {
    const char* got = options.epilogue == GemmEpilogue::kGeluAuxBias  ? "kGeluAuxBias"
                      : options.epilogue == GemmEpilogue::kDGeluBGrad ? "kDGeluBGrad"
                                                                      : "kBGradB";
    return InvalidField("options.epilogue", "kNone or kBias for block-scaled operands", got);
  }
  if (options.d_amax != nullptr) {
    return InvalidField("options.d_amax", "nullptr for block-scaled operands", "a tensor");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status BlockScaledGemmSupport(const Context& ctx) {
  return Dispatch("BlockScaledGemm", ctx, [&] { return absl::OkStatus(); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::BlockScaledGemmSupport(ctx.device.index); }));
}

absl::Status MicroScaledGemmSupport(const Context& ctx) {
  return Dispatch("MicroScaledGemm", ctx, [&] { return absl::OkStatus(); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::MicroScaledGemmSupport(ctx.device.index); }));
}

absl::Status CheckGemmArguments(const Context& ctx, const GemmOperand& a, const GemmOperand& b, const Tensor* d,
                                const GemmOptions& options) {
  RETURN_IF_ERROR(CheckOperand("a", a, ctx));
  RETURN_IF_ERROR(CheckOperand("b", b, ctx));
  RETURN_IF_ERROR(CheckOperandPair(a, b));
  RETURN_IF_ERROR(CheckGemmOutput(a, b, d, options, ctx));
  RETURN_IF_ERROR(CheckEpilogue(a, *d, options, ctx));
  return CheckBlockScaling(a, *d, options);
}

absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options) {
  RETURN_IF_ERROR(CheckGemmArguments(ctx, a, b, d, options));
  ScopedKernelTimer timer(ctx, KernelOp::kGemm);
  return Dispatch("Gemm", ctx, [&] { return cpu::Gemm(ctx, a, b, d, options); },
                  TESERVE_CUDA_KERNEL([&] { return cuda::Gemm(ctx, a, b, d, options); }));
}

}  // namespace kernels
}  // namespace teserve
