// Stats-warp LayerNorm / RMSNorm forward with the fused per-tensor FP8 or MXFP8 output
// (contract: kernels/normalization.h; selection: normalization_stats_warp.h). The default
// forward kernel for 16-bit x with cols % 64 == 0 up to 8192 and rows % 8 == 0. Target:
// the cast-transpose's bandwidth; on an H200, 16384 x 8192 BF16 LN + E4M3 rowwise +
// columnwise (bench/norm_bench) runs at ~3.6 TB/s, about 1.6x the register-tile kernel.
// What gets it there: the quad schedule (its comment below), the amax zeroed by the first
// CTA through an amax_sync workspace instead of a reset launch in front (amax_sync.cuh),
// and the columnwise codes stored under an L2 evict-last policy. The MXFP8 output (kMx,
// the register-tile kernel's Mxfp8Tile with this kernel's lane bits) takes about twice as
// long: it needs two normalization passes.
// Up to 256 rows without a columnwise copy, the one-CTA-per-row kernel
// (normalization_row_per_cta.cu) takes them.
//
// Same tile (32 rows x 64 columns per compute warp, cluster of S CTAs along the row) and
// arithmetic as the register-tile kernel (normalization_register_tile.cu, helpers in
// normalization_register_tile_common.cuh), so mu, rsigma, y, codes and amax equal that
// kernel's bit for bit (the lanes differ, the merge tree does not: WarpMoments). Per CTA:
// - A producer warp (warp W + 1), one row per lane: per tile, one bulk copy (TMA) of the
//   CTA's columns of each row into stage t % 3 (row-major), completing on staged[t % 3],
//   after every compute warp released that stage (drained[t % 3]). Bulk copies reach L2 as
//   whole-line requests: the per-thread 16-byte cp.async of the register-tile kernel made
//   one request per 16 bytes (ncu: 15.6M L2 read requests and twice the read sectors,
//   L2 tag lookups at 80% of peak, the limiter at 234 us).
// - W compute warps (64 columns each; lanes 8 r .. 8 r + 7 read one 128-byte run of a row,
//   so 16-byte shared loads are conflict-free): wait for staged[tile i + 1], per-lane moments
//   of tile i + 1 and their warp reduction into warp_stats[(i + 1) % 2], named-barrier
//   arrive (no wait), then wait for row_stats[i % 2] and normalize / encode / store tile i,
//   then release its stage. They never run a merge chain and never touch the cluster.
// - The stats warp (warp W), one row per lane, per tile t: waits for the warp partials
//   (named barrier), merges them in warp order (the register-tile kernel's CTA merge),
//   pushes the CTA partial into slot t % 2 of every other CTA of the cluster with st.async
//   (8 bytes per lane and CTA, completing transactions on the receiver's mbarrier
//   full[t % 2]; its own slot by a plain store + mbarrier.complete_tx), waits for the S
//   partials on its own full[t % 2], merges them in rank order, writes row_stats[t % 2]
//   (rank 0 also mu / rsigma) and arrives on stats_ready[t % 2], an mbarrier each compute
//   warp waits on by itself (kMx: a named barrier of all compute warps, see below). No
//   cluster barrier and no GPU-scope fence per tile. What does not depend on the data (the
//   merge weights) is computed once per CTA: the warp's chain set the tile period before.
// - Why two slots suffice: a CTA pushes its partial of tile t + 1 only after its stats warp
//   consumed slot t % 2 (program order of one warp), and a peer can push tile t + 2 into
//   slot t % 2 only after it received every CTA's partial of tile t + 1. full[s] is
//   re-armed (arrive + expect_tx) for tile t + 2 right after tile t was consumed, so
//   transactions never land in the wrong phase. Named barriers 1 + t % 2 (partials) and
//   3 + t % 2 (statistics, kMx) alternate so an arrival for tile t + 1 can never join the
//   instance of tile t - 1; warp_stats and row_stats are double-buffered by the same
//   argument (each buffer is rewritten only after the barrier that follows its last read).
//   A stage is refilled (tile t + 3) only after all W compute warps arrived on drained[t % 3]
//   for tile t, and staged / drained phases alternate per use of a stage.
// - Row groups: cluster y takes groups y, y + C, ... (C clusters), so the four 32-row groups
//   whose columnwise codes share 128-byte lines are written at about the same time. With a
//   per-tensor columnwise copy and no y (kPaired, an instantiation of its own) it takes
//   them in pairs instead: groups (2 q, 2 q + 1) for q = y, y + C, ..., one after the other,
//   while every cluster has a pair left, then the left-over groups one by one. A compute
//   lane keeps the first tile's columnwise codes (rows 0-3 in registers, 4-7 in shared
//   memory) and stores them with the second tile's as 64-byte runs per column: one L2
//   request per 64 bytes instead of per 32. Half of those stores wait for the next tile
//   (StorePairColumns, normalization_stats_warp_tile.cuh, says why). H200, LN + FP8:
//   about 1% faster; a layout-free imitation of the same runs was ~3% faster still.
//   NormForwardKernel::kStatsWarpContiguous gives each cluster one block of consecutive
//   groups instead (measured ~20% slower).
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
#include "kernels/cuda/normalization/normalization_register_tile_mxfp8.cuh"
#include "kernels/cuda/normalization/stats_warp_ptx.cuh"

