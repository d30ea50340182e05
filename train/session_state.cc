// train::Session's SessionState: the tensors a checkpoint holds, captured from and
// restored into a session (train/session.h).
#include <algorithm>
#include <string>
#include <vector>

#include "train/session_internal.h"

namespace teserve {
namespace train {
namespace session_internal {

absl::StatusOr<Tensor> Int64Scalar(int64_t value) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kInt64, {1}));
  t.data<int64_t>()[0] = value;
  return t;
}

absl::StatusOr<Tensor> FloatVector(const std::vector<float>& values) {
  return Tensor::FromFloats(values, {static_cast<int64_t>(values.size())});
}

absl::StatusOr<std::vector<const Tensor*>> MatchGroup(absl::string_view group, const std::vector<TensorSpec>& specs,
                                                      const std::vector<NamedTensor>& tensors) {
  const std::string file = absl::StrCat(group, ".safetensors");
  absl::flat_hash_map<std::string, const Tensor*> by_name;
  for (const NamedTensor& t : tensors) {
    if (!by_name.emplace(t.name, &t.tensor).second) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(t.name), " appears twice"));
    }
    if (!t.tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(t.name), ": expected a CPU tensor"));
    }
  }
  std::vector<const Tensor*> out;
  for (const TensorSpec& spec : specs) {
    auto it = by_name.find(spec.name);
    if (it == by_name.end()) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(spec.name), " is missing (this model has it)"));
    }
    const Tensor& t = *it->second;
    if (t.dtype() != spec.dtype) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(spec.name), ": expected dtype ",
                                                     DTypeName(spec.dtype), ", got ", DTypeName(t.dtype())));
    }
    if (t.shape() != spec.shape) {
      return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(spec.name), ": expected shape ",
                                                     ShapeToString(spec.shape), ", got ", ShapeToString(t.shape())));
    }
    out.push_back(&t);
    by_name.erase(it);
  }
  if (!by_name.empty()) {
    std::vector<std::string> extra;
    for (const auto& [name, t] : by_name) extra.push_back(name);
    std::sort(extra.begin(), extra.end());
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor ", Quoted(extra[0]),
                                                   " is not part of this model's state (", extra.size(),
                                                   " unexpected tensor(s))"));
  }
  return out;
}

}  // namespace session_internal

using session_internal::FloatOf;
using session_internal::Int64Of;
using session_internal::MatchGroup;
using session_internal::TensorSpec;

absl::StatusOr<SessionState> Session::CaptureState(uint64_t* version) const {
  absl::MutexLock lock(&mu_);
  const State& s = *state_;
  if (version != nullptr) *version = s.version;
  SessionState out;
  out.step = s.step;
  // Every device tensor of the state (parameters, gradients, optimizer buffers) goes to
  // the host in one batched copy (kernels::CopyManyTo): enqueued on the session's stream
  // through a pinned staging buffer and waited for once per chunk, not once per tensor.
  std::vector<const Tensor*> sources;
  std::vector<std::string> names;
  for (const layers::Parameter* p : s.params) {
    sources.push_back(&p->value);
    names.push_back(p->name);
  }
  RETURN_IF_ERROR(layers::FillDeferredGrads(s.ctx, s.params));
  for (const layers::Parameter* p : s.params) {
    sources.push_back(&p->grad);
    names.push_back(p->name);
  }
  for (const Optimizer::StateBuffer& b : s.optimizer->StateBuffers()) {
    if (b.tensors->empty()) continue;
    for (size_t i = 0; i < s.params.size() && i < b.tensors->size(); ++i) {
      sources.push_back(&(*b.tensors)[i]);
      names.push_back(absl::StrCat(s.params[i]->name, ".", b.name));
    }
  }
  ASSIGN_OR_RETURN(std::vector<Tensor> copies, kernels::CopyManyTo(s.ctx, sources, Device::Cpu()));
  const size_t n = s.params.size();
  for (size_t i = 0; i < copies.size(); ++i) {
    std::vector<NamedTensor>& group = i < n ? out.parameters : i < 2 * n ? out.gradients : out.optimizer;
    group.push_back(NamedTensor{std::move(names[i]), std::move(copies[i])});
  }
  std::vector<TensorSpec> specs;
  RETURN_IF_ERROR(s.StateGroup(&specs, &out.state));
  return out;
}

