// Test-only kernel around kernels/cuda/amax_sync.cuh, so that tests can drive the grid-side
// amax reset directly: grids of any size, a first CTA held back before its zero, and a
// workspace seeded at any generation.
#ifndef TESERVE_TESTS_GPU_AMAX_SYNC_KERNELS_H_
#define TESERVE_TESTS_GPU_AMAX_SYNC_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace testing {

// `ctas` CTAs of `threads` threads; thread 0 of CTA b arrives on `sync` (AmaxSyncArrive, the
// first arrival sleeping zero_delay_ns before it zeroes *amax_bits), waits (AmaxSyncWait)
// and then adds b + 1 with atomicMax, so a correct launch leaves *amax_bits == ctas whatever
// the word held before.
cudaError_t LaunchAmaxSyncProbe(uint32_t* sync, uint32_t* amax_bits, int ctas, int threads, uint32_t zero_delay_ns,
                                cudaStream_t stream);

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_GPU_AMAX_SYNC_KERNELS_H_
