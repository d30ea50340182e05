// CPU GEMM: row-major cblas_sgemm on FP32 operands (OpenBLAS, its own threads).
// Design choices:
// - beta == 0 must ignore C's contents, NaN included. BLAS implementations are allowed
//   to, and OpenBLAS does, skip reading C then, but we do not rely on it: C is zeroed
//   first, which makes the result independent of the library's beta handling.
// - Empty products: m or n == 0 touches nothing; k == 0 gives C = beta * C without
//   calling BLAS (leading dimensions of empty matrices are awkward there).
// - CBLAS takes int dimensions; larger problems are rejected instead of truncated.
// - ColumnSum accumulates each column in double: it produces bias gradients, where the
//   sum runs over batch*sequence rows and FP32 accumulation drifts.
#include "kernels/cpu/gemm_cpu.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/status.h"
#include "kernels/activation_math.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cpu/nvfp4_cpu.h"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

absl::Status CheckBlasDim(const char* name, int64_t value) {
  if (value > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Gemm: ", name, " = ", value, " exceeds the CBLAS int range (", std::numeric_limits<int>::max(), ")"));
  }
  return absl::OkStatus();
}

void ScaleInPlace(float beta, Tensor* c) {
  absl::Span<float> values = c->mutable_floats();
  if (beta == 0.0f) {
    std::fill(values.begin(), values.end(), 0.0f);
  } else if (beta != 1.0f) {
    for (float& v : values) v *= beta;
  }
}

// dst's bytes become src's (same dtype and size); nothing to do when they share a buffer.
void CopyBytes(const Tensor& src, Tensor* dst) {
  if (src.raw_data() != dst->raw_data()) std::memcpy(dst->raw_data(), src.raw_data(), src.nbytes());
}

// The FP32 sums into the bias gradient, rounded to its dtype.
absl::Status WriteBiasGrad(const Context& ctx, const Tensor& sums, Tensor* bias_grad) {
  ASSIGN_OR_RETURN(Tensor encoded, CastFromFloat32(ctx, sums, bias_grad->dtype()));
  CopyBytes(encoded, bias_grad);
  return absl::OkStatus();
}

// The scale_inv of element (r, c) of a block-scaled operand, in either layout
// (kernels/gemm.h; the checks have fixed the shapes).
float BlockScale(const GemmOperand& operand, int64_t r, int64_t c) {
  const int64_t ld = operand.scale_inv.dim(1);
  const int64_t cb = c / kGemmBlockSize;
  const bool gemm_layout = operand.scale_layout == GemmScaleLayout::kGemm;
  if (operand.scale_mode == GemmScaleMode::kMxfp8) {
    const uint8_t* e = operand.scale_inv.data<uint8_t>();
    const int64_t kb = c / kGemmMxfp8BlockSize;
    return E8M0ToFloat(gemm_layout ? e[Mxfp8SwizzledOffset(r, kb, ld)] : e[r * ld + kb]);
  }
  if (operand.scale_mode == GemmScaleMode::kNvfp4_1D || operand.scale_mode == GemmScaleMode::kNvfp4_2D) {
    const uint8_t* e = operand.scale_inv.data<uint8_t>();
    const int64_t kb = c / kGemmNvfp4BlockSize;
    if (gemm_layout) return E4M3ToFloat(e[Mxfp8SwizzledOffset(r, kb, ld)]);  // per row in either mode
    const int64_t row = operand.scale_mode == GemmScaleMode::kNvfp4_2D ? r / kGemmNvfp4BlockSize : r;
    return E4M3ToFloat(e[row * ld + kb]);
  }
  const float* s = operand.scale_inv.data<float>();
  if (operand.scale_mode == GemmScaleMode::kBlock1D) {
    return gemm_layout ? s[cb * ld + r] : s[r * ld + cb];
  }
  return s[(r / kGemmBlockSize) * ld + cb];  // 2D: the same indexing in both layouts
}

// An operand as the FP32 matrix it stands for: FP8 codes times their scale_inv, one
// FP32 product per element (per tensor or per block), so a block-scaled operand decodes
// bit for bit to kernels::DequantizeBlock's copy; NVFP4 codes times their E4M3 block
// scales (the per-tensor decode scale is the caller's alpha, kernels/gemm.h).
absl::StatusOr<Tensor> DecodeOperand(const Context& ctx, const GemmOperand& operand) {
  const bool fp4 = operand.data.dtype() == DType::kFloat4E2M1;
  ASSIGN_OR_RETURN(Tensor values, fp4 ? Float4E2M1ToFloat32(ctx, operand.data) : ToFloat32(ctx, operand.data));
  if (!fp4 && !IsFloat8(operand.data.dtype())) return values;
  if (operand.scale_mode == GemmScaleMode::kPerTensor) {
    const float scale_inv = operand.scale_inv.data<float>()[0];
    for (float& v : values.mutable_floats()) v *= scale_inv;
    return values;
  }
  const int64_t rows = values.dim(0);
  const int64_t cols = values.dim(1);
  float* v = values.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) v[r * cols + c] *= BlockScale(operand, r, c);
  }
  return values;
}

