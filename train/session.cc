#include "train/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "kernels/cast.h"
#include "kernels/device_info.h"
#include "kernels/elementwise.h"
#include "layers/layer_stack.h"
#include "layers/spec.h"
#include "recipes/gemm_execution.h"
#include "recipes/recipe.h"
#include "train/optimizer.h"
#include "train/session_internal.h"

namespace teserve {
namespace train {
namespace session_internal {

absl::Status CheckFp32Cpu(const Tensor& t, absl::string_view field) {
  if (t.dtype() != DType::kFloat32) {
    return InvalidField(absl::StrCat(field, ".dtype"), "FLOAT32", DTypeName(t.dtype()));
  }
  if (!t.device().is_cpu()) return InvalidField(absl::StrCat(field, ".device"), "cpu", t.device().ToString());
  return absl::OkStatus();
}

absl::Status CheckSideInputs(const layers::SideInputs& side) {
  for (const auto& [name, tensor] : side.values()) {
    const std::string field = absl::StrCat("side_inputs.", name);
    bool known = false;
    for (absl::string_view n : layers::kSideInputNames) known = known || n == name;
    if (!known) {
      return InvalidField(field, absl::StrCat("a side input name, one of ", absl::StrJoin(layers::kSideInputNames, ", ")),
                          Quoted(name));
    }
    if (!tensor.device().is_cpu()) return InvalidField(absl::StrCat(field, ".device"), "cpu", tensor.device().ToString());
  }
  return absl::OkStatus();
}

}  // namespace session_internal

using session_internal::CheckFp32Cpu;
using session_internal::CheckSideInputs;


Session::Session(v1::ModelSpec model, v1::RecipeSpec recipe, v1::OptimizerSpec optimizer,
                 std::unique_ptr<State> state)
    : model_spec_(std::move(model)),
      recipe_spec_(std::move(recipe)),
      optimizer_spec_(std::move(optimizer)),
      state_(std::move(state)) {}

Session::~Session() = default;

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const v1::ModelSpec& model,
                                                         const v1::RecipeSpec& recipe,
                                                         const v1::OptimizerSpec& optimizer,
                                                         const Context& ctx) {
  auto state = std::make_unique<State>();
  state->ctx = ctx;
  ASSIGN_OR_RETURN(state->recipe, recipes::RecipeFromProto(recipe));
  ASSIGN_OR_RETURN(state->optimizer, OptimizerFromProto(optimizer));
  ASSIGN_OR_RETURN(state->stack, layers::BuildStack(model, state->recipe));
  state->params = state->stack->Parameters();
  state->quantizers = state->stack->Quantizers();
  state->spec_health_stats = recipe.fp8_health_stats();
  for (const layers::NamedQuantizer& q : state->quantizers) {
    q.quantizer->set_health_stats(state->spec_health_stats);
  }
  state->max_grad_norm = optimizer.max_grad_norm();
  if (!ctx.device.is_cpu()) {
    // A model or recipe without a device path runs on the CPU reference instead, and
    // the session says so (SessionInfo.device and device_note).
    const absl::Status path = state->DevicePath();
    if (path.ok()) {
      RETURN_IF_ERROR(state->PlaceOnDevice());
    } else if (absl::IsUnimplemented(path)) {
      state->device_note = std::string(path.message());
      state->ctx.device = Device::Cpu();
      state->ctx.stream = nullptr;
    } else {
      return path;
    }
  }
  // On a device PlaceParameters has built the 16-bit compute copies; on the CPU they
  // are built here (no code outside the session writes its parameters).
  if (state->ctx.device.is_cpu()) RETURN_IF_ERROR(layers::RefreshComputeCopies(state->ctx, state->params));
  state->gemm_plan = recipes::PlanGemm(state->recipe.name(), state->DeviceFacts());
  return std::unique_ptr<Session>(new Session(model, recipe, optimizer, std::move(state)));
}

absl::StatusOr<ForwardResult> Session::Forward(const std::vector<Tensor>& inputs, bool save_for_backward,
                                               const layers::SideInputs& side, const Interruption* interruption) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  ASSIGN_OR_RETURN(std::vector<Shape> output_shapes, s.ValidateForward(inputs, side));
  if (save_for_backward && s.pending.size() >= kMaxLiveHandles) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "forward: ", s.pending.size(), " forwards already await their Backward (limit ", kMaxLiveHandles,
        "); run Backward on them or Forward with no_grad"));
  }

  layers::ForwardOptions options;
  options.save_for_backward = save_for_backward;
  options.side = &side;
  std::unique_ptr<layers::SavedActivations> saved;
  auto forward = [&](const Context& ctx) -> absl::StatusOr<ForwardResult> {
    ASSIGN_OR_RETURN(std::vector<Tensor> device_inputs, s.ToDevice(inputs));
    ASSIGN_OR_RETURN(layers::ForwardOutput out, s.stack->Forward(ctx, device_inputs, options));
    s.EndRegion(/*forward=*/true);
    ForwardResult r;
    ASSIGN_OR_RETURN(r.outputs, s.ToHost(std::move(out.outputs)));
    RETURN_IF_ERROR(CheckInterruption(ctx, "forward", ""));
    saved = std::move(out.saved);
    return r;
  };
  ASSIGN_OR_RETURN(ForwardResult result, s.Transaction<ForwardResult>(interruption, /*grads=*/false, forward));
  // Kept: the handle is the last thing a Forward changes.
  ++s.version;
  if (save_for_backward) {
    result.handle = s.next_handle++;
    s.pending[result.handle] = State::Pending{std::move(saved), std::move(output_shapes)};
  }
  return result;
}

