// Attention backward (kernels/attention.h), every kernel recomputing the probabilities
// it needs as P = exp(S - lse) from q, k and the forward's softmax_lse:
//   prepare: a warp per (query row, head): delta = dout . out and, with a learnable
//            sink, the row's term -exp(c - lse) * delta of dsoftmax_offset.
//   dq:      a warp per (query row, head) over the keys of its window:
//            dq = scale * sum_j dS(i, j) k(j).
//   dk, dv:  a warp per (key row, key/value head g) over the heads of group g and the
//            queries whose window holds the key: dv = sum P' dout(i),
//            dk = scale * sum dS q(i).
//   dbias:   a warp per dbias element over the batch and head entries it broadcasts to.
// dS(i, j) = P (dP' keep / (1 - p) - delta(i)) with dP' = dout(i) . v(j). Rows with a
// -inf lse (nothing attended) and rows outside every sequence contribute nothing and get
// zero gradients. Each warp sums in a fixed order and writes its own outputs: no atomics.
#include <cmath>

#include "kernels/cuda/attention/attention_common.cuh"
#include "kernels/cuda/attention/attention_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// a . b over `dim` elements, lanes striding, then a warp sum (same value in every lane).
__device__ __forceinline__ float StridedDot(const float* a, const float* b, int64_t dim, int lane) {
  float s = 0.0f;
  for (int64_t d = lane; d < dim; d += kWarpSize) s = fmaf(a[d], b[d], s);
  return WarpSum(s);
}

// This lane's share of the dot product of two register rows.
__device__ __forceinline__ float LaneDot(const LaneRow& a, const LaneRow& b) {
  float s = 0.0f;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) s = fmaf(a[c], b[c], s);
  return s;
}

__device__ __forceinline__ bool InWindow(const AttentionLaunchParams& p, int64_t i, int64_t j, int64_t o) {
  if (p.window_left >= 0 && j < i + o - p.window_left) return false;
  if (p.window_right >= 0 && j > i + o + p.window_right) return false;
  return true;
}

__global__ void __launch_bounds__(kThreads)
    PrepareKernel(AttentionLaunchParams p, const float* __restrict__ out, const float* __restrict__ dout,
                  const float* __restrict__ lse, float* __restrict__ delta, float* __restrict__ sink_terms) {
  const int lane = Lane();
  const int64_t tasks = p.rows_q * p.heads;
  for (int64_t task = FirstWarpTask(); task < tasks; task += WarpTaskStride()) {
    const int64_t h = task % p.heads;
    float d = 0.0f;
    float term = 0.0f;
    if (LocateQ(p, task / p.heads).b >= 0) {
      const float row_lse = lse[task];
      if (row_lse != -INFINITY) {
        d = StridedDot(dout + task * p.d_v, out + task * p.d_v, p.d_v, lane);
        if (p.sink == AttnSink::kLearnable) term = -expf(p.softmax_offset[h] - row_lse) * d;
      }
    }
    if (lane == 0) {
      delta[task] = d;
      if (sink_terms != nullptr) sink_terms[task] = term;
    }
  }
}

__global__ void __launch_bounds__(kThreads)
    DqKernel(AttentionLaunchParams p, const float* __restrict__ q, const float* __restrict__ k,
             const float* __restrict__ v, const float* __restrict__ dout, const float* __restrict__ lse,
             const float* __restrict__ delta, float* __restrict__ dq) {
  const int lane = Lane();
  const int64_t tasks = p.rows_q * p.heads;
  const int64_t heads_per_group = p.heads / p.groups;
  for (int64_t task = FirstWarpTask(); task < tasks; task += WarpTaskStride()) {
    const int64_t row_q = task / p.heads;
    const int64_t h = task % p.heads;
    const SeqPos at = LocateQ(p, row_q);
    const float row_lse = at.b >= 0 ? lse[task] : -INFINITY;
    float* dq_row = dq + task * p.d_qk;
    if (row_lse == -INFINITY) {
      StoreZeros(dq_row, p.d_qk, lane);
      continue;
    }
    const int64_t b = at.b;
    const int64_t i = at.pos;
    const int64_t group = h / heads_per_group;
    const int64_t o = DiagonalOffset(p, b);
    const float slope = AlibiSlope(p, b, h);
    const float row_delta = delta[task];
    LaneRow qr, dor, acc;
    LoadRow(q + task * p.d_qk, p.d_qk, lane, qr);
    LoadRow(dout + task * p.d_v, p.d_v, lane, dor);
    ZeroRow(acc);
    int64_t j_lo, j_hi;
    KeyRange(p, i, o, LenKv(p, b), &j_lo, &j_hi);
    for (int64_t j = j_lo; j < j_hi; ++j) {
      if (MaskedOut(p, b, h, i, j)) continue;
      const int64_t row_kv = RowKv(p, b, j);
      const int64_t kv = row_kv * p.groups + group;
      const float* k_row = k + kv * p.d_qk;
      float qk = PartialDot(qr, k_row, p.d_qk, lane);
      float dp = PartialDot(dor, v + kv * p.d_v, p.d_v, lane);
      WarpSum2(qk, dp);
      const float s = Score(p, qk, b, h, i, j, o, slope);
      if (s == -INFINITY) continue;
      const float prob = expf(s - row_lse);
      const float keep = DropoutMultiplier(p, h, row_q, row_kv);
      const float ds = prob * (dp * keep - row_delta);
      AddScaledRow(acc, ds, k_row, p.d_qk, lane);
    }
    StoreRow(dq_row, p.d_qk, lane, acc, p.scale);
  }
}