// The epilogue on the FP32 product (which already holds alpha * AB + beta * D).
absl::Status ApplyEpilogue(const Context& ctx, const GemmOptions& options, const Tensor& a_values,
                           bool transpose_a, Tensor* product) {
  const int64_t m = product->dim(0);
  const int64_t n = product->dim(1);
  absl::Span<float> y = product->mutable_floats();
  const act::GeluOp gelu;
  switch (options.epilogue) {
    case GemmEpilogue::kNone:
      return absl::OkStatus();
    case GemmEpilogue::kBias:
    case GemmEpilogue::kGeluAuxBias: {
      ASSIGN_OR_RETURN(Tensor bias, ToFloat32(ctx, *options.bias));
      const float* b = bias.data<float>();
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) y[i * n + j] += b[j];
      }
      if (options.epilogue == GemmEpilogue::kBias) return absl::OkStatus();
      ASSIGN_OR_RETURN(Tensor aux, CastFromFloat32(ctx, *product, options.aux->dtype()));
      CopyBytes(aux, options.aux);
      for (float& v : y) v = gelu.Value(v);
      return absl::OkStatus();
    }
    case GemmEpilogue::kDGeluBGrad: {
      ASSIGN_OR_RETURN(Tensor aux, ToFloat32(ctx, *options.aux));
      const float* pre = aux.data<float>();
      for (int64_t i = 0; i < m * n; ++i) y[i] *= gelu.Grad(pre[i]);
      ASSIGN_OR_RETURN(Tensor sums, Tensor::Zeros(DType::kFloat32, {n}));
      RETURN_IF_ERROR(ColumnSum(ctx, *product, /*accumulate=*/false, &sums));
      return WriteBiasGrad(ctx, sums, options.bias_grad);
    }
    case GemmEpilogue::kBGradB: {
      // bias_grad[i] = sum over k of op(A)[i, k]: column sums of A^T, or of A itself
      // when op(A) = A^T.
      ASSIGN_OR_RETURN(Tensor sums, Tensor::Zeros(DType::kFloat32, {m}));
      if (transpose_a) {
        RETURN_IF_ERROR(ColumnSum(ctx, a_values, /*accumulate=*/false, &sums));
      } else {
        const int64_t k = a_values.dim(1);
        const float* av = a_values.data<float>();
        for (int64_t i = 0; i < m; ++i) {
          double sum = 0.0;
          for (int64_t j = 0; j < k; ++j) sum += av[i * k + j];
          sums.data<float>()[i] = static_cast<float>(sum);
        }
      }
      return WriteBiasGrad(ctx, sums, options.bias_grad);
    }
  }
  return absl::InvalidArgumentError("Gemm: unknown epilogue");
}

}  // namespace

absl::Status Gemm(const Context& ctx, const GemmOperand& a, const GemmOperand& b, Tensor* d,
                  const GemmOptions& options) {
  ASSIGN_OR_RETURN(Tensor a_values, DecodeOperand(ctx, a));
  ASSIGN_OR_RETURN(Tensor b_values, DecodeOperand(ctx, b));
  Tensor product;
  if (options.beta != 0.0f) {
    // The FP32 copy of D must not share D's buffer: D is written only at the end.
    ASSIGN_OR_RETURN(product, ToFloat32(ctx, *d));
    if (product.raw_data() == d->raw_data()) {
      ASSIGN_OR_RETURN(product, d->Clone());
    }
  } else {
    ASSIGN_OR_RETURN(product, Tensor::Zeros(DType::kFloat32, d->shape()));
  }
  RETURN_IF_ERROR(Gemm(ctx, a_values, a.transpose, b_values, b.transpose, options.alpha,
                       options.beta, &product));
  RETURN_IF_ERROR(ApplyEpilogue(ctx, options, a_values, a.transpose, &product));
  if (options.d_amax != nullptr) {
    float amax = 0.0f;
    for (float v : product.floats()) amax = std::max(amax, std::fabs(v));
    options.d_amax->data<float>()[0] = amax;
  }
  if (IsFloat8(d->dtype())) {
    const float scale = options.d_scale->data<float>()[0];
    for (float& v : product.mutable_floats()) v *= scale;
  }
  ASSIGN_OR_RETURN(Tensor encoded, CastFromFloat32(ctx, product, d->dtype()));
  CopyBytes(encoded, d);
  return absl::OkStatus();
}

absl::Status Gemm(const Context&, const Tensor& a, bool transpose_a, const Tensor& b,
                  bool transpose_b, float alpha, float beta, Tensor* c) {
  const int64_t m = c->dim(0);
  const int64_t n = c->dim(1);
  const int64_t k = transpose_a ? a.dim(0) : a.dim(1);
  RETURN_IF_ERROR(CheckBlasDim("m", m));
  RETURN_IF_ERROR(CheckBlasDim("n", n));
  RETURN_IF_ERROR(CheckBlasDim("k", k));
  if (m == 0 || n == 0) return absl::OkStatus();
  if (beta == 0.0f) ScaleInPlace(0.0f, c);
  if (k == 0) {
    ScaleInPlace(beta, c);
    return absl::OkStatus();
  }
  // Stored (not logical) column counts are the row-major leading dimensions.
  const int lda = static_cast<int>(a.dim(1));
  const int ldb = static_cast<int>(b.dim(1));
  const int ldc = static_cast<int>(n);
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a.data<float>(), lda, b.data<float>(), ldb, beta,
              c->data<float>(), ldc);
  return absl::OkStatus();
}

absl::Status AddBias(const Context&, const Tensor& bias, Tensor* y) {
  const int64_t rows = y->dim(0);
  const int64_t cols = y->dim(1);
  const float* b = bias.data<float>();
  float* out = y->data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) out[i * cols + j] += b[j];
  }
  return absl::OkStatus();
}

absl::Status ColumnSum(const Context&, const Tensor& x, bool accumulate, Tensor* out) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  std::vector<double> sums(cols, 0.0);
  const float* in = x.data<float>();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) sums[j] += in[i * cols + j];
  }
  float* dst = out->data<float>();
  for (int64_t j = 0; j < cols; ++j) {
    dst[j] = accumulate ? static_cast<float>(dst[j] + sums[j]) : static_cast<float>(sums[j]);
  }
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
