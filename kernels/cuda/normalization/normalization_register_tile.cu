// Register-tile LayerNorm / RMSNorm forward with the fused per-tensor FP8 output
// (contract: kernels/normalization.h; selection: normalization_register_tile.h).
//
// Covers BF16 / FP16 x with cols a multiple of 64 up to 8192 and rows a multiple of 8,
// the hardware FP8 encoder; LaunchNormForward uses the shared-memory tile kernel
// (normalization_forward_kernels.cu) for everything else. By default (NormForwardKernel::
// kAuto) nothing comes here: the stats-warp kernel (normalization_stats_warp.cu) runs the
// same tile arithmetic, MXFP8 included (normalization_register_tile_mxfp8.cuh is shared);
// kRegisterTile selects this kernel for comparison.
// - Tile: 32 rows x (64 W) columns per CTA of W <= 16 warps; a row of h columns is split
//   over a cluster of S = ceil(h / (64 W)) <= 8 CTAs. Each lane holds 8 rows x 8 columns
//   (8 x 16 bytes); lane = 4 * column group +
//   row group, so a warp covers 32 rows x 64 columns, a load instruction reads 4 x 128
//   contiguous bytes, a rowwise code store writes 4 x 64 bytes and a columnwise store
//   writes 8 columns x 32 bytes (four lanes' 8 rows): whole 32-byte sectors everywhere.
// - Persistent grid of clusters looping over row groups; x is staged with 16-byte
//   cp.async copies into three shared-memory buffers (each thread reads back only its
//   own bytes, so no barrier guards them), two tiles ahead of the one being processed;
//   the tile is read from shared memory twice (statistics, normalization) instead of
//   being held in registers.
// - Statistics in one pass over registers: per lane and row, the mean and M2 (sum of
//   squared deviations) of its 8 values; merged over the warp's 8 column groups by a
//   shuffle butterfly (equal counts), over the CTA's warps in warp order and over the
//   cluster's CTAs in rank order through distributed shared memory (Chan's formula with
//   counts), one cluster barrier per tile. Every CTA merges the same partials in the same
//   order, so all slices use identical mu and rsigma; the order depends only on the shape,
//   not on the grid (sm_margin changes no result). RMSNorm sums squares instead.
// - y = fma((x - mu) * rsigma, w, beta) in FP32 as the tile kernel computes it; codes
//   q = cvt.rn.satfinite(y * scale) in pairs (NaN -> 0x7F only in rows holding a NaN);
//   rowwise codes stored per row, the 8x8 code block transposed with byte permutes for
//   the columnwise copy. amax: max.NaN of |y| in FP32, warp max, one atomicMax per warp.
// - MXFP8 output (p.mxfp8; template flag kMx, so the per-tensor kernels compile as before):
//   1x32 / 32x1 blocks with E8M0 scales, exactly QuantizeMxfp8 of the FP32 y
//   (normalization_register_tile_mxfp8.cuh); the tile is normalized twice from shared
//   memory (block maxima, then codes). rows % 32 == 0 for the columnwise copy.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/cuda/normalization/normalization_register_tile.h"
#include "kernels/cuda/normalization/normalization_common.cuh"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

#include "kernels/cuda/normalization/normalization_register_tile_common.cuh"

#include "kernels/cuda/normalization/normalization_register_tile_mxfp8.cuh"

