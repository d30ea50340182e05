// LayerNormLinear: normalization, then a linear map (TE's LayerNormLinear).
//
//   ln_out = norm(x)               LayerNorm or RMSNorm over in_features (eps,
//                                  zero_centered_gamma: layers/normalization.h)
//   y      = ln_out W^T + b        W [out_features, in_features] (layers/linear.h)
// Outputs, in TE's order: y, then b when return_bias (and bias), then ln_out when
// return_layernorm_output. The gradient of a returned ln_out joins the one flowing
// back from the GEMM before the normalization's backward.
//
// The layer is a Normalization followed by a Linear sub-module, so every recipe
// quantizes the GEMM exactly as a Linear would (its quantizers carry the layer's
// name) and the result is bitwise that of the two modules in sequence.
//
// Parameters (TE's names): "<layer>.layer_norm_weight", "<layer>.layer_norm_bias"
// (LayerNorm only), "<layer>.weight", "<layer>.bias". With parameters_split the weight
// and bias are cut along dim 0 into consecutive row blocks named
// "<layer>.<split>_weight" / "<layer>.<split>_bias" (trailing underscores of a split
// name are dropped, as TE does); the blocks are views of one weight, so the output is
// still one tensor and the GEMM is still one GEMM.
#ifndef TESERVE_LAYERS_LAYERNORM_LINEAR_H_
#define TESERVE_LAYERS_LAYERNORM_LINEAR_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "layers/linear.h"
#include "layers/module.h"
#include "layers/normalization.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

// (name, rows) blocks of TE's parameters_split, in order.
using ParametersSplit = std::vector<std::pair<std::string, int64_t>>;

struct LayerNormLinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  float eps = 1e-5f;
  bool bias = true;
  NormKind normalization = NormKind::kLayerNorm;
  bool zero_centered_gamma = false;
  bool return_bias = false;              // return b instead of adding it
  bool return_layernorm_output = false;  // also return ln_out
  ParametersSplit parameters_split;      // empty: one weight and one bias
  float init_std = 0.023f;               // W ~ N(0, init_std^2), as a Linear with `seed`
  uint64_t seed = 0;
  // TE's params_dtype, for the norm's output and the Linear (layers/linear.h).
  DType params_dtype = DType::kFloat32;
};

// Checks a parameters_split against out_features: every name non-empty once trailing
// underscores are dropped, names unique, sizes > 0 summing to out_features. Errors are
// INVALID_ARGUMENT naming "<field>[i].name" / "<field>[i].size" / "<field>".
absl::Status ValidateParametersSplit(const ParametersSplit& split, int64_t out_features, absl::string_view field);

class LayerNormLinear : public Module {
 public:
  // INVALID_ARGUMENT naming "parameters_split..." for a bad split.
  static absl::StatusOr<std::unique_ptr<LayerNormLinear>> Create(std::string name,
                                                                 const LayerNormLinearOptions& options,
                                                                 const recipes::Recipe& recipe);

  std::string kind() const override { return "LayerNormLinear"; }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  // layer_norm_weight, [layer_norm_bias], then the weight(s), then the bias(es).
  std::vector<Parameter*> Parameters() override;
  std::vector<NamedQuantizer> Quantizers() override;

 private:
  LayerNormLinear(std::string name, const LayerNormLinearOptions& options)
      : Module(std::move(name)), options_(options) {}
  bool returns_bias() const { return options_.bias && options_.return_bias; }

  LayerNormLinearOptions options_;
  std::unique_ptr<Normalization> norm_;
  std::unique_ptr<Linear> linear_;
  // With parameters_split: views of linear_'s weight / bias (value and grad) rows.
  std::vector<Parameter> split_weights_;
  std::vector<Parameter> split_biases_;
};

// Shared by LayerNormLinear and LayerNormMLP: a Normalization whose parameters carry
// TE's names "<layer>.layer_norm_weight" / "<layer>.layer_norm_bias".
absl::StatusOr<std::unique_ptr<Normalization>> CreateLayerNorm(const std::string& layer, NormKind kind,
                                                               int64_t hidden_size, float eps,
                                                               bool zero_centered_gamma,
                                                               DType params_dtype = DType::kFloat32);

// norm(inputs[0]) then linear on it, as the forwards of LayerNormLinear and LayerNormMLP
// (fc1) run them: the normalized values go straight into linear's quantized input when its
// recipe lets the norm kernel make that cast (Linear::PlanInputCast: delayed scaling,
// MXFP8), so they are not written in params_dtype and read again to be quantized. The
// norm's output (outputs[0], params_dtype) is then written only when `write_y` (the layer
// returns it); otherwise it always is.
struct NormThenLinearOutput {
  ForwardOutput normed;     // the norm's
  ForwardOutput projected;  // the Linear's
  std::optional<recipes::FusedCast> fused;  // the cast the norm made, when it made one
};
absl::StatusOr<NormThenLinearOutput> NormThenLinear(const Context& ctx, Normalization& norm, Linear& linear,
                                                    const std::vector<Tensor>& inputs, const ForwardOptions& options,
                                                    bool write_y);

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_LAYERNORM_LINEAR_H_
