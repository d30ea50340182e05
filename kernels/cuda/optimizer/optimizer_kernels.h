// Launchers for the multi-tensor optimizer kernels (optimizer_kernels.cu). Light header:
// CUDA runtime types and kernels/optimizer_math.h only, so benchmarks call it too.
//
// A launch walks a device table of chunks, each a range of one tensor's elements; blocks
// stride over the chunks, so one launch updates a whole parameter list. Launchers do not
// synchronize and return cudaGetLastError after the launch.
#ifndef TESERVE_KERNELS_CUDA_OPTIMIZER_KERNELS_H_
#define TESERVE_KERNELS_CUDA_OPTIMIZER_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "kernels/optimizer_math.h"

namespace teserve {
namespace kernels {
namespace cuda {

// One tensor's device buffers (FP32 unless noted). m: AdamW exp_avg or SGD momentum
// buffer (null for SGD without momentum); v: AdamW exp_avg_sq.
struct MultiTensorSlot {
  float* p = nullptr;
  const float* g = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  void* copy = nullptr;  // BF16, FP16 or FP8 codes of p's shape, or null
  float copy_scale = 1.0f;
  int32_t copy_kind = 0;  // optimizer_math::ModelCopyKind
  int32_t vectorized = 0; // every pointer aligned for 4-element accesses
  int64_t numel = 0;
};

struct MultiTensorChunk {
  int32_t slot = 0;
  int32_t pad = 0;
  int64_t begin = 0;  // a multiple of 4
  int64_t end = 0;
};

// Elements per chunk (a multiple of 4).
inline constexpr int64_t kOptimizerChunk = 65536;

// Sets `vectorized` from the pointers and appends the slot's chunks.
void AppendChunks(MultiTensorSlot* slot, int32_t slot_index, std::vector<MultiTensorChunk>* chunks);

// Device tables built by the caller: slots[], chunks[num_chunks].
cudaError_t LaunchAdamW(const MultiTensorSlot* slots, const MultiTensorChunk* chunks, int64_t num_chunks,
                        const optimizer_math::AdamWScalars& scalars, cudaStream_t stream);

cudaError_t LaunchSgd(const MultiTensorSlot* slots, const MultiTensorChunk* chunks, int64_t num_chunks,
                      const optimizer_math::SgdScalars& scalars, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_OPTIMIZER_KERNELS_H_