template <NormDType kType, Fp8Format kFormat, bool kRms, bool kMx>
__global__ void __launch_bounds__(kRtMaxWarps * 32, 1)
    NormForwardRegisterTileKernel(NormForwardParams p, RtGeometry g) {
  __shared__ float2 warp_stats[kRtMaxWarps][kRtRows];  // (mean, m2) of 64 columns per row
  __shared__ float2 cta_stats[2][kRtRows];            // of the CTA's columns; read by the cluster
  __shared__ float2 row_stats[2][kRtRows];            // (mu, rsigma)
  cg::cluster_group cluster = cg::this_cluster();

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int rg = lane % 4;  // rows 8 rg .. 8 rg + 7 of the tile
  const int cg8 = lane / 4; // columns 8 cg8 .. 8 cg8 + 7 of the warp's 64
  const int rank = static_cast<int>(blockIdx.x);
  const int active_warps = min(g.warps, g.units - rank * g.warps);
  const bool warp_active = warp < active_warps;
  const int64_t col = static_cast<int64_t>(rank * g.warps + warp) * kRtColsPerWarp + 8 * cg8;
  const uint16_t* x = static_cast<const uint16_t*>(p.x);
  const bool quantize = p.rowwise != nullptr || p.columnwise != nullptr;
  const float cols_f = static_cast<float>(p.cols);
  const int64_t stride = gridDim.y;

  // Three staging buffers of 8 x 16 bytes per thread (tile i in slot i % 3). Each thread
  // reads back only the bytes it copied itself, so no barrier guards them.
  extern __shared__ uint4 staging[];
  const int stage_stride = 8 * blockDim.x;
  auto slot_of = [&](int i) { return staging + (i % 3) * stage_stride + threadIdx.x; };
  auto stage_tile = [&](int i) {
    const int64_t grp = blockIdx.y + i * stride;
    const int64_t row = grp * kRtRows + 8 * rg;
    StageBlock(x, row, p.cols, col, warp_active && grp < g.row_groups && row < p.rows, slot_of(i));
  };

  // Partials of the CTA's warps -> cta_stats[buf]: warp 0, one row per lane, in warp order.
  auto cta_merge = [&](int buf) {
    if (warp == 0) {
      float m = warp_stats[0][lane].x, q = warp_stats[0][lane].y;
      float n = static_cast<float>(kRtColsPerWarp);
      for (int i = 1; i < active_warps; ++i) {
        const float2 part = warp_stats[i][lane];
        MergeMoments<kRms>(m, q, n, part.x, part.y, static_cast<float>(kRtColsPerWarp));
      }
      cta_stats[buf][lane] = make_float2(m, q);
    }
  };
  // Partials of the cluster's CTAs (distributed shared memory), in rank order -> row_stats
  // [buf], and mu / rsigma of tile i to memory: the last warp, one row per lane (warp 0
  // merges the CTA's warps). Every CTA computes the same values.
  const int last_warp = static_cast<int>(blockDim.x / 32) - 1;
  auto cluster_merge = [&](int buf, int i) {
    if (warp == last_warp) {
      float2 parts[kRtMaxCluster];
#pragma unroll
      for (int s = 0; s < kRtMaxCluster; ++s) {
        if (s < g.cluster) parts[s] = cluster.map_shared_rank(&cta_stats[buf][0], s)[lane];
      }
      float m = parts[0].x, q = parts[0].y;
      float n = static_cast<float>(kRtColsPerWarp * min(g.warps, g.units));
#pragma unroll
      for (int s = 1; s < kRtMaxCluster; ++s) {
        if (s < g.cluster) {
          MergeMoments<kRms>(m, q, n, parts[s].x, parts[s].y,
                             static_cast<float>(kRtColsPerWarp * min(g.warps, g.units - s * g.warps)));
        }
      }
      const float rsigma = 1.0f / sqrtf(q / cols_f + p.eps);
      row_stats[buf][lane] = make_float2(kRms ? 0.0f : m, rsigma);
      const int64_t row = (blockIdx.y + static_cast<int64_t>(i) * stride) * kRtRows + lane;
      if (rank == 0 && row < p.rows) {
        p.rsigma[row] = rsigma;
        if (!kRms) p.mu[row] = m;
      }
    }
  };

  // Tiles i = 0, 1, ... are row groups blockIdx.y + i * gridDim.y. Iteration i computes
  // the statistics of tile i + 1 and normalizes tile i, so the cluster barrier's wait
  // (arrive before the normalization, wait after it) overlaps the normalization.
  const int tiles =
      blockIdx.y < g.row_groups ? static_cast<int>(CeilDivDevice(g.row_groups - blockIdx.y, stride)) : 0;
  stage_tile(0);
  stage_tile(1);
  stage_tile(2);
  asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  WarpMoments<kType, kRms, 4>(slot_of(0), blockDim.x, lane, rg, cg8, warp, warp_stats);
  __syncthreads();
  cta_merge(0);
  cluster.sync();
  cluster_merge(0, 0);

  float w[8], b[8];  // this lane's 8 columns of the weight and bias
  LoadAffine8<kRms>(p, warp_active ? col : 0, w, b);
  float amax = 0.0f;
  for (int i = 0; i < tiles; ++i) {
    const int buf = i & 1;
    const int next_buf = buf ^ 1;
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");  // tile i + 1 staged
    WarpMoments<kType, kRms, 4>(slot_of(i + 1), blockDim.x, lane, rg, cg8, warp, warp_stats);
    __syncthreads();  // warp partials of tile i + 1 and row_stats[buf] of tile i visible
    cta_merge(next_buf);
    // Only warp 0 wrote what the cluster reads (cta_stats): it arrives with release
    // semantics, the other warps relaxed (their shared-memory hazards are ordered by the
    // block barriers). The last warp's remote reads of cta_stats (cluster_merge) are
    // ordered before the owner's overwrite two tiles later only by program order and the
    // data dependence of the merge, not formally by this relaxed arrive; a release arrive
    // on that warp would make it formal (not changed: not re-measured on a GPU).
    if (warp == 0) {
      asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
    } else {
      asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    }

    const int64_t my_row = (blockIdx.y + i * stride) * kRtRows + 8 * rg;
    if constexpr (kMx) {
      if (warp_active) {  // warp-uniform: Mxfp8Tile shuffles across the warp
        Mxfp8Tile<kType, kFormat, 4, 8, 1, 2>(p, slot_of(i), blockDim.x, &row_stats[buf][8 * rg], w, b, lane, my_row,
                                  my_row < p.rows, col, blockIdx.y + i * stride, amax);
      }
    } else if (warp_active && my_row < p.rows) {
      const uint4* const tile = slot_of(i);
      uint32_t lo[8], hi[8];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const float2 st = row_stats[buf][8 * rg + k];
        float v[8];
        Unpack16<kType>(tile[k * blockDim.x], v);
        float row_max = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          v[e] = fmaf((v[e] - st.x) * st.y, w[e], b[e]);
          row_max = MaxNaN(row_max, fabsf(v[e]));
        }
        amax = MaxNaN(amax, row_max);
        const int64_t row = my_row + k;
        if (p.y != nullptr) StoreY8(p.y, p.y_type, row * p.cols + col, v);
        if (quantize) {
          if (row_max != row_max) {  // a NaN: the patched encoder for this row
            lo[k] = Encode4<kFormat, Fp8Encoder::kHardware, true>(v, p.scale);
            hi[k] = Encode4<kFormat, Fp8Encoder::kHardware, true>(v + 4, p.scale);
          } else {
            lo[k] = Encode4<kFormat, Fp8Encoder::kHardware, false>(v, p.scale);
            hi[k] = Encode4<kFormat, Fp8Encoder::kHardware, false>(v + 4, p.scale);
          }
          if (p.rowwise != nullptr) {
            *reinterpret_cast<uint2*>(p.rowwise + row * p.cols + col) = make_uint2(lo[k], hi[k]);
          }
        }
      }
      if (p.columnwise != nullptr) {
        uint32_t first[8], second[8];  // rows 0-3 and 4-7 of columns col .. col + 7
        Transpose4x4(lo, first);
        Transpose4x4(hi, first + 4);
        Transpose4x4(lo + 4, second);
        Transpose4x4(hi + 4, second + 4);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          *reinterpret_cast<uint2*>(p.columnwise + (col + e) * p.rows + my_row) =
              make_uint2(first[e], second[e]);
        }
      }
    }
    stage_tile(i + 3);  // into tile i's slot, which this thread no longer reads

    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    cluster_merge(next_buf, i + 1);
  }
  asm volatile("cp.async.wait_all;\n" ::: "memory");

  if (p.amax_bits != nullptr) {
    // |y| max as FP32 bits: non-negative, so integer order is value order (NaN above Inf).
    const uint32_t bits = __reduce_max_sync(0xFFFFFFFFu, __float_as_uint(amax));
    if (lane == 0) {
      // The amax reset (LaunchRtClusters); waited for even with nothing to add, so that this
      // grid cannot complete before it.
      WaitPrerequisiteGrids();
      if (bits != 0u) atomicMax(p.amax_bits, bits);
    }
  }
  if (!kMx && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) {
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
  }
  cluster.sync();  // no CTA leaves while others can still read its partials
}

