#include "recipes/quantizer.h"

#include "absl/status/status.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "recipes/scaling.h"

namespace teserve {
namespace recipes {
namespace {

class DelayedScalingQuantizer : public Quantizer {
 public:
  DelayedScalingQuantizer(const DelayedScalingConfig& config, TensorRole role)
      : Quantizer(role),
        format_(FormatFor(config.fp8_format, role)),
        state_(config, DTypeMaxFinite(format_)) {}

  absl::StatusOr<QuantizedTensor> Quantize(const Context& ctx, const Tensor& x, bool rowwise,
                                           bool columnwise) override {
    kernels::PerTensorQuantizeOptions options;
    options.format = format_;
    options.scale = state_.scale();
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    ASSIGN_OR_RETURN(QuantizedTensor q, kernels::QuantizePerTensor(ctx, x, options));
    state_.RecordAmax(q.amax);
    last_amax_ = q.amax;
    ++calls_;
    return q;
  }

  void EndRegion() override { state_.Update(); }

  QuantizerSnapshot Snapshot() const override {
    QuantizerSnapshot s;
    s.recipe = "delayed";
    s.format = format_;
    s.amax = last_amax_;
    s.scale = state_.scale();
    s.scale_inv = state_.scale_inv();
    s.amax_history = state_.history();
    s.quantize_calls = calls_;
    return s;
  }

 private:
  DType format_;
  ScalingState state_;
  float last_amax_ = 0.0f;
  int64_t calls_ = 0;
};

class CurrentScalingQuantizer : public Quantizer {
 public:
  CurrentScalingQuantizer(const CurrentScalingConfig& config, TensorRole role)
      : Quantizer(role), config_(config), format_(FormatFor(config.fp8_format, role)) {}

  absl::StatusOr<QuantizedTensor> Quantize(const Context& ctx, const Tensor& x, bool rowwise,
                                           bool columnwise) override {
    ASSIGN_OR_RETURN(float amax, kernels::Amax(ctx, x));
    kernels::PerTensorQuantizeOptions options;
    options.format = format_;
    options.scale = CurrentScale(amax, DTypeMaxFinite(format_), config_.amax_epsilon,
                                 config_.power_2_scale);
    options.rowwise = rowwise;
    options.columnwise = columnwise;
    ASSIGN_OR_RETURN(QuantizedTensor q, kernels::QuantizePerTensor(ctx, x, options));
    last_amax_ = q.amax;
    last_scale_ = options.scale;
    ++calls_;
    return q;
  }

  QuantizerSnapshot Snapshot() const override {
    QuantizerSnapshot s;
    s.recipe = "current";
    s.format = format_;
    s.amax = last_amax_;
    s.scale = last_scale_;
    s.scale_inv = 1.0f / last_scale_;
    s.quantize_calls = calls_;
    return s;
  }

 private:
  CurrentScalingConfig config_;
  DType format_;
  float last_amax_ = 0.0f;
  float last_scale_ = 1.0f;
  int64_t calls_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Quantizer>> MakeQuantizer(const Recipe& recipe, TensorRole role) {
  if (!recipe.quantizes()) return std::unique_ptr<Quantizer>();
  if (const auto* delayed = absl::get_if<DelayedScalingConfig>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new DelayedScalingQuantizer(*delayed, role));
  }
  if (const auto* current = absl::get_if<CurrentScalingConfig>(&recipe.config)) {
    return std::unique_ptr<Quantizer>(new CurrentScalingQuantizer(*current, role));
  }
  return absl::InternalError("MakeQuantizer: recipe without a quantizer");
}

}  // namespace recipes
}  // namespace teserve
