// LayerNorm and RMSNorm over the last dimension (TE's LayerNorm / RMSNorm): weight
// (gamma) and, for LayerNorm, bias (beta); zero_centered_gamma stores gamma - 1 so the
// parameter is initialized to zero and the effective weight is 1 + gamma.
#ifndef TESERVE_LAYERS_NORMALIZATION_H_
#define TESERVE_LAYERS_NORMALIZATION_H_

#include <memory>
#include <string>
#include <vector>

#include "layers/module.h"

namespace teserve {
namespace layers {

enum class NormKind { kLayerNorm, kRmsNorm };

struct NormOptions {
  NormKind kind = NormKind::kLayerNorm;
  int64_t hidden_size = 0;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
};

class Normalization : public Module {
 public:
  static absl::StatusOr<std::unique_ptr<Normalization>> Create(std::string name, const NormOptions& options);

  std::string kind() const override;
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                  absl::string_view field) const override;
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override;
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads = nullptr) override;
  std::vector<Parameter*> Parameters() override;

 private:
  Normalization(std::string name, const NormOptions& options) : Module(std::move(name)), options_(options) {}
  bool has_beta() const { return options_.kind == NormKind::kLayerNorm; }

  NormOptions options_;
  Parameter gamma_;
  Parameter beta_;  // LayerNorm only
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_NORMALIZATION_H_