__global__ void __launch_bounds__(kThreads)
    DkDvKernel(AttentionLaunchParams p, const float* __restrict__ q, const float* __restrict__ k,
               const float* __restrict__ v, const float* __restrict__ dout, const float* __restrict__ lse,
               const float* __restrict__ delta, float* __restrict__ dk, float* __restrict__ dv) {
  const int lane = Lane();
  const int64_t tasks = p.rows_kv * p.groups;
  const int64_t heads_per_group = p.heads / p.groups;
  for (int64_t task = FirstWarpTask(); task < tasks; task += WarpTaskStride()) {
    const int64_t row_kv = task / p.groups;
    const int64_t group = task % p.groups;
    const SeqPos at = LocateKv(p, row_kv);
    LaneRow dk_acc, dv_acc;
    ZeroRow(dk_acc);
    ZeroRow(dv_acc);
    if (at.b >= 0) {
      const int64_t b = at.b;
      const int64_t j = at.pos;
      const int64_t o = DiagonalOffset(p, b);
      LaneRow kr, vr, qr, dor;
      LoadRow(k + task * p.d_qk, p.d_qk, lane, kr);
      LoadRow(v + task * p.d_v, p.d_v, lane, vr);
      int64_t i_lo, i_hi;
      QueryRange(p, j, o, LenQ(p, b), &i_lo, &i_hi);
      for (int64_t h = group * heads_per_group; h < (group + 1) * heads_per_group; ++h) {
        const float slope = AlibiSlope(p, b, h);
        for (int64_t i = i_lo; i < i_hi; ++i) {
          const int64_t row_q = RowQ(p, b, i);
          const int64_t qh = row_q * p.heads + h;
          const float row_lse = lse[qh];
          if (row_lse == -INFINITY || MaskedOut(p, b, h, i, j)) continue;
          LoadRow(q + qh * p.d_qk, p.d_qk, lane, qr);
          LoadRow(dout + qh * p.d_v, p.d_v, lane, dor);
          float qk = LaneDot(qr, kr);
          float dp = LaneDot(dor, vr);
          WarpSum2(qk, dp);
          const float s = Score(p, qk, b, h, i, j, o, slope);
          if (s == -INFINITY) continue;
          const float prob = expf(s - row_lse);
          const float keep = DropoutMultiplier(p, h, row_q, row_kv);
          const float ds = prob * (dp * keep - delta[qh]);
          AddScaledLaneRow(dv_acc, prob * keep, dor);
          AddScaledLaneRow(dk_acc, ds, qr);
        }
      }
    }
    StoreRow(dk + task * p.d_qk, p.d_qk, lane, dk_acc, p.scale);
    StoreRow(dv + task * p.d_v, p.d_v, lane, dv_acc, 1.0f);
  }
}

