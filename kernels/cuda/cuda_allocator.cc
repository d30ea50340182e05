// The allocator of DeviceType::kCuda (core/tensor.h), registered with core on first use
// (core knows nothing of CUDA).
//
// Memory comes from each device's stream-ordered pool (cudaMallocFromPoolAsync /
// cudaFreeAsync on the device's default memory pool). The pool keeps what it has
// reserved (release threshold: no limit), so the steady state of a training loop
// allocates and frees without a driver call or a device synchronization, and a free on
// a session's stream makes the block reusable for that stream at once.
//
// Tensors allocated without a stream keep the synchronous contract of Tensor::Zeros:
// the allocation and any zero fill are finished when Allocate returns, so work on any
// stream may use the memory. Tensors allocated on a stream are zero-filled (when asked)
// on that stream and never wait.
//
// Kernels write every element of the outputs they allocate unfilled (Tensor::Empty), so
// no zero fill is spent on them. TESERVE_CUDA_POISON_EMPTY=1 checks that: every unfilled
// allocation is filled with 0xFF bytes instead (NaN in every floating dtype, -1 in the
// integer ones), so an element a kernel forgot to write shows up in the GPU tests'
// comparisons with the CPU reference instead of holding whatever the pool held before.
#include "kernels/cuda/cuda_allocator.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/host_block_cache.h"
#include "core/status.h"
#include "core/tensor.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

absl::StatusOr<cudaMemPool_t> PoolOf(int device_index) {
  cudaMemPool_t pool = nullptr;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device_index));
  // Keep reserved memory across synchronizations instead of returning it to the driver.
  uint64_t threshold = UINT64_MAX;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold));
  return pool;
}

absl::Status OutOfMemory(int64_t bytes, int device_index, cudaMemPool_t pool) {
  cudaGetLastError();  // the failed allocation is not sticky; clear it for the next call
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  uint64_t reserved = 0, used = 0;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &used);
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot allocate ", bytes, " bytes on cuda:", device_index, ": ", free_bytes, " bytes free of ",
      total_bytes, " (teserve's pool holds ", reserved, " bytes, ", used, " in use)"));
}

bool PoisonEmpty() {
  static const bool poison = [] {
    const char* v = std::getenv("TESERVE_CUDA_POISON_EMPTY");
    return v != nullptr && v[0] != '\0' && v[0] != '0';
  }();
  return poison;
}

class CudaAllocator : public Allocator {
 public:
  absl::StatusOr<void*> Allocate(int64_t bytes, int device_index, void* stream_ptr, bool zero) override {
    if (bytes == 0) return nullptr;
    ScopedDevice device(device_index);
    TESERVE_CUDA_RETURN_IF_ERROR(device.status());
    ASSIGN_OR_RETURN(cudaMemPool_t pool, Pool(device_index));
    const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
    void* ptr = nullptr;
    const cudaError_t status = cudaMallocFromPoolAsync(&ptr, static_cast<size_t>(bytes), pool, stream);
    if (status == cudaErrorMemoryAllocation) return OutOfMemory(bytes, device_index, pool);
    TESERVE_CUDA_RETURN_IF_ERROR(status);
    cudaError_t fill = cudaSuccess;
    if (zero || PoisonEmpty()) fill = cudaMemsetAsync(ptr, zero ? 0 : 0xFF, static_cast<size_t>(bytes), stream);
    if (fill == cudaSuccess && stream == nullptr) fill = cudaStreamSynchronize(nullptr);
    if (fill != cudaSuccess) {
      cudaFreeAsync(ptr, stream);
      TESERVE_CUDA_RETURN_IF_ERROR(fill);
    }
    return ptr;
  }

  void Deallocate(void* ptr, int device_index, void* stream) override {
    if (ptr == nullptr) return;
    ScopedDevice device(device_index);
    // A failure here (a context already torn down at exit) leaves nothing to recover.
    cudaFreeAsync(ptr, static_cast<cudaStream_t>(stream));
  }

  absl::Status Copy(void* dst, const void* src, int64_t bytes, int device_index, void* stream) override {
    ScopedDevice device(device_index);
    TESERVE_CUDA_RETURN_IF_ERROR(device.status());
    TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice,
                                                 static_cast<cudaStream_t>(stream)));
    return absl::OkStatus();
  }

 private:
  absl::StatusOr<cudaMemPool_t> Pool(int device_index) {
    std::lock_guard<std::mutex> lock(mu_);
    if (device_index < 0 || device_index >= kMaxDevices) {
      return absl::InvalidArgumentError(absl::StrCat("device index ", device_index, " out of range"));
    }
    if (pools_[device_index] == nullptr) {
      ASSIGN_OR_RETURN(pools_[device_index], PoolOf(device_index));
    }
    return pools_[device_index];
  }

  static constexpr int kMaxDevices = 64;
  std::mutex mu_;
  cudaMemPool_t pools_[kMaxDevices] = {};
};

// Page-locked host memory for the RPC edge: core/host_block_cache.h's policy over
// cudaHostAlloc / cudaFreeHost.
void* CudaHostAllocate(int64_t bytes) {
  void* ptr = nullptr;
  if (cudaHostAlloc(&ptr, static_cast<size_t>(bytes), cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();  // not sticky; the caller falls back to ordinary memory
    return nullptr;
  }
  return ptr;
}

void CudaHostRelease(void* ptr) { cudaFreeHost(ptr); }

}  // namespace

void RegisterCudaAllocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    static CudaAllocator* allocator = new CudaAllocator();
    RegisterAllocator(DeviceType::kCuda, allocator);
    RegisterPinnedHostAllocator(new HostBlockCache(&CudaHostAllocate, &CudaHostRelease));
    RegisterCudaTimer();
  });
}

absl::StatusOr<DevicePoolMemory> PoolMemory(int device_index) {
  ScopedDevice device(device_index);
  TESERVE_CUDA_RETURN_IF_ERROR(device.status());
  cudaMemPool_t pool = nullptr;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaDeviceGetDefaultMemPool(&pool, device_index));
  DevicePoolMemory memory;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &memory.reserved));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &memory.used));
  return memory;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
