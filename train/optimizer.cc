#include "train/optimizer.h"

#include <cmath>

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

// The parameter list as kernels/optimizer.h tensors.
std::vector<kernels::OptimizerTensor> OptimizerTensors(const std::vector<layers::Parameter*>& params,
                                                       std::vector<Tensor>* exp_avg,
                                                       std::vector<Tensor>* exp_avg_sq) {
  std::vector<kernels::OptimizerTensor> tensors(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    tensors[i].param = &params[i]->value;
    tensors[i].grad = &params[i]->grad;
    if (exp_avg != nullptr) tensors[i].exp_avg = &(*exp_avg)[i];
    if (exp_avg_sq != nullptr) tensors[i].exp_avg_sq = &(*exp_avg_sq)[i];
  }
  return tensors;
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
    const std::vector<kernels::OptimizerTensor> tensors =
        OptimizerTensors(params, momentum ? &momentum_ : nullptr, nullptr);
    return kernels::SgdStep(ctx, tensors, options_, step);
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
    const std::vector<kernels::OptimizerTensor> tensors = OptimizerTensors(params, &exp_avg_, &exp_avg_sq_);
    return kernels::AdamWStep(ctx, tensors, options_, step);
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
