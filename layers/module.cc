#include "layers/module.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"

namespace teserve {
namespace layers {
Tensor Rows(const Tensor& t, int64_t begin, int64_t rows) {
  const int64_t cols = t.rank() == 2 ? t.dim(1) : 1;
  Shape shape = t.rank() == 2 ? Shape{rows, cols} : Shape{rows};
  const char* base = static_cast<const char*>(t.raw_data()) + begin * cols * (DTypeBits(t.dtype()) / 8);
  return Tensor::Borrow(const_cast<char*>(base), t.dtype(), std::move(shape), t.device());
}

absl::StatusOr<Tensor> OnDevice(const Context& ctx, const Tensor& t) {
  if (!t.defined() || t.device() == ctx.device) return t;
  return kernels::CopyTo(ctx, t, ctx.device);
}

Parameter RowBlock(Parameter& whole, std::string name, int64_t begin, int64_t rows) {
  Parameter view;
  view.name = std::move(name);
  view.value = Rows(whole.value, begin, rows);
  view.grad = Rows(whole.grad, begin, rows);
  view.view_of = &whole;
  view.view_begin = begin;
  return view;
}

namespace {

// Owners of `params` in first-seen order, each once.
std::vector<Parameter*> Owners(const std::vector<Parameter*>& params) {
  std::vector<Parameter*> owners;
  absl::flat_hash_map<Parameter*, size_t> index;
  for (Parameter* p : params) {
    Parameter* owner = &OwnerOf(*p);
    if (index.emplace(owner, owners.size()).second) owners.push_back(owner);
  }
  return owners;
}

bool HasComputeCopy(const Parameter& owner) {
  return owner.compute_dtype != DType::kFloat32 && owner.value.defined();
}

}  // namespace

absl::Status RefreshComputeCopy(const Context& ctx, Parameter& p) {
  Parameter& owner = OwnerOf(p);
  owner.compute_copy_valid = false;
  if (!HasComputeCopy(owner)) return absl::OkStatus();
  // Convert returns a new tensor: the old buffer stays with whoever still holds it.
  ASSIGN_OR_RETURN(owner.compute_copy, kernels::Convert(ctx, owner.value, owner.compute_dtype));
  owner.compute_copy_valid = true;
  return absl::OkStatus();
}

absl::Status RefreshComputeCopies(const Context& ctx, const std::vector<Parameter*>& params) {
  for (Parameter* owner : Owners(params)) RETURN_IF_ERROR(RefreshComputeCopy(ctx, *owner));
  return absl::OkStatus();
}

absl::StatusOr<Tensor> ComputeValue(const Context& ctx, const Parameter& p) {
  const Parameter& owner = OwnerOf(p);
  const bool usable = HasComputeCopy(owner) && owner.compute_copy_valid && owner.compute_copy.defined() &&
                      owner.compute_copy.dtype() == owner.compute_dtype &&
                      owner.compute_copy.device() == ctx.device && owner.compute_copy.shape() == owner.value.shape();
  Tensor whole;
  if (usable && !ctx.device.is_cpu()) {
    whole = owner.compute_copy;
  } else {
    ASSIGN_OR_RETURN(whole, kernels::Convert(ctx, owner.value, owner.compute_dtype));
    if (usable) {
      if (!BitwiseEqual(whole, owner.compute_copy)) {
        return absl::InternalError(absl::StrCat(
            "parameter ", Quoted(owner.name), ": its ", DTypeName(owner.compute_dtype),
            " compute copy is stale (its value was written without refreshing or invalidating the copy; "
            "see layers::InvalidateComputeCopy)"));
      }
      whole = owner.compute_copy;
    }
  }
  return whole;
}

absl::Status CheckGradIsZero(const Context& ctx, const Parameter& p) {
  const Parameter& owner = OwnerOf(p);
  if (!owner.grad_is_zero || owner.grad_fill_deferred || !ctx.device.is_cpu() || !owner.grad.device().is_cpu()) {
    return absl::OkStatus();
  }
  for (float g : owner.grad.floats()) {
    if (g != 0.0f) {
      return absl::InternalError(absl::StrCat("parameter ", Quoted(owner.name),
                                              ": marked grad_is_zero but its gradient holds ", g,
                                              " (a writer of the gradient left the flag set)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ZeroGrads(const Context& ctx, const std::vector<Parameter*>& params) {
  (void)ctx;  // nothing is launched: the fill waits for a reader (FillDeferredGrad)
  for (Parameter* owner : Owners(params)) {
    owner->grad_is_zero = true;
    owner->grad_fill_deferred = true;
  }
  return absl::OkStatus();
}

absl::Status FillDeferredGrad(const Context& ctx, Parameter& p) {
  Parameter& owner = OwnerOf(p);
  if (!owner.grad_fill_deferred) return absl::OkStatus();
  RETURN_IF_ERROR(kernels::FillZero(ctx, &owner.grad));
  owner.grad_fill_deferred = false;
  return absl::OkStatus();
}

absl::Status FillDeferredGrads(const Context& ctx, const std::vector<Parameter*>& params) {
  for (Parameter* owner : Owners(params)) RETURN_IF_ERROR(FillDeferredGrad(ctx, *owner));
  return absl::OkStatus();
}

absl::Status PlaceParameters(const Context& ctx, const std::vector<Parameter*>& params) {
  // The moved copies are made before anything is assigned, so a failed copy leaves
  // every parameter as it was.
  const std::vector<Parameter*> owners = Owners(params);
  struct Moved {
    Tensor value, grad, compute_copy;
  };
  std::vector<Moved> moved;
  moved.reserve(owners.size());
  for (Parameter* owner : owners) {
    Moved m;
    ASSIGN_OR_RETURN(m.value, kernels::CopyTo(ctx, owner->value, ctx.device));
    ASSIGN_OR_RETURN(m.grad, kernels::CopyTo(ctx, owner->grad, ctx.device));
    if (HasComputeCopy(*owner)) {
      ASSIGN_OR_RETURN(m.compute_copy, kernels::Convert(ctx, m.value, owner->compute_dtype));
    }
    moved.push_back(std::move(m));
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    owners[i]->value = std::move(moved[i].value);
    owners[i]->grad = std::move(moved[i].grad);  // the same contents: grad_is_zero holds
    owners[i]->compute_copy = std::move(moved[i].compute_copy);
    owners[i]->compute_copy_valid = owners[i]->compute_copy.defined();
  }
  for (Parameter* p : params) {
    if (p->view_of == nullptr) continue;
    *p = RowBlock(*p->view_of, p->name, p->view_begin, p->value.dim(0));
  }
  return absl::OkStatus();
}

}  // namespace layers
}  // namespace teserve
