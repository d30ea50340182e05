// LayerNorm and RMSNorm over the last dimension (TE's LayerNorm / RMSNorm): weight
// (gamma) and, for LayerNorm, bias (beta); zero_centered_gamma stores gamma - 1 so the
// parameter is initialized to zero and the effective weight is 1 + gamma.
#ifndef TESERVE_LAYERS_NORMALIZATION_H_
#define TESERVE_LAYERS_NORMALIZATION_H_

#include <memory>
#include <string>
#include <vector>

#include "kernels/normalization.h"
#include "layers/module.h"
#include "recipes/quantizer.h"

namespace teserve {
namespace layers {

enum class NormKind { kLayerNorm, kRmsNorm };

struct NormOptions {
  NormKind kind = NormKind::kLayerNorm;
  int64_t hidden_size = 0;
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  // TE's params_dtype: y comes out in it (FP32, BF16 or FP16); x may come in any of the
  // three and dx goes back in x's dtype. gamma / beta and their gradients stay FP32 (the
  // masters); the statistics are FP32 whatever the dtypes.
  DType params_dtype = DType::kFloat32;
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

  // Forward whose output also comes as quantized copies made by the norm kernel as it
  // writes y (a consumer's Quantizer::PlanFusedCast plan): the FP32 normalized values
  // quantized exactly as the plan's quantizer quantizes an FP32 tensor, rowwise
  // [N, hidden] and, with `columnwise`, [hidden, N], into *q. outputs[0] is y in
  // params_dtype when `write_y`, else outputs is empty. The backward is Forward's.
  absl::StatusOr<ForwardOutput> ForwardFused(const Context& ctx, const std::vector<Tensor>& inputs,
                                             const ForwardOptions& options, const recipes::FusedCast& cast,
                                             bool columnwise, bool write_y, QuantizedTensor* q);

 private:
  Normalization(std::string name, const NormOptions& options) : Module(std::move(name)), options_(options) {}
  bool has_beta() const { return options_.kind == NormKind::kLayerNorm; }
  kernels::NormType Type() const {
    return has_beta() ? kernels::NormType::kLayerNorm : kernels::NormType::kRmsNorm;
  }
  // The kernel options of Forward's general entry point: y in params_dtype.
  kernels::NormForwardOptions KernelOptions() const;
  // What the backward reads.
  std::unique_ptr<SavedActivations> Save(const Shape& input_shape, const Tensor& x, Tensor mu, Tensor rsigma) const;

  NormOptions options_;
  Parameter gamma_;
  Parameter beta_;  // LayerNorm only
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_NORMALIZATION_H_