__global__ void __launch_bounds__(kThreads)
    DbiasKernel(AttentionLaunchParams p, const float* __restrict__ q, const float* __restrict__ k,
                const float* __restrict__ v, const float* __restrict__ dout, const float* __restrict__ lse,
                const float* __restrict__ delta, float* __restrict__ dbias) {
  const int lane = Lane();
  const int64_t* dims = p.bias_dims;
  const int64_t tasks = dims[0] * dims[1] * dims[2] * dims[3];
  const int64_t heads_per_group = p.heads / p.groups;
  for (int64_t task = FirstWarpTask(); task < tasks; task += WarpTaskStride()) {
    const int64_t j = task % dims[3];
    const int64_t i = task / dims[3] % dims[2];
    const int64_t hh = task / (dims[3] * dims[2]) % dims[1];
    const int64_t bb = task / (dims[3] * dims[2] * dims[1]);
    const int64_t b_lo = dims[0] == 1 ? 0 : bb;
    const int64_t b_hi = dims[0] == 1 ? p.batch : bb + 1;
    const int64_t h_lo = dims[1] == 1 ? 0 : hh;
    const int64_t h_hi = dims[1] == 1 ? p.heads : hh + 1;
    float sum = 0.0f;
    for (int64_t b = b_lo; b < b_hi; ++b) {
      if (i >= LenQ(p, b) || j >= LenKv(p, b)) continue;
      const int64_t o = DiagonalOffset(p, b);
      if (!InWindow(p, i, j, o)) continue;
      const int64_t row_q = RowQ(p, b, i);
      const int64_t row_kv = RowKv(p, b, j);
      for (int64_t h = h_lo; h < h_hi; ++h) {
        const int64_t qh = row_q * p.heads + h;
        const float row_lse = lse[qh];
        if (row_lse == -INFINITY || MaskedOut(p, b, h, i, j)) continue;
        const int64_t kv = row_kv * p.groups + h / heads_per_group;
        const float qk = StridedDot(q + qh * p.d_qk, k + kv * p.d_qk, p.d_qk, lane);
        const float dp = StridedDot(dout + qh * p.d_v, v + kv * p.d_v, p.d_v, lane);
        const float s = Score(p, qk, b, h, i, j, o, 0.0f);
        if (s == -INFINITY) continue;
        const float prob = expf(s - row_lse);
        const float keep = DropoutMultiplier(p, h, row_q, row_kv);
        sum += prob * (dp * keep - delta[qh]);
      }
    }
    if (lane == 0) dbias[task] = p.bias_type == AttnBias::kPreScale ? p.scale * sum : sum;
  }
}

}  // namespace

cudaError_t LaunchAttentionBackwardPrepare(const AttentionLaunchParams& p, const float* out, const float* dout,
                                           const float* lse, float* delta, float* sink_terms, cudaStream_t stream) {
  const int64_t tasks = p.rows_q * p.heads;
  if (tasks <= 0) return cudaSuccess;
  PrepareKernel<<<GridForWarpTasks(tasks), kThreads, 0, stream>>>(p, out, dout, lse, delta, sink_terms);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackwardDq(const AttentionLaunchParams& p, const float* q, const float* k, const float* v,
                                      const float* dout, const float* lse, const float* delta, float* dq,
                                      cudaStream_t stream) {
  const int64_t tasks = p.rows_q * p.heads;
  if (tasks <= 0) return cudaSuccess;
  DqKernel<<<GridForWarpTasks(tasks), kThreads, 0, stream>>>(p, q, k, v, dout, lse, delta, dq);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackwardDkDv(const AttentionLaunchParams& p, const float* q, const float* k,
                                        const float* v, const float* dout, const float* lse, const float* delta,
                                        float* dk, float* dv, cudaStream_t stream) {
  const int64_t tasks = p.rows_kv * p.groups;
  if (tasks <= 0) return cudaSuccess;
  DkDvKernel<<<GridForWarpTasks(tasks), kThreads, 0, stream>>>(p, q, k, v, dout, lse, delta, dk, dv);
  return cudaGetLastError();
}

cudaError_t LaunchAttentionBackwardDbias(const AttentionLaunchParams& p, const float* q, const float* k,
                                         const float* v, const float* dout, const float* lse, const float* delta,
                                         float* dbias, cudaStream_t stream) {
  const int64_t tasks = p.bias_dims[0] * p.bias_dims[1] * p.bias_dims[2] * p.bias_dims[3];
  if (tasks <= 0) return cudaSuccess;
  DbiasKernel<<<GridForWarpTasks(tasks), kThreads, 0, stream>>>(p, q, k, v, dout, lse, delta, dbias);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
