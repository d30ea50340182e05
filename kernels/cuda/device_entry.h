// EnterDevice: the prologue of every CUDA host entry point (kernels/cuda/*/..._cuda.cc).
//
// Before an op touches its tensors it must (1) have the cudaMalloc allocator registered
// with core, so the Tensor::Zeros outputs it allocates on "cuda:N" work even when this op
// is the process's first CUDA call, and (2) make the tensors' device current on the calling
// thread, restoring the previous device when the op returns, so a server thread that runs
// ops on several GPUs never leaves a stale device behind. A device that cannot be made
// current (no such ordinal, no driver) becomes a Status with the code CudaErrorCode gives
// it, and the op returns it instead of launching on the wrong GPU.
//
//   ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(x.device().index));
//
// The returned guard restores the previous device when it goes out of scope.
#ifndef TESERVE_KERNELS_CUDA_DEVICE_ENTRY_H_
#define TESERVE_KERNELS_CUDA_DEVICE_ENTRY_H_

#include <utility>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {

// The Context's stream as the CUDA runtime takes it (nullptr: the legacy default stream).
inline cudaStream_t StreamOf(const Context& ctx) { return static_cast<cudaStream_t>(ctx.stream); }

inline absl::StatusOr<ScopedDevice> EnterDevice(int device_index) {
  RegisterCudaAllocator();
  ScopedDevice device(device_index);
  TESERVE_CUDA_RETURN_IF_ERROR(device.status());
  return std::move(device);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_DEVICE_ENTRY_H_
