// The small kernels around cuDNN's fused attention (attention_kernels.h): softmax_lse
// between q's layout and cuDNN's packed [B, H, S] statistics, sequence lengths from
// cu_seqlens, and the zeroing of padding rows. A thread per element; all of them touch
// little next to the attention itself.
#include "kernels/cuda/attention/attention_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

__global__ void LsePermuteKernel(LseLayout layout, const float* __restrict__ in, float* __restrict__ out,
                                 bool to_layout, const int32_t* __restrict__ seq_len) {
  const int64_t total = layout.batch * layout.heads * layout.seq;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t s = i % layout.seq;
    const int64_t h = (i / layout.seq) % layout.heads;
    const int64_t b = i / (layout.seq * layout.heads);
    const bool padded = seq_len != nullptr && s >= seq_len[b];
    const int64_t strided = layout.row_start != nullptr
                                ? (layout.row_start[b] + s) * layout.stride_s + h * layout.stride_h
                                : b * layout.stride_b + h * layout.stride_h + s * layout.stride_s;
    if (to_layout) {
      if (padded && layout.row_start != nullptr) continue;  // not a token of sequence b
      out[strided] = padded ? __int_as_float(0xff800000) : in[i];
    } else {
      out[i] = padded ? 0.0f : in[strided];
    }
  }
}

__global__ void SeqLensKernel(const int32_t* __restrict__ cu, int32_t* __restrict__ lens, int64_t batch) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    lens[b] = cu[b + 1] - cu[b];
  }
}

// A block per token row; rows of real tokens return at once.
__global__ void ZeroPaddedRowsKernel(TokenRows rows, const int32_t* __restrict__ seq_len, uint16_t* __restrict__ data) {
  for (int64_t row = blockIdx.x; row < rows.batch * rows.seq; row += gridDim.x) {
    const int64_t b = row / rows.seq;
    const int64_t s = row % rows.seq;
    if (s < seq_len[b]) continue;
    uint16_t* p = data + b * rows.stride_b + s * rows.stride_s;
    for (int64_t e = threadIdx.x; e < rows.row_elems; e += blockDim.x) p[e] = 0;
  }
}

__global__ void RaggedOffsetsKernel(const int32_t* __restrict__ start, int32_t* __restrict__ offsets, int64_t batch,
                                    int64_t row_elems) {
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b <= batch;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    offsets[b] = static_cast<int32_t>(start[b] * row_elems);
  }
}

// A block per token row: the last sequence starting at or before it decides (sequences
// do not overlap, so an earlier one cannot reach past a later start).
__global__ void ClearRowsOutsideSequencesKernel(RaggedRows rows, const int32_t* __restrict__ start,
                                                const int32_t* __restrict__ len, uint16_t* __restrict__ data,
                                                float* __restrict__ lse) {
  for (int64_t t = blockIdx.x; t < rows.tokens; t += gridDim.x) {
    int64_t lo = 0, hi = rows.batch - 1, found = -1;
    while (lo <= hi) {
      const int64_t mid = (lo + hi) / 2;
      if (start[mid] <= t) {
        found = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (found >= 0 && t < start[found] + len[found]) continue;
    uint16_t* p = data + t * rows.row_elems;
    for (int64_t e = threadIdx.x; e < rows.row_elems; e += blockDim.x) p[e] = 0;
    if (lse != nullptr) {
      for (int64_t h = threadIdx.x; h < rows.heads; h += blockDim.x) lse[t * rows.heads + h] = __int_as_float(0xff800000);
    }
  }
}

unsigned Blocks(int64_t total, int threads) {
  const int64_t blocks = (total + threads - 1) / threads;
  return static_cast<unsigned>(blocks < 65535 ? blocks : 65535);
}

}  // namespace

cudaError_t LaunchSeqLensFromCu(const int32_t* cu_seqlens, int32_t* seq_len, int64_t batch, cudaStream_t stream) {
  if (batch == 0) return cudaSuccess;
  SeqLensKernel<<<Blocks(batch, 128), 128, 0, stream>>>(cu_seqlens, seq_len, batch);
  return cudaGetLastError();
}

cudaError_t LaunchZeroPaddedRows(const TokenRows& rows, const int32_t* seq_len, uint16_t* data, cudaStream_t stream) {
  const int64_t total = rows.batch * rows.seq;
  if (total == 0 || rows.row_elems == 0) return cudaSuccess;
  ZeroPaddedRowsKernel<<<static_cast<unsigned>(total < 65535 ? total : 65535), 128, 0, stream>>>(rows, seq_len, data);
  return cudaGetLastError();
}

cudaError_t LaunchRaggedOffsets(const int32_t* row_start, int32_t* offsets, int64_t batch, int64_t row_elems,
                                cudaStream_t stream) {
  RaggedOffsetsKernel<<<Blocks(batch + 1, 128), 128, 0, stream>>>(row_start, offsets, batch, row_elems);
  return cudaGetLastError();
}

cudaError_t LaunchClearRowsOutsideSequences(const RaggedRows& rows, const int32_t* row_start, const int32_t* seq_len,
                                            uint16_t* data, float* lse, cudaStream_t stream) {
  if (rows.tokens == 0) return cudaSuccess;
  ClearRowsOutsideSequencesKernel<<<static_cast<unsigned>(rows.tokens < 65535 ? rows.tokens : 65535), 128, 0,
                                    stream>>>(rows, row_start, seq_len, data, lse);
  return cudaGetLastError();
}

cudaError_t LaunchLsePermute(const LseLayout& layout, const float* in, float* out, bool to_layout,
                             const int32_t* seq_len, cudaStream_t stream) {
  const int64_t total = layout.batch * layout.heads * layout.seq;
  if (total == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  LsePermuteKernel<<<Blocks(total, kThreads), kThreads, 0, stream>>>(layout, in, out, to_layout, seq_len);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
