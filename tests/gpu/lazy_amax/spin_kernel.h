// Test-only kernel that keeps a stream busy for a while, so that tests can tell a host call
// that waits for the stream from one that returns at once.
#ifndef TESERVE_TESTS_GPU_LAZY_AMAX_SPIN_KERNEL_H_
#define TESERVE_TESTS_GPU_LAZY_AMAX_SPIN_KERNEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace testing {

// One thread that runs until the GPU's global timer has advanced by `nanoseconds`.
cudaError_t LaunchSpin(uint64_t nanoseconds, cudaStream_t stream);

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_GPU_LAZY_AMAX_SPIN_KERNEL_H_
