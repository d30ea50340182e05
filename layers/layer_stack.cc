#include "layers/layer_stack.h"

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace teserve {
namespace layers {
namespace {

struct StackSaved : public SavedActivations {
  std::vector<std::unique_ptr<SavedActivations>> per_module;
};

}  // namespace

absl::StatusOr<std::vector<Shape>> LayerStack::OutputShapes(const std::vector<Shape>& input_shapes,
                                                            absl::string_view field) const {
  std::vector<Shape> shapes = input_shapes;
  std::string current_field(field);
  for (size_t i = 0; i < modules_.size(); ++i) {
    ASSIGN_OR_RETURN(shapes, modules_[i]->OutputShapes(shapes, current_field));
    current_field = absl::StrCat("output of layer ", Quoted(modules_[i]->name()));
  }
  return shapes;
}

absl::Status LayerStack::ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
  std::vector<Shape> shapes = input_shapes;
  for (size_t i = 0; i < modules_.size(); ++i) {
    RETURN_IF_ERROR(modules_[i]->ValidateSide(side, shapes));
    ASSIGN_OR_RETURN(shapes, modules_[i]->OutputShapes(shapes, "inputs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ForwardOutput> LayerStack::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                  const ForwardOptions& options) {
  auto saved = std::make_unique<StackSaved>();
  std::vector<Tensor> activations = inputs;
  for (size_t i = 0; i < modules_.size(); ++i) {
    const auto& module = modules_[i];
    // Between modules the call may stop (its client went away); the session undoes it.
    if (i > 0) RETURN_IF_ERROR(CheckInterruption(ctx, "forward", module->name()));
    ASSIGN_OR_RETURN(ForwardOutput out, module->Forward(ctx, activations, options));
    activations = std::move(out.outputs);
    saved->per_module.push_back(std::move(out.saved));
  }
  ForwardOutput result;
  result.outputs = std::move(activations);
  if (options.save_for_backward) result.saved = std::move(saved);
  return result;
}

absl::StatusOr<std::vector<Tensor>> LayerStack::Backward(const Context& ctx, SavedActivations& saved_base,
                                                         const std::vector<Tensor>& grad_outputs,
                                                         SideGrads* side_grads) {
  auto& saved = static_cast<StackSaved&>(saved_base);
  std::vector<Tensor> grads = grad_outputs;
  for (size_t i = modules_.size(); i-- > 0;) {
    if (i + 1 < modules_.size()) RETURN_IF_ERROR(CheckInterruption(ctx, "backward", modules_[i]->name()));
    ASSIGN_OR_RETURN(grads, modules_[i]->Backward(ctx, *saved.per_module[i], grads, side_grads));
  }
  return grads;
}

std::vector<Parameter*> LayerStack::Parameters() {
  std::vector<Parameter*> params;
  for (const auto& module : modules_) {
    for (Parameter* p : module->Parameters()) params.push_back(p);
  }
  return params;
}

void LayerStack::DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const {
  for (const auto& module : modules_) module->DescribeAttention(device, out);
}

std::vector<NamedQuantizer> LayerStack::Quantizers() {
  std::vector<NamedQuantizer> quantizers;
  for (const auto& module : modules_) {
    for (const NamedQuantizer& q : module->Quantizers()) quantizers.push_back(q);
  }
  return quantizers;
}

std::vector<RngCounter> LayerStack::RngCounters() {
  std::vector<RngCounter> counters;
  for (const auto& module : modules_) {
    for (const RngCounter& c : module->RngCounters()) counters.push_back(c);
  }
  return counters;
}

}  // namespace layers
}  // namespace teserve