constexpr int kPartialsBarrier = 1;  // + t % 2: warp partials of tile t written
constexpr int kStatsBarrier = 3;     // + t % 2: row_stats of tile t written (kMx; else stats_ready)
constexpr int kComputeBarrier = 5;   // the compute warps alone (kMx: after the last tile)
constexpr int kStages = 3;           // x tiles in shared memory (64 KiB each at 16 warps)
constexpr uint32_t kStageAlign = 1024;  // byte alignment of the first stage
// Row-group order bits of the kernel's `order` argument (neither: strided, paired where
// UsesPairs).
constexpr int kContiguousOrder = 1;  // NormForwardKernel::kStatsWarpContiguous
constexpr int kQuadOrder = 2;        // NormForwardKernel::kStatsWarpQuads (paired instantiation)

#include "kernels/cuda/normalization/normalization_stats_warp_tile.cuh"

// Pairs of full 32-row groups each of `clusters` clusters takes in the paired order without
// the quad bit (the plan's test for pairs).
inline int64_t PairRounds(int64_t rows, int64_t clusters) { return rows / kRtRows / 2 / clusters; }

// Rounds of four full 32-row groups each of `clusters` clusters takes first in the quad order
// (the kernel and the plan).
__host__ __device__ inline int64_t QuadRounds(int64_t rows, int64_t clusters) {
  return rows / kRtRows / 4 / clusters;
}