using KernelFn = void (*)(NormForwardParams, RtGeometry);

template <NormDType kType, Fp8Format kFormat, bool kMx>
KernelFn KernelForRms(bool rms) {
  return rms ? NormForwardRegisterTileKernel<kType, kFormat, true, kMx>
             : NormForwardRegisterTileKernel<kType, kFormat, false, kMx>;
}

template <NormDType kType, bool kMx>
KernelFn KernelForFormat(const NormForwardParams& p) {
  return p.format == Fp8Format::kE4M3 ? KernelForRms<kType, Fp8Format::kE4M3, kMx>(p.rms)
                                      : KernelForRms<kType, Fp8Format::kE5M2, kMx>(p.rms);
}

template <NormDType kType>
KernelFn KernelFor(const NormForwardParams& p) {
  return p.mxfp8 ? KernelForFormat<kType, true>(p) : KernelForFormat<kType, false>(p);
}

bool Covers(const NormForwardParams& p) {
  if (p.x_type == NormDType::kFloat32 || p.encoder != Fp8Encoder::kHardware) return false;
  if (p.rows <= 0 || p.rows % 8 != 0) return false;
  if (p.cols % kRtColsPerWarp != 0 || p.cols > kRtColsPerWarp * kRtMaxWarps * kRtMaxCluster) return false;
  if (!IsAligned(p.x, 16) || !IsAligned(p.gamma, 16)) return false;
  if (!p.rms && !IsAligned(p.beta, 16)) return false;
  if (p.y != nullptr && !IsAligned(p.y, 16)) return false;
  if (p.rowwise != nullptr && !IsAligned(p.rowwise, 8)) return false;
  if (p.columnwise != nullptr && !IsAligned(p.columnwise, 8)) return false;
  if (p.mxfp8) {  // whole 32x1 column blocks per tile; every requested copy has its scales
    if (p.rowwise == nullptr && p.columnwise == nullptr) return false;
    if (p.rowwise != nullptr && p.rowwise_e8m0 == nullptr) return false;
    if (p.columnwise != nullptr && (p.columnwise_e8m0 == nullptr || p.rows % kRtRows != 0)) return false;
  }
  return true;
}

