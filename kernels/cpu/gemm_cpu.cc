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
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"

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

}  // namespace

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