// Row groups of cluster y (of C = gridDim.y): with `contiguous`, the block
// [y G / C, (y + 1) G / C) of the G groups in order, so one CTA writes all four 32-byte
// sectors of each 128-byte line of the columnwise copy (rows 128 k .. 128 k + 127 of a
// column) except at block ends, instead of four clusters on different SMs writing one
// sector each at the same time; with kPaired, adjacent pairs (2 q, 2 q + 1), q = y, y + C,
// ..., then the left-over groups y, y + C, ... among them (the header says why); with kPaired
// and the quad bit (kStatsWarpQuads), pairs of adjacent pairs first, groups 4 q .. 4 q + 3 for
// q = y, y + C, ..., so that one CTA writes both halves of each columnwise line, then pairs
// and single groups of what is left as before; else the register-tile kernel's order
// y, y + C, ... All of them give every cluster floor(G / C) or ceil(G / C) groups. kY: p.y
// is set (a template flag, so the codes-only path carries no per-row y test).
template <NormDType kType, Fp8Format kFormat, bool kRms, bool kY, bool kMx, bool kPaired>
__global__ void __launch_bounds__((kRtMaxWarps + 2) * 32, 1)
    NormForwardStatsWarpKernel(NormForwardParams p, RtGeometry g, int order) {
  const bool contiguous = (order & kContiguousOrder) != 0;
  const bool quad = (order & kQuadOrder) != 0;
  __shared__ float2 warp_stats[2][kRtMaxWarps][kRtRows];  // (mean, m2) of 64 columns per row
  __shared__ float2 parts[2][kRtMaxCluster][kRtRows];     // CTA partials pushed by each rank
  __shared__ float2 row_stats[2][kRtRows];                // (mu, rsigma)
  __shared__ float2 merge_w[kRtMaxWarps + kRtMaxCluster];  // the stats warp's merge weights
  // Paired order: rows 4-7 of the pair's first tile's columnwise codes, word e of compute
  // thread t at [e][t] (rows 0-3 stay in registers: all 64 bytes there made ptxas spill).
  __shared__ uint32_t held_rows4[kPaired ? 8 : 1][kRtMaxWarps * 32];
  __shared__ alignas(8) uint64_t full[2];                 // parts[slot] complete
  __shared__ alignas(8) uint64_t stats_ready[2];          // row_stats[slot] written (!kMx)
  __shared__ alignas(8) uint64_t staged[kStages];         // x of a tile landed in stage s
  __shared__ alignas(8) uint64_t drained[kStages];        // every compute warp done with stage s
  // kMx: the rowwise E8M0 codes of tiles i % 2 (row, block of the CTA), written out by warp 0
  // as whole 32-byte runs per row once every compute warp is done with the tile.
  __shared__ alignas(16) uint8_t row_scales[kMx ? 2 : 1][kMx ? kRtRows : 1][kScaleRowBytes];
  // The x tiles: stage s holds rows 0..31 of a tile, row-major, row_uint4 16-byte chunks
  // (64 columns per compute warp, 8 chunks) per row.
  extern __shared__ uint4 dynamic_smem[];
  // The stages start at a 1024-byte boundary. The bulk copies' destination alignment matters:
  // On 16384 x 8192, 16-byte aligned stages were ~14% slower than 1024-byte ones, 64-byte
  // ~4%, 128-byte ~1%.
  constexpr uint32_t kAlignChunks = kStageAlign / 16;
  uint4* const stages =
      dynamic_smem + (kAlignChunks - (SharedAddress(dynamic_smem) / 16) % kAlignChunks) % kAlignChunks;
  cg::cluster_group cluster = cg::this_cluster();

  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int stats_warp = g.warps, producer_warp = g.warps + 1;
  const int threads = (g.warps + 1) * 32;  // the named barriers: compute warps + stats warp
  const int rank = static_cast<int>(blockIdx.x);
  const int active_warps = min(g.warps, g.units - rank * g.warps);
  const int row_uint4 = g.warps * (kRtColsPerWarp / 8);
  const int64_t stride = gridDim.y;
  const int64_t first = blockIdx.y * g.row_groups / stride;
  // Paired order (per-tensor columnwise output): tiles 0 .. paired_tiles - 1 are the pairs of
  // full groups (2 q, 2 q + 1) for q = y, y + C, ..., so that the compute warps can store 64
  // contiguous rows of each column at once; the groups left over (fewer than 2 C, the partial
  // last one among them) follow one by one, strided. With the quad bit the pairs come as
  // (4 q, 4 q + 1), (4 q + 2, 4 q + 3) while every cluster has four full groups left. The quad
  // order itself is slower , but ptxas schedules this kernel's paired
  // LN instantiation ~2 us faster with the branch in group_of than without , so
  // the default paired order runs through the same code with quad_rounds 0.
  const bool paired = kPaired && !contiguous;
  const int64_t quad_rounds = paired && quad ? QuadRounds(p.rows, stride) : 0;
  const int64_t quad_groups = 4 * quad_rounds * stride;
  const int64_t pair_rounds = paired ? (p.rows / kRtRows - quad_groups) / 2 / stride : 0;
  const int paired_tiles = static_cast<int>(4 * quad_rounds + 2 * pair_rounds);
  const int64_t singles0 = quad_groups + 2 * pair_rounds * stride;  // first group taken one by one
  int tiles = 0;
  if (contiguous) {
    tiles = static_cast<int>((blockIdx.y + 1) * g.row_groups / stride - first);
  } else if (singles0 + blockIdx.y < g.row_groups) {
    tiles = paired_tiles + static_cast<int>(CeilDivDevice(g.row_groups - singles0 - blockIdx.y, stride));
  } else {
    tiles = paired_tiles;
  }
  auto group_of = [&](int i) -> int64_t {
    if (contiguous) return first + i;
    if (i < 4 * quad_rounds) {
      const int j = i >> 1;
      return 4 * (blockIdx.y + (j >> 1) * stride) + 2 * (j & 1) + (i & 1);
    }
    if (i < paired_tiles) {
      const int k = i - static_cast<int>(4 * quad_rounds);
      return quad_groups + 2 * (blockIdx.y + (k >> 1) * stride) + (k & 1);
    }
    return singles0 + blockIdx.y + (i - paired_tiles) * stride;
  };
  const uint32_t part_bytes = static_cast<uint32_t>(g.cluster * kRtRows * sizeof(float2));

  if (warp == stats_warp && lane == 0) {
    MbarrierInit(SharedAddress(&full[0]), 1);
    MbarrierInit(SharedAddress(&full[1]), 1);
    MbarrierInit(SharedAddress(&stats_ready[0]), 1);  // the stats warp's arrive
    MbarrierInit(SharedAddress(&stats_ready[1]), 1);
    for (int s = 0; s < kStages; ++s) {
      MbarrierInit(SharedAddress(&staged[s]), 1);           // the producer's arrive + bytes
      MbarrierInit(SharedAddress(&drained[s]), g.warps);    // one arrive per compute warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    if (tiles > 0) MbarrierArriveExpect(SharedAddress(&full[0]), part_bytes);
    if (tiles > 1) MbarrierArriveExpect(SharedAddress(&full[1]), part_bytes);
  }
  cluster.sync();  // every CTA's barriers exist before any partial is pushed

  if (warp == producer_warp) {
    // ---- Producer warp: lane = row of the tile; one bulk copy of the CTA's columns per row
    // (whole 128-byte lines, so L2 sees full-line requests), completing on staged[stage].
    const uint32_t row_bytes = static_cast<uint32_t>(active_warps * kRtColsPerWarp * 2);
    const int64_t col0 = static_cast<int64_t>(rank) * g.warps * kRtColsPerWarp;
    const uint16_t* x = static_cast<const uint16_t*>(p.x);
    for (int t = 0; t < tiles; ++t) {
      const int s = t % kStages;
      if (t >= kStages) {
        MbarrierWait<false>(SharedAddress(&drained[s]), static_cast<uint32_t>(t / kStages - 1) & 1u);
      } else if (t == kStages - 1) {
        // The last stage of the start goes out once the one before it has landed. Issued
        // together, the second and third stages landed together, ~4.7 us after the first, and
        // the first tile's normalization waits for the second (the moments run one tile
        // ahead); staggered, the rowwise-only, BF16-y, RMSNorm and MXFP8 outputs gained
        // 0.6-1.5 us, LN + FP8 nothing.
        MbarrierWait<false>(SharedAddress(&staged[t - 1]), 0u);
      }
      const int64_t row0 = group_of(t) * kRtRows;
      const int rows = p.rows - row0 < kRtRows ? static_cast<int>(p.rows - row0) : kRtRows;
      const uint32_t bar = SharedAddress(&staged[s]);
      if (lane == 0) MbarrierArriveExpect(bar, static_cast<uint32_t>(rows) * row_bytes);
      __syncwarp();
      if (lane < rows) {
        BulkCopyRow(SharedAddress(stages + (s * kRtRows + lane) * row_uint4),
                    x + (row0 + lane) * p.cols + col0, row_bytes, bar);
      }
    }
  } else if (warp == stats_warp) {
    // ---- Stats warp: lane = row of the tile.
    // This warp's work per tile is one serial chain (it measured about as long as a whole
    // tile period, so it set the kernel's pace). What does not depend on
    // the data is done once here: the merge weights (MergeWeights, as MergeMoments computes
    // them for the same counts, so the same bits; lane i < W: warp i into warps 0 .. i - 1,
    // lane W + r: rank r into ranks 0 .. r - 1).
    const float cols_f = static_cast<float>(p.cols);
    if (lane > 0 && lane < kRtMaxWarps) {
      merge_w[lane] = MergeWeights(static_cast<float>(kRtColsPerWarp * lane), static_cast<float>(kRtColsPerWarp));
    } else if (lane > kRtMaxWarps && lane < kRtMaxWarps + g.cluster) {
      const int r = lane - kRtMaxWarps;
      merge_w[lane] = MergeWeights(static_cast<float>(kRtColsPerWarp * min(g.units, r * g.warps)),
                                   static_cast<float>(kRtColsPerWarp * min(g.warps, g.units - r * g.warps)));
    }
    if (p.amax_sync != nullptr && p.amax_bits != nullptr) {
      // The amax reset without a launch in front (amax_sync.cuh). The compute warps add to
      // the word only after the last tile's statistics, which this warp hands over after
      // the wait (mbarrier / named-barrier release), so they come after the zero.
      if (lane == 0) AmaxSyncWait(p.amax_sync, AmaxSyncArrive(p.amax_sync, p.amax_bits, gridDim.x * gridDim.y));
    }
    __syncwarp();
    for (int t = 0; t < tiles; ++t) {
      const int s = t & 1;
      NamedSync<kPartialsBarrier>(s, threads);
      float m = warp_stats[s][0][lane].x, q = warp_stats[s][0][lane].y;
#pragma unroll
      for (int i = 1; i < kRtMaxWarps; ++i) {
        if (i < active_warps) {
          const float2 part = warp_stats[s][i][lane];
          MergeWeighted<kRms>(m, q, part.x, part.y, merge_w[i]);
        }
      }
      const uint32_t slot = SharedAddress(&parts[s][rank][lane]);
      const uint32_t bar = SharedAddress(&full[s]);
      for (int dst = 0; dst < g.cluster; ++dst) {
        if (dst == rank) {
          parts[s][rank][lane] = make_float2(m, q);
          MbarrierCompleteLocal(bar, sizeof(float2));
        } else {
          PushPartial(ClusterAddress(slot, dst), make_float2(m, q), ClusterAddress(bar, dst));
        }
      }
      MbarrierWait<true>(bar, static_cast<uint32_t>(t >> 1) & 1u);
      float2 all[kRtMaxCluster];
#pragma unroll
      for (int r = 0; r < kRtMaxCluster; ++r) {
        if (r < g.cluster) all[r] = parts[s][r][lane];
      }
      m = all[0].x;
      q = all[0].y;
#pragma unroll
      for (int r = 1; r < kRtMaxCluster; ++r) {
        if (r < g.cluster) MergeWeighted<kRms>(m, q, all[r].x, all[r].y, merge_w[kRtMaxWarps + r]);
      }
      const float rsigma = 1.0f / sqrtf(q / cols_f + p.eps);
      row_stats[s][lane] = make_float2(kRms ? 0.0f : m, rsigma);
      const int64_t row = group_of(t) * kRtRows + lane;
      if (rank == 0 && row < p.rows) {
        p.rsigma[row] = rsigma;
        if (!kRms) p.mu[row] = m;
      }
      __syncwarp();  // every lane has read parts[s] before the slot is re-armed
      if (lane == 0 && t + 2 < tiles) MbarrierArriveExpect(bar, part_bytes);
      if constexpr (kMx) {
        NamedArrive<kStatsBarrier>(s, threads);
      } else {
        // Release of every lane's row_stats stores (ordered before lane 0's arrive by the
        // __syncwarp above).
        if (lane == 0) MbarrierArrive(SharedAddress(&stats_ready[s]));
      }
    }
  } else {
    // ---- Compute warps. Lanes 8 r .. 8 r + 7 read one 128-byte run of a row, so each
    // quarter-warp phase of a 16-byte shared load hits 32 distinct banks.
    const int rg = lane / 8;   // rows 8 rg .. 8 rg + 7 of the tile
    const int cg8 = lane % 8;  // columns 8 cg8 .. 8 cg8 + 7 of the warp's 64
    const bool warp_active = warp < active_warps;
    const int64_t col = static_cast<int64_t>(rank * g.warps + warp) * kRtColsPerWarp + 8 * cg8;
    const bool quantize = p.rowwise != nullptr || p.columnwise != nullptr;
    // This thread's first chunk (row 8 rg, its 8 columns) in stage s.
    auto block_of = [&](int i) {
      return stages + ((i % kStages) * kRtRows + 8 * rg) * row_uint4 + warp * (kRtColsPerWarp / 8) + cg8;
    };
    auto wait_staged = [&](int i) {
      MbarrierWait<false>(SharedAddress(&staged[i % kStages]), static_cast<uint32_t>(i / kStages) & 1u);
    };

    // In a partial last row group the moments of rows past the tensor come from stage rows
    // the producer did not copy (an earlier tile's, or never written on a stage's first
    // use); their statistics are never stored and those rows are never normalized, but
    // compute-sanitizer's initcheck reports the reads.
    float amax = 0.0f;
    if (tiles > 0) {
      wait_staged(0);
      if (warp_active) WarpMoments<kType, kRms, 1>(block_of(0), row_uint4, lane, rg, cg8, warp, warp_stats[0]);
      NamedArrive<kPartialsBarrier>(0, threads);
    }

    float w[8], b[8];  // this lane's 8 columns of the weight and bias
    LoadAffine8<kRms>(p, warp_active ? col : 0, w, b);
    // Paired order: the columnwise codes of the pair's first tile (rows 0-3 of this lane's
    // 8 row block, columns col .. col + 7; rows 4-7 in held_rows4), stored with the second
    // tile's; after the second tile, the stores it left for the next one (StorePairColumns),
    // in the same two places. `later` says that they are there, later_row0 for which pair.
    uint32_t held_first[8];
    bool later = false;
    int64_t later_row0 = 0;
    // This thread's word k of held_rows4 (one slot in the other instantiations, which never
    // reach it: paired_tiles is 0 there).
    auto held_word = [&](int k) -> uint32_t& { return held_rows4[kPaired ? k : 0][threadIdx.x]; };

    for (int i = 0; i < tiles; ++i) {
      const int s = i & 1;
      if (i + 1 < tiles) {
        wait_staged(i + 1);
        if (warp_active) {
          WarpMoments<kType, kRms, 1>(block_of(i + 1), row_uint4, lane, rg, cg8, warp, warp_stats[s ^ 1]);
        }
        NamedArrive<kPartialsBarrier>(s ^ 1, threads);
      }
      // row_stats[s] of tile i. kMx: a named barrier, so that every compute warp has finished
      // tile i - 1 when warp 0 writes that tile's rowwise scales below.
      if constexpr (kMx) {
        NamedSync<kStatsBarrier>(s, threads);
      } else {
        // Each warp waits for the statistics alone, not for the other compute warps: the
        // trace showed the warps finishing a tile up to 1 us apart (higher warps first), and
        // a block-wide barrier here held the early ones idle. Tile i is
        // phase i / 2 of stats_ready[i % 2]; row_stats[s] is rewritten for tile i + 2 only
        // after every compute warp has arrived with its partials of tile i + 2, i.e. after
        // it normalized tile i.
        MbarrierWait<false>(SharedAddress(&stats_ready[s]), static_cast<uint32_t>(i >> 1) & 1u);
      }

      const int64_t my_row = group_of(i) * kRtRows + 8 * rg;
      // Paired order: tile i holds the first or the second group of a pair.
      const bool pair_first = i < paired_tiles && (i & 1) == 0;
      const bool pair_second = i < paired_tiles && (i & 1) == 1;
      if constexpr (kMx) {
        // MXFP8 (kernels/cuda/normalization/normalization_register_tile_mxfp8.cuh, this kernel's lane bits:
        // row blocks across cg8 bits 0-1 = lane bits 1, 2; column blocks across rg = lane
        // bits 8, 16). Every lane of an active warp takes part (shuffles); y at run time.
        if (warp_active) {
          Mxfp8Tile<kType, kFormat, 1, 2, 8, 16>(p, block_of(i), row_uint4, &row_stats[s][8 * rg], w, b, lane, my_row,
                                                my_row < p.rows, col, group_of(i), amax,
                                                &row_scales[s][8 * rg][2 * warp + cg8 / 4], kScaleRowBytes);
        }
        // Tile i - 1's rowwise codes: every compute warp finished that tile before the
        // statistics barrier above, and none writes its buffer again before warp 0 has
        // arrived at the next one.
        if (warp == 0 && i > 0 && p.rowwise != nullptr) {
          WriteRowScales(p, row_scales[s ^ 1], group_of(i - 1), rank * g.warps * 2, active_warps * 2, lane);
        }
      } else {
        if (warp_active && my_row < p.rows) {
          const uint4* const tile = block_of(i);
          const float2* const stats = &row_stats[s][8 * rg];
          if (quantize) {
            uint32_t lo[8], hi[8];
            float tile_max = NormalizeRows<kType, kFormat, kY, true, false>(p, tile, row_uint4, stats, w, b,
                                                                           my_row, col, lo, hi);
            if (tile_max != tile_max) {
              // A NaN among these 64 values (rare): the same rows again with the encoder that
              // maps NaN products to 0x7F (it gives the same codes for every other value) and
              // the exact y conversion. The empty asm hides that the pointers are the same, so
              // the compiler reloads the tile here instead of keeping the 64 values of the
              // first pass live for it.
              const uint4* again = tile;
              const float2* again_stats = stats;
              asm volatile("" : "+l"(again), "+l"(again_stats));
              NormalizeRows<kType, kFormat, kY, true, true>(p, again, row_uint4, again_stats, w, b, my_row, col,
                                                            lo, hi);
            }
            amax = MaxNaN(amax, tile_max);
            if (p.rowwise != nullptr) {
              uint8_t* out = p.rowwise + my_row * p.cols + col;
#pragma unroll
              for (int k = 0; k < 8; ++k, out += p.cols) {
                *reinterpret_cast<uint2*>(out) = make_uint2(lo[k], hi[k]);
              }
            }
            if (p.columnwise != nullptr) {
              uint32_t first[8], second[8];  // rows 0-3 and 4-7 of columns col .. col + 7
              Transpose4x4(lo, first);
              Transpose4x4(hi, first + 4);
              Transpose4x4(lo + 4, second);
              Transpose4x4(hi + 4, second + 4);
              if (later) {  // the previous pair's columns 4-7, before their registers are reused
                StoreLaterPairColumns(p, held_first, held_rows4, col, later_row0, rg, cg8);
                later = false;
              }
              if (pair_first) {
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                  held_first[e] = first[e];
                  held_word(e) = second[e];
                }
              } else if (pair_second) {
                uint32_t held_second[8], later_a[8], later_b[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) held_second[e] = held_word(e);
                later_row0 = my_row - kRtRows - 8 * rg;
                StorePairColumns(p, held_first, held_second, first, second, col, later_row0, rg, cg8, later_a,
                                 later_b);
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                  held_first[k] = later_a[k];
                  held_word(k) = later_b[k];
                }
                later = true;
              } else {
                uint8_t* out = p.columnwise + col * p.rows + my_row;
                const uint64_t policy = L2EvictLastPolicy();
#pragma unroll
                for (int e = 0; e < 8; ++e, out += p.rows) StoreGlobal8EvictLast(out, first[e], second[e], policy);
              }
            }
          } else {
            const float tile_max = NormalizeRows<kType, kFormat, kY, false, false>(p, tile, row_uint4, stats, w, b,
                                                                                  my_row, col, nullptr, nullptr);
            if (kY && tile_max != tile_max) {  // y again with the exact conversion (see above)
              const uint4* again = tile;
              const float2* again_stats = stats;
              asm volatile("" : "+l"(again), "+l"(again_stats));
              NormalizeRows<kType, kFormat, kY, false, true>(p, again, row_uint4, again_stats, w, b, my_row, col,
                                                             nullptr, nullptr);
            }
            amax = MaxNaN(amax, tile_max);
          }
        }
      }
      if (later && !pair_second) {
        // A lane that stored nothing in this tile (rows past the tensor).
        StoreLaterPairColumns(p, held_first, held_rows4, col, later_row0, rg, cg8);
        later = false;
      }
      __syncwarp();  // the whole warp is done reading stage i % kStages
      if (lane == 0) MbarrierArrive(SharedAddress(&drained[i % kStages]));
    }

    if (later) StoreLaterPairColumns(p, held_first, held_rows4, col, later_row0, rg, cg8);  // the last pair's
    if constexpr (kMx) {  // the last tile's rowwise codes, once every compute warp is done with it
      if (tiles > 0 && p.rowwise != nullptr) {
        NamedSync<kComputeBarrier>(0, g.warps * 32);
        if (warp == 0) {
          WriteRowScales(p, row_scales[(tiles - 1) & 1], group_of(tiles - 1), rank * g.warps * 2, active_warps * 2,
                         lane);
        }
      }
    }
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
    if (!kMx && threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) {  // MXFP8: E8M0 scales only
      if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
      if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
    }
  }
  cluster.sync();  // no CTA leaves while a peer's st.async into it may be in flight
}

