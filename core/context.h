// Context: where and how an op runs. Ops take it first; the op headers dispatch on
// `device`. CUDA-specific members are opaque here (core knows nothing of CUDA); the
// CUDA backend fills them (stream, library handles) behind kernels/cuda.
#ifndef TESERVE_CORE_CONTEXT_H_
#define TESERVE_CORE_CONTEXT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {
class KernelTimingSink;  // kernels/timing.h
}  // namespace kernels

// Whether the work running under a Context should stop early: the server's answer when
// the client that asked for it has gone (cancelled the call, or its deadline passed).
// Layers ask between their parts (LayerStack between modules, TransformerLayer between
// its blocks), never inside a kernel; the train::Session call that started the work then
// puts back everything the call changed (train/session.h).
struct Context;

class Interruption {
 public:
  virtual ~Interruption() = default;
  // OK to go on; else the status to stop with (CANCELLED, DEADLINE_EXCEEDED), its
  // message naming the pass ("forward", "backward", "step") and the module that would
  // have run next ("fc2", "block.layernorm_mlp"; empty: the pass is done and its
  // results not yet kept).
  virtual absl::Status Check(absl::string_view pass, absl::string_view next) const = 0;
  // Called before each Check with the pass's context: an implementation may wait here so
  // that the device is never more than a few parts behind the host (kernels::RunAheadLimit),
  // which makes a stop decided by Check take effect within those parts.
  virtual void Pace(const Context& ctx) const {}
};

struct Context {
  Device device = Device::Cpu();
  void* stream = nullptr;  // cudaStream_t on CUDA devices; nullptr = default stream
  uint64_t seed = 0;       // base seed for stochastic ops (dropout, stochastic rounding)
  // Receives sampled kernel durations (kernels/timing.h); nullptr = no timing. Not owned.
  kernels::KernelTimingSink* kernel_timing = nullptr;
  // Asked between the parts of a pass (see Interruption); nullptr = never interrupted.
  // Not owned; set per call by train::Session.
  const Interruption* interruption = nullptr;

  static Context Cpu() { return Context{}; }
};

// OK unless ctx has an Interruption that says to stop before `next` of `pass`.
inline absl::Status CheckInterruption(const Context& ctx, absl::string_view pass, absl::string_view next) {
  if (ctx.interruption == nullptr) return absl::OkStatus();
  ctx.interruption->Pace(ctx);
  return ctx.interruption->Check(pass, next);
}

}  // namespace teserve

#endif  // TESERVE_CORE_CONTEXT_H_
