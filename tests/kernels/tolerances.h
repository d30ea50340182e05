// The one tolerance table for kernel tests, keyed by the dtype of the output checked.
// Values are Transformer Engine's C++ op tests (docs/te_facts.md, "Tolerances"):
//   FP32 atol 1e-6 / rtol 5e-6, FP16 1e-5 / 1e-3, BF16 1e-5 / 1e-2, FP8 1e-2 / 1e-2.
// Quantized codes and scales are not compared with tolerances at all: they must be
// bit-exact (TE expects quantize kernels with the same scale to be bit-exact).
//
// The relative part is applied to a magnitude the caller supplies. For a plain value
// it is |reference|. For a reduction (a GEMM entry, a normalization gradient) it is the
// sum of the absolute values of the terms reduced, the standard forward-error scale of
// a floating-point sum: a result that cancels to near zero is then judged by the size
// of what was added, not by the size of the cancelled result.
#ifndef TESERVE_TESTS_KERNELS_TOLERANCES_H_
#define TESERVE_TESTS_KERNELS_TOLERANCES_H_

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "core/dtype.h"
#include "gtest/gtest.h"

namespace teserve {
namespace testing_kernels {

struct Tolerance {
  double atol;
  double rtol;
};

inline Tolerance ToleranceFor(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return {1e-6, 5e-6};
    case DType::kFloat16: return {1e-5, 1e-3};
    case DType::kBFloat16: return {1e-5, 1e-2};
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0: return {1e-2, 1e-2};
    default: return {0.0, 0.0};  // integers and codes: exact
  }
}

// |got[i] - want[i]| <= atol + rtol * magnitude[i] for every i (magnitude defaults to
// |want[i]|). Reports the count of failures and the first few.
inline ::testing::AssertionResult AllClose(absl::Span<const float> got,
                                           absl::Span<const double> want, DType dtype,
                                           absl::Span<const double> magnitude = {}) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  const Tolerance tol = ToleranceFor(dtype);
  int64_t failures = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); ++i) {
    const double scale = magnitude.empty() ? std::fabs(want[i]) : magnitude[i];
    const double error = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (error <= tol.atol + tol.rtol * scale) continue;  // NaN errors fail here too
    if (++failures <= 5) {
      absl::StrAppend(&report, "\n  [", i, "] got ", got[i], " want ", want[i], " (error ",
                      error, ", allowed ", tol.atol + tol.rtol * scale, ")");
    }
  }
  if (failures == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << failures << " of " << got.size()
                                       << " values out of tolerance for " << DTypeName(dtype)
                                       << report;
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_TOLERANCES_H_
