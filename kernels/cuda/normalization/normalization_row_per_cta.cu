// One CTA per row: the LayerNorm / RMSNorm forward for few rows without a columnwise copy
// (contract: kernels/normalization.h; selection: normalization_stats_warp.h, which
// StatsWarpForward follows: kAuto, up to kRowPerCtaMaxRows rows, per-tensor outputs only).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/cuda/normalization/normalization_stats_warp.h"
#include "kernels/cuda/normalization/normalization_common.cuh"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

#include "kernels/cuda/amax_sync.cuh"
#include "kernels/cuda/normalization/normalization_register_tile_common.cuh"
#include "kernels/cuda/normalization/normalization_stats_warp_tile.cuh"

// ---- Few rows without a columnwise copy: one CTA per row (NormForwardPlan::row_per_cta).
// For a handful of rows the cluster kernel's time is its latency (one 32-row tile: launch,
// bulk copies, the statistics chain and the cluster exchange, ~10-12 us for 32 x 8192 on an
// H200), not bandwidth. Here a CTA of cols / 8 threads (one 8-column chunk each, up to 1024)
// takes a whole row: LaneMoments, the warp's column groups merged across lane bits 4, 2, 1
// with MergeEqual (WarpMoments' tree; MergeEqual is symmetric, so it does not matter which
// lane keeps a row), then the 64-column units of each rank merged in warp order and the
// ranks in rank order with the cluster kernel's MergeWeights, and NormalizeRow. So mu,
// rsigma, y, codes and amax equal the cluster kernel's (and the register-tile kernel's) bit
// for bit. Persistent over min(rows, usable SMs x resident CTAs) CTAs (sm_margin holds).
// Up to 8 rows (all CTAs one cluster, kClusterReset) the kernel zeroes the amax itself,
// before a cluster barrier arrive that every thread passes at its start and waits on before
// adding to the word, instead of the reset kernel in front (LaunchRtClusters), whose launch
// is a large part of the latency at this size. With more CTAs and p.amax_sync (kSyncReset),
// the first CTA to start zeroes it and the others wait for that before adding
// (amax_sync.cuh), also without a launch in front. The kernel's amax_reset argument:
constexpr int kResetInFront = 0, kClusterReset = 1, kSyncReset = 2;

