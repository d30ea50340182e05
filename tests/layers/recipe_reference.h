// FP64 references on dequantized operands for the layer tests under quantizing
// recipes: each GEMM operand is quantized as the recipe's quantizer for its role would
// quantize it (fresh quantizers, so delayed scaling uses its initial scale 1), then
// dequantized and multiplied in double. Tolerances are TE's module-test values per
// format (docs/te_facts.md).
#ifndef TESERVE_TESTS_LAYERS_RECIPE_REFERENCE_H_
#define TESERVE_TESTS_LAYERS_RECIPE_REFERENCE_H_

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"

namespace teserve {
namespace testing_util {

struct Tolerance {
  double rtol, atol;
};

// TE's module tolerances vs references on dequantized inputs.
inline constexpr Tolerance kE4M3{0.125, 0.0675};
inline constexpr Tolerance kE5M2{0.25, 0.125};
inline constexpr Tolerance kE2M1{0.25, 0.125};

inline recipes::Recipe MakeRecipe(recipes::Recipe::Config config) {
  recipes::Recipe r;
  r.config = config;
  return r;
}

inline recipes::Nvfp4Config Nvfp4(bool rht, bool sr, bool two_d) {
  recipes::Nvfp4Config c;
  c.random_hadamard = rht;
  c.stochastic_rounding = sr;
  c.two_d = two_d;
  return c;
}

// One recipe of a parameterized layer test, with TE's module tolerance for its format.
struct RecipeCase {
  std::string name;
  recipes::Recipe recipe;
  Tolerance te;
};

inline void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

// No recipe and delayed scaling while calibrating (high precision: 1e-5), and every
// quantizing recipe (NVFP4 with RHT, stochastic rounding and 2D weight blocks).
inline std::vector<RecipeCase> EveryRecipe() {
  recipes::Recipe calibrating = MakeRecipe(recipes::DelayedScalingConfig());
  calibrating.calibrating = true;
  return {
      {"none", recipes::Recipe(), {1e-5, 1e-5}},
      {"delayed", MakeRecipe(recipes::DelayedScalingConfig()), kE4M3},
      {"current", MakeRecipe(recipes::CurrentScalingConfig()), kE4M3},
      {"mxfp8", MakeRecipe(recipes::Mxfp8Config()), kE4M3},
      {"block", MakeRecipe(recipes::BlockScalingConfig()), kE4M3},
      {"nvfp4", MakeRecipe(Nvfp4(true, true, true)), kE2M1},
      {"delayed_calibrating", calibrating, {1e-5, 1e-5}},
  };
}

// x^T of a 2-D FP32 tensor.
inline Tensor Transposed(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor t = Tensor::Zeros(DType::kFloat32, {cols, rows}).value();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t.mutable_floats()[j * rows + i] = x.floats()[i * cols + j];
  return t;
}

// Dequantized copy of x as a fresh quantizer of `recipe` for `role` makes it, in that
// copy's layout (columnwise: [cols, rows]). Without quantization (no recipe,
// calibration) the copies are x and x^T.
inline Tensor QuantizedReference(const recipes::Recipe& recipe, recipes::TensorRole role, const Tensor& x,
                                 kernels::Copy copy) {
  auto quantizer = recipes::MakeQuantizer(recipe, role).value();
  if (quantizer == nullptr || !recipe.quantizes()) return copy == kernels::Copy::kRowwise ? x : Transposed(x);
  QuantizedTensor q = quantizer->Quantize(Context(), x, true, true).value();
  return recipes::DequantizeCopy(Context(), q, copy).value();
}

// C[m, n] = sum_k A(i, k) B(k, j) with A, B read through index functions, in FP64.
inline std::vector<double> MatMul(int64_t m, int64_t n, int64_t k, const std::function<double(int64_t, int64_t)>& a,
                                  const std::function<double(int64_t, int64_t)>& b) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j)
      for (int64_t p = 0; p < k; ++p) c[i * n + j] += a(i, p) * b(p, j);
  return c;
}

// Element (i, j) of a row-major FP32 tensor with `cols` columns, as a double.
inline std::function<double(int64_t, int64_t)> At(const Tensor& t, int64_t cols) {
  return [&t, cols](int64_t i, int64_t j) { return static_cast<double>(t.floats()[i * cols + j]); };
}

// |got - want| <= atol + rtol |want| elementwise; reports the first few failures.
inline void ExpectClose(const Tensor& got, const std::vector<double>& want, Tolerance tol, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  int failures = 0;
  for (size_t i = 0; i < want.size() && failures < 5; ++i) {
    if (!(std::fabs(got.floats()[i] - want[i]) <= tol.atol + tol.rtol * std::fabs(want[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << got.floats()[i] << ", want " << want[i];
      ++failures;
    }
  }
}

}  // namespace testing_util
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_RECIPE_REFERENCE_H_
