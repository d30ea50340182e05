// Context: where and how an op runs. Ops take it first; the op headers dispatch on
// `device`. CUDA-specific members are opaque here (core knows nothing of CUDA); the
// CUDA backend fills them (stream, library handles) behind kernels/cuda.
#ifndef TESERVE_CORE_CONTEXT_H_
#define TESERVE_CORE_CONTEXT_H_

#include <cstdint>

#include "core/tensor.h"

namespace teserve {
namespace kernels {
class KernelTimingSink;  // kernels/timing.h
}  // namespace kernels

struct Context {
  Device device = Device::Cpu();
  void* stream = nullptr;  // cudaStream_t on CUDA devices; nullptr = default stream
  uint64_t seed = 0;       // base seed for stochastic ops (dropout, stochastic rounding)
  // Receives sampled kernel durations (kernels/timing.h); nullptr = no timing. Not owned.
  kernels::KernelTimingSink* kernel_timing = nullptr;

  static Context Cpu() { return Context{}; }
};

}  // namespace teserve

#endif  // TESERVE_CORE_CONTEXT_H_
