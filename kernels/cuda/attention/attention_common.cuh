// Device helpers of the attention kernels (attention_forward_kernels.cu,
// attention_backward_kernels.cu): where a token row sits in its sequence, the mask, the
// score of one (query, key) pair, the sink, the dropout multiplier, and the per-lane
// register rows with their warp dot products. The formulas are kernels/attention.h's,
// term by term as kernels/cpu/attention_cpu.cc evaluates them, in FP32.
//
// Only the attention .cu files include this. Like device_common.cuh, everything sits in
// an unnamed namespace, so each kernel file keeps its own internal copy.
#ifndef TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_
#define TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/attention/attention_kernels.h"
#include "kernels/cuda/block_reduce.cuh"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kWarpsPerBlock * kWarpSize;
constexpr int64_t kMaxBlocks = int64_t{1} << 20;
// Register elements per lane of one head-size row (kMaxAttentionHeadDim / 32).
constexpr int kPerLane = static_cast<int>(kMaxAttentionHeadDim / kWarpSize);
static_assert(kMaxAttentionHeadDim % kWarpSize == 0, "whole lanes");

// Blocks for `tasks` warp tasks (each kernel loops with a grid stride beyond the cap).
inline unsigned GridForWarpTasks(int64_t tasks) {
  const int64_t blocks = (tasks + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ __forceinline__ int Lane() { return static_cast<int>(threadIdx.x % kWarpSize); }
__device__ __forceinline__ int64_t FirstWarpTask() {
  return static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
}
__device__ __forceinline__ int64_t WarpTaskStride() { return static_cast<int64_t>(gridDim.x) * kWarpsPerBlock; }

// ---- Sequences.

__device__ __forceinline__ int64_t SeqLen(const int32_t* cu, int64_t full, int64_t b) {
  return cu == nullptr ? full : static_cast<int64_t>(cu[b + 1]) - cu[b];
}

__device__ __forceinline__ int64_t LenQ(const AttentionLaunchParams& p, int64_t b) {
  return SeqLen(p.cu_q, p.full_q, b);
}
__device__ __forceinline__ int64_t LenKv(const AttentionLaunchParams& p, int64_t b) {
  return SeqLen(p.cu_kv, p.full_kv, b);
}

// The diagonal offset o of sequence b.
__device__ __forceinline__ int64_t DiagonalOffset(const AttentionLaunchParams& p, int64_t b) {
  return p.top_left ? 0 : LenKv(p, b) - LenQ(p, b);
}

// Token row of position `pos` of sequence b on one side.
__device__ __forceinline__ int64_t TokenRow(const AttentionLaunchParams& p, const int32_t* off, int64_t full,
                                            int64_t b, int64_t pos) {
  switch (p.layout) {
    case AttnLayout::kSbhd: return pos * p.batch + b;
    case AttnLayout::kBshd: return b * full + pos;
    default: return off[b] + pos;
  }
}
__device__ __forceinline__ int64_t RowQ(const AttentionLaunchParams& p, int64_t b, int64_t i) {
  return TokenRow(p, p.off_q, p.full_q, b, i);
}
__device__ __forceinline__ int64_t RowKv(const AttentionLaunchParams& p, int64_t b, int64_t j) {
  return TokenRow(p, p.off_kv, p.full_kv, b, j);
}

struct SeqPos {
  int64_t b = -1;  // -1: the row lies outside every sequence (padding)
  int64_t pos = 0;
};

// The sequence and position of token row `row` on one side. thd: the last sequence
// whose first row is <= row (offsets are non-decreasing and sequences do not overlap, so
// a row past that sequence's length is padding).
__device__ SeqPos LocateRow(const AttentionLaunchParams& p, const int32_t* cu, const int32_t* off, int64_t full,
                            int64_t row) {
  SeqPos s;
  int64_t b = 0;
  int64_t pos = 0;
  switch (p.layout) {
    case AttnLayout::kSbhd:
      b = row % p.batch;
      pos = row / p.batch;
      break;
    case AttnLayout::kBshd:
      b = row / full;
      pos = row % full;
      break;
    default: {
      int64_t lo = 0;
      int64_t hi = p.batch;  // count of offsets <= row, by bisection
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (off[mid] <= row) {
          lo = mid + 1;
        } else {
          hi = mid;
        }
      }
      if (lo == 0) return s;
      b = lo - 1;
      pos = row - off[b];
      break;
    }
  }
  if (pos < SeqLen(cu, full, b)) {
    s.b = b;
    s.pos = pos;
  }
  return s;
}
__device__ __forceinline__ SeqPos LocateQ(const AttentionLaunchParams& p, int64_t row) {
  return LocateRow(p, p.cu_q, p.off_q, p.full_q, row);
}
__device__ __forceinline__ SeqPos LocateKv(const AttentionLaunchParams& p, int64_t row) {
  return LocateRow(p, p.cu_kv, p.off_kv, p.full_kv, row);
}

// ---- Mask and window.

// [lo, hi): the keys of query i that the window allows (the whole sequence without one).
__device__ __forceinline__ void KeyRange(const AttentionLaunchParams& p, int64_t i, int64_t o, int64_t len_kv,
                                         int64_t* lo, int64_t* hi) {
  *lo = p.window_left >= 0 ? max(int64_t{0}, i + o - p.window_left) : 0;
  *hi = p.window_right >= 0 ? min(len_kv, i + o + p.window_right + 1) : len_kv;
}

// [lo, hi): the queries whose window holds key j.
__device__ __forceinline__ void QueryRange(const AttentionLaunchParams& p, int64_t j, int64_t o, int64_t len_q,
                                           int64_t* lo, int64_t* hi) {
  *lo = p.window_right >= 0 ? max(int64_t{0}, j - o - p.window_right) : 0;
  *hi = p.window_left >= 0 ? min(len_q, j - o + p.window_left + 1) : len_q;
}

// Offset of [b, h, i, j] in a rank-4 tensor broadcast to [B, H, S_q, S_kv].
__device__ __forceinline__ int64_t BroadcastOffset(const int64_t (&dims)[4], int64_t b, int64_t h, int64_t i,
                                                   int64_t j) {
  int64_t offset = dims[0] == 1 ? 0 : b;
  offset = offset * dims[1] + (dims[1] == 1 ? 0 : h);
  offset = offset * dims[2] + (dims[2] == 1 ? 0 : i);
  return offset * dims[3] + (dims[3] == 1 ? 0 : j);
}

// The arbitrary mask (the window is applied through the loop ranges).
__device__ __forceinline__ bool MaskedOut(const AttentionLaunchParams& p, int64_t b, int64_t h, int64_t i,
                                          int64_t j) {
  return p.mask != nullptr && p.mask[BroadcastOffset(p.mask_dims, b, h, i, j)] != 0;
}

// ---- Scores, sink, dropout.

__device__ __forceinline__ float AlibiSlope(const AttentionLaunchParams& p, int64_t b, int64_t h) {
  if (p.bias_type != AttnBias::kAlibi) return 0.0f;
  return p.alibi_slopes[(p.alibi_per_batch ? b * p.heads : 0) + h];
}

// S(i, j) from qk = q(i) . k(j).
__device__ __forceinline__ float Score(const AttentionLaunchParams& p, float qk, int64_t b, int64_t h, int64_t i,
                                       int64_t j, int64_t o, float slope) {
  switch (p.bias_type) {
    case AttnBias::kPreScale: return p.scale * (qk + p.bias[BroadcastOffset(p.bias_dims, b, h, i, j)]);
    case AttnBias::kPostScale: return p.scale * qk + p.bias[BroadcastOffset(p.bias_dims, b, h, i, j)];
    case AttnBias::kAlibi: return p.scale * qk - slope * fabsf(static_cast<float>(i + o - j));
    default: return p.scale * qk;
  }
}

// The sink logit c of head h; -inf without a sink.
__device__ __forceinline__ float SinkLogit(const AttentionLaunchParams& p, int64_t h) {
  switch (p.sink) {
    case AttnSink::kZero: return 0.0f;
    case AttnSink::kLearnable: return p.softmax_offset[h];
    default: return -INFINITY;
  }
}

// keep(h, r_q, r_kv) / (1 - p): the draw of kernels/attention.h, bit for bit the CPU's.
__device__ __forceinline__ float DropoutMultiplier(const AttentionLaunchParams& p, int64_t h, int64_t row_q,
                                                   int64_t row_kv) {
  if (!(p.dropout > 0.0f)) return 1.0f;
  const uint64_t index = (static_cast<uint64_t>(h) * static_cast<uint64_t>(p.rows_q) + static_cast<uint64_t>(row_q)) *
                             static_cast<uint64_t>(p.rows_kv) +
                         static_cast<uint64_t>(row_kv);
  return Uniform24ToFloat(RandomBits24(p.dropout_key, index)) >= p.dropout ? p.dropout_scale : 0.0f;
}

// ---- Register rows: lane l holds elements l, l + 32, ... of a head-size row.

using LaneRow = float[kPerLane];

__device__ __forceinline__ void LoadRow(const float* row, int64_t dim, int lane, LaneRow& r) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + c * kWarpSize;
    r[c] = d < dim ? row[d] : 0.0f;
  }
}

