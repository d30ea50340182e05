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

namespace teserve {
namespace train {
namespace {

absl::Status CheckFp32Cpu(const Tensor& t, absl::string_view field) {
  if (t.dtype() != DType::kFloat32) {
    return InvalidField(absl::StrCat(field, ".dtype"), "FLOAT32", DTypeName(t.dtype()));
  }
  if (!t.device().is_cpu()) return InvalidField(absl::StrCat(field, ".device"), "cpu", t.device().ToString());
  return absl::OkStatus();
}

// Side inputs: known names, CPU tensors; the layers check dtypes and shapes.
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

// One tensor a SessionState group must hold.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

absl::StatusOr<Tensor> Int64Scalar(int64_t value) {
  ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(DType::kInt64, {1}));
  t.data<int64_t>()[0] = value;
  return t;
}

absl::StatusOr<Tensor> FloatVector(const std::vector<float>& values) {
  return Tensor::FromFloats(values, {static_cast<int64_t>(values.size())});
}

// `tensors` against `specs`: each spec exactly once with its dtype and shape, nothing
// else, all on the CPU. Returns the tensors in spec order. Errors name
// "<group>.safetensors" and the tensor.
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

int64_t Int64Of(const Tensor& t) { return t.data<int64_t>()[0]; }
float FloatOf(const Tensor& t) { return t.data<float>()[0]; }

}  // namespace

struct Session::State {
  struct Pending {
    std::unique_ptr<layers::SavedActivations> saved;
    std::vector<Shape> output_shapes;
  };

  // Declared first, destroyed last: every device tensor of the session is freed in
  // its stream's order.
  std::unique_ptr<kernels::DeviceStream> stream;
  Context ctx;
  std::string device_note;  // why a session asked for on a GPU runs on the CPU
  recipes::Recipe recipe;
  std::unique_ptr<layers::LayerStack> stack;
  std::unique_ptr<Optimizer> optimizer;
  std::vector<layers::Parameter*> params;
  std::vector<layers::NamedQuantizer> quantizers;  // of the stack, fixed at Create
  float max_grad_norm = 0.0f;
  // How this session's quantized GEMMs run, planned for the device it computes on
  // (per-tensor FP8 on sm_90: native, Linear reads the codes directly).
  recipes::GemmPlan gemm_plan;
  int64_t step = 0;
  int64_t skipped_steps = 0;
  bool has_loss = false;
  float last_loss = 0.0f;
  bool has_grad_norm = false;
  float last_grad_norm = 0.0f;
  bool spec_health_stats = false;  // RecipeSpec.fp8_health_stats
  bool health_sampling = false;
  uint64_t next_handle = 1;
  absl::flat_hash_map<uint64_t, Pending> pending;
  // Whether every gradient is zero (a new session, after ZeroGrad): undoing a backward
  // then needs no copy of them.
  bool grads_zero = true;
  // Counts the calls that changed the state (Session::StateVersion).
  uint64_t version = 0;

  // What a training call changes besides its results, taken before it computes when the
  // call may be interrupted, so that an interrupted (or otherwise failed) call leaves the
  // session exactly as it was: quantizer state (scales, amax histories, counters, NVFP4
  // draws), random-stream counters and, for calls that accumulate, the gradients.
  struct Undo {
    std::vector<recipes::QuantizerState> quantizers;
    std::vector<uint64_t> rng;
    bool grads = false;               // the call accumulates gradients
    bool grads_zero = false;          // ... into all-zero ones: zeroing restores them
    std::vector<Tensor> grad_copies;  // else a copy per GradOwners() entry
    std::vector<bool> grad_is_zero;   // Parameter::grad_is_zero per GradOwners() entry
  };

  // The parameters that own gradient memory, each once: a row view (parameters_split)
  // contributes its owner.
  std::vector<layers::Parameter*> GradOwners() const {
    std::vector<layers::Parameter*> owners;
    absl::flat_hash_set<const layers::Parameter*> seen;
    for (layers::Parameter* p : params) {
      layers::Parameter* owner = p->view_of != nullptr ? p->view_of : p;
      if (seen.insert(owner).second) owners.push_back(owner);
    }
    return owners;
  }

  absl::StatusOr<Undo> Mark(bool grads) const {
    Undo undo;
    for (const layers::NamedQuantizer& q : quantizers) undo.quantizers.push_back(q.quantizer->ExportState());
    for (const layers::RngCounter& c : stack->RngCounters()) undo.rng.push_back(*c.value);
    undo.grads = grads;
    undo.grads_zero = grads_zero;
    if (grads) {
      for (const layers::Parameter* p : GradOwners()) undo.grad_is_zero.push_back(p->grad_is_zero);
    }
    if (grads && !grads_zero) {
      for (layers::Parameter* p : GradOwners()) {
        RETURN_IF_ERROR(layers::FillDeferredGrad(ctx, *p));
        ASSIGN_OR_RETURN(Tensor copy, p->grad.Clone(ctx.stream));
        undo.grad_copies.push_back(std::move(copy));
      }
    }
    return undo;
  }

