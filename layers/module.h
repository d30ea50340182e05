// Module: the interface every layer implements (TE's torch modules, as a server holds
// them). A module owns its parameters and quantizers but not its activations: Forward
// returns what its Backward will need as a SavedActivations object, which the session
// keeps under an activation handle. So several forwards (microbatches) may be in
// flight before their backwards, and a module never mixes them up.
//
// Tensors are FP32 on the CPU backend. Inputs are [..., features]; all leading
// dimensions are folded into rows.
#ifndef TESERVE_LAYERS_MODULE_H_
#define TESERVE_LAYERS_MODULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"
#include "recipes/quantizer.h"

namespace teserve {
namespace layers {

struct Parameter {
  std::string name;  // "<layer>.weight"
  Tensor value;      // FP32 master weights
  Tensor grad;       // FP32, same shape; Backward accumulates into it
  // Set for a row block of another parameter (TE's parameters_split): value and grad
  // are rows [view_begin, view_begin + rows) of view_of's tensors and share their
  // memory. A view owns nothing; moving the owner to a device rebinds its views
  // (PlaceParameters), so a view never points at memory its owner has let go.
  Parameter* view_of = nullptr;
  int64_t view_begin = 0;

  // The fields below are meaningful on owners only (a view's state is its owner's;
  // the functions below take either and act on the owner).
  //
  // Compute copy: the dtype the owning layer's GEMMs read `value` in (a 16-bit
  // params_dtype; FP32 = no copy) and `value` rounded to it (kernels::Convert's
  // round-to-nearest-even), on value's device. The copy may be read only while
  // compute_copy_valid. Stale by default: only writers that know keep it valid
  // (the optimizer step writes it in the same pass as the update; SetParameters,
  // RestoreState and PlaceParameters rebuild it), and every other write of `value`
  // leaves or makes it invalid (InvalidateComputeCopy). A valid copy's buffer is never
  // written again: a writer gives the parameter a new one, so a forward that saved the
  // old buffer for its backward keeps reading the weight it ran with.
  DType compute_dtype = DType::kFloat32;
  Tensor compute_copy;
  bool compute_copy_valid = false;
  // True only while `grad` is known to hold zeros (+0.0 everywhere): set where a
  // gradient is zero-filled (a layer's Create, the session's ZeroGrad and undo),
  // cleared by every write that may leave anything else. A layer may then write its
  // gradient fresh (GEMM beta 0) instead of accumulating into it.
  bool grad_is_zero = false;
  // True while `grad` is zero only logically: ZeroGrads marks it so instead of filling
  // it (a memset as large as the gradient, every step), because the usual first writer,
  // Linear's wgrad, overwrites the whole gradient anyway. Implies grad_is_zero. Whoever
  // reads the gradient or adds into it first calls FillDeferredGrad; a writer of the
  // whole gradient clears the flag. Set on owners only (row views share the owner's).
  bool grad_fill_deferred = false;
};

// The parameter owning p's memory: p itself, or the parameter p is a row view of.
inline Parameter& OwnerOf(Parameter& p) { return p.view_of != nullptr ? *p.view_of : p; }
inline const Parameter& OwnerOf(const Parameter& p) { return p.view_of != nullptr ? *p.view_of : p; }

// For writers of `value` that do not maintain the compute copy (host code writing a
// CPU parameter through mutable_floats() included): the copy of p's owner may no
// longer be read.
inline void InvalidateComputeCopy(Parameter& p) { OwnerOf(p).compute_copy_valid = false; }

// Rebuilds the compute copy of p's owner from its whole value on ctx (a new buffer)
// and marks it valid; nothing for an FP32 compute dtype. On failure the copy is
// invalid.
absl::Status RefreshComputeCopy(const Context& ctx, Parameter& p);
// The same for the owners of `params`, each once.
absl::Status RefreshComputeCopies(const Context& ctx, const std::vector<Parameter*>& params);

// The weight a layer's GEMMs read: the whole value of p's owner in its compute dtype
// (a layer passes the parameter it owns). The valid compute copy when there is one (no
// conversion), else value converted now (value itself for FP32). On the CPU, where
// host code may write a value directly, a valid copy is first checked against the
// value and a stale one is an INTERNAL error naming the parameter (a writer that
// neither refreshed nor invalidated the copy); the check reads the whole value, which
// the CPU reference can afford and a device path skips.
absl::StatusOr<Tensor> ComputeValue(const Context& ctx, const Parameter& p);

// On the CPU, where host code may write a gradient directly: INTERNAL naming the
// parameter when p's owner claims grad_is_zero and its gradient holds anything but
// zeros. OK on a device (only the known writers reach device memory) and when the
// flag is clear.
absl::Status CheckGradIsZero(const Context& ctx, const Parameter& p);

// Makes the gradients of `params` zero (their owners' whole gradients, once each) and
// marks them so: what a training step does between steps (Session's ZeroGrad). The fill
// is deferred (Parameter::grad_fill_deferred) to the first reader that needs it.
absl::Status ZeroGrads(const Context& ctx, const std::vector<Parameter*>& params);
// Fills the gradient of p's owner with zeros when its fill was deferred; nothing
// otherwise. Every reader of a gradient, and every writer that adds into one, calls it
// first.
absl::Status FillDeferredGrad(const Context& ctx, Parameter& p);
// The same for the owners of `params`.
absl::Status FillDeferredGrads(const Context& ctx, const std::vector<Parameter*>& params);

// Rows [begin, begin + rows) of a rank-1 or rank-2 tensor of 8-bit or wider elements,
// sharing its memory on whatever device it lives; valid while `t`'s storage is.
Tensor Rows(const Tensor& t, int64_t begin, int64_t rows);

// `t` on ctx's device: itself when it is there already (or undefined), else a copy
// ordered on ctx.stream. For host-made tensors a device op reads (side inputs, tables).
absl::StatusOr<Tensor> OnDevice(const Context& ctx, const Tensor& t);

// A parameter named `name` holding rows [begin, begin + rows) of `whole` (rank 1 or 2).
Parameter RowBlock(Parameter& whole, std::string name, int64_t begin, int64_t rows);

// Moves every parameter of `params` that owns its tensors, and the owner of every view
// among them, to ctx.device (ordered on ctx.stream), then points the views at the
// moved tensors. Owners with a 16-bit compute dtype get their compute copy built there
// (valid). On failure the parameters are as they were (nothing half moved).
absl::Status PlaceParameters(const Context& ctx, const std::vector<Parameter*>& params);

// How one attention core computes on a device (SessionInfo.attention).
struct AttentionPathInfo {
  std::string layer;
  std::string path;  // "cpu_reference", "cudnn_fused", "cuda_unfused", "unavailable"
  std::string reason;
};

// What one forward kept for its backward; each module defines its own.
class SavedActivations {
 public:
  virtual ~SavedActivations() = default;
};

// Per-call inputs any layer of a stack may read besides the activation stream: TE's
// forward keyword arguments (attention masks, cu_seqlens, the encoder output of a
// decoder, GroupedLinear's m_splits). Looked up by name; the session accepts only the
// names in kSideInputNames and each layer validates the ones it reads (ValidateSide).
//   attention_mask, enc_dec_attention_mask   BOOL, true = masked out
//   encoder_output                           FP32, the cross-attention memory
//   cu_seqlens_q, cu_seqlens_kv              INT32 [batch + 1] (qkv_format thd)
//   cu_seqlens_q_padded, cu_seqlens_kv_padded
//   core_attention_bias                      FP32 (pre/post_scale_bias)
//   alibi_slopes                             FP32 [heads] or [batch, heads]
//   m_splits                                 INT64 [num_gemms]
class SideInputs {
 public:
  void Set(std::string name, Tensor value) { values_[std::move(name)] = std::move(value); }
  // Null when absent.
  const Tensor* Find(absl::string_view name) const {
    auto it = values_.find(name);
    return it == values_.end() ? nullptr : &it->second;
  }
  bool empty() const { return values_.empty(); }
  const absl::flat_hash_map<std::string, Tensor>& values() const { return values_; }