template <NormDType kType, Fp8Format kFormat, bool kRms, bool kY>
__global__ void __launch_bounds__(kRtMaxWarps * kRtMaxCluster * kRtColsPerWarp / 8, 1)
    NormForwardRowKernel(NormForwardParams p, RtGeometry g, int amax_reset) {
  __shared__ float2 unit_stats[kRtMaxWarps * kRtMaxCluster];  // (mean, m2) of each 64-column unit
  __shared__ float2 rank_parts[kRtMaxCluster];
  __shared__ float2 row_stats;  // (mu, rsigma)
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t % 32;
  const bool active = t < p.cols / 8;  // this thread's 8-column chunk exists
  const int64_t col = 8 * static_cast<int64_t>(active ? t : 0);
  const uint4* const x = static_cast<const uint4*>(p.x);
  const float cols_f = static_cast<float>(p.cols);
  __shared__ uint32_t sync_target;  // kSyncReset: AmaxSyncArrive's value for this CTA
  if (amax_reset == kClusterReset) {
    if (blockIdx.y == 0 && t == 0 && p.amax_bits != nullptr) *p.amax_bits = 0u;
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
  } else if (amax_reset == kSyncReset && t == 0) {
    sync_target = AmaxSyncArrive(p.amax_sync, p.amax_bits, gridDim.y);
  }
  float w[8], b[8];
  LoadAffine8<kRms>(p, col, w, b);
  auto active_of = [&](int r) { return min(g.warps, g.units - r * g.warps); };
  float amax = 0.0f;
  for (int64_t row = blockIdx.y; row < p.rows; row += gridDim.y) {
    const uint4 chunk = active ? x[(row * p.cols + col) / 8] : make_uint4(0u, 0u, 0u, 0u);
    float m = 0.0f, q = 0.0f;
    LaneMoments<kType, kRms>(chunk, m, q);
#pragma unroll
    for (int step = 0; step < 3; ++step) {  // lane bits 4, 2, 1; half counts 4, 8, 16
      const int bit = 4 >> step;
      const float other_m = __shfl_xor_sync(0xFFFFFFFFu, m, bit);
      const float other_q = __shfl_xor_sync(0xFFFFFFFFu, q, bit);
      MergeEqual<kRms>(m, q, other_m, other_q, static_cast<float>(4 << step));
    }
    __syncthreads();  // the previous row's statistics have been read
    if (active && lane % 8 == 0) unit_stats[t / 8] = make_float2(m, q);
    __syncthreads();
    if (t < g.cluster) {  // rank t's units in warp order (the stats warp's CTA merge)
      float rm = unit_stats[t * g.warps].x, rq = unit_stats[t * g.warps].y;
      for (int i = 1; i < active_of(t); ++i) {
        const float2 part = unit_stats[t * g.warps + i];
        MergeWeighted<kRms>(rm, rq, part.x, part.y,
                            MergeWeights(static_cast<float>(kRtColsPerWarp * i), static_cast<float>(kRtColsPerWarp)));
      }
      rank_parts[t] = make_float2(rm, rq);
    }
    __syncthreads();
    if (t == 0) {  // the ranks in rank order (the stats warp's cluster merge)
      float rm = rank_parts[0].x, rq = rank_parts[0].y;
      for (int r = 1; r < g.cluster; ++r) {
        MergeWeighted<kRms>(rm, rq, rank_parts[r].x, rank_parts[r].y,
                            MergeWeights(static_cast<float>(kRtColsPerWarp * min(g.units, r * g.warps)),
                                         static_cast<float>(kRtColsPerWarp * active_of(r))));
      }
      const float rsigma = 1.0f / sqrtf(rq / cols_f + p.eps);
      row_stats = make_float2(kRms ? 0.0f : rm, rsigma);
      p.rsigma[row] = rsigma;
      if (!kRms) p.mu[row] = rm;
    }
    __syncthreads();
    if (active) {
      const float2 st = row_stats;
      const int64_t index = row * p.cols + col;
      uint32_t lo = 0, hi = 0;
      float row_max = 0.0f;
      if (p.rowwise != nullptr) {
        NormalizeRow<kType, kFormat, kY, true, false>(p, chunk, st, w, b, index, lo, hi, row_max);
        if (row_max != row_max) {  // a NaN among these 8 values: the cluster kernel's second pass
          float again = 0.0f;
          NormalizeRow<kType, kFormat, kY, true, true>(p, chunk, st, w, b, index, lo, hi, again);
        }
        *reinterpret_cast<uint2*>(p.rowwise + index) = make_uint2(lo, hi);
      } else {
        NormalizeRow<kType, kFormat, kY, false, false>(p, chunk, st, w, b, index, lo, hi, row_max);
        if (kY && row_max != row_max) {
          float again = 0.0f;
          NormalizeRow<kType, kFormat, kY, false, true>(p, chunk, st, w, b, index, lo, hi, again);
        }
      }
      amax = MaxNaN(amax, row_max);
    }
  }
  if (amax_reset == kClusterReset) {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");  // the reset above
  } else if (amax_reset == kSyncReset) {
    __syncthreads();  // sync_target written
  }
  if (p.amax_bits != nullptr) {
    const uint32_t bits = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(amax));
    if (lane == 0) {
      if (amax_reset == kSyncReset) {
        AmaxSyncWait(p.amax_sync, sync_target);  // the first CTA's zero
      } else {
        WaitPrerequisiteGrids();  // else the amax reset (LaunchRtClusters), as in the cluster kernel
      }
      if (bits != 0u) atomicMax(p.amax_bits, bits);
    }
  }
  if (t == 0 && blockIdx.y == 0) {
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
  }
}

// Rows up to which kAuto takes the one-CTA-per-row kernel (without a columnwise copy). H200,
// x 8192 BF16, rowwise FP8 codes (bench/norm_bench): 1 / 4 / 8 rows (one
// cluster, no reset kernel) 6.1-6.7 us against 21.9 / 24.4 (the tile kernel: rows % 8 != 0) /
// 9.7-10.6; 32 / 128 rows 7.4-9.1 / 9.1-9.9 against 10.0-11.0 / 10.2-11.2; 256 rows the same
// (11.4-11.6); 512 / 1024 rows slower (14.9 / 21.7 against 13.8 / 16.9).
constexpr int64_t kRowPerCtaMaxRows = 256;