absl::Status Session::ReleaseHandle(uint64_t handle) {
  absl::MutexLock lock(&mu_);
  if (state_->pending.erase(handle) == 0) {
    return absl::NotFoundError(absl::StrCat("handle: no pending activation handle ", handle));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<Tensor>> Session::Backward(uint64_t handle, const std::vector<Tensor>& grad_outputs,
                                                      std::vector<NamedTensor>* side_grads,
                                                      const Interruption* interruption) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  auto it = s.pending.find(handle);
  if (it == s.pending.end()) {
    if (handle != 0 && handle < s.next_handle) {
      return absl::NotFoundError(absl::StrCat("handle: activation handle ", handle,
                                              " was already used by a Backward, or released because the client "
                                              "abandoned its Forward (each Forward allows one Backward)"));
    }
    return absl::NotFoundError(absl::StrCat("handle: no activation handle ", handle,
                                            " in this session (expected a handle returned by Forward)"));
  }
  const std::vector<Shape>& expected = it->second.output_shapes;
  if (grad_outputs.size() != expected.size()) {
    return InvalidField("grad_outputs", absl::StrCat(expected.size(), " tensor(s), one per forward output"),
                        grad_outputs.size());
  }
  for (size_t i = 0; i < grad_outputs.size(); ++i) {
    const std::string field = absl::StrCat("grad_outputs[", i, "]");
    RETURN_IF_ERROR(CheckFp32Cpu(grad_outputs[i], field));
    if (grad_outputs[i].shape() != expected[i]) {
      return InvalidField(absl::StrCat(field, ".shape"),
                          absl::StrCat(ShapeToString(expected[i]), " (the shape of forward output ", i, ")"),
                          ShapeToString(grad_outputs[i].shape()));
    }
  }
  std::vector<NamedTensor> new_side_grads;
  auto backward = [&](const Context& ctx) -> absl::StatusOr<std::vector<Tensor>> {
    layers::SideGrads layer_side_grads;
    ASSIGN_OR_RETURN(std::vector<Tensor> device_grads, s.ToDevice(grad_outputs));
    ASSIGN_OR_RETURN(std::vector<Tensor> device_grad_inputs,
                     s.stack->Backward(ctx, *it->second.saved, device_grads, &layer_side_grads));
    ASSIGN_OR_RETURN(std::vector<Tensor> host_grads, s.ToHost(std::move(device_grad_inputs)));
    if (side_grads != nullptr && layer_side_grads.encoder_output.defined()) {
      ASSIGN_OR_RETURN(std::vector<Tensor> encoder_grad, s.ToHost({std::move(layer_side_grads.encoder_output)}));
      new_side_grads.push_back(NamedTensor{"encoder_output", std::move(encoder_grad[0])});
    }
    s.EndRegion(/*forward=*/false);
    RETURN_IF_ERROR(CheckInterruption(ctx, "backward", ""));
    return host_grads;
  };
  ASSIGN_OR_RETURN(std::vector<Tensor> grad_inputs,
                   s.Transaction<std::vector<Tensor>>(interruption, /*grads=*/true, backward));
  // Kept: the handle is consumed only by a Backward that completed (an undone one leaves
  // it pending, so the client may run it again).
  s.pending.erase(it);
  s.GradsWritten();
  ++s.version;
  if (side_grads != nullptr) {
    for (NamedTensor& g : new_side_grads) side_grads->push_back(std::move(g));
  }
  return grad_inputs;
}

absl::StatusOr<ForwardBackwardResult> Session::ForwardBackward(const std::vector<Tensor>& inputs,
                                                               const layers::SideInputs& side,
                                                               const LossOptions& loss, const Tensor& target,
                                                               bool return_input_grad, bool return_outputs,
                                                               const Interruption* interruption) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  ASSIGN_OR_RETURN(std::vector<Shape> output_shapes, s.ValidateForward(inputs, side));
  if (output_shapes.size() != 1) {
    return InvalidField("loss", "a model with one output (the last layer must not return its bias)",
                        absl::StrCat(output_shapes.size(), " outputs"));
  }
  RETURN_IF_ERROR(ValidateLossTarget(loss, output_shapes[0], target));

  layers::ForwardOptions options;
  options.side = &side;
  auto forward_backward = [&](const Context& ctx) -> absl::StatusOr<ForwardBackwardResult> {
    ASSIGN_OR_RETURN(std::vector<Tensor> device_inputs, s.ToDevice(inputs));
    ASSIGN_OR_RETURN(layers::ForwardOutput out, s.stack->Forward(ctx, device_inputs, options));
    s.EndRegion(/*forward=*/true);
    // The output leaves the device only when the client asks for it.
    std::vector<Tensor> host_output;
    if (return_outputs) {
      ASSIGN_OR_RETURN(host_output, s.ToHost({out.outputs[0]}));
    }
    // The loss runs on the session's device (MSE and cross entropy have device kernels;
    // only the loss value is read back, and cross entropy reads its labels on the host):
    // the target of an MSE goes in once, the gradient stays there.
    // A 16-bit params_dtype hands over 16-bit logits; the loss reads their FP32 values.
    ASSIGN_OR_RETURN(const Tensor logits, kernels::Convert(ctx, out.outputs[0], DType::kFloat32));
    Tensor loss_target = target;
    if (loss.kind == LossOptions::Kind::kMse) {
      ASSIGN_OR_RETURN(std::vector<Tensor> device_target, s.ToDevice({target}));
      loss_target = std::move(device_target[0]);
    }
    ASSIGN_OR_RETURN(LossResult loss_result, ComputeLoss(ctx, loss, logits, loss_target));
    RETURN_IF_ERROR(CheckInterruption(ctx, "forward", ""));
    std::vector<Tensor> grad_output{std::move(loss_result.grad_output)};
    layers::SideGrads layer_side_grads;
    ASSIGN_OR_RETURN(std::vector<Tensor> device_grad_inputs,
                     s.stack->Backward(ctx, *out.saved, grad_output, &layer_side_grads));
    // The input gradients leave the device only when the client asks for them.
    std::vector<Tensor> grad_inputs;
    if (return_input_grad) {
      ASSIGN_OR_RETURN(grad_inputs, s.ToHost(std::move(device_grad_inputs)));
    }
    s.EndRegion(/*forward=*/false);
    RETURN_IF_ERROR(CheckInterruption(ctx, "backward", ""));

    ForwardBackwardResult r;
    r.loss = loss_result.loss;
    r.num_tokens = loss_result.num_tokens;
    if (return_input_grad) {
      r.grad_inputs = std::move(grad_inputs);
      if (layer_side_grads.encoder_output.defined()) {
        // Like Backward's: a device session's side gradient leaves through a host copy.
        ASSIGN_OR_RETURN(std::vector<Tensor> encoder_grad, s.ToHost({std::move(layer_side_grads.encoder_output)}));
        r.side_grads.push_back(NamedTensor{"encoder_output", std::move(encoder_grad[0])});
      }
    }
    // The model has exactly one output (checked above), the one the loss read.
    if (return_outputs) r.outputs = std::move(host_output);
    return r;
  };
  ASSIGN_OR_RETURN(ForwardBackwardResult result,
                   s.Transaction<ForwardBackwardResult>(interruption, /*grads=*/true, forward_backward));
  s.has_loss = true;
  s.last_loss = result.loss;
  s.GradsWritten();
  ++s.version;
  return result;
}

