#include "kernels/cuda/host_readback_cuda.h"

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/elementwise/elementwise_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

namespace {

// Small staging (a readback of a few amax words, which is what nearly every HostReadback
// holds) comes in fixed blocks from page-locked slabs the process keeps: cudaHostAlloc and
// cudaFreeHost cost tens of microseconds each and cudaFreeHost waits for the device, which
// a deep model's thousands of quantizers would pay when its first call runs and again when
// the session goes (at server stop, right after the final checkpoints). Freed blocks go
// back to the list; slabs are never returned.
constexpr size_t kSmallBlockBytes = 256;
constexpr size_t kBlocksPerSlab = 1024;

struct SmallPinnedBlocks {
  std::mutex mu;
  std::vector<void*> free;  // guarded by mu
};

SmallPinnedBlocks& SmallBlocks() {
  static SmallPinnedBlocks* blocks = new SmallPinnedBlocks();  // outlives every user, exit included
  return *blocks;
}

}  // namespace

absl::StatusOr<void*> AllocatePinnedHost(size_t bytes) {
  void* ptr = nullptr;
  if (bytes > kSmallBlockBytes) {
    TESERVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable));
    return ptr;
  }
  SmallPinnedBlocks& blocks = SmallBlocks();
  std::lock_guard<std::mutex> lock(blocks.mu);
  if (blocks.free.empty()) {
    TESERVE_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&ptr, kSmallBlockBytes * kBlocksPerSlab, cudaHostAllocPortable));
    for (size_t i = kBlocksPerSlab; i-- > 0;) blocks.free.push_back(static_cast<uint8_t*>(ptr) + i * kSmallBlockBytes);
  }
  ptr = blocks.free.back();
  blocks.free.pop_back();
  return ptr;
}

void FreePinnedHost(void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  if (bytes <= kSmallBlockBytes) {
    SmallPinnedBlocks& blocks = SmallBlocks();
    std::lock_guard<std::mutex> lock(blocks.mu);
    blocks.free.push_back(ptr);
    return;
  }
  if (cudaFreeHost(ptr) != cudaSuccess) cudaGetLastError();
}

namespace {

// The gathered form of StartDeviceToHost's copies (before its event): the table of pieces
// to the device, one gather into device scratch, one copy to dst. Returns the first CUDA
// error; *enqueued says whether anything reached the stream.
cudaError_t GatherToHost(const Context& ctx, absl::Span<const Tensor> tensors, uint8_t* dst,
                         absl::Span<const size_t> offsets, GatherTable* table, std::vector<Tensor>* keep,
                         bool* enqueued) {
  const size_t n = tensors.size();
  const size_t total = offsets[n];
  const size_t table_bytes = n * sizeof(GatherPiece);
  if (table->capacity < table_bytes) {
    FreePinnedHost(table->pinned, table->capacity);
    table->pinned = nullptr;
    table->capacity = 0;
    absl::StatusOr<void*> pinned = AllocatePinnedHost(2 * table_bytes);
    if (!pinned.ok()) return cudaErrorMemoryAllocation;
    table->pinned = *pinned;
    table->capacity = 2 * table_bytes;
  }
  absl::StatusOr<Tensor> scratch = Tensor::Empty(DType::kBool, {static_cast<int64_t>(total)}, ctx.device, ctx.stream);
  absl::StatusOr<Tensor> device_table = Tensor::Empty(
      DType::kInt64, {static_cast<int64_t>((table_bytes + sizeof(int64_t) - 1) / sizeof(int64_t))}, ctx.device,
      ctx.stream);
  if (!scratch.ok() || !device_table.ok()) return cudaErrorMemoryAllocation;
  GatherPiece* pieces = static_cast<GatherPiece*>(table->pinned);
  for (size_t i = 0; i < n; ++i) {
    pieces[i] = GatherPiece{tensors[i].raw_data(), offsets[i], offsets[i + 1] - offsets[i]};
  }
  const cudaStream_t stream = StreamOf(ctx);
  GatherPiece* device_pieces = static_cast<GatherPiece*>(device_table->raw_data());
  char* packed = static_cast<char*>(scratch->raw_data());
  cudaError_t error = cudaMemcpyAsync(device_pieces, pieces, table_bytes, cudaMemcpyHostToDevice, stream);
  if (error != cudaSuccess) return error;
  *enqueued = true;
  error = LaunchGather(device_pieces, static_cast<int64_t>(n), packed, stream);
  if (error == cudaSuccess) error = cudaMemcpyAsync(dst, packed, total, cudaMemcpyDeviceToHost, stream);
  keep->push_back(*std::move(scratch));
  keep->push_back(*std::move(device_table));
  return error;
}

}  // namespace

absl::Status StartDeviceToHost(const Context& ctx, absl::Span<const Tensor> tensors, uint8_t* dst,
                               absl::Span<const size_t> offsets, void** event, int* event_device,
                               GatherTable* table, std::vector<Tensor>* keep) {
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
  if (tensors.size() >= kGatherFrom && offsets[tensors.size()] > 0) {
    error = GatherToHost(ctx, tensors, dst, offsets, table, keep, &enqueued);
  } else {
    for (size_t i = 0; i < tensors.size() && error == cudaSuccess; ++i) {
      const size_t bytes = offsets[i + 1] - offsets[i];
      if (bytes == 0) continue;
      error = cudaMemcpyAsync(dst + offsets[i], tensors[i].raw_data(), bytes, cudaMemcpyDeviceToHost, stream);
      enqueued = enqueued || error == cudaSuccess;
    }
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
