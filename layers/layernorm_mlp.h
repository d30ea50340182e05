// LayerNormMLP: normalization, then fc1, an activation and fc2 (TE's LayerNormMLP).
//
//   ln_out  = norm(x)                 LayerNorm or RMSNorm over hidden_size
//   fc1_out = ln_out W1^T + b1        W1 [fc1_width, hidden_size]; fc1_width is
//                                     ffn_hidden_size, or 2 * ffn_hidden_size for the
//                                     gated activations ([a | b], kernels/activation.h)
//   act     = activation(fc1_out)     [..., ffn_hidden_size]
//   y       = act W2^T + b2           W2 [hidden_size, ffn_hidden_size]
// Outputs, in TE's order: y, then b2 when return_bias (and bias), then ln_out when
// return_layernorm_output. `bias` applies to both GEMMs.
//
// Normalization and the two GEMMs are sub-modules (layers/normalization.h,
// layers/linear.h), so every recipe quantizes fc1 and fc2 exactly as a Linear would.
// Their quantizers are reported under "<layer>.fc1" and "<layer>.fc2".
// Parameters (TE's names): "<layer>.layer_norm_weight", "<layer>.layer_norm_bias"
// (LayerNorm only), "<layer>.fc1_weight", "<layer>.fc1_bias", "<layer>.fc2_weight",
// "<layer>.fc2_bias". W1 is initialized from DeriveSeed(seed, 1), W2 from
// DeriveSeed(seed, 2).
//
// params_dtype (TE's; FLOAT32, BFLOAT16 or FLOAT16): the activations travel in it. The
// norm reads x in its dtype and writes ln_out in params_dtype; fc1 and fc2 are Linears
// in params_dtype (their GEMMs read the FP32 masters rounded to it); the activation
// reads fc1_out and writes its output in params_dtype (FP32 math per element,
// kernels::FusedActivationForward / Backward), and its backward returns d fc1_out in
// it. y, b2 and ln_out come out in params_dtype, dx in x's dtype; the saved fc1_out is
// 16-bit. Parameters and their gradients stay FP32 (the optimizer's masters). Under a
// quantizing recipe fc1's and fc2's quantizers read the 16-bit ln_out and activation.
// gelu with a bias, 16-bit params and no quantizing recipe (TE's GEMM + gelu fusion):
// fc1's GEMM applies the gelu in its epilogue (Linear::set_fprop_gelu), on the FP32 sums
// before rounding, and writes the pre-activation fc1_out beside it: one pass over
// [tokens, ffn_hidden_size] instead of the GEMM's write and the activation's read and
// write. act then differs from gelu(rounded fc1_out) in the last bit of some elements.
//
// checkpoint (TE's selective activation checkpointing): the forward does not keep
// fc1_out, the largest activation of the layer ([tokens, fc1_width] in params_dtype);
// the backward recomputes ln_out = norm(x) and fc1_out from the input, bit-exactly:
//   - What is kept: the input x with the normalization's per-row statistics, and what
//     the backward GEMMs read, exactly as the forward made it (fc1's and fc2's saved
//     operands: the columnwise quantized copies under a quantizing recipe).
//   - The recomputed fc1 fprop quantizes ln_out and W1 rowwise as the forward did
//     WITHOUT going through fc1's quantizers, so no quantizer bookkeeping runs twice
//     (no second amax in a delayed-scaling history, no second current-scaling amax or
//     call count, no second health measurement) and nothing depends on a scale having
//     moved on since the forward: per-tensor recipes (delayed, current) requantize with
//     the scale recorded at the forward; the block recipes (MXFP8, block, NVFP4) derive
//     their scales from the tensor itself and requantize with private quantizers whose
//     state nobody reports. Calibration and no recipe use the unquantized operands in
//     params_dtype, as fc1 does. The GEMM is fc1's own fprop (Linear::Fprop) on those
//     operands, so it runs exactly as in the forward.
//   - The recomputation reads the current W1 and b1: they must not change between a
//     checkpointed forward and its backward (TE's checkpointing has the same rule).
// So y, every gradient and every quantizer's state equal those of checkpoint = false.
#ifndef TESERVE_LAYERS_LAYERNORM_MLP_H_
#define TESERVE_LAYERS_LAYERNORM_MLP_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kernels/activation.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "layers/normalization.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

