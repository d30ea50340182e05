// Session: a layer stack + quantization recipe + optimizer + step counter, with the
// saved activations of forwards that await their backward (keyed by handle).
//
// Thread-safety: every method locks the session; concurrent calls on one session are
// serialized, calls on different sessions run in parallel.
// Failure atomicity: a call that returns an error leaves parameters, gradients,
// optimizer state, scaling state and live handles as they were (except that Backward
// with a bad gradient keeps its handle alive so the client can retry).
// Interruption: Forward, Backward, ForwardBackward and Step take an optional
// Interruption (core/context.h), asked once the session lock is held, between layers
// (and TransformerLayer blocks), and once more when the computation is done, before
// anything is kept. When it says stop, the call returns its status (CANCELLED,
// DEADLINE_EXCEEDED) and the session is exactly as before the call: the quantizer state,
// random-stream counters and gradients the call changed are put back (the gradients
// from a copy taken before it, or by zeroing when they were all zero), no handle is made
// and a Backward's handle stays pending. The same undo covers any other error past
// validation. Step stops only before it updates anything (after the gradient norm);
// once the update starts it runs to its end.
#ifndef TESERVE_TRAIN_SESSION_H_
#define TESERVE_TRAIN_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "core/context.h"
#include "core/tensor.h"
#include "layers/module.h"
#include "recipes/health.h"
#include "train/loss.h"
#include "train/named_tensor.h"
#include "train/session_snapshot.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace train {


// What GetParameters / GetGradients would copy, without copying it: lets the server
// size a reply before building it.
struct TensorLayout {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  int64_t nbytes = 0;
};

// Forwards a session keeps awaiting their Backward; beyond this a Forward that saves
// activations is refused (RESOURCE_EXHAUSTED) instead of growing memory without bound.
inline constexpr size_t kMaxLiveHandles = 1024;

struct ForwardResult {
  std::vector<Tensor> outputs;  // FP32
  uint64_t handle = 0;          // 0 when no activations were saved
};

struct ForwardBackwardResult {
  float loss = 0.0f;
  int64_t num_tokens = 0;                // see train/loss.h
  std::vector<Tensor> grad_inputs;       // with return_input_grad
  std::vector<NamedTensor> side_grads;   // with return_input_grad
  std::vector<Tensor> outputs;           // with return_outputs
};

struct StepResult {
  int64_t step = 0;         // steps taken so far (after this one)
  float grad_norm = 0.0f;   // global L2 norm before clipping
  bool skipped = false;     // non-finite gradients: nothing was updated
};

// One quantized GEMM operand (GetQuantizationState).
struct QuantizerReport {
  std::string layer;
  std::string tensor;        // "input", "weight", "grad_output"
  std::string recipe;        // "delayed", "current", "mxfp8", "block", "nvfp4"
  DType format = DType::kFloat8E4M3;
  std::string scaling_mode;  // "per_tensor", "mxfp8_1d", "block_1d", ...
  std::string execution;     // "emulated" (dequantized operands, FP32 GEMM) or "native"
  float amax = 0.0f;         // of the latest quantization
  float scale = 1.0f;
  float scale_inv = 1.0f;
  std::vector<float> amax_history;  // delayed scaling only, TE's slot order
  int64_t quantize_calls = 0;
  recipes::BlockScaleSummary block_scales;  // block recipes
  recipes::HealthStats health;              // with RecipeSpec.fp8_health_stats or while sampling
};

struct LayerSummary {
  std::string name;
  std::string kind;
  std::vector<std::string> parameters;
};

struct SessionSummary {
  int64_t step = 0;
  int64_t num_parameters = 0;
  // Bytes the session keeps on its device between RPCs: parameters (with the 16-bit
  // compute copies of 16-bit layers' weights), gradients and optimizer state (the saved
  // activations of pending forwards are not counted).
  int64_t state_bytes = 0;
  int64_t live_handles = 0;
  std::string device;       // where the session computes
  std::string device_note;  // why that is the CPU when a GPU was asked for, else empty
  std::string recipe_name;  // "none" or the recipe's name ("delayed", "mxfp8", ...)
  std::vector<LayerSummary> layers;
  std::vector<layers::AttentionPathInfo> attention;  // per attention core, in stack order
};

// Everything of a session that later results depend on, as CPU tensors: what a
// checkpoint holds besides the specs (train/checkpoint.h writes each group to the file
// "<group>.safetensors"). Names:
//   parameters   FP32, GetParameters' names and order
//   gradients    FP32, the same names (accumulated, not yet stepped)
//   optimizer    FP32 "<parameter>.<buffer>": exp_avg and exp_avg_sq (AdamW), momentum
//                (SGD with momentum); none before the first Step allocates them
//   state        INT64 [1] "session.step", "session.skipped_steps",
//                "rng.<layer>.dropout_calls" (dropout streams drawn, Module::RngCounters);
//                per quantizer "quantizer.<layer>.<tensor>." + "amax" FP32 [1],
//                "scale" FP32 [1], "quantize_calls" INT64 [1], "rng_draws" INT64 [1]
//                and, delayed scaling only, "amax_history" FP32 [amax_history_len]
// Not kept: the saved activations of pending forwards (RestoreState drops them), the
// latest loss / grad norm and the block-scale and health summaries of the latest
// quantization (reports that the next call recomputes).
struct SessionState {
  int64_t step = 0;
  std::vector<NamedTensor> parameters;
  std::vector<NamedTensor> gradients;
  std::vector<NamedTensor> optimizer;
  std::vector<NamedTensor> state;
};

