#include "kernels/cuda/host_readback_cuda.h"

#include <cuda_runtime_api.h>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"

namespace teserve {
namespace kernels {
namespace cuda {

absl::StatusOr<void*> AllocatePinnedHost(size_t bytes) {
  void* ptr = nullptr;
  TESERVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
  return ptr;
}

void FreePinnedHost(void* ptr) {
  if (ptr != nullptr && cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

absl::Status StartDeviceToHost(const Context& ctx, absl::Span<const Tensor> tensors, uint8_t* dst,
                               absl::Span<const size_t> offsets, void** event, int* event_device) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  // An event can only be recorded on a stream of the device it was made on.
  if (*event != nullptr && *event_device != ctx.device.index) {
    DestroyEvent(*event, *event_device);
    *event = nullptr;
    *event_device = -1;
  }
  if (*event == nullptr) {
    cudaEvent_t made = nullptr;
    TESERVE_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&made, cudaEventDisableTiming));
    *event = made;
    *event_device = ctx.device.index;
  }
  const cudaStream_t stream = StreamOf(ctx);
  cudaError_t error = cudaSuccess;
  bool enqueued = false;
  for (size_t i = 0; i < tensors.size() && error == cudaSuccess; ++i) {
    const size_t bytes = offsets[i + 1] - offsets[i];
    if (bytes == 0) continue;
    error = cudaMemcpyAsync(dst + offsets[i], tensors[i].raw_data(), bytes, cudaMemcpyDeviceToHost, stream);
    enqueued = enqueued || error == cudaSuccess;
  }
  if (error == cudaSuccess) error = cudaEventRecord(static_cast<cudaEvent_t>(*event), stream);
  if (error != cudaSuccess) {
    // Error path only: the copies already enqueued must not land in dst later.
    if (enqueued) cudaStreamSynchronize(stream);
    cudaGetLastError();
    return CudaErrorToStatus(error, "cudaMemcpyAsync / cudaEventRecord (HostReadback::Start)", __FILE__, __LINE__);
  }
  return absl::OkStatus();
}

absl::Status WaitEvent(void* event, int event_device) {
  ScopedDevice device(event_device);
  TESERVE_CUDA_RETURN_IF_ERROR(device.status());
  TESERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
  return absl::OkStatus();
}

bool EventDone(void* event, int event_device) {
  ScopedDevice device(event_device);
  const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (status == cudaErrorNotReady) return false;
  if (status != cudaSuccess) cudaGetLastError();
  return true;
}

void DestroyEvent(void* event, int event_device) {
  if (event == nullptr) return;
  ScopedDevice device(event_device);
  if (cudaEventDestroy(static_cast<cudaEvent_t>(event)) != cudaSuccess) cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