using KernelFn = void (*)(NormForwardParams, RtGeometry, int);

// The paired row-group order (columnwise codes stored as 64-byte runs) is an instantiation
// of its own: its held codes cost the other outputs' kernels registers. Not with y: there
// ptxas spilled 40 bytes per thread.
bool UsesPairs(const NormForwardParams& p) {
  return !p.mxfp8 && p.columnwise != nullptr && p.y == nullptr && p.kernel != NormForwardKernel::kStatsWarpContiguous;
}

// The kernel's `order` bits for p.kernel.
int OrderOf(const NormForwardParams& p) {
  if (p.kernel == NormForwardKernel::kStatsWarpContiguous) return kContiguousOrder;
  return p.kernel == NormForwardKernel::kStatsWarpQuads ? kQuadOrder : 0;
}

template <NormDType kType, Fp8Format kFormat, bool kY, bool kMx, bool kPaired = false>
KernelFn KernelForRms(bool rms) {
  return rms ? NormForwardStatsWarpKernel<kType, kFormat, true, kY, kMx, kPaired>
             : NormForwardStatsWarpKernel<kType, kFormat, false, kY, kMx, kPaired>;
}

// The MXFP8 instantiations take y at run time (Mxfp8Tile tests p.y), so kY only splits the
// per-tensor ones.
template <NormDType kType, Fp8Format kFormat>
KernelFn KernelForY(const NormForwardParams& p) {
  if (p.mxfp8) return KernelForRms<kType, kFormat, false, true>(p.rms);
  if (UsesPairs(p)) return KernelForRms<kType, kFormat, false, false, true>(p.rms);
  return p.y != nullptr ? KernelForRms<kType, kFormat, true, false>(p.rms)
                        : KernelForRms<kType, kFormat, false, false>(p.rms);
}