class Session {
 public:
  // Validates the specs (INVALID_ARGUMENT naming the field, e.g.
  // "model.layers[1].linear.in_features: expected 64 (output of layer 'norm'), got 32")
  // and builds the stack with initialized parameters.
  static absl::StatusOr<std::unique_ptr<Session>> Create(const v1::ModelSpec& model,
                                                         const v1::RecipeSpec& recipe,
                                                         const v1::OptimizerSpec& optimizer,
                                                         const Context& ctx);
  ~Session();

  // inputs: FP32 CPU tensors (the server converts wire dtypes). Errors name
  // "inputs[i]" with expected vs got. `side`: named per-call inputs (layers/module.h
  // lists the names); unknown names and inputs the layers reject fail with
  // INVALID_ARGUMENT naming "side_inputs.<name>".
  absl::StatusOr<ForwardResult> Forward(const std::vector<Tensor>& inputs, bool save_for_backward,
                                        const layers::SideInputs& side = layers::SideInputs(),
                                        const Interruption* interruption = nullptr);
  // NOT_FOUND for an unknown handle or one already consumed (the message says which).
  // Gradients of side inputs that have one (encoder_output) go to `side_grads` when
  // given.
  absl::StatusOr<std::vector<Tensor>> Backward(uint64_t handle, const std::vector<Tensor>& grad_outputs,
                                               std::vector<NamedTensor>* side_grads = nullptr,
                                               const Interruption* interruption = nullptr);
  // Forward (saving activations), the loss on the single output, Backward with its
  // gradient, in one locked call; regions end as after Forward then Backward. The
  // inputs, side inputs, loss and target are all validated first (errors name
  // "inputs[i]", "side_inputs.<name>", "loss...", "target..."), so a rejected call
  // changes nothing. No handle is kept.
  absl::StatusOr<ForwardBackwardResult> ForwardBackward(const std::vector<Tensor>& inputs,
                                                        const layers::SideInputs& side, const LossOptions& loss,
                                                        const Tensor& target, bool return_input_grad,
                                                        bool return_outputs,
                                                        const Interruption* interruption = nullptr);
  // The optimizer step, then, with `zero_grad`, ZeroGrad, under one lock (no call on
  // this session runs between the two).
  absl::StatusOr<StepResult> Step(bool zero_grad = false, const Interruption* interruption = nullptr);
  absl::Status ZeroGrad();
  // Drops the saved activations of `handle` without a Backward (the server does this
  // when the client abandoned the Forward that made it). NOT_FOUND when not pending.
  absl::Status ReleaseHandle(uint64_t handle);

  // Deep copies (all parameters when `names` is empty). Unknown names: NOT_FOUND naming
  // the parameter; a name given twice: INVALID_ARGUMENT "names[i]: expected each
  // parameter at most once, got 'x' again".
  absl::StatusOr<std::vector<NamedTensor>> GetParameters(const std::vector<std::string>& names) const;
  absl::StatusOr<std::vector<NamedTensor>> GetGradients(const std::vector<std::string>& names) const;
  // The layouts GetParameters (`grads` false) / GetGradients (true) would return for
  // `names`, with the same errors; copies nothing.
  absl::StatusOr<std::vector<TensorLayout>> Layouts(const std::vector<std::string>& names, bool grads) const;
  // All-or-nothing: validates every name, dtype (FP32) and shape before writing any.
  absl::Status SetParameters(const std::vector<NamedTensor>& parameters);

  std::vector<QuantizerReport> QuantizationState() const;
  SessionSummary Summary() const;
  // (layer, tensor) of every quantizer, in QuantizationState() order; fixed for the
  // session's life.
  std::vector<std::pair<std::string, std::string>> QuantizerNames() const;
  // The training counters and, `with_quantizers`, every quantizer's values, under one
  // lock: what the server passes to its metrics after each call.
  SessionSnapshot Snapshot(bool with_quantizers) const;

  // While on, every quantization measures the FP8 health statistics (as
  // RecipeSpec.fp8_health_stats does always); off, quantizing costs nothing extra unless
  // the spec asks for them. The server switches it on for the steps it samples.
  void SetHealthSampling(bool on);

  // A consistent copy of the SessionState (taken under the session's lock, so between
  // two calls, never inside one); `version`, when given, receives the StateVersion the
  // copy has.
  absl::StatusOr<SessionState> CaptureState(uint64_t* version = nullptr) const;
  // Counts the calls that changed the session's state so far (Forward, Backward,
  // ForwardBackward, Step, ZeroGrad, SetParameters, RestoreState; an undone or rejected
  // call counts nothing): equal versions mean equal states. 0 for a new session.
  uint64_t StateVersion() const;
  // All-or-nothing: checks that `state` fits this session (every tensor of every group
  // present once with this session's name, dtype and shape, no others; the optimizer
  // group complete or empty; counters >= 0; quantizer histories of the recipe's length)
  // before changing anything, then replaces parameters, gradients, optimizer state,
  // quantizer state, random-stream counters and step, and drops pending forwards'
  // handles. Errors name the group file and the tensor ("state.safetensors: tensor
  // 'quantizer.fc1.input.amax_history': expected shape [16], got [8]").
  absl::Status RestoreState(const SessionState& state);

  const v1::ModelSpec& model_spec() const { return model_spec_; }
  const v1::RecipeSpec& recipe_spec() const { return recipe_spec_; }
  const v1::OptimizerSpec& optimizer_spec() const { return optimizer_spec_; }

 private:
  struct State;
  Session(v1::ModelSpec model, v1::RecipeSpec recipe, v1::OptimizerSpec optimizer,
          std::unique_ptr<State> state);

  const v1::ModelSpec model_spec_;
  const v1::RecipeSpec recipe_spec_;
  const v1::OptimizerSpec optimizer_spec_;
  mutable absl::Mutex mu_;
  std::unique_ptr<State> state_ ABSL_GUARDED_BY(mu_);
};

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_SESSION_H_
