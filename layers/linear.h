// Linear: y = x W^T + b with W [out_features, in_features] (TE's Linear).
//
// Under a quantizing recipe the three GEMMs use quantized operands, each from its own
// quantizer (docs/ARCHITECTURE.md, docs/te_facts.md "GEMMs"):
//   fprop  y  = x W^T    x rowwise,  W rowwise           (input, weight quantizers)
//   dgrad  dx = dy W     dy rowwise, W columnwise        (grad_output quantizer)
//   wgrad  dW = dy^T x   dy columnwise, x columnwise
// On the CPU the quantized operands are dequantized and multiplied in FP32, which is
// numerically the quantized computation. The master weight, the bias and their
// gradients stay FP32; with a 16-bit params_dtype, x and the weight are read in that
// dtype (the weight rounded from its master each forward, as TE's 16-bit weights are),
// y and dx come out in it, and the bias is added by the GEMM's epilogue in it.
#ifndef TESERVE_LAYERS_LINEAR_H_
#define TESERVE_LAYERS_LINEAR_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/quantized_tensor.h"
#include "layers/module.h"
#include "recipes/recipe.h"

namespace teserve {
namespace layers {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  bool return_bias = false;  // return the bias instead of adding it (TE's return_bias)
  float init_std = 0.023f;   // TE's default init_method: normal(0, 0.023)
  uint64_t seed = 0;
  // TE's params_dtype: FLOAT32, BFLOAT16 or FLOAT16. Activations (y, dx) come out in it
  // and the GEMMs read x and the weight in it (the FP32 master rounded per forward);
  // weight and bias gradients stay FP32 (the optimizer's masters).
  DType params_dtype = DType::kFloat32;
  // Parameter names; empty means "<layer>.weight" / "<layer>.bias" (GroupedLinear names
  // the weight and bias of GEMM i "<layer>.weight<i>" / "<layer>.bias<i>", as TE does).
  std::string weight_name;
  std::string bias_name;
};

class Linear : public Module {
 public:
  static absl::StatusOr<std::unique_ptr<Linear>> Create(std::string name, const LinearOptions& options,
                                                        const recipes::Recipe& recipe);

  std::string kind() const override { return "Linear"; }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;
  std::vector<NamedQuantizer> Quantizers() override;

  // The weight the GEMMs read: the FP32 master rounded to params_dtype (the master
  // itself for FP32).
  absl::StatusOr<Tensor> GemmWeight(const Context& ctx) const;
  DType params_dtype() const { return options_.params_dtype; }
  // Forward's fprop y [N, out] = x W^T (+ b unless return_bias), in params_dtype, on
  // operands prepared by the caller, touching no quantizer: x [N, in] and w
  // (GemmWeight) are read in params_dtype, or through the rowwise copies of x_q / w_q
  // when given (as made by a quantizer of this Linear's recipe). Forward runs this very
  // GEMM on its quantizers' copies, so a caller that reproduces those copies reproduces
  // y bit for bit (LayerNormMLP's checkpoint recomputation). x may be undefined when x_q
  // is given. With set_fprop_gelu, y is the gelu and *gelu_aux (required then, and only
  // then) the pre-activation.
  absl::StatusOr<Tensor> Fprop(const Context& ctx, const Tensor& x, const QuantizedTensor* x_q, const Tensor& w,
                               const QuantizedTensor* w_q, Tensor* gelu_aux = nullptr) const;

  // LayerNormMLP's fc1 under a gelu activation (TE's GEMM + gelu fusion): the fprop's
  // epilogue applies gelu_tanh as well (kernels::GemmEpilogue::kGeluAuxBias), so
  // Forward's first output is gelu(x W^T + b), computed on the FP32 sums before any
  // rounding, and its last output the pre-activation x W^T + b (the activation's
  // backward input), both in params_dtype: one pass over [N, out] where a separate
  // activation kernel would make three. The backward is unchanged (it reads x and W).
  // Only for a bias added in the fprop, 16-bit params and no quantizer (INTERNAL
  // otherwise: the caller checks).
  absl::Status set_fprop_gelu(bool on);

