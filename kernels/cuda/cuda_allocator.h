// RegisterCudaAllocator: the cudaMalloc/cudaFree allocator for DeviceType::kCuda,
// registered with core on first use (core knows nothing of CUDA; see core/tensor.h).
#ifndef TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_
#define TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_

namespace teserve {
namespace kernels {
namespace cuda {

// Registers the allocator with core. Safe to call many times and from many threads; every
// CUDA entry point calls it through EnterDevice (device_entry.h).
void RegisterCudaAllocator();

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CUDA_ALLOCATOR_H_
