// cudaMalloc/cudaFree allocator for DeviceType::kCuda, registered with core on first use
// (core knows nothing of CUDA; see core/tensor.h).
//
// Tensor::Zeros promises zero-filled memory, so Allocate clears the block with
// cudaMemset and waits for it on the legacy default stream: after Allocate returns the
// zeros are visible to work on any stream, including non-blocking ones. cudaMalloc
// synchronizes the device anyway, so the extra wait costs little; hot paths that
// overwrite every byte should come from a pool (later), not from here.
#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

class CudaAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes, int device_index) override {
    if (bytes == 0) return nullptr;
    ScopedDevice device(device_index);
    TESERVE_CUDA_RETURN_IF_ERROR(device.status());
    void* ptr = nullptr;
    const cudaError_t malloc_status = cudaMalloc(&ptr, static_cast<size_t>(bytes));
    if (malloc_status == cudaErrorMemoryAllocation) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cannot allocate ", bytes, " bytes on cuda:", device_index, " (out of device memory)"));
    }
    TESERVE_CUDA_RETURN_IF_ERROR(malloc_status);
    const cudaError_t memset_status = cudaMemset(ptr, 0, static_cast<size_t>(bytes));
    const cudaError_t sync_status =
        memset_status == cudaSuccess ? cudaStreamSynchronize(nullptr) : memset_status;
    if (sync_status != cudaSuccess) {
      cudaFree(ptr);
      TESERVE_CUDA_RETURN_IF_ERROR(sync_status);
    }
    return ptr;
  }

  void Deallocate(void* ptr, int device_index) override {
    if (ptr == nullptr) return;
    ScopedDevice device(device_index);
    // A failure here (a context already torn down at exit) leaves nothing to recover.
    cudaFree(ptr);
  }
};

}  // namespace

void RegisterCudaAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CudaAllocator* allocator = new CudaAllocator();
    RegisterAllocator(DeviceType::kCuda, allocator);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