  absl::Status Rewind(const Undo& undo) {
    for (size_t i = 0; i < quantizers.size() && i < undo.quantizers.size(); ++i) {
      quantizers[i].quantizer->ImportState(undo.quantizers[i]);
    }
    const std::vector<layers::RngCounter> rng = stack->RngCounters();
    for (size_t i = 0; i < rng.size() && i < undo.rng.size(); ++i) *rng[i].value = undo.rng[i];
    if (!undo.grads) return absl::OkStatus();
    const std::vector<layers::Parameter*> owners = GradOwners();
    for (size_t i = 0; i < owners.size(); ++i) {
      owners[i]->grad_is_zero = false;
      owners[i]->grad_fill_deferred = false;
      if (undo.grads_zero) {
        RETURN_IF_ERROR(kernels::FillZero(ctx, &owners[i]->grad));
      } else {
        RETURN_IF_ERROR(kernels::CopyInto(ctx, undo.grad_copies[i], &owners[i]->grad));
      }
      owners[i]->grad_is_zero = undo.grad_is_zero[i];
    }
    return absl::OkStatus();
  }

  // After a call that may have written gradients: neither the session nor any
  // parameter knows them to be zero any more (layers clear their own flags as they
  // write; this covers every parameter, whichever module wrote it).
  void GradsWritten() {
    grads_zero = false;
    for (layers::Parameter* p : GradOwners()) p->grad_is_zero = false;
  }

  // Runs `body` (a training call after its validation) as one transaction: with an
  // interruption, everything the call changes is marked first and put back when the
  // body fails, whether the interruption stopped it or anything else did. Without one
  // the body runs as it is (no interruption can come; errors past validation are
  // allocation failures).
  template <typename Result, typename Body>
  absl::StatusOr<Result> Transaction(const Interruption* interruption, bool grads, Body&& body) {
    if (interruption == nullptr) {
      absl::StatusOr<Result> result = body(ctx);
      if (!result.ok() && grads) GradsWritten();  // nothing undone: whatever was written stays
      return result;
    }
    Context call = ctx;
    call.interruption = interruption;
    // A call that waited for the session lock may have been abandoned meanwhile.
    RETURN_IF_ERROR(interruption->Check("wait for the session", ""));
    ASSIGN_OR_RETURN(const Undo undo, Mark(grads));
    absl::StatusOr<Result> result = body(call);
    if (result.ok()) return result;
    const absl::Status rewound = Rewind(undo);
    if (!rewound.ok()) {
      return absl::InternalError(absl::StrCat(result.status().message(), "; undoing the call failed too: ",
                                              rewound.message()));
    }
    return result;
  }

  // Zero-fills every gradient (each owner's whole one, which its row views share) and
  // marks them zero, so the next backward's GEMMs may write them fresh.
  absl::Status ZeroGrads() {
    grads_zero = false;
    RETURN_IF_ERROR(layers::ZeroGrads(ctx, params));
    grads_zero = true;
    return absl::OkStatus();
  }

  // Quantizers whose region ends with a Forward (true) or a Backward (false).
  void EndRegion(bool forward) {
    for (const layers::NamedQuantizer& q : quantizers) {
      if (recipes::IsForwardRole(q.quantizer->role()) == forward) q.quantizer->EndRegion();
    }
  }

  // The checks every forward runs before touching state: FP32 CPU inputs the stack
  // accepts, known side inputs the layers accept. Returns the output shapes.
  absl::StatusOr<std::vector<Shape>> ValidateForward(const std::vector<Tensor>& inputs,
                                                     const layers::SideInputs& side) const {
    std::vector<Shape> shapes;
    for (size_t i = 0; i < inputs.size(); ++i) {
      RETURN_IF_ERROR(CheckFp32Cpu(inputs[i], absl::StrCat("inputs[", i, "]")));
      shapes.push_back(inputs[i].shape());
    }
    ASSIGN_OR_RETURN(std::vector<Shape> output_shapes, stack->OutputShapes(shapes, "inputs"));
    RETURN_IF_ERROR(CheckSideInputs(side));
    RETURN_IF_ERROR(stack->ValidateSide(side, shapes));
    return output_shapes;
  }

