#include "tests/gpu/normalization/amax_sync_kernels.h"

#include <cuda_runtime.h>

namespace teserve {
namespace testing {
namespace {

#include "kernels/cuda/amax_sync.cuh"

__global__ void AmaxSyncProbeKernel(uint32_t* sync, uint32_t* amax_bits, uint32_t zero_delay_ns) {
  if (threadIdx.x != 0) return;
  const uint32_t target = AmaxSyncArrive(sync, amax_bits, gridDim.x, zero_delay_ns);
  AmaxSyncWait(sync, target);
  atomicMax(amax_bits, blockIdx.x + 1u);
}

}  // namespace

cudaError_t LaunchAmaxSyncProbe(uint32_t* sync, uint32_t* amax_bits, int ctas, int threads, uint32_t zero_delay_ns,
                                cudaStream_t stream) {
  if (ctas < 1 || threads < 1 || threads > 1024) return cudaErrorInvalidValue;
  AmaxSyncProbeKernel<<<ctas, threads, 0, stream>>>(sync, amax_bits, zero_delay_ns);
  return cudaGetLastError();
}

}  // namespace testing
}  // namespace teserve
