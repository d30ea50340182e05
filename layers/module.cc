#include "layers/module.h"

#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
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

absl::Status PlaceParameters(const Context& ctx, const std::vector<Parameter*>& params) {
  // Owners in first-seen order; the moved copies are made before anything is
  // assigned, so a failed copy leaves every parameter as it was.
  std::vector<Parameter*> owners;
  absl::flat_hash_map<Parameter*, size_t> index;
  for (Parameter* p : params) {
    Parameter* owner = p->view_of != nullptr ? p->view_of : p;
    if (index.emplace(owner, owners.size()).second) owners.push_back(owner);
  }
  std::vector<std::pair<Tensor, Tensor>> moved;
  moved.reserve(owners.size());
  for (Parameter* owner : owners) {
    ASSIGN_OR_RETURN(Tensor value, kernels::CopyTo(ctx, owner->value, ctx.device));
    ASSIGN_OR_RETURN(Tensor grad, kernels::CopyTo(ctx, owner->grad, ctx.device));
    moved.emplace_back(std::move(value), std::move(grad));
  }
  for (size_t i = 0; i < owners.size(); ++i) {
    owners[i]->value = std::move(moved[i].first);
    owners[i]->grad = std::move(moved[i].second);
  }
  for (Parameter* p : params) {
    if (p->view_of == nullptr) continue;
    *p = RowBlock(*p->view_of, p->name, p->view_begin, p->value.dim(0));
  }
  return absl::OkStatus();
}

}  // namespace layers
}  // namespace teserve