template <NormDType kType>
KernelFn KernelFor(const NormForwardParams& p) {
  return p.format == Fp8Format::kE4M3 ? KernelForY<kType, Fp8Format::kE4M3>(p)
                                      : KernelForY<kType, Fp8Format::kE5M2>(p);
}

// any_rows: for the one-CTA-per-row kernel, which takes any row count (the cluster kernel's
// 8-row lane blocks need rows % 8 == 0).
bool Covers(const NormForwardParams& p, bool any_rows) {
  if (p.kernel == NormForwardKernel::kRegisterTile) return false;
  if (p.x_type == NormDType::kFloat32 || p.encoder != Fp8Encoder::kHardware) return false;
  if (p.rows <= 0 || (!any_rows && p.rows % 8 != 0)) return false;
  if (p.cols % kRtColsPerWarp != 0 || p.cols > kRtColsPerWarp * kRtMaxWarps * kRtMaxCluster) return false;
  if (!IsAligned(p.x, 16) || !IsAligned(p.gamma, 16)) return false;
  if (!p.rms && !IsAligned(p.beta, 16)) return false;
  if (p.y != nullptr && !IsAligned(p.y, 16)) return false;
  if (p.rowwise != nullptr && !IsAligned(p.rowwise, 8)) return false;
  if (p.columnwise != nullptr && !IsAligned(p.columnwise, 8)) return false;
  if (p.mxfp8) {  // as the register-tile kernel: whole 32x1 column blocks, scales for each copy
    if (p.rowwise == nullptr && p.columnwise == nullptr) return false;
    if (p.rowwise != nullptr && p.rowwise_e8m0 == nullptr) return false;
    if (p.columnwise != nullptr && (p.columnwise_e8m0 == nullptr || p.rows % kRtRows != 0)) return false;
  }
  return true;
}