__device__ __forceinline__ void ZeroRow(LaneRow& r) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) r[c] = 0.0f;
}

__device__ __forceinline__ void StoreRow(float* row, int64_t dim, int lane, const LaneRow& r, float factor) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + c * kWarpSize;
    if (d < dim) row[d] = r[c] * factor;
  }
}

__device__ __forceinline__ void StoreZeros(float* row, int64_t dim, int lane) {
  for (int64_t d = lane; d < dim; d += kWarpSize) row[d] = 0.0f;
}

// This lane's share of r . row.
__device__ __forceinline__ float PartialDot(const LaneRow& r, const float* row, int64_t dim, int lane) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + c * kWarpSize;
    if (d < dim) s = fmaf(r[c], row[d], s);
  }
  return s;
}

// acc += w * row.
__device__ __forceinline__ void AddScaledRow(LaneRow& acc, float w, const float* row, int64_t dim, int lane) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) {
    const int64_t d = lane + c * kWarpSize;
    if (d < dim) acc[c] = fmaf(w, row[d], acc[c]);
  }
}

// acc += w * r (both register rows).
__device__ __forceinline__ void AddScaledLaneRow(LaneRow& acc, float w, const LaneRow& r) {
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) acc[c] = fmaf(w, r[c], acc[c]);
}

// Two warp sums at once (the butterflies interleave); every lane gets both results.
__device__ __forceinline__ void WarpSum2(float& a, float& b) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    a += __shfl_xor_sync(0xFFFFFFFFu, a, o);
    b += __shfl_xor_sync(0xFFFFFFFFu, b, o);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ATTENTION_ATTENTION_COMMON_CUH_
