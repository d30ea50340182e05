// softmax_lse between q's layout and cuDNN's packed [B, H, S] statistics
// (attention_kernels.h: LaunchLsePermute). A thread per element; B * H * S_q floats are
// small next to the attention itself.
#include "kernels/cuda/attention/attention_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

__global__ void LsePermuteKernel(LseLayout layout, const float* __restrict__ in, float* __restrict__ out,
                                 bool to_layout) {
  const int64_t total = layout.batch * layout.heads * layout.seq;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i % layout.seq;
    const int64_t h = (i / layout.seq) % layout.heads;
    const int64_t b = i / (layout.seq * layout.heads);
    const int64_t strided = b * layout.stride_b + h * layout.stride_h + s * layout.stride_s;
    if (to_layout) {
      out[strided] = in[i];
    } else {
      out[i] = in[strided];
    }
  }
}

}  // namespace

cudaError_t LaunchLsePermute(const LseLayout& layout, const float* in, float* out, bool to_layout,
                             cudaStream_t stream) {
  const int64_t total = layout.batch * layout.heads * layout.seq;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = (total + kThreads - 1) / kThreads;
  LsePermuteKernel<<<static_cast<unsigned>(blocks < 65535 ? blocks : 65535), kThreads, 0, stream>>>(layout, in, out,
                                                                                                   to_layout);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