// Dynamic shared memory: kStages x tiles of 32 rows x 64 columns per compute warp, 16-bit.
int StagingBytes(int warps) { return kStages * kRtRows * warps * kRtColsPerWarp * 2 + kStageAlign; }


}  // namespace

cudaError_t StatsWarpForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan,
                             cudaStream_t stream, bool launch, bool* handled) {
  *handled = false;
  const bool row_per_cta = TakesRowPerCta(p);
  if (!Covers(p, row_per_cta)) return cudaSuccess;
  if (row_per_cta) {
    *handled = true;
    return RowPerCtaForward(p, usable_sms, plan, stream, launch);
  }
  // The register-tile kernel's geometry (same tiles, so the same statistics order).
  const RtGeometry g = RtGeometryFor(p.rows, p.cols);
  const bool contiguous = p.kernel == NormForwardKernel::kStatsWarpContiguous;

  KernelFn kernel = nullptr;
  switch (p.x_type) {
    case NormDType::kBFloat16: kernel = KernelFor<NormDType::kBFloat16>(p); break;
    case NormDType::kFloat16: kernel = KernelFor<NormDType::kFloat16>(p); break;
    default: return cudaSuccess;
  }
  const int threads = (g.warps + 2) * 32;
  int ctas_per_sm = 0, active_clusters = 0;
  const cudaError_t status = RtOccupancy(kernel, threads, StagingBytes(g.warps), StagingBytes(kRtMaxWarps), g.cluster,
                                         &ctas_per_sm, &active_clusters);
  if (status != cudaSuccess) return status;
  const int64_t clusters = RtClusters(g, usable_sms, ctas_per_sm, active_clusters);
  if (clusters == 0) return cudaSuccess;
  *handled = true;

  if (plan != nullptr) {
    FillRtPlan(g, clusters, ctas_per_sm, usable_sms, StagingBytes(g.warps), plan);
    plan->stats_warp = true;
    plan->contiguous_row_groups = contiguous;
    plan->amax_zeroed_in_kernel = p.amax_sync != nullptr;
    // The kernel's pair_rounds / quad_rounds: whether every cluster gets at least one pair /
    // four full groups.
    plan->paired_row_groups = UsesPairs(p) && PairRounds(p.rows, clusters) > 0;
    plan->quad_row_groups = UsesPairs(p) && (OrderOf(p) & kQuadOrder) != 0 && QuadRounds(p.rows, clusters) > 0;
  }
  if (!launch) return cudaSuccess;
  // With amax_sync the kernel zeroes the amax itself: no reset kernel in front.
  uint32_t* const reset = p.amax_sync != nullptr ? nullptr : p.amax_bits;
  return LaunchRtClusters(kernel, g, clusters, threads, StagingBytes(g.warps), reset, stream, p, g, OrderOf(p));
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
