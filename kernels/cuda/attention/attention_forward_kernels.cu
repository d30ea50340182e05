// Attention forward: a warp per (query token row, head) runs an online softmax over the
// keys its window allows. With m the running max (starting at the sink logit c, or -inf
// without a sink) and l the running sum of exp(S - m) (starting at exp(c - c) = 1 with a
// sink), a key with a larger score rescales l and the output accumulator by
// exp(m_old - m_new) before adding its own term; at the end lse = m + log(l) and
// out = acc / l, which is sum_j exp(S_j - lse) * keep_j / (1 - p) * v_j. A row inside a
// sequence that has neither an unmasked key nor a sink keeps l = 0: lse -inf, output 0,
// as do rows outside every sequence (sink or not, as the CPU reference).
//
// The per-head reduction (max_logit, dsoftmax_offset) lives here as well: a block per
// head, a thread per strided set of rows, then a shared-memory tree in a fixed order.
#include <cmath>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

__global__ void __launch_bounds__(kThreads)
    AttentionForwardKernel(AttentionLaunchParams p, const float* __restrict__ q, const float* __restrict__ k,
                           const float* __restrict__ v, float* __restrict__ out, float* __restrict__ lse,
                           float* __restrict__ row_max) {
  const int lane = Lane();
  const int64_t tasks = p.rows_q * p.heads;
  const int64_t heads_per_group = p.heads / p.groups;
  for (int64_t task = FirstWarpTask(); task < tasks; task += WarpTaskStride()) {
    const int64_t row_q = task / p.heads;
    const int64_t h = task % p.heads;
    const SeqPos at = LocateQ(p, row_q);
    float m = -INFINITY;
    float l = 0.0f;
    float largest = -INFINITY;  // the row's largest unmasked logit, for max_logit
    LaneRow acc;
    ZeroRow(acc);
    if (at.b >= 0) {
      const int64_t b = at.b;
      const int64_t i = at.pos;
      const float sink = SinkLogit(p, h);
      if (sink != -INFINITY) {
        m = sink;
        l = 1.0f;
      }
      const int64_t group = h / heads_per_group;
      const int64_t o = DiagonalOffset(p, b);
      const float slope = AlibiSlope(p, b, h);
      LaneRow qr;
      LoadRow(q + (row_q * p.heads + h) * p.d_qk, p.d_qk, lane, qr);
      int64_t j_lo, j_hi;
      KeyRange(p, i, o, LenKv(p, b), &j_lo, &j_hi);
      for (int64_t j = j_lo; j < j_hi; ++j) {
        if (MaskedOut(p, b, h, i, j)) continue;
        const int64_t kv = RowKv(p, b, j) * p.groups + group;
        const float qk = WarpSum(PartialDot(qr, k + kv * p.d_qk, p.d_qk, lane));
        const float s = Score(p, qk, b, h, i, j, o, slope);
        if (s == -INFINITY) continue;  // the reference treats a -inf score as masked
        largest = fmaxf(largest, s);
        if (s > m) {
          const float rescale = expf(m - s);  // 0 while m is -inf
          l *= rescale;
#pragma unroll
          for (int c = 0; c < kPerLane; ++c) acc[c] *= rescale;
          m = s;
        }
        const float e = expf(s - m);
        l += e;
        const float keep = DropoutMultiplier(p, h, row_q, RowKv(p, b, j));
        if (keep != 0.0f) AddScaledRow(acc, e * keep, v + kv * p.d_v, p.d_v, lane);
      }
    }
    float* out_row = out + (row_q * p.heads + h) * p.d_v;
    if (l > 0.0f) {
      StoreRow(out_row, p.d_v, lane, acc, 1.0f / l);
      if (lane == 0) lse[row_q * p.heads + h] = m + logf(l);
    } else {
      StoreZeros(out_row, p.d_v, lane);
      if (lane == 0) lse[row_q * p.heads + h] = -INFINITY;
    }
    if (row_max != nullptr && lane == 0) row_max[row_q * p.heads + h] = largest;
  }
}

constexpr int kReduceThreads = 256;

__global__ void __launch_bounds__(kReduceThreads)
    ReducePerHeadKernel(HeadReduce op, const float* __restrict__ x, int64_t rows, int64_t heads,
                        float* __restrict__ out) {
  __shared__ double partial[kReduceThreads];
  const int64_t h = blockIdx.x;
  const bool is_max = op == HeadReduce::kMax;
  double acc = is_max ? -INFINITY : 0.0;
  for (int64_t r = threadIdx.x; r < rows; r += kReduceThreads) {
    const double value = x[r * heads + h];
    acc = is_max ? fmax(acc, value) : acc + value;
  }
  partial[threadIdx.x] = acc;
  __syncthreads();
  for (int stride = kReduceThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      const double other = partial[threadIdx.x + stride];
      partial[threadIdx.x] = is_max ? fmax(partial[threadIdx.x], other) : partial[threadIdx.x] + other;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[h] = static_cast<float>(partial[0]);
}

}  // namespace

cudaError_t LaunchAttentionForward(const AttentionLaunchParams& p, const float* q, const float* k, const float* v,
                                   float* out, float* lse, float* row_max, cudaStream_t stream) {
  const int64_t tasks = p.rows_q * p.heads;
  if (tasks <= 0) return cudaSuccess;
  AttentionForwardKernel<<<GridForWarpTasks(tasks), kThreads, 0, stream>>>(p, q, k, v, out, lse, row_max);
  return cudaGetLastError();
}

cudaError_t LaunchReducePerHead(HeadReduce op, const float* x, int64_t rows, int64_t heads, float* out,
                                cudaStream_t stream) {
  if (heads <= 0) return cudaSuccess;
  ReducePerHeadKernel<<<static_cast<unsigned>(heads), kReduceThreads, 0, stream>>>(op, x, rows, heads, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
