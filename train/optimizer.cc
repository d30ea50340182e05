#include "train/optimizer.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/status.h"
#include "kernels/optimizer.h"

namespace teserve {
namespace train {
namespace {

absl::Status CheckRange(float value, float lo, float hi, bool hi_open, absl::string_view field) {
  const bool ok = std::isfinite(value) && value >= lo && (hi_open ? value < hi : value <= hi);
  if (!ok) return InvalidField(field, absl::StrCat("a value in [", lo, ", ", hi, hi_open ? ")" : "]"), value);
  return absl::OkStatus();
}

absl::Status CheckPositive(float value, absl::string_view field) {
  if (!std::isfinite(value) || value <= 0.0f) return InvalidField(field, "a finite value > 0", value);
  return absl::OkStatus();
}

// Per-parameter state buffers (zero-initialized on ctx's device, allocated on first use).
absl::Status EnsureState(const Context& ctx, const std::vector<layers::Parameter*>& params,
                         std::vector<Tensor>* state) {
  if (state->size() == params.size()) return absl::OkStatus();
  state->clear();
  for (const layers::Parameter* p : params) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::ZerosOn(DType::kFloat32, p->value.shape(), ctx.device, ctx.stream));
    state->push_back(std::move(t));
  }
  return absl::OkStatus();
}

int64_t TensorBytes(const std::vector<Tensor>& tensors) {
  int64_t bytes = 0;
  for (const Tensor& t : tensors) bytes += t.nbytes();
  return bytes;
}

// The parameter list as kernels/optimizer.h tensors, with the compute copies the
// update rewrites in the same pass.
//
// Each owner with a 16-bit compute dtype gets a new copy buffer (stream-ordered pool
// memory; a forward that saved the old one for its backward keeps reading the weight
// it ran with) that the kernel writes as the model copy of the owner, or of each of its
// row views: rows [view_begin, +rows) of the new buffer. The kernel encodes each
// updated master with kernels::Convert's round-to-nearest-even, so the copy is valid
// once the step has run on every row; an owner whose rows the list does not all cover
// (only some of its views listed) keeps no copy and is marked stale.
struct UpdateList {
  std::vector<kernels::OptimizerTensor> tensors;
  std::vector<Tensor> row_copies;          // the views' rows of the new copies
  std::vector<layers::Parameter*> copied;  // owners whose new copy the step writes whole
};

absl::StatusOr<UpdateList> OptimizerTensors(const Context& ctx, const std::vector<layers::Parameter*>& params,
                                            std::vector<Tensor>* exp_avg, std::vector<Tensor>* exp_avg_sq) {
  // Rows of each 16-bit owner the list updates, owners in first-seen order.
  std::vector<layers::Parameter*> owners;
  absl::flat_hash_map<layers::Parameter*, int64_t> covered;
  for (layers::Parameter* p : params) {
    layers::Parameter& owner = layers::OwnerOf(*p);
    if (owner.compute_dtype == DType::kFloat32 || owner.value.rank() < 1) continue;
    auto [it, inserted] = covered.emplace(&owner, 0);
    if (inserted) owners.push_back(&owner);
    it->second += p->value.dim(0);
  }
  UpdateList list;
  absl::flat_hash_map<layers::Parameter*, bool> writes_copy;
  for (layers::Parameter* owner : owners) {
    owner->compute_copy_valid = false;
    owner->compute_copy = Tensor();
    if (covered[owner] != owner->value.dim(0)) continue;
    ASSIGN_OR_RETURN(owner->compute_copy,
                     Tensor::Empty(owner->compute_dtype, owner->value.shape(), ctx.device, ctx.stream));
    writes_copy[owner] = true;
    list.copied.push_back(owner);
  }
  list.tensors.resize(params.size());
  list.row_copies.reserve(params.size());  // no reallocation: model_copy points into it
  for (size_t i = 0; i < params.size(); ++i) {
    layers::Parameter* p = params[i];
    kernels::OptimizerTensor& t = list.tensors[i];
    t.param = &p->value;
    t.grad = &p->grad;
    if (exp_avg != nullptr) t.exp_avg = &(*exp_avg)[i];
    if (exp_avg_sq != nullptr) t.exp_avg_sq = &(*exp_avg_sq)[i];
    layers::Parameter& owner = layers::OwnerOf(*p);
    if (!writes_copy.contains(&owner)) continue;
    if (&owner == p) {
      t.model_copy = &owner.compute_copy;
    } else {
      list.row_copies.push_back(layers::Rows(owner.compute_copy, p->view_begin, p->value.dim(0)));
      t.model_copy = &list.row_copies.back();
    }
  }
  return list;
}

// After the kernel: the copies it wrote are valid; on failure nothing is.
absl::Status FinishUpdate(const UpdateList& list, absl::Status status) {
  for (layers::Parameter* owner : list.copied) owner->compute_copy_valid = status.ok();
  return status;
}

class Sgd : public Optimizer {
 public:
  explicit Sgd(const v1::SGD& spec) : spec_(spec) {
    options_.lr = spec.lr();
    options_.momentum = spec.momentum();
    options_.dampening = spec.dampening();
    options_.weight_decay = spec.weight_decay();
    options_.nesterov = spec.nesterov();
  }

