// PrecisionBoundary: a layer that computes in FP32 inside a stack whose activations
// travel in a 16-bit params_dtype (LayerSpec.params_dtype BFLOAT16 / FLOAT16).
//
// The wrapped module keeps its FP32 computation and its FP32 master parameters; the
// boundary converts what enters and leaves it:
//   Forward:  inputs -> FP32, outputs -> params_dtype;
//   Backward: grad_outputs -> FP32, input gradients -> the dtype each input came in.
// So the next layer reads activations in params_dtype, as under TE, and every
// gradient has the dtype of the value it belongs to. Everything else (name, kind,
// parameters, quantizers, RNG counters, attention paths) is the wrapped module's.
// Linear, GroupedLinear, LayerNorm / RMSNorm, LayerNormLinear, LayerNormMLP,
// DotProductAttention and MultiheadAttention compute in params_dtype natively and need
// no boundary; TransformerLayer is the layer built behind one.
#ifndef TESERVE_LAYERS_PRECISION_BOUNDARY_H_
#define TESERVE_LAYERS_PRECISION_BOUNDARY_H_

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace teserve {
namespace layers {

class PrecisionBoundary : public Module {
 public:
  // activation_dtype: BFLOAT16 or FLOAT16 (callers validated it).
  PrecisionBoundary(std::unique_ptr<Module> inner, DType activation_dtype)
      : Module(inner->name()), inner_(std::move(inner)), activation_dtype_(activation_dtype) {}

  std::string kind() const override { return inner_->kind(); }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override {
    return inner_->OutputShapes(input_shapes, field);
  }
  absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const override {
    return inner_->ValidateSide(side, input_shapes);
  }
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override { return inner_->Parameters(); }
  std::vector<NamedQuantizer> Quantizers() override { return inner_->Quantizers(); }
  std::vector<RngCounter> RngCounters() override { return inner_->RngCounters(); }
  void DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const override {
    inner_->DescribeAttention(device, out);
  }

 private:
  std::unique_ptr<Module> inner_;
  DType activation_dtype_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_PRECISION_BOUNDARY_H_
