// Quantizer: turns a high-precision tensor into a QuantizedTensor under one recipe.
// Each GEMM operand of a layer owns one (TensorRole: input, weight, grad_output), and
// the quantizer owns what persists across steps for that operand (ScalingState for
// delayed scaling) and what GetQuantizationState shows of it.
//
// Quantize() is the same for every recipe: the recipe's DoQuantize, then bookkeeping
// (latest amax, call count, block-scale summary) and, when enabled, the FP8 health
// statistics measured against the source. Observe() is the calibration path: the amax
// is collected (and delayed scaling updates its history) but nothing is cast.
#ifndef TESERVE_RECIPES_QUANTIZER_H_
#define TESERVE_RECIPES_QUANTIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "kernels/cast.h"
#include "recipes/health.h"
#include "recipes/recipe.h"

namespace teserve {
namespace recipes {

// What GetQuantizationState shows of one quantizer.
struct QuantizerSnapshot {
  std::string recipe;
  DType format = DType::kFloat8E4M3;
  ScalingMode mode = ScalingMode::kPerTensor;
  float amax = 0.0f;       // of the latest quantization (or observation)
  float scale = 1.0f;      // per-tensor recipes: used by the latest (current) / next (delayed)
  float scale_inv = 1.0f;
  std::vector<float> amax_history;  // delayed only
  int64_t quantize_calls = 0;
  BlockScaleSummary block_scales;   // block recipes: decoded scale_inv of the latest call
  HealthStats health;               // when health statistics are enabled
};

// What a checkpoint keeps of a quantizer: every value that later quantizations depend on
// (the delayed-scaling scale and amax history, NVFP4's count of random streams drawn)
// and the counters GetQuantizationState reports. The block-scale summary and the health
// statistics describe the latest quantization only and are not kept.
struct QuantizerState {
  float amax = 0.0f;                // of the latest quantization (or observation)
  int64_t quantize_calls = 0;
  float scale = 1.0f;               // delayed: the next scale; current: the latest
  std::vector<float> amax_history;  // delayed only (amax_history_len slots)
  int64_t rng_draws = 0;            // nvfp4: random streams used (stochastic rounding, RHT)
};

class Quantizer {
 public:
  Quantizer(TensorRole role, std::string recipe, DType format, ScalingMode mode)
      : role_(role), recipe_(std::move(recipe)), format_(format), mode_(mode) {}
  virtual ~Quantizer() = default;

  // x: FP32, BF16 or FP16 [rows, cols]. Produces the requested copies (rowwise
  // [rows, cols], columnwise [cols, rows]). Per-tensor recipes read FP32 and BF16
  // directly; everything else quantizes the FP32 value of x (a converted copy), so a
  // 16-bit x quantizes exactly as its FP32 value would.
  // dbias (optional, FP32 [cols] on x's device) is overwritten with the column sums of x
  // (the bias gradient when x is a Linear's dy): fused into the cast on per-tensor
  // recipes, a separate ColumnSum otherwise.
  absl::StatusOr<QuantizedTensor> Quantize(const Context& ctx, const Tensor& x, bool rowwise, bool columnwise,
                                           Tensor* dbias = nullptr);
  // Calibration: records the amax of x (FP32, BF16 or FP16) without casting.
  absl::Status Observe(const Context& ctx, const Tensor& x);
  // End of the region this operand belongs to (forward or backward): delayed scaling
  // rolls the history and computes the next scale. No-op for other recipes.
  virtual void EndRegion() {}
  QuantizerSnapshot Snapshot() const;
  QuantizerState ExportState() const;
  // Whether ImportState may take `state` (what ExportState returned for a quantizer of
  // the same recipe and config): INVALID_ARGUMENT naming "<field>.<value>" when the amax
  // history length differs or a count or scale is out of range.
  absl::Status CheckState(const QuantizerState& state, absl::string_view field) const;
  // Puts back a state that CheckState accepted.
  void ImportState(const QuantizerState& state);

  void set_health_stats(bool enabled) { health_stats_ = enabled; }
  TensorRole role() const { return role_; }
  DType format() const { return format_; }

 protected:
  // x is what Source returned; dbias is only passed to per-tensor recipes.
  virtual absl::StatusOr<QuantizedTensor> DoQuantize(const Context& ctx, const Tensor& x, bool rowwise,
                                                     bool columnwise, Tensor* dbias) = 0;
  // Delayed scaling records observed amaxes in its history.
  virtual void RecordAmax(float amax) {}
  // Per-tensor scale fields and history.
  virtual void FillSnapshot(QuantizerSnapshot* snapshot) const {}
  // |x| beyond this overflows the format at the scale in use (delayed scaling); 0 when
  // the recipe cannot overflow (its scale comes from the tensor itself).
  virtual float OverflowLimit() const { return 0.0f; }
  // The recipe's own part of QuantizerState (scale, history, draws).
  virtual void ExportExtra(QuantizerState* state) const {}
  virtual absl::Status CheckExtra(const QuantizerState& state, absl::string_view field) const {
    return absl::OkStatus();
  }
  virtual void ImportExtra(const QuantizerState& state) {}

 private:
  // x as this recipe's quantize kernels read it: itself (FP32; BF16 for per-tensor
  // recipes) or its FP32 value.
  absl::StatusOr<Tensor> Source(const Context& ctx, const Tensor& x) const;

  TensorRole role_;
  std::string recipe_;
  DType format_;
  ScalingMode mode_;
  bool health_stats_ = false;
  float last_amax_ = 0.0f;
  int64_t calls_ = 0;
  BlockScaleSummary block_scales_;
  HealthStats health_;
};

// The quantizer for `role` under `recipe`; nullptr when the recipe has none (no recipe,
// or enabled = false).
absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const Recipe& recipe, TensorRole role);

// Dequantizes any recipe's copy to FP32 in that copy's layout. An NVFP4 columnwise copy
// made with the random Hadamard transform stays in the transformed basis (the wgrad
// GEMM contracts two such copies, so the transform cancels).
absl::StatusOr<Tensor> DequantizeCopy(const Context& ctx, const QuantizedTensor& q, kernels::Copy copy);

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_QUANTIZER_H_
