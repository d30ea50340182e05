#include "layers/precision_boundary.h"

#include "core/status.h"
#include "kernels/cast.h"

namespace teserve {
namespace layers {
namespace {

struct BoundarySaved : public SavedActivations {
  std::vector<DType> input_dtypes;
  std::unique_ptr<SavedActivations> inner;
};

// Each tensor of `tensors` as `dtype` (undefined tensors stay undefined).
absl::StatusOr<std::vector<Tensor>> ConvertAll(const Context& ctx, const std::vector<Tensor>& tensors, DType dtype) {
  std::vector<Tensor> out;
  out.reserve(tensors.size());
  for (const Tensor& t : tensors) {
    if (!t.defined()) {
      out.push_back(t);
      continue;
    }
    ASSIGN_OR_RETURN(Tensor converted, kernels::Convert(ctx, t, dtype));
    out.push_back(std::move(converted));
  }
  return out;
}

}  // namespace

absl::StatusOr<ForwardOutput> PrecisionBoundary::Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                         const ForwardOptions& options) {
  ASSIGN_OR_RETURN(std::vector<Tensor> inner_inputs, ConvertAll(ctx, inputs, DType::kFloat32));
  ASSIGN_OR_RETURN(ForwardOutput inner, inner_->Forward(ctx, inner_inputs, options));
  ForwardOutput out;
  ASSIGN_OR_RETURN(out.outputs, ConvertAll(ctx, inner.outputs, activation_dtype_));
  if (inner.saved != nullptr) {
    auto saved = std::make_unique<BoundarySaved>();
    for (const Tensor& t : inputs) saved->input_dtypes.push_back(t.dtype());
    saved->inner = std::move(inner.saved);
    out.saved = std::move(saved);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> PrecisionBoundary::Backward(const Context& ctx, SavedActivations& saved_base,
                                                                const std::vector<Tensor>& grad_outputs,
                                                                SideGrads* side_grads) {
  auto& saved = static_cast<BoundarySaved&>(saved_base);
  ASSIGN_OR_RETURN(std::vector<Tensor> inner_grads, ConvertAll(ctx, grad_outputs, DType::kFloat32));
  ASSIGN_OR_RETURN(std::vector<Tensor> grads, inner_->Backward(ctx, *saved.inner, inner_grads, side_grads));
  for (size_t i = 0; i < grads.size() && i < saved.input_dtypes.size(); ++i) {
    if (!grads[i].defined()) continue;
    ASSIGN_OR_RETURN(grads[i], kernels::Convert(ctx, grads[i], saved.input_dtypes[i]));
  }
  return grads;
}

}  // namespace layers
}  // namespace teserve