struct LayerNormMLPOptions {
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;
  float eps = 1e-5f;
  bool bias = true;
  NormKind normalization = NormKind::kLayerNorm;
  kernels::Activation activation = kernels::Activation::kGelu;
  kernels::ActivationParams activation_params;  // clamped_swiglu: limit, alpha
  bool return_layernorm_output = false;
  bool return_bias = false;  // return b2 instead of adding it
  bool zero_centered_gamma = false;
  bool checkpoint = false;   // recompute ln_out and fc1_out in the backward
  float init_std = 0.023f;   // W1, W2 ~ N(0, init_std^2)
  uint64_t seed = 0;
  // TE's params_dtype: FLOAT32, BFLOAT16 or FLOAT16 (see above).
  DType params_dtype = DType::kFloat32;
};

class LayerNormMLP : public Module {
 public:
  static absl::StatusOr<std::unique_ptr<LayerNormMLP>> Create(std::string name, const LayerNormMLPOptions& options,
                                                              const recipes::Recipe& recipe);

  std::string kind() const override { return "LayerNormMLP"; }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  // layer_norm_weight, [layer_norm_bias], fc1_weight, [fc1_bias], fc2_weight, [fc2_bias].
  std::vector<Parameter*> Parameters() override;
  // fc1's (layer "<layer>.fc1"), then fc2's ("<layer>.fc2").
  std::vector<NamedQuantizer> Quantizers() override;

 private:
  struct Saved;
  // How the forward quantized one fc1 fprop operand, so the recomputation can repeat it.
  struct FpropQuantization {
    bool quantized = false;
    bool per_tensor = false;  // delayed / current: requantize with `scale` or `current`
    DType format = DType::kFloat8E4M3;
    float scale = 1.0f;
    // Current scaling: the scale came from the operand's own amax, so the recomputed
    // operand (the same values) gets it again by the same rule.
    std::optional<kernels::CurrentScaleRule> current;
    // fc1's input only: the norm kernel made the cast (NormThenLinear), from its FP32
    // values, in this scaling mode; the recomputation makes it the same way.
    std::optional<ScalingMode> fused_mode;
  };

  LayerNormMLP(std::string name, const LayerNormMLPOptions& options) : Module(std::move(name)), options_(options) {}
  bool returns_bias() const { return options_.bias && options_.return_bias; }
  int64_t fc1_width() const { return kernels::ActivationInputWidth(options_.activation, options_.ffn_hidden_size); }

  // What the forward's fc1 quantizer for `role` just did (call right after fc1's Forward).
  FpropQuantization Record(recipes::TensorRole role) const;
  // The quantized copies of the fc1 fprop operand x that the forward made, recomputed
  // without fc1's quantizers (how.quantized only).
  absl::StatusOr<QuantizedTensor> Requantize(const Context& ctx, const FpropQuantization& how,
                                             recipes::Quantizer* replay, const Tensor& x) const;
  // The backward's end once fc1's has run: a returned ln_out's gradient joins d_ln, then
  // the norm's backward.
  absl::StatusOr<std::vector<Tensor>> FinishBackward(const Context& ctx, Saved& saved,
                                                     const std::vector<Tensor>& grad_outputs,
                                                     std::vector<Tensor> d_ln);
  // fc1_out [tokens, fc1_width] of the forward that saved `saved`, recomputed.
  absl::StatusOr<Tensor> RecomputeFc1(const Context& ctx, const Saved& saved) const;
  // The forward's end once fc2 has run: the outputs, and what the backward keeps (fc1_out,
  // or what its recomputation needs: the input and how fc1's operands were quantized,
  // `fused` being the cast the norm made).
  absl::StatusOr<ForwardOutput> Finish(ForwardOutput normed, ForwardOutput fc1, ForwardOutput fc2,
                                       const Tensor& fc1_out, const Tensor& input,
                                       const std::optional<recipes::FusedCast>& fused, const ForwardOptions& options);

  LayerNormMLPOptions options_;
  std::unique_ptr<Normalization> norm_;
  std::unique_ptr<Linear> fc1_;
  std::unique_ptr<Linear> fc2_;
  // checkpoint under a block recipe: quantizers of the recomputation (never reported).
  std::unique_ptr<recipes::Quantizer> replay_input_;
  std::unique_ptr<recipes::Quantizer> replay_weight_;
  // fc1's GEMM applies the gelu (Linear::set_fprop_gelu): gelu, a bias, 16-bit params and
  // no quantization.
  bool gelu_epilogue_ = false;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_LAYERNORM_MLP_H_