 private:
  absl::flat_hash_map<std::string, Tensor> values_;
};

inline constexpr absl::string_view kSideInputNames[] = {
    "attention_mask", "enc_dec_attention_mask", "encoder_output", "cu_seqlens_q",       "cu_seqlens_kv",
    "cu_seqlens_q_padded", "cu_seqlens_kv_padded", "core_attention_bias", "alibi_slopes", "m_splits"};

// Gradients of side inputs that have one (encoder_output); Backward accumulates into
// them when the caller passes a SideGrads.
struct SideGrads {
  Tensor encoder_output;  // undefined until a layer adds to it
};

struct ForwardOptions {
  bool save_for_backward = true;
  const SideInputs* side = nullptr;  // null: no side inputs
};

struct ForwardOutput {
  std::vector<Tensor> outputs;
  std::unique_ptr<SavedActivations> saved;  // null without save_for_backward
};

struct NamedQuantizer {
  std::string layer;
  recipes::Quantizer* quantizer;
};

// A count of the random streams a module has drawn (its dropout masks come from its seed
// and this count): the state besides parameters and quantizers that later results
// depend on, which a checkpoint saves and restores so that a resumed run draws the same
// masks.
struct RngCounter {
  std::string name;  // "<layer>.dropout_calls", unique in a stack
  uint64_t* value;   // owned by the module
};

class Module {
 public:
  explicit Module(std::string name) : name_(std::move(name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& name() const { return name_; }
  virtual std::string kind() const = 0;

  // Shapes of the outputs for inputs of `input_shapes`, or INVALID_ARGUMENT naming
  // `field` ("inputs[0].shape: expected last dimension 64, got 32"). Forward accepts
  // exactly the inputs this accepts, so callers validate before any state changes.
  virtual absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& input_shapes,
                                                          absl::string_view field) const = 0;

  // Checks the side inputs this module reads against inputs of `input_shapes`
  // (INVALID_ARGUMENT naming "side_inputs.<name>"); Forward may assume it passed.
  virtual absl::Status ValidateSide(const SideInputs& side, const std::vector<Shape>& input_shapes) const {
    return absl::OkStatus();
  }

  virtual absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                                const ForwardOptions& options) = 0;

  // Consumes `saved` (one backward per forward); accumulates parameter gradients and
  // returns the gradients of the forward's inputs. grad_outputs match the forward's
  // outputs in number and shape (callers validate). Gradients of side inputs are added
  // to `side_grads` when it is not null.
  virtual absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                                       const std::vector<Tensor>& grad_outputs,
                                                       SideGrads* side_grads = nullptr) = 0;

  virtual std::vector<Parameter*> Parameters() { return {}; }
  virtual std::vector<NamedQuantizer> Quantizers() { return {}; }
  // This module's and its sub-modules' random-stream counters.
  virtual std::vector<RngCounter> RngCounters() { return {}; }

  // How each attention core in this module computes on `device` (appended in order);
  // modules holding attention layers forward the question to them.
  virtual void DescribeAttention(const Device& device, std::vector<AttentionPathInfo>* out) const {}

 private:
  std::string name_;
};

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_MODULE_H_