// Dynamic shared memory: three staging buffers of 8 x 16 bytes per thread.
int StagingBytes(int warps) { return 3 * 8 * 16 * 32 * warps; }


}  // namespace

cudaError_t RegisterTileForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan,
                                cudaStream_t stream, bool launch, bool* handled) {
  *handled = false;
  // The MXFP8 output exists only here: a shape this kernel does not take is an error, not
  // a fallback to the shared-memory tile kernel (which would ignore p.mxfp8).
  const cudaError_t not_covered = p.mxfp8 ? cudaErrorNotSupported : cudaSuccess;
  if (!Covers(p)) return not_covered;
  const RtGeometry g = RtGeometryFor(p.rows, p.cols);

  KernelFn kernel = nullptr;
  switch (p.x_type) {
    case NormDType::kBFloat16: kernel = KernelFor<NormDType::kBFloat16>(p); break;
    case NormDType::kFloat16: kernel = KernelFor<NormDType::kFloat16>(p); break;
    default: return not_covered;
  }
  const int threads = g.warps * 32;
  int ctas_per_sm = 0, active_clusters = 0;
  const cudaError_t status = RtOccupancy(kernel, threads, StagingBytes(g.warps), StagingBytes(kRtMaxWarps), g.cluster,
                                         &ctas_per_sm, &active_clusters);
  if (status != cudaSuccess) return status;
  const int64_t clusters = RtClusters(g, usable_sms, ctas_per_sm, active_clusters);
  if (clusters == 0) return not_covered;
  *handled = true;

  if (plan != nullptr) {
    FillRtPlan(g, clusters, ctas_per_sm, usable_sms, StagingBytes(g.warps), plan);
    plan->stats_warp = false;
    plan->contiguous_row_groups = false;
    plan->quad_row_groups = false;
  }
  if (!launch) return cudaSuccess;
  return LaunchRtClusters(kernel, g, clusters, threads, StagingBytes(g.warps), p.amax_bits, stream, p, g);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
