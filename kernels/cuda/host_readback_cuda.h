// CUDA side of kernels/host_readback.h: page-locked staging memory, the copies and the
// event. HostReadback (kernels/host_readback.cc) owns what these functions make.
#ifndef TESERVE_KERNELS_CUDA_HOST_READBACK_CUDA_H_
#define TESERVE_KERNELS_CUDA_HOST_READBACK_CUDA_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Page-locked host memory that copies on any device treat as such (cudaHostAllocPortable).
absl::StatusOr<void*> AllocatePinnedHost(size_t bytes);
// `bytes` as allocated: small blocks go back to a process-wide list instead of the driver.
void FreePinnedHost(void* ptr, size_t bytes);

// What a readback of many tensors keeps from call to call for its gather: the page-locked
// table of pieces, reused and grown when a call needs more. Free with FreePinnedHost.
struct GatherTable {
  void* pinned = nullptr;
  size_t capacity = 0;  // bytes
};

// Enqueues on ctx.stream the device-to-host copies of tensors[i] (on ctx.device) into
// dst + offsets[i], then records *event there; *event (cudaEvent_t, without timing) is
// made on ctx.device when null or of another device (*event_device). A few tensors are
// copied one cudaMemcpyAsync each; from kGatherFrom on, they are packed on the device
// first (the pieces' table uploaded from `table`, one gather launch) and come over in one
// copy, so reading a session's thousands of amax words costs four stream operations, not
// one per word. The device memory the gather uses is appended to *keep, which the caller
// holds until the event has completed; `table` must not be reused before then either. On
// an error after some copies were enqueued the stream is drained before returning, so that
// nothing writes into dst afterwards.
inline constexpr size_t kGatherFrom = 4;
absl::Status StartDeviceToHost(const Context& ctx, absl::Span<const Tensor> tensors, uint8_t* dst,
                               absl::Span<const size_t> offsets, void** event, int* event_device,
                               GatherTable* table, std::vector<Tensor>* keep);
// Blocks until the event has completed (cudaEventSynchronize: that event only).
absl::Status WaitEvent(void* event, int event_device);
// Whether the event has completed (an error counts as completed: Wait reports it).
bool EventDone(void* event, int event_device);
void DestroyEvent(void* event, int event_device);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_HOST_READBACK_CUDA_H_