absl::Status Session::RestoreState(const SessionState& in) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  // Everything is checked before anything changes.
  ASSIGN_OR_RETURN(const std::vector<const Tensor*> params, MatchGroup("parameters", s.ParameterSpecs(), in.parameters));
  ASSIGN_OR_RETURN(const std::vector<const Tensor*> grads, MatchGroup("gradients", s.ParameterSpecs(), in.gradients));
  std::vector<const Tensor*> moments;
  if (!in.optimizer.empty()) {
    ASSIGN_OR_RETURN(moments, MatchGroup("optimizer", s.OptimizerSpecs(), in.optimizer));
  }
  std::vector<TensorSpec> state_specs;
  RETURN_IF_ERROR(s.StateGroup(&state_specs, nullptr));
  ASSIGN_OR_RETURN(const std::vector<const Tensor*> state, MatchGroup("state", state_specs, in.state));
  absl::flat_hash_map<std::string, const Tensor*> by_name;
  for (size_t i = 0; i < state_specs.size(); ++i) by_name[state_specs[i].name] = state[i];
  auto counter = [&](const std::string& name) -> absl::StatusOr<int64_t> {
    const int64_t v = Int64Of(*by_name.at(name));
    if (v < 0) return absl::InvalidArgumentError(absl::StrCat("state.safetensors: tensor ", Quoted(name), ": expected a count >= 0, got ", v));
    return v;
  };
  ASSIGN_OR_RETURN(const int64_t step, counter("session.step"));
  ASSIGN_OR_RETURN(const int64_t skipped, counter("session.skipped_steps"));
  if (step != in.step) {
    return absl::InvalidArgumentError(absl::StrCat("state.safetensors: session.step is ", step,
                                                   " but the checkpoint says step ", in.step));
  }
  const std::vector<layers::RngCounter> rng = s.stack->RngCounters();
  std::vector<int64_t> rng_values;
  for (const layers::RngCounter& c : rng) {
    ASSIGN_OR_RETURN(const int64_t v, counter(absl::StrCat("rng.", c.name)));
    rng_values.push_back(v);
  }
  std::vector<recipes::QuantizerState> quantizer_states;
  for (const layers::NamedQuantizer& q : s.quantizers) {
    const std::string key = s.QuantizerKey(q);
    recipes::QuantizerState qs;
    qs.amax = FloatOf(*by_name.at(absl::StrCat(key, ".amax")));
    qs.scale = FloatOf(*by_name.at(absl::StrCat(key, ".scale")));
    ASSIGN_OR_RETURN(qs.quantize_calls, counter(absl::StrCat(key, ".quantize_calls")));
    ASSIGN_OR_RETURN(qs.rng_draws, counter(absl::StrCat(key, ".rng_draws")));
    auto history = by_name.find(absl::StrCat(key, ".amax_history"));
    if (history != by_name.end()) {
      const absl::Span<const float> h = history->second->floats();
      qs.amax_history.assign(h.begin(), h.end());
    }
    const absl::Status ok = q.quantizer->CheckState(qs, key);
    if (!ok.ok()) return absl::InvalidArgumentError(absl::StrCat("state.safetensors: ", ok.message()));
    quantizer_states.push_back(std::move(qs));
  }
  // The optimizer buffers are built on the session's device before anything is replaced.
  // Host-to-device copies are batched as CaptureState's (kernels::CopyManyTo / CopyManyInto:
  // one wait per staging chunk, not per tensor).
  std::vector<Optimizer::StateBuffer> buffers = s.optimizer->StateBuffers();
  std::vector<std::vector<Tensor>> new_buffers(buffers.size());
  if (!moments.empty()) {
    std::vector<const Tensor*> sources;
    for (size_t b = 0; b < buffers.size(); ++b) {
      for (size_t i = 0; i < s.params.size(); ++i) sources.push_back(moments[b * s.params.size() + i]);
    }
    ASSIGN_OR_RETURN(std::vector<Tensor> copies, kernels::CopyManyTo(s.ctx, sources, s.ctx.device));
    for (size_t b = 0; b < buffers.size(); ++b) {
      for (size_t i = 0; i < s.params.size(); ++i) {
        new_buffers[b].push_back(std::move(copies[b * s.params.size() + i]));
      }
    }
  }

  for (layers::Parameter* p : s.params) layers::InvalidateComputeCopy(*p);
  s.GradsWritten();  // whatever the checkpoint held
  for (layers::Parameter* p : s.GradOwners()) p->grad_fill_deferred = false;  // overwritten below
  std::vector<const Tensor*> srcs;
  std::vector<Tensor*> dsts;
  for (size_t i = 0; i < s.params.size(); ++i) {
    srcs.push_back(params[i]);
    dsts.push_back(&s.params[i]->value);
    srcs.push_back(grads[i]);
    dsts.push_back(&s.params[i]->grad);
  }
  RETURN_IF_ERROR(kernels::CopyManyInto(s.ctx, srcs, dsts));
  RETURN_IF_ERROR(layers::RefreshComputeCopies(s.ctx, s.params));
  for (size_t b = 0; b < buffers.size(); ++b) *buffers[b].tensors = std::move(new_buffers[b]);
  for (size_t i = 0; i < rng.size(); ++i) *rng[i].value = static_cast<uint64_t>(rng_values[i]);
  for (size_t i = 0; i < s.quantizers.size(); ++i) s.quantizers[i].quantizer->ImportState(quantizer_states[i]);
  s.step = step;
  s.skipped_steps = skipped;
  s.pending.clear();
  ++s.version;
  return absl::OkStatus();
}

}  // namespace train
}  // namespace teserve