  absl::Status Apply(const Context& ctx, const std::vector<layers::Parameter*>& params, int64_t step) override {
    const bool momentum = spec_.momentum() != 0.0f;
    if (momentum) RETURN_IF_ERROR(EnsureState(ctx, params, &momentum_));
    ASSIGN_OR_RETURN(const UpdateList list, OptimizerTensors(ctx, params, momentum ? &momentum_ : nullptr, nullptr));
    return FinishUpdate(list, kernels::SgdStep(ctx, list.tensors, options_, step));
  }

  int64_t StateBytes() const override { return TensorBytes(momentum_); }
  std::vector<StateBuffer> StateBuffers() override {
    if (spec_.momentum() == 0.0f) return {};
    return {{"momentum", &momentum_}};
  }

 private:
  v1::SGD spec_;
  kernels::SgdOptions options_;
  std::vector<Tensor> momentum_;
};

class AdamW : public Optimizer {
 public:
  explicit AdamW(const kernels::AdamWOptions& options) : options_(options) {}

  absl::Status Apply(const Context& ctx, const std::vector<layers::Parameter*>& params, int64_t step) override {
    RETURN_IF_ERROR(EnsureState(ctx, params, &exp_avg_));
    RETURN_IF_ERROR(EnsureState(ctx, params, &exp_avg_sq_));
    ASSIGN_OR_RETURN(const UpdateList list, OptimizerTensors(ctx, params, &exp_avg_, &exp_avg_sq_));
    return FinishUpdate(list, kernels::AdamWStep(ctx, list.tensors, options_, step));
  }

  int64_t StateBytes() const override { return TensorBytes(exp_avg_) + TensorBytes(exp_avg_sq_); }
  std::vector<StateBuffer> StateBuffers() override { return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}}; }

 private:
  kernels::AdamWOptions options_;
  std::vector<Tensor> exp_avg_;
  std::vector<Tensor> exp_avg_sq_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> OptimizerFromProto(const v1::OptimizerSpec& spec) {
  if (!std::isfinite(spec.max_grad_norm()) || spec.max_grad_norm() < 0.0f) {
    return InvalidField("optimizer.max_grad_norm", "a finite value >= 0 (0 = no clipping)", spec.max_grad_norm());
  }
  switch (spec.optimizer_case()) {
    case v1::OptimizerSpec::kSgd: {
      const v1::SGD& s = spec.sgd();
      RETURN_IF_ERROR(CheckPositive(s.lr(), "optimizer.sgd.lr"));
      RETURN_IF_ERROR(CheckRange(s.momentum(), 0.0f, 1.0f, false, "optimizer.sgd.momentum"));
      RETURN_IF_ERROR(CheckRange(s.dampening(), 0.0f, 1.0f, false, "optimizer.sgd.dampening"));
      RETURN_IF_ERROR(CheckRange(s.weight_decay(), 0.0f, 1.0f, false, "optimizer.sgd.weight_decay"));
      if (s.nesterov() && (s.momentum() == 0.0f || s.dampening() != 0.0f)) {
        return InvalidField("optimizer.sgd.nesterov", "momentum > 0 and dampening 0 with nesterov",
                            absl::StrCat("momentum ", s.momentum(), ", dampening ", s.dampening()));
      }
      return std::unique_ptr<Optimizer>(new Sgd(s));
    }
    case v1::OptimizerSpec::kAdamw: {
      const v1::AdamW& s = spec.adamw();
      const float beta1 = s.has_beta1() ? s.beta1() : 0.9f;
      const float beta2 = s.has_beta2() ? s.beta2() : 0.999f;
      const float eps = s.has_eps() ? s.eps() : 1e-8f;
      const float weight_decay = s.has_weight_decay() ? s.weight_decay() : 0.01f;
      RETURN_IF_ERROR(CheckPositive(s.lr(), "optimizer.adamw.lr"));
      RETURN_IF_ERROR(CheckRange(beta1, 0.0f, 1.0f, true, "optimizer.adamw.beta1"));
      RETURN_IF_ERROR(CheckRange(beta2, 0.0f, 1.0f, true, "optimizer.adamw.beta2"));
      RETURN_IF_ERROR(CheckPositive(eps, "optimizer.adamw.eps"));
      RETURN_IF_ERROR(CheckRange(weight_decay, 0.0f, 1.0f, false, "optimizer.adamw.weight_decay"));
      kernels::AdamWOptions options;
      options.lr = s.lr();
      options.beta1 = beta1;
      options.beta2 = beta2;
      options.eps = eps;
      options.weight_decay = weight_decay;
      return std::unique_ptr<Optimizer>(new AdamW(options));
    }
    case v1::OptimizerSpec::OPTIMIZER_NOT_SET:
      break;
  }
  return InvalidField("optimizer", "one of sgd, adamw", "none set");
}

}  // namespace train
}  // namespace teserve