using RowKernelFn = void (*)(NormForwardParams, RtGeometry, int);

template <NormDType kType, Fp8Format kFormat>
RowKernelFn RowKernelFor(const NormForwardParams& p) {
  if (p.y != nullptr) {
    return p.rms ? NormForwardRowKernel<kType, kFormat, true, true> : NormForwardRowKernel<kType, kFormat, false, true>;
  }
  return p.rms ? NormForwardRowKernel<kType, kFormat, true, false> : NormForwardRowKernel<kType, kFormat, false, false>;
}

RowKernelFn RowKernelFor(const NormForwardParams& p) {
  const bool bf16 = p.x_type == NormDType::kBFloat16;
  if (p.format == Fp8Format::kE4M3) {
    return bf16 ? RowKernelFor<NormDType::kBFloat16, Fp8Format::kE4M3>(p)
                : RowKernelFor<NormDType::kFloat16, Fp8Format::kE4M3>(p);
  }
  return bf16 ? RowKernelFor<NormDType::kBFloat16, Fp8Format::kE5M2>(p)
              : RowKernelFor<NormDType::kFloat16, Fp8Format::kE5M2>(p);
}

}  // namespace

bool TakesRowPerCta(const NormForwardParams& p) {
  return p.kernel == NormForwardKernel::kAuto && !p.mxfp8 && p.columnwise == nullptr && p.rows <= kRowPerCtaMaxRows;
}

cudaError_t RowPerCtaForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan, cudaStream_t stream,
                             bool launch) {
  const RtGeometry g = RtGeometryFor(p.rows, p.cols);  // the cluster kernel's merge order
  const RowKernelFn kernel = RowKernelFor(p);
  const int threads = static_cast<int>(CeilDiv(p.cols / 8, 32) * 32);
  int ctas_per_sm = 0, unused = 0;
  const cudaError_t status = RtOccupancy(kernel, threads, 0, 0, 1, &ctas_per_sm, &unused);
  if (status != cudaSuccess) return status;
  const int64_t ctas = std::max<int64_t>(1, std::min<int64_t>(p.rows, static_cast<int64_t>(usable_sms) * ctas_per_sm));
  if (plan != nullptr) {
    plan->rows_per_cta = 1;
    plan->cols_per_cta = static_cast<int>(p.cols);
    plan->slices = 1;
    plan->cluster_size = 1;
    plan->separate_stats = false;
    plan->register_tile = false;
    plan->stats_warp = false;
    plan->row_per_cta = true;
    plan->amax_zeroed_in_kernel = ctas <= kRtMaxCluster || p.amax_sync != nullptr;
    plan->ctas = static_cast<int>(ctas);
    plan->ctas_per_sm = ctas_per_sm;
    plan->usable_sms = usable_sms;
    plan->shared_bytes = 0;
  }
  if (!launch) return cudaSuccess;
  if (ctas <= kRtMaxCluster) {  // one cluster of ctas CTAs, which resets the amax itself
    cudaLaunchAttribute attribute;
    cudaLaunchConfig_t config =
        ClusterLaunchConfig(dim3(1, static_cast<unsigned>(ctas), 1), 1, threads, 0, stream, &attribute);
    attribute.val.clusterDim.y = static_cast<unsigned>(ctas);
    const cudaError_t launched = cudaLaunchKernelEx(&config, kernel, p, g, kClusterReset);
    return launched != cudaSuccess ? launched : cudaGetLastError();
  }
  RtGeometry grid = g;
  grid.cluster = 1;  // LaunchRtClusters' grid: 1 x ctas (the kernel takes the row geometry g)
  if (p.amax_sync != nullptr && p.amax_bits != nullptr) {  // the kernel zeroes the amax itself
    return LaunchRtClusters(kernel, grid, ctas, threads, 0, nullptr, stream, p, g, kSyncReset);
  }
  return LaunchRtClusters(kernel, grid, ctas, threads, 0, p.amax_bits, stream, p, g, kResetInFront);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
