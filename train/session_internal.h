// The inside of train::Session, shared by its two source files: session.cc (the
// training calls) and session_state.cc (the SessionState a checkpoint holds: capture and
// restore). Nothing outside train/session*.cc includes it.
#ifndef TESERVE_TRAIN_SESSION_INTERNAL_H_
#define TESERVE_TRAIN_SESSION_INTERNAL_H_

#include <cstdint>
#include <memory>
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
#include "train/session.h"

namespace teserve {
namespace train {
namespace session_internal {

// One tensor a SessionState group must hold.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
};

absl::StatusOr<Tensor> Int64Scalar(int64_t value);
absl::StatusOr<Tensor> FloatVector(const std::vector<float>& values);
// `tensors` against `specs`: each spec exactly once with its dtype and shape, nothing
// else, all on the CPU. Returns the tensors in spec order. Errors name
// "<group>.safetensors" and the tensor.
absl::StatusOr<std::vector<const Tensor*>> MatchGroup(absl::string_view group, const std::vector<TensorSpec>& specs,
                                                      const std::vector<NamedTensor>& tensors);
inline int64_t Int64Of(const Tensor& t) { return t.data<int64_t>()[0]; }
inline float FloatOf(const Tensor& t) { return t.data<float>()[0]; }
// A tensor of the client's: FP32 on the CPU, or INVALID_ARGUMENT naming field.
absl::Status CheckFp32Cpu(const Tensor& t, absl::string_view field);
// Side inputs: known names, CPU tensors; the layers check dtypes and shapes.
absl::Status CheckSideInputs(const layers::SideInputs& side);

}  // namespace session_internal

struct Session::State {
  using TensorSpec = session_internal::TensorSpec;
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
  recipes::RegionEnd forward_region_end;
  recipes::RegionEnd backward_region_end;
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
    if (undo.grads_zero) {
      // Zero before the call: zero again as ZeroGrads leaves them (the fill deferred to
      // their next reader), not one memset per gradient.
      grads_zero = false;
      RETURN_IF_ERROR(layers::ZeroGrads(ctx, params));
      grads_zero = true;
      return absl::OkStatus();
    }
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

  // Quantizers whose region ends with a Forward (true) or a Backward (false), ended
  // together: on a device, one read of all their amaxes (recipes::RegionEnd).
  void EndRegion(bool forward) {
    std::vector<recipes::Quantizer*> ending;
    ending.reserve(quantizers.size());
    for (const layers::NamedQuantizer& q : quantizers) {
      if (recipes::IsForwardRole(q.quantizer->role()) == forward) ending.push_back(q.quantizer);
    }
    (forward ? forward_region_end : backward_region_end).End(ending);
  }

  // The checks every forward runs before touching state: FP32 CPU inputs the stack
  // accepts, known side inputs the layers accept. Returns the output shapes.
  absl::StatusOr<std::vector<Shape>> ValidateForward(const std::vector<Tensor>& inputs,
                                                     const layers::SideInputs& side) const {
    std::vector<Shape> shapes;
    for (size_t i = 0; i < inputs.size(); ++i) {
      RETURN_IF_ERROR(session_internal::CheckFp32Cpu(inputs[i], absl::StrCat("inputs[", i, "]")));
      shapes.push_back(inputs[i].shape());
    }
    ASSIGN_OR_RETURN(std::vector<Shape> output_shapes, stack->OutputShapes(shapes, "inputs"));
    RETURN_IF_ERROR(session_internal::CheckSideInputs(side));
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

  // The RPC edge of a session on a device: client tensors (host; page-locked when the
  // server decoded them for a GPU, server/tensor_codec.h) are copied to the session's
  // device on the way in and results back on the way out. On the CPU both are the
  // tensors themselves.
  absl::StatusOr<std::vector<Tensor>> ToDevice(const std::vector<Tensor>& host) const {
    std::vector<Tensor> out;
    out.reserve(host.size());
    for (const Tensor& t : host) {
      ASSIGN_OR_RETURN(Tensor d, kernels::CopyTo(ctx, t, ctx.device));
      out.push_back(std::move(d));
    }
    return out;
  }
  // Results come back into page-locked host memory (Tensor::EmptyPinnedHost): the copy
  // runs at full bus speed with no staging, and the encoder reads the bytes from there.
  absl::StatusOr<std::vector<Tensor>> ToHost(std::vector<Tensor> tensors) const {
    for (Tensor& t : tensors) {
      if (!t.defined() || t.device().is_cpu()) continue;
      ASSIGN_OR_RETURN(Tensor host, Tensor::EmptyPinnedHost(t.dtype(), t.shape()));
      RETURN_IF_ERROR(kernels::CopyInto(ctx, t, &host));
      t = std::move(host);
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
        ASSIGN_OR_RETURN(Tensor t, session_internal::Int64Scalar(v));
        values->push_back(NamedTensor{std::move(name), std::move(t)});
      }
      return absl::OkStatus();
    };
    auto add_floats = [&](std::string name, const std::vector<float>& v) -> absl::Status {
      specs->push_back(TensorSpec{name, DType::kFloat32, {static_cast<int64_t>(v.size())}});
      if (values != nullptr) {
        ASSIGN_OR_RETURN(Tensor t, session_internal::FloatVector(v));
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

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_SESSION_INTERNAL_H_
