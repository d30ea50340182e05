// LayerStack: modules run in sequence; itself a Module. Every module but the last
// produces exactly one output, which is the next module's input. Between two modules
// (forward and backward) it asks the Context's Interruption whether to stop.
#ifndef TESERVE_LAYERS_LAYER_STACK_H_
#define TESERVE_LAYERS_LAYER_STACK_H_

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace teserve {
namespace layers {

class LayerStack : public Module {
 public:
  explicit LayerStack(std::string name = "stack") : Module(std::move(name)) {}

  void Append(std::unique_ptr<Module> module) { modules_.push_back(std::move(module)); }
  const std::vector<std::unique_ptr<Module>>& modules() const { return modules_; }

  std::string kind() const override { return "LayerStack"; }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;
  std::vector<NamedQuantizer> Quantizers() override;
  void DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const override;
  std::vector<RngCounter> RngCounters() override;

 private:
  std::vector<std::unique_ptr<Module>> modules_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_LAYER_STACK_H_