absl::StatusOr<StepResult> Session::Step(bool zero_grad, const Interruption* interruption) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  if (interruption != nullptr) RETURN_IF_ERROR(interruption->Check("wait for the session", ""));
  RETURN_IF_ERROR(layers::FillDeferredGrads(s.ctx, s.params));  // gradients no call wrote
  std::vector<Tensor> grads;
  for (const layers::Parameter* p : s.params) grads.push_back(p->grad);
  ASSIGN_OR_RETURN(const double sum_squares, kernels::SumOfSquares(s.ctx, grads));
  // The last point where the step may stop; from here on it runs to its end (an update
  // is never half applied).
  if (interruption != nullptr) RETURN_IF_ERROR(interruption->Check("gradient norm", ""));
  StepResult result;
  result.grad_norm = static_cast<float>(std::sqrt(sum_squares));
  s.has_grad_norm = true;
  s.last_grad_norm = result.grad_norm;
  if (!std::isfinite(sum_squares)) {
    result.step = s.step;
    result.skipped = true;
    ++s.skipped_steps;
  } else {
    if (s.max_grad_norm > 0.0f && result.grad_norm > s.max_grad_norm) {
      const float factor = s.max_grad_norm / (result.grad_norm + 1e-6f);
      for (layers::Parameter* p : s.params) RETURN_IF_ERROR(kernels::Scale(s.ctx, factor, &p->grad));
    }
    RETURN_IF_ERROR(s.optimizer->Apply(s.ctx, s.params, s.step + 1));
    result.step = ++s.step;
  }
  ++s.version;
  if (zero_grad) RETURN_IF_ERROR(s.ZeroGrads());
  return result;
}