  absl::StatusOr<layers::Parameter*> FindParameter(const std::string& name) const {
    for (layers::Parameter* p : params) {
      if (p->name == name) return p;
    }
    std::vector<std::string> known;
    for (const layers::Parameter* p : params) known.push_back(p->name);
    return absl::NotFoundError(absl::StrCat("parameters: no parameter named ", Quoted(name), " (this model has ",
                                            absl::StrJoin(known, ", "), ")"));
  }

  // The named parameters (all when `names` is empty), in request order; each at most once.
  absl::StatusOr<std::vector<layers::Parameter*>> Select(const std::vector<std::string>& names) const {
    if (names.empty()) return params;
    std::vector<layers::Parameter*> selected;
    absl::flat_hash_set<const layers::Parameter*> seen;
    for (size_t i = 0; i < names.size(); ++i) {
      ASSIGN_OR_RETURN(layers::Parameter * p, FindParameter(names[i]));
      if (!seen.insert(p).second) {
        return InvalidField(absl::StrCat("names[", i, "]"), "each parameter at most once",
                            absl::StrCat(Quoted(names[i]), " again"));
      }
      selected.push_back(p);
    }
    return selected;
  }

  TrainingStats Stats() const {
    TrainingStats stats;
    stats.step = step;
    stats.skipped_steps = skipped_steps;
    stats.has_loss = has_loss;
    stats.loss = last_loss;
    stats.has_grad_norm = has_grad_norm;
    stats.grad_norm = last_grad_norm;
    stats.health_sampling = health_sampling;
    return stats;
  }

  // Whether this recipe can run on ctx's device (every layer can): UNIMPLEMENTED with
  // the reason when the GPU cannot run the recipe's GEMMs. PlaceOnDevice then gives the
  // session its own stream and moves the parameters and gradients (initialized on the
  // host when the stack was built) to the device, where they stay.
  recipes::DeviceFacts DeviceFacts() const {
    recipes::DeviceFacts facts;
    if (ctx.device.is_cpu()) return facts;
    const kernels::DeviceInfo info = kernels::QueryDeviceInfo();
    facts.is_cuda = true;
    facts.cc_major = info.cc_major;
    facts.cc_minor = info.cc_minor;
    facts.cublaslt_version = info.cublaslt_version;
    return facts;
  }