  // The MLP backward's fusion (TE's DGELU_BGRAD): this Linear is fc2, whose input was
  // gelu(pre_activation) (fc1's output, [N, in] in params_dtype). Backward, but the
  // dgrad's epilogue applies gelu' (kernels::GemmEpilogue::kDGeluBGrad): returns the
  // gradient of the pre-activation, d(pre) = (dy W) * gelu'(pre_activation), in
  // params_dtype, and sets *pre_activation_bias_grad to its column sums ([in], in
  // params_dtype: fc1's bias gradient). Everything else (dW, this bias) as Backward.
  // 16-bit params and no quantizer only (INTERNAL otherwise).
  absl::StatusOr<Tensor> BackwardThroughGelu(const Context& ctx, SavedActivations& saved,
                                             const std::vector<Tensor>& grad_outputs, const Tensor& pre_activation,
                                             Tensor* pre_activation_bias_grad);
  // Backward with the bias gradient given (fc1 after BackwardThroughGelu: any dtype,
  // [out]) instead of the column sums of dy. A bias added in the fprop and an unquantized
  // dy only (INTERNAL otherwise).
  absl::StatusOr<std::vector<Tensor>> BackwardWithBiasGrad(const Context& ctx, SavedActivations& saved,
                                                           const std::vector<Tensor>& grad_outputs,
                                                           const Tensor& bias_grad);

  // For a caller that produces x itself (the norm of LayerNormLinear and LayerNormMLP,
  // the MLP's activation): the cast of x that producer may make as it writes x, in place
  // of Forward's quantization of x (Quantizer::PlanFusedCast), for `rows` tokens. Set
  // when the forward quantizes x (a quantizing recipe, not calibrating) and the recipe
  // allows it on these shapes. Rowwise always; columnwise when the forward saves for
  // the backward.
  std::optional<recipes::FusedCast> PlanInputCast(int64_t rows, const ForwardOptions& options);
  // Forward on an x that the caller quantized under PlanInputCast's plan: x_q holds its
  // copies ([rows, in_features]); input_shape and input_dtype are those of the x it
  // stands for (y takes the shape, dx comes back in the dtype). Records the cast with the
  // input quantizer, then runs exactly Forward's GEMMs on it.
  absl::StatusOr<ForwardOutput> ForwardQuantizedInput(const Context& ctx, QuantizedTensor x_q,
                                                      const Shape& input_shape, DType input_dtype,
                                                      const ForwardOptions& options);

 private:
  Linear(std::string name, const LinearOptions& options) : Module(std::move(name)), options_(options) {}

  // The bias the fprop adds: the FP32 master, or null without one or with return_bias.
  const Tensor* FpropBias() const;
  // What BackwardImpl fuses: the dgrad's gelu' (pre_activation, bias_grad set) or a bias
  // gradient given in place of dy's column sums (given_bias_grad). Empty: Backward.
  struct GeluBackward {
    Tensor pre_activation;                  // [N, in], params_dtype
    Tensor* bias_grad = nullptr;            // [in], params_dtype: written
    const Tensor* given_bias_grad = nullptr;  // [out]: read
  };
  absl::StatusOr<std::vector<Tensor>> BackwardImpl(const Context& ctx, SavedActivations& saved,
                                                   const std::vector<Tensor>& grad_outputs, const GeluBackward& gelu);
  // Forward from x in params_dtype [rows, in] or, when x_q is given, from its copies.
  absl::StatusOr<ForwardOutput> ForwardFrom(const Context& ctx, const Tensor& x, const QuantizedTensor* x_q,
                                            const Shape& input_shape, DType input_dtype,
                                            const ForwardOptions& options);

  LinearOptions options_;
  bool fprop_gelu_ = false;      // set_fprop_gelu
  bool calibrating_ = false;     // quantizers observe amaxes; GEMMs stay in FP32
  int64_t row_multiple_ = 1;     // token count divisor the recipe's blocks need
  Parameter weight_;
  Parameter bias_;  // undefined tensors when options_.bias is false
  std::unique_ptr<recipes::Quantizer> input_quantizer_;
  std::unique_ptr<recipes::Quantizer> weight_quantizer_;
  std::unique_ptr<recipes::Quantizer> grad_output_quantizer_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_LINEAR_H_
