#include "tests/gpu/lazy_amax/spin_kernel.h"

#include <cuda_runtime.h>

namespace teserve {
namespace testing {
namespace {

__device__ __forceinline__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNs();
  while (GlobalTimerNs() - start < nanoseconds) __nanosleep(1000);
}

}  // namespace

cudaError_t LaunchSpin(uint64_t nanoseconds, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace testing
}  // namespace teserve
