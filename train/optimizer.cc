#include "train/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

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

// Per-parameter state buffers (zero-initialized, allocated on first use).
absl::Status EnsureState(const std::vector<layers::Parameter*>& params, std::vector<Tensor>* state) {
  if (state->size() == params.size()) return absl::OkStatus();
  state->clear();
  for (const layers::Parameter* p : params) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kFloat32, p->value.shape()));
    state->push_back(std::move(t));
  }
  return absl::OkStatus();
}

class Sgd : public Optimizer {
 public:
  explicit Sgd(const v1::SGD& spec) : spec_(spec) {}

  absl::Status Apply(const std::vector<layers::Parameter*>& params, int64_t step) override {
    if (spec_.momentum() != 0.0f) RETURN_IF_ERROR(EnsureState(params, &momentum_));
    for (size_t i = 0; i < params.size(); ++i) {
      absl::Span<float> p = params[i]->value.mutable_floats();
      absl::Span<const float> grad = params[i]->grad.floats();
      for (size_t j = 0; j < p.size(); ++j) {
        float g = grad[j] + spec_.weight_decay() * p[j];
        if (spec_.momentum() != 0.0f) {
          float& buf = momentum_[i].mutable_floats()[j];
          buf = step == 1 ? g : spec_.momentum() * buf + (1.0f - spec_.dampening()) * g;
          g = spec_.nesterov() ? g + spec_.momentum() * buf : buf;
        }
        p[j] -= spec_.lr() * g;
      }
    }
    return absl::OkStatus();
  }

 private:
  v1::SGD spec_;
  std::vector<Tensor> momentum_;
};

class AdamW : public Optimizer {
 public:
  AdamW(float lr, float beta1, float beta2, float eps, float weight_decay)
      : lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps), weight_decay_(weight_decay) {}

  absl::Status Apply(const std::vector<layers::Parameter*>& params, int64_t step) override {
    RETURN_IF_ERROR(EnsureState(params, &exp_avg_));
    RETURN_IF_ERROR(EnsureState(params, &exp_avg_sq_));
    const float bias_correction1 = 1.0f - std::pow(beta1_, static_cast<float>(step));
    const float bias_correction2 = 1.0f - std::pow(beta2_, static_cast<float>(step));
    const float step_size = lr_ / bias_correction1;
    const float bias_correction2_sqrt = std::sqrt(bias_correction2);
    for (size_t i = 0; i < params.size(); ++i) {
      absl::Span<float> p = params[i]->value.mutable_floats();
      absl::Span<const float> grad = params[i]->grad.floats();
      absl::Span<float> m = exp_avg_[i].mutable_floats();
      absl::Span<float> v = exp_avg_sq_[i].mutable_floats();
      for (size_t j = 0; j < p.size(); ++j) {
        const float g = grad[j];
        p[j] *= 1.0f - lr_ * weight_decay_;
        m[j] = beta1_ * m[j] + (1.0f - beta1_) * g;
        v[j] = beta2_ * v[j] + (1.0f - beta2_) * g * g;
        const float denom = std::sqrt(v[j]) / bias_correction2_sqrt + eps_;
        p[j] -= step_size * m[j] / denom;
      }
    }
    return absl::OkStatus();
  }

 private:
  float lr_, beta1_, beta2_, eps_, weight_decay_;
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
      return std::unique_ptr<Optimizer>(new AdamW(s.lr(), beta1, beta2, eps, weight_decay));
    }
    case v1::OptimizerSpec::OPTIMIZER_NOT_SET:
      break;
  }
  return InvalidField("optimizer", "one of sgd, adamw", "none set");
}

}  // namespace train
}  // namespace teserve