absl::Status Session::ZeroGrad() {
  absl::MutexLock lock(&mu_);
  ++state_->version;
  return state_->ZeroGrads();
}


absl::StatusOr<std::vector<NamedTensor>> Session::GetParameters(const std::vector<std::string>& names) const {
  absl::MutexLock lock(&mu_);
  return state_->CopyTensors(names, /*grads=*/false);
}

absl::StatusOr<std::vector<NamedTensor>> Session::GetGradients(const std::vector<std::string>& names) const {
  absl::MutexLock lock(&mu_);
  return state_->CopyTensors(names, /*grads=*/true);
}

absl::StatusOr<std::vector<TensorLayout>> Session::Layouts(const std::vector<std::string>& names,
                                                           bool grads) const {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(const std::vector<layers::Parameter*> selected, state_->Select(names));
  std::vector<TensorLayout> out;
  out.reserve(selected.size());
  for (const layers::Parameter* p : selected) {
    const Tensor& source = grads ? p->grad : p->value;
    out.push_back(TensorLayout{p->name, source.dtype(), source.shape(), source.nbytes()});
  }
  return out;
}

absl::Status Session::SetParameters(const std::vector<NamedTensor>& parameters) {
  absl::MutexLock lock(&mu_);
  std::vector<layers::Parameter*> targets;
  absl::flat_hash_set<std::string> seen;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const NamedTensor& named = parameters[i];
    const std::string field = absl::StrCat("parameters[", i, "]");
    ASSIGN_OR_RETURN(layers::Parameter * p, state_->FindParameter(named.name));
    if (!seen.insert(named.name).second) {
      return InvalidField(absl::StrCat(field, ".name"), "each parameter at most once",
                          absl::StrCat(Quoted(named.name), " again"));
    }
    RETURN_IF_ERROR(CheckFp32Cpu(named.tensor, absl::StrCat(field, ".tensor")));
    if (named.tensor.shape() != p->value.shape()) {
      return InvalidField(absl::StrCat(field, ".tensor.shape"),
                          absl::StrCat(ShapeToString(p->value.shape()), " (shape of '", p->name, "')"),
                          ShapeToString(named.tensor.shape()));
    }
    targets.push_back(p);
  }
  ++state_->version;  // even a copy that fails halfway has changed something
  // The compute copies of the parameters written are stale until rebuilt from the new
  // values (a row view's copy is its owner's, rebuilt whole).
  for (layers::Parameter* p : targets) layers::InvalidateComputeCopy(*p);
  for (size_t i = 0; i < targets.size(); ++i) {
    RETURN_IF_ERROR(kernels::CopyInto(state_->ctx, parameters[i].tensor, &targets[i]->value));
  }
  return layers::RefreshComputeCopies(state_->ctx, targets);
}

