// Quantizer: turns a high-precision tensor into a QuantizedTensor under one recipe.
// Each GEMM operand of a layer owns one (TensorRole: input, weight, grad_output), and
// the quantizer owns what persists across steps for that operand (ScalingState for
// delayed scaling).
#ifndef TESERVE_RECIPES_QUANTIZER_H_
#define TESERVE_RECIPES_QUANTIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "recipes/recipe.h"

namespace teserve {
namespace recipes {

// What GetQuantizationState shows of one quantizer.
struct QuantizerSnapshot {
  std::string recipe;
  DType format = DType::kFloat8E4M3;
  ScalingMode mode = ScalingMode::kPerTensor;
  float amax = 0.0f;       // of the latest quantization
  float scale = 1.0f;      // used by the latest quantization (current) / next one (delayed)
  float scale_inv = 1.0f;
  std::vector<float> amax_history;  // delayed only
  int64_t quantize_calls = 0;
};

class Quantizer {
 public:
  explicit Quantizer(TensorRole role) : role_(role) {}
  virtual ~Quantizer() = default;

  // x: FP32 [rows, cols]. Produces the requested copies (rowwise [rows, cols],
  // columnwise [cols, rows]).
  virtual absl::StatusOr<QuantizedTensor> Quantize(const Context& ctx, const Tensor& x,
                                                   bool rowwise, bool columnwise) = 0;
  // End of the region this operand belongs to (forward or backward): delayed scaling
  // rolls the history and computes the next scale. No-op for other recipes.
  virtual void EndRegion() {}
  virtual QuantizerSnapshot Snapshot() const = 0;

  TensorRole role() const { return role_; }

 private:
  TensorRole role_;
};

// The quantizer for `role` under `recipe`; nullptr when the recipe does not quantize
// (no recipe, or enabled = false).
absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const Recipe& recipe, TensorRole role);

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_QUANTIZER_H_