  absl::Status DevicePath() const {
    // A recipe whose GEMMs this GPU cannot run at all (FP8 before compute capability
    // 8.9, block recipes before 9.0) keeps the session on the CPU.
    if (recipe.has_quantizers()) {
      const recipes::GemmPlan plan = recipes::PlanGemm(recipe.name(), DeviceFacts());
      if (plan.execution == recipes::GemmExecution::kUnavailable) {
        return absl::UnimplementedError(absl::StrCat("recipe: '", recipe.name(), "' has no ", ctx.device.ToString(),
                                                     " path: ", plan.reason, " (use --device=cpu for this recipe)"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status PlaceOnDevice() {
    ASSIGN_OR_RETURN(stream, kernels::DeviceStream::Create(ctx.device.index));
    ctx.stream = stream->get();
    return layers::PlaceParameters(ctx, params);
  }

  // The RPC edge of a session on a device: client tensors (host) are copied to the
  // session's device on the way in and results back on the way out. On the CPU both
  // are the tensors themselves.
  absl::StatusOr<std::vector<Tensor>> ToDevice(const std::vector<Tensor>& host) const {
    std::vector<Tensor> out;
    out.reserve(host.size());
    for (const Tensor& t : host) {
      ASSIGN_OR_RETURN(Tensor d, kernels::CopyTo(ctx, t, ctx.device));
      out.push_back(std::move(d));
    }
    return out;
  }
  absl::StatusOr<std::vector<Tensor>> ToHost(std::vector<Tensor> tensors) const {
    for (Tensor& t : tensors) {
      if (!t.defined()) continue;
      ASSIGN_OR_RETURN(t, kernels::CopyTo(ctx, t, Device::Cpu()));
    }
    return tensors;
  }

  // Checkpoint names of the quantizers ("quantizer.<layer>.<tensor>") and their state
  // tensors, in quantizer order.
  std::string QuantizerKey(const layers::NamedQuantizer& q) const {
    return absl::StrCat("quantizer.", q.layer, ".", recipes::TensorRoleName(q.quantizer->role()));
  }

  // The "state" group's tensors, with their values when `values` (else only specs).
  absl::Status StateGroup(std::vector<TensorSpec>* specs, std::vector<NamedTensor>* values) const {
    auto add_int = [&](std::string name, int64_t v) -> absl::Status {
      specs->push_back(TensorSpec{name, DType::kInt64, {1}});
      if (values != nullptr) {
        ASSIGN_OR_RETURN(Tensor t, Int64Scalar(v));
        values->push_back(NamedTensor{std::move(name), std::move(t)});
      }
      return absl::OkStatus();
    };
    auto add_floats = [&](std::string name, const std::vector<float>& v) -> absl::Status {
      specs->push_back(TensorSpec{name, DType::kFloat32, {static_cast<int64_t>(v.size())}});
      if (values != nullptr) {
        ASSIGN_OR_RETURN(Tensor t, FloatVector(v));
        values->push_back(NamedTensor{std::move(name), std::move(t)});
      }
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(add_int("session.step", step));
    RETURN_IF_ERROR(add_int("session.skipped_steps", skipped_steps));
    for (const layers::RngCounter& c : stack->RngCounters()) {
      RETURN_IF_ERROR(add_int(absl::StrCat("rng.", c.name), static_cast<int64_t>(*c.value)));
    }
    for (const layers::NamedQuantizer& q : quantizers) {
      const std::string key = QuantizerKey(q);
      const recipes::QuantizerState qs = q.quantizer->ExportState();
      RETURN_IF_ERROR(add_floats(absl::StrCat(key, ".amax"), {qs.amax}));
      RETURN_IF_ERROR(add_floats(absl::StrCat(key, ".scale"), {qs.scale}));
      RETURN_IF_ERROR(add_int(absl::StrCat(key, ".quantize_calls"), qs.quantize_calls));
      RETURN_IF_ERROR(add_int(absl::StrCat(key, ".rng_draws"), qs.rng_draws));
      if (recipe.name() == "delayed") RETURN_IF_ERROR(add_floats(absl::StrCat(key, ".amax_history"), qs.amax_history));
    }
    absl::flat_hash_set<std::string> names;
    for (const TensorSpec& s : *specs) {
      if (!names.insert(s.name).second) {
        return absl::InternalError(absl::StrCat("session state: two state tensors named ", Quoted(s.name)));
      }
    }
    return absl::OkStatus();
  }

  std::vector<TensorSpec> ParameterSpecs() const {
    std::vector<TensorSpec> specs;
    for (const layers::Parameter* p : params) specs.push_back(TensorSpec{p->name, DType::kFloat32, p->value.shape()});
    return specs;
  }

  std::vector<TensorSpec> OptimizerSpecs() const {
    std::vector<TensorSpec> specs;
    for (const Optimizer::StateBuffer& b : optimizer->StateBuffers()) {
      for (const layers::Parameter* p : params) {
        specs.push_back(TensorSpec{absl::StrCat(p->name, ".", b.name), DType::kFloat32, p->value.shape()});
      }
    }
    return specs;
  }

  // Deep copies of the named parameters (all when `names` is empty), or of their grads.
  absl::StatusOr<std::vector<NamedTensor>> CopyTensors(const std::vector<std::string>& names, bool grads) const {
    ASSIGN_OR_RETURN(const std::vector<layers::Parameter*> selected, Select(names));
    if (grads) RETURN_IF_ERROR(layers::FillDeferredGrads(ctx, selected));
    std::vector<const Tensor*> sources;
    for (const layers::Parameter* p : selected) sources.push_back(grads ? &p->grad : &p->value);
    // One batched copy to the host: a wait per staging chunk, not per tensor.
    ASSIGN_OR_RETURN(std::vector<Tensor> copies, kernels::CopyManyTo(ctx, sources, Device::Cpu()));
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < selected.size(); ++i) out.push_back(NamedTensor{selected[i]->name, std::move(copies[i])});
    return out;
  }
};

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
    // The loss runs on the CPU reference: its output must be read anyway, and MSE has
    // no CUDA kernel yet. On a device that is one copy of the output out and of its
    // gradient in.
    ASSIGN_OR_RETURN(std::vector<Tensor> host_output, s.ToHost({out.outputs[0]}));
    Context host_ctx = Context::Cpu();
    host_ctx.kernel_timing = s.ctx.kernel_timing;  // the loss kernels are timed as before
    // A 16-bit params_dtype hands over 16-bit logits; the loss reads their FP32 values.
    ASSIGN_OR_RETURN(const Tensor logits, kernels::Convert(host_ctx, host_output[0], DType::kFloat32));
    ASSIGN_OR_RETURN(LossResult loss_result, ComputeLoss(host_ctx, loss, logits, target));
    RETURN_IF_ERROR(CheckInterruption(ctx, "forward", ""));
    ASSIGN_OR_RETURN(std::vector<Tensor> grad_output, s.ToDevice({loss_result.grad_output}));
    layers::SideGrads layer_side_grads;
    ASSIGN_OR_RETURN(std::vector<Tensor> device_grad_inputs,
                     s.stack->Backward(ctx, *out.saved, grad_output, &layer_side_grads));
    ASSIGN_OR_RETURN(std::vector<Tensor> grad_inputs, s.ToHost(std::move(device_grad_inputs)));
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
