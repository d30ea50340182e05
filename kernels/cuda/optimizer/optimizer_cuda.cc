// Host side of the CUDA optimizer steps: builds the slot and chunk tables of the
// parameter list, copies them to the device in one buffer and launches one kernel.
#include "kernels/cuda/optimizer/optimizer_cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/device_entry.h"
#include "kernels/cuda/optimizer/optimizer_kernels.h"
#include "kernels/cuda/scoped_device.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

using optimizer_math::ModelCopyKind;

ModelCopyKind CopyKindOf(const Tensor* copy) {
  if (copy == nullptr) return ModelCopyKind::kNone;
  switch (copy->dtype()) {
    case DType::kBFloat16: return ModelCopyKind::kBFloat16;
    case DType::kFloat16: return ModelCopyKind::kFloat16;
    case DType::kFloat8E4M3: return ModelCopyKind::kE4M3;
    case DType::kFloat8E5M2: return ModelCopyKind::kE5M2;
    default: return ModelCopyKind::kNone;
  }
}

// The device table: slots, then chunks (16-byte aligned), in one INT64 tensor.
struct DeviceTable {
  Tensor buffer;
  const MultiTensorSlot* slots = nullptr;
  const MultiTensorChunk* chunks = nullptr;
  int64_t num_chunks = 0;
};

absl::StatusOr<DeviceTable> BuildTable(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                                       bool with_m, bool with_v) {
  std::vector<MultiTensorSlot> slots;
  std::vector<MultiTensorChunk> chunks;
  for (const OptimizerTensor& t : tensors) {
    if (t.param->numel() == 0) continue;
    MultiTensorSlot s;
    s.p = t.param->data<float>();
    s.g = t.grad->data<float>();
    s.m = with_m ? t.exp_avg->data<float>() : nullptr;
    s.v = with_v ? t.exp_avg_sq->data<float>() : nullptr;
    s.copy_kind = static_cast<int32_t>(CopyKindOf(t.model_copy));
    s.copy = s.copy_kind != 0 ? t.model_copy->raw_data() : nullptr;
    s.copy_scale = t.model_copy_scale;
    s.numel = t.param->numel();
    AppendChunks(&s, static_cast<int32_t>(slots.size()), &chunks);
    slots.push_back(s);
  }
  DeviceTable table;
  table.num_chunks = static_cast<int64_t>(chunks.size());
  if (chunks.empty()) return table;
  const size_t slot_bytes = (slots.size() * sizeof(MultiTensorSlot) + 15) / 16 * 16;
  const size_t bytes = slot_bytes + chunks.size() * sizeof(MultiTensorChunk);
  std::vector<uint8_t> host(bytes, 0);
  std::memcpy(host.data(), slots.data(), slots.size() * sizeof(MultiTensorSlot));
  std::memcpy(host.data() + slot_bytes, chunks.data(), chunks.size() * sizeof(MultiTensorChunk));
  ASSIGN_OR_RETURN(table.buffer, Tensor::Zeros(DType::kInt64, {static_cast<int64_t>((bytes + 7) / 8)},
                                               ctx.device));
  // From pageable memory: the call returns once `host` has been read.
  TESERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(table.buffer.raw_data(), host.data(), bytes, cudaMemcpyHostToDevice,
                                               static_cast<cudaStream_t>(ctx.stream)));
  uint8_t* base = static_cast<uint8_t*>(table.buffer.raw_data());
  table.slots = reinterpret_cast<const MultiTensorSlot*>(base);
  table.chunks = reinterpret_cast<const MultiTensorChunk*>(base + slot_bytes);
  return table;
}

template <typename Launcher>
absl::Status Run(const Context& ctx, absl::Span<const OptimizerTensor> tensors, bool with_m, bool with_v,
                 const Launcher& launch) {
  ASSIGN_OR_RETURN(const ScopedDevice device, EnterDevice(ctx.device.index));
  ASSIGN_OR_RETURN(DeviceTable table, BuildTable(ctx, tensors, with_m, with_v));
  if (table.num_chunks == 0) return absl::OkStatus();
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  TESERVE_CUDA_RETURN_IF_ERROR(launch(table, stream));
  TESERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));  // before the table is freed
  return absl::OkStatus();
}

}  // namespace

absl::Status AdamWStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                       const optimizer_math::AdamWScalars& scalars) {
  return Run(ctx, tensors, /*with_m=*/true, /*with_v=*/true, [&](const DeviceTable& t, cudaStream_t stream) {
    return LaunchAdamW(t.slots, t.chunks, t.num_chunks, scalars, stream);
  });
}

absl::Status SgdStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                     const optimizer_math::SgdScalars& scalars) {
  return Run(ctx, tensors, /*with_m=*/scalars.momentum != 0.0f, /*with_v=*/false,
             [&](const DeviceTable& t, cudaStream_t stream) {
               return LaunchSgd(t.slots, t.chunks, t.num_chunks, scalars, stream);
             });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
