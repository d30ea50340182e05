// RegisterCudaAllocator: the stream-ordered pool allocator for DeviceType::kCuda
// (cuda_allocator.cc), registered with core on first use (core knows nothing of CUDA;
// see core/tensor.h). PoolMemory: what the pool of a device holds, for the memory gauge.
#ifndef TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_
#define TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Registers the allocator with core. Safe to call many times and from many threads; every
// CUDA entry point calls it through EnterDevice (device_entry.h).
void RegisterCudaAllocator();

// Registers the CUDA-event DeviceTimer factory of kernels/timing.h (timing_cuda.cc), so
// sampled ops on CUDA devices are timed; RegisterCudaAllocator does it too.
void RegisterCudaTimer();

// Bytes the device's memory pool holds from the driver, and of those the bytes in use.
struct DevicePoolMemory {
  uint64_t reserved = 0;
  uint64_t used = 0;
};
absl::StatusOr<DevicePoolMemory> PoolMemory(int device_index);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_