std::vector<QuantizerReport> Session::QuantizationState() const {
  absl::MutexLock lock(&mu_);
  std::vector<QuantizerReport> reports;
  for (const layers::NamedQuantizer& q : state_->quantizers) {
    const recipes::QuantizerSnapshot snap = q.quantizer->Snapshot();
    QuantizerReport r;
    r.layer = q.layer;
    r.tensor = std::string(recipes::TensorRoleName(q.quantizer->role()));
    r.recipe = snap.recipe;
    r.format = snap.format;
    r.scaling_mode = std::string(ScalingModeName(snap.mode));
    r.execution = std::string(recipes::GemmExecutionName(state_->gemm_plan.execution));
    r.amax = snap.amax;
    r.scale = snap.scale;
    r.scale_inv = snap.scale_inv;
    r.amax_history = snap.amax_history;
    r.quantize_calls = snap.quantize_calls;
    r.block_scales = snap.block_scales;
    r.health = snap.health;
    reports.push_back(std::move(r));
  }
  return reports;
}

std::vector<std::pair<std::string, std::string>> Session::QuantizerNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, std::string>> names;
  for (const layers::NamedQuantizer& q : state_->quantizers) {
    names.emplace_back(q.layer, std::string(recipes::TensorRoleName(q.quantizer->role())));
  }
  return names;
}

SessionSnapshot Session::Snapshot(bool with_quantizers) const {
  absl::MutexLock lock(&mu_);
  SessionSnapshot sample;
  sample.stats = state_->Stats();
  if (!with_quantizers) return sample;
  sample.quantizers.reserve(state_->quantizers.size());
  for (const layers::NamedQuantizer& q : state_->quantizers) {
    const recipes::QuantizerSnapshot snap = q.quantizer->Snapshot();
    QuantizerSample out;
    out.amax = snap.amax;
    out.window_max = snap.amax_history.empty()
                         ? snap.amax
                         : *std::max_element(snap.amax_history.begin(), snap.amax_history.end());
    out.scale = snap.scale;
    out.scale_inv = snap.scale_inv;
    out.quantize_calls = snap.quantize_calls;
    out.health = snap.health;
    sample.quantizers.push_back(out);
  }
  return sample;
}

void Session::SetHealthSampling(bool on) {
  absl::MutexLock lock(&mu_);
  State& s = *state_;
  if (s.health_sampling == on) return;
  s.health_sampling = on;
  for (const layers::NamedQuantizer& q : s.quantizers) {
    q.quantizer->set_health_stats(s.spec_health_stats || on);
  }
}

uint64_t Session::StateVersion() const {
  absl::MutexLock lock(&mu_);
  return state_->version;
}

SessionSummary Session::Summary() const {
  absl::MutexLock lock(&mu_);
  SessionSummary summary;
  summary.step = state_->step;
  for (const layers::Parameter* p : state_->params) {
    summary.num_parameters += p->value.numel();
    summary.state_bytes += p->value.nbytes() + p->grad.nbytes();
  }
  for (const layers::Parameter* owner : state_->GradOwners()) {
    if (owner->compute_copy.defined()) summary.state_bytes += owner->compute_copy.nbytes();
  }
  summary.state_bytes += state_->optimizer->StateBytes();
  summary.live_handles = static_cast<int64_t>(state_->pending.size());
  summary.device = state_->ctx.device.ToString();
  summary.device_note = state_->device_note;
  summary.recipe_name = !state_->recipe.has_quantizers() ? "none"
                        : state_->recipe.calibrating ? state_->recipe.name() + " (calibrating)"
                                                     : state_->recipe.name();
  for (const auto& module : state_->stack->modules()) {
    LayerSummary layer;
    layer.name = module->name();
    layer.kind = module->kind();
    for (const layers::Parameter* p : module->Parameters()) layer.parameters.push_back(p->name);
    summary.layers.push_back(std::move(layer));
  }
  state_->stack->DescribeAttention(state_->ctx.device, &summary.attention);
  return summary;
}

}  // namespace train
}  // namespace teserve
