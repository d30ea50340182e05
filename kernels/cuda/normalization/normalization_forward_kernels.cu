// CUDA LayerNorm / RMSNorm (contract: kernels/normalization.h; launchers:
// normalization_kernels.h).
//
// Forward: BF16 / FP16 shapes with cols a multiple of 64 (<= 8192) and rows a multiple of 8
// go to the stats-warp kernel (normalization_stats_warp.cu; not for MXFP8 output or with
// params.kernel = kRegisterTile) or else the register-tile kernel
// (normalization_register_tile.cu), which give the same bytes; the rest to the
// shared-memory tile kernel here. Both read x once and write y (optional), mu, rsigma and
// the per-tensor FP8 codes, rowwise and transposed (columnwise), with the amax.
//
// Shared-memory tile kernel: one fused kernel reads x once and writes y (optional), mu, rsigma and the
// per-tensor FP8 codes, rowwise and transposed (columnwise), with the amax.
// - Work unit: a tile of 32 rows x C columns, staged in shared memory with 16-byte
//   cp.async copies (zero-filled outside the tensor). A row longer than one tile is
//   split across a thread-block cluster of S <= 8 CTAs (one column slice each); the CTAs
//   exchange per-row partial sums through distributed shared memory, so statistics cost
//   no extra pass over memory. Statistics are two-pass in FP32 over the staged tile:
//   mean first, then the mean of squared deviations (RMSNorm: mean of squares). Every
//   CTA of a cluster adds the S partials in rank order, so all slices use identical
//   mu and rsigma. Partials are double-buffered by pass parity, so one cluster barrier
//   per pass suffices (a buffer is rewritten only after every CTA has passed the next
//   barrier, i.e. finished reading it).
// - The grid is persistent: (SMs - sm_margin) x resident CTAs, each cluster looping over
//   row groups; the x tile of the next row group is prefetched while the columnwise
//   codes of the current one are stored.
// - Phase A: each thread normalizes a 4x4 block (4 rows x 4 columns), y = fma((x - mu) *
//   rsigma, w, beta) in FP32, stores y and the rowwise codes (4 bytes per row), and
//   transposes the 4x4 codes with byte permutes into a column-major code tile in shared
//   memory (32 bytes per column; columns XOR-swizzled within groups of 4 to spread banks).
// - Phase B: the code tile goes out as 16-byte stores, 32 contiguous bytes per column and
//   row group, so the transposed copy is written in whole 32-byte sectors.
// - Rows too long for 8 slices fall back to a statistics kernel plus the same tile kernel
//   reading mu / rsigma from memory (x is then read twice).
// - FP8 codes: q = encode(y * scale), the product one FP32 multiply (__fmul_rn), so the
//   codes equal kernels::QuantizePerTensor of the FP32 y. The encoder is Hopper's
//   cvt.rn.satfinite (two values per instruction), NaN mapped to 0x7F (only blocks that
//   hold a NaN take that patched path): the same codes as core/float_codec.h for every
//   FP32 input (checked exhaustively by the GPU test); the integer codec variant is kept
//   for that comparison and for the benchmark.
// - amax: max over the FP32 bits of |y| as unsigned integers (NaN's bits exceed Inf's,
//   so NaN propagates), warp max, then one atomicMax per CTA.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/cuda/normalization/normalization_register_tile.h"
#include "kernels/cuda/normalization/normalization_stats_warp.h"
#include "kernels/cuda/normalization/normalization_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kTileRows = 32;
constexpr int kSliceAlign = 32;         // tile widths are multiples of this many columns
constexpr int kMaxCluster = 8;          // portable cluster size
constexpr int kRowPadBytes = 16;        // x tile row padding (bank spread, keeps 16 B alignment)
constexpr int kTwoPerSmBudget = 100 * 1024;  // tile bytes that still allow 2 CTAs per SM

// ---------------------------------------------------------------------------------------
// Forward tile kernel.

struct TileGeometry {
  int cols_per_cta = 0;   // C, a multiple of kSliceAlign
  int slices = 0;         // ceil(cols / C) == gridDim.x
  int row_stride = 0;     // bytes per x tile row in shared memory
  int64_t row_groups = 0; // ceil(rows / kTileRows)
  bool clustered = false; // statistics through the cluster (else read from mu / rsigma)
  bool vector_load = false;     // cols * sizeof(x) % 16 == 0 and x 16-byte aligned
  bool vector_y = false;        // cols % 4 == 0 and y aligned for 4-element stores
  bool vector_rowwise = false;  // cols % 4 == 0 (4-byte code stores)
  bool vector_columnwise = false;  // rows % 16 == 0 (16-byte code stores)
};

// The column position of column c in the code tile: a permutation within aligned groups
// of 4 columns that sends the 4-byte stores of one warp to distinct banks (2-way at worst).
__device__ __forceinline__ int SwizzleColumn(int c) { return c ^ ((c >> 2) & 3); }

__device__ __forceinline__ void CpAsync16(void* shared_dst, const void* global_src, bool fill) {
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(shared_dst));
  const uint32_t src_bytes = fill ? 16u : 0u;  // 0: zero-fill the 16 bytes
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(global_src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// Stages rows [row0, row0 + 32) x columns [col0, col0 + C) of x into the tile; zeros
// outside the tensor.
template <NormDType kType>
__device__ __forceinline__ void LoadTile(const NormForwardParams& p, const TileGeometry& g,
                                         int64_t row0, int64_t col0, unsigned char* tile) {
  using Storage = typename Elem<kType>::Storage;
  const Storage* x = static_cast<const Storage*>(p.x);
  if (g.vector_load) {
    constexpr int kPerChunk = 16 / sizeof(Storage);
    const int chunks_per_row = g.cols_per_cta / kPerChunk;
    for (int i = threadIdx.x; i < kTileRows * chunks_per_row; i += kThreads) {
      const int r = i / chunks_per_row;
      const int k = i - r * chunks_per_row;
      const int64_t row = row0 + r;
      const int64_t col = col0 + static_cast<int64_t>(k) * kPerChunk;
      const bool inside = row < p.rows && col < p.cols;
      const Storage* src = inside ? x + row * p.cols + col : x;
      CpAsync16(tile + r * g.row_stride + k * 16, src, inside);
    }
    CpAsyncCommit();
  } else {
    for (int i = threadIdx.x; i < kTileRows * g.cols_per_cta; i += kThreads) {
      const int r = i / g.cols_per_cta;
      const int c = i - r * g.cols_per_cta;
      const int64_t row = row0 + r;
      const int64_t col = col0 + c;
      const Storage v = (row < p.rows && col < p.cols) ? x[row * p.cols + col] : Storage(0);
      reinterpret_cast<Storage*>(tile + r * g.row_stride)[c] = v;
    }
  }
}

// Sum over the valid columns of tile row r of f(x), for the calling warp (result in all
// lanes). f(x) = x - shift squared when `squares`, else x.
template <NormDType kType>
__device__ __forceinline__ float WarpRowSum(const unsigned char* row, int valid_cols, bool squares,
                                            float shift) {
  using Storage = typename Elem<kType>::Storage;
  constexpr int kPerChunk = 16 / sizeof(Storage);
  const int lane = threadIdx.x % 32;
  const int chunks = (valid_cols + kPerChunk - 1) / kPerChunk;
  float sum = 0.0f;
  for (int k = lane; k < chunks; k += 32) {
    float v[kPerChunk];
    Unpack16<kType>(*reinterpret_cast<const uint4*>(row + k * 16), v);
#pragma unroll
    for (int e = 0; e < kPerChunk; ++e) {
      if (k * kPerChunk + e < valid_cols) {
        const float d = v[e] - shift;
        sum += squares ? d * d : v[e];
      }
    }
  }
  return WarpSum(sum);
}

template <NormDType kType, Fp8Format kFormat, Fp8Encoder kEncoder>
__global__ void __launch_bounds__(kThreads)
    NormForwardTileKernel(NormForwardParams p, TileGeometry g) {
  extern __shared__ __align__(16) unsigned char shared[];
  unsigned char* x_tile = shared;
  uint8_t* code_tile = shared + kTileRows * g.row_stride;  // C x 32 bytes, column-major
  __shared__ float partial[2][kTileRows];
  __shared__ float row_mean[kTileRows];
  __shared__ float row_rsigma[kTileRows];

  const int slice = blockIdx.x;
  const int64_t col0 = static_cast<int64_t>(slice) * g.cols_per_cta;
  const int valid_cols = static_cast<int>(min(static_cast<int64_t>(g.cols_per_cta), p.cols - col0));
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const bool quantize = p.rowwise != nullptr || p.columnwise != nullptr;
  const float cols_f = static_cast<float>(p.cols);
  int parity = 0;
  uint32_t local_amax = 0;

  // Adds the partial sums of the cluster's slices, in rank order, for every tile row.
  auto reduce_partials = [&](float* out) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    if (threadIdx.x < kTileRows) {
      float total = 0.0f;
      for (int rank = 0; rank < g.slices; ++rank) {
        total += cluster.map_shared_rank(&partial[parity][0], rank)[threadIdx.x];
      }
      out[threadIdx.x] = total;
    }
    parity ^= 1;
    __syncthreads();
  };

  int64_t group = blockIdx.y;
  if (group < g.row_groups) LoadTile<kType>(p, g, group * kTileRows, col0, x_tile);
  for (; group < g.row_groups; group += gridDim.y) {
    const int64_t row0 = group * kTileRows;
    if (g.vector_load) CpAsyncWaitAll();
    __syncthreads();

    // Row statistics.
    if (g.clustered) {
      if (!p.rms) {
        for (int r = warp; r < kTileRows; r += kWarps) {
          const float s = WarpRowSum<kType>(x_tile + r * g.row_stride, valid_cols, false, 0.0f);
          if (lane == 0) partial[parity][r] = s;
        }
        reduce_partials(row_mean);
        if (threadIdx.x < kTileRows) row_mean[threadIdx.x] /= cols_f;
        __syncthreads();
      } else if (threadIdx.x < kTileRows) {
        row_mean[threadIdx.x] = 0.0f;
      }
      __syncthreads();
      for (int r = warp; r < kTileRows; r += kWarps) {
        const float s =
            WarpRowSum<kType>(x_tile + r * g.row_stride, valid_cols, true, row_mean[r]);
        if (lane == 0) partial[parity][r] = s;
      }
      reduce_partials(row_rsigma);
      if (threadIdx.x < kTileRows) {
        const float var = row_rsigma[threadIdx.x] / cols_f;
        const float rsigma = 1.0f / sqrtf(var + p.eps);
        row_rsigma[threadIdx.x] = rsigma;
        const int64_t row = row0 + threadIdx.x;
        if (slice == 0 && row < p.rows) {
          p.rsigma[row] = rsigma;
          if (!p.rms) p.mu[row] = row_mean[threadIdx.x];
        }
      }
    } else if (threadIdx.x < kTileRows) {
      const int64_t row = row0 + threadIdx.x;
      const bool inside = row < p.rows;
      row_mean[threadIdx.x] = (inside && !p.rms) ? p.mu[row] : 0.0f;
      row_rsigma[threadIdx.x] = inside ? p.rsigma[row] : 0.0f;
    }
    __syncthreads();

    // Phase A: 4x4 blocks. A warp covers 16 rows x 32 columns per unit.
    const int q = lane / 8;  // rows 4q .. 4q+3 of the unit
    const int gc = lane % 8; // columns 4gc .. 4gc+3 of the unit
    const int units = 2 * (g.cols_per_cta / 32);
    for (int u = warp; u < units; u += kWarps) {
      const int rbase = 16 * (u & 1) + 4 * q;
      const int cbase = 32 * (u >> 1) + 4 * gc;
      if (cbase >= valid_cols) continue;  // whole block outside the tensor
      const int ncols = min(4, valid_cols - cbase);
      const int64_t col = col0 + cbase;
      float w[4], b[4];
      for (int i = 0; i < 4; ++i) {
        w[i] = i < ncols ? __ldg(p.gamma + col + i) : 0.0f;
        if (p.zero_centered_gamma) w[i] += 1.0f;
        b[i] = (i < ncols && !p.rms) ? __ldg(p.beta + col + i) : 0.0f;
      }
      float y[4][4];
      uint32_t block_bits = 0;  // max |y| bits over the block's elements inside the tensor
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int r = rbase + k;
        const int64_t row = row0 + r;
        LoadShared4<kType>(x_tile + r * g.row_stride + cbase * sizeof(typename Elem<kType>::Storage), y[k]);
        const float mean = row_mean[r];
        const float rsigma = row_rsigma[r];
#pragma unroll
        for (int i = 0; i < 4; ++i) y[k][i] = fmaf((y[k][i] - mean) * rsigma, w[i], b[i]);
        if (row < p.rows) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            if (i < ncols) block_bits = max(block_bits, MagnitudeBits(y[k][i]));
          }
          if (p.y != nullptr) StoreY4(p.y, p.y_type, row * p.cols + col, y[k], ncols, g.vector_y);
        }
      }
      local_amax = max(local_amax, block_bits);
      uint32_t row_codes[4];
      if (quantize) {
        if (block_bits > 0x7F800000u) {  // a NaN: take the patched path for this block
#pragma unroll
          for (int k = 0; k < 4; ++k) row_codes[k] = Encode4<kFormat, kEncoder, true>(y[k], p.scale);
        } else {
#pragma unroll
          for (int k = 0; k < 4; ++k) row_codes[k] = Encode4<kFormat, kEncoder, false>(y[k], p.scale);
        }
        if (p.rowwise != nullptr) {
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const int64_t row = row0 + rbase + k;
            if (row >= p.rows) continue;
            uint8_t* dst = p.rowwise + row * p.cols + col;
            if (g.vector_rowwise && ncols == 4) {
              *reinterpret_cast<uint32_t*>(dst) = row_codes[k];
            } else {
#pragma unroll
              for (int i = 0; i < 4; ++i) {
                if (i < ncols) dst[i] = static_cast<uint8_t>(row_codes[k] >> (8 * i));
              }
            }
          }
        }
      }
      if (p.columnwise != nullptr) {
        // Word i holds column cbase + i for rows rbase .. rbase + 3.
        uint32_t columns[4];
        Transpose4x4(row_codes, columns);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          *reinterpret_cast<uint32_t*>(code_tile + SwizzleColumn(cbase + i) * kTileRows + rbase) =
              columns[i];
        }
      }
    }
    __syncthreads();  // x tile free, code tile complete

    const int64_t next = group + gridDim.y;
    if (next < g.row_groups) LoadTile<kType>(p, g, next * kTileRows, col0, x_tile);

    // Phase B: the transposed codes, 16 bytes (16 rows of one column) per thread.
    if (p.columnwise != nullptr) {
      for (int i = threadIdx.x; i < 2 * g.cols_per_cta; i += kThreads) {
        const int c = i >> 1;
        const int half = i & 1;
        const int64_t row = row0 + 16 * half;
        if (c >= valid_cols || row >= p.rows) continue;
        const uint4 v =
            *reinterpret_cast<const uint4*>(code_tile + SwizzleColumn(c) * kTileRows + 16 * half);
        uint8_t* dst = p.columnwise + (col0 + c) * p.rows + row;
        if (g.vector_columnwise) {
          *reinterpret_cast<uint4*>(dst) = v;
        } else {
          const uint32_t words[4] = {v.x, v.y, v.z, v.w};
          const int n = static_cast<int>(min(static_cast<int64_t>(16), p.rows - row));
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            if (e < n) dst[e] = static_cast<uint8_t>(words[e / 4] >> (8 * (e % 4)));
          }
        }
      }
    }
  }

  if (p.amax_bits != nullptr) {
    const uint32_t block_amax = BlockMax<kThreads>(local_amax);
    if (threadIdx.x == 0 && block_amax != 0u) atomicMax(p.amax_bits, block_amax);
  }
  if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) {
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
  }
  // No CTA may leave while others can still read its partials.
  if (g.clustered) cg::this_cluster().sync();
}

// Statistics for rows too long for one cluster: one CTA per row (persistent), two passes
// over the row in memory.
template <NormDType kType>
__global__ void __launch_bounds__(kThreads) NormStatsKernel(NormForwardParams p) {
  using Storage = typename Elem<kType>::Storage;
  const Storage* x = static_cast<const Storage*>(p.x);
  __shared__ float warp_sums[2][kWarps];
  int parity = 0;
  auto block_sum = [&](float v) {
    v = WarpSum(v);
    if (threadIdx.x % 32 == 0) warp_sums[parity][threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int w = 0; w < kWarps; ++w) total += warp_sums[parity][w];
    parity ^= 1;
    return total;
  };
  const float cols_f = static_cast<float>(p.cols);
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const Storage* xr = x + row * p.cols;
    float mean = 0.0f;
    if (!p.rms) {
      float s = 0.0f;
      for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) s += Elem<kType>::ToFloat(xr[c]);
      mean = block_sum(s) / cols_f;
    }
    float s = 0.0f;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float d = Elem<kType>::ToFloat(xr[c]) - mean;
      s += d * d;
    }
    const float var = block_sum(s) / cols_f;
    if (threadIdx.x == 0) {
      p.rsigma[row] = 1.0f / sqrtf(var + p.eps);
      if (!p.rms) p.mu[row] = mean;
    }
  }
}

__global__ void WriteScaleInvKernel(float scale_inv, float* rowwise, float* columnwise) {
  if (rowwise != nullptr) *rowwise = scale_inv;
  if (columnwise != nullptr) *columnwise = scale_inv;
}


int TileSharedBytes(int cols_per_cta, NormDType x_type, bool columnwise) {
  const int row_stride = cols_per_cta * BytesOf(x_type) + kRowPadBytes;
  return kTileRows * row_stride + (columnwise ? cols_per_cta * kTileRows : 0);
}

int SliceWidth(int64_t cols, int slices) {
  return static_cast<int>(CeilDiv(CeilDiv(cols, slices), kSliceAlign) * kSliceAlign);
}

// Tile shape: the fewest slices (<= 8, one cluster) whose tile leaves room for 2 CTAs per
// SM; else the fewest within the device's shared memory; else separate statistics with
// tiles of the 2-per-SM size.
void ChooseTiles(const NormForwardParams& p, const DeviceLimits& limits, TileGeometry* g) {
  const bool columnwise = p.columnwise != nullptr;
  for (const int budget : {kTwoPerSmBudget, limits.max_shared_optin - 1024}) {
    for (int s = 1; s <= kMaxCluster; ++s) {
      const int width = SliceWidth(p.cols, s);
      if (CeilDiv(p.cols, width) != s) continue;  // rounding left a slice empty
      if (TileSharedBytes(width, p.x_type, columnwise) <= budget) {
        g->cols_per_cta = width;
        g->slices = s;
        g->clustered = true;
        return;
      }
    }
  }
  const int per_column = kTileRows * BytesOf(p.x_type) + (columnwise ? kTileRows : 0);
  int width = (kTwoPerSmBudget - kTileRows * kRowPadBytes) / per_column;
  width = width / kSliceAlign * kSliceAlign;
  g->cols_per_cta = width;
  g->slices = static_cast<int>(CeilDiv(p.cols, width));
  g->clustered = false;
}

// Plans (and, with a stream, launches) the forward pass for one instantiation.
template <NormDType kType, Fp8Format kFormat, Fp8Encoder kEncoder>
cudaError_t PlanOrLaunchForward(const NormForwardParams& p, NormForwardPlan* plan,
                                cudaStream_t stream, bool launch) {
  const auto tile_kernel = NormForwardTileKernel<kType, kFormat, kEncoder>;
  DeviceLimits limits;
  cudaError_t status = GetDeviceLimits(&limits);
  if (status != cudaSuccess) return status;
  if (p.sm_margin < 0 || p.sm_margin >= limits.sms) return cudaErrorInvalidValue;
  const int usable_sms = limits.sms - p.sm_margin;
  bool handled = false;
  status = StatsWarpForward(p, usable_sms, plan, stream, launch, &handled);
  if (status != cudaSuccess || handled) return status;
  status = RegisterTileForward(p, usable_sms, plan, stream, launch, &handled);
  if (status != cudaSuccess || handled) return status;

  TileGeometry g;
  ChooseTiles(p, limits, &g);
  g.row_stride = g.cols_per_cta * BytesOf(p.x_type) + kRowPadBytes;
  g.row_groups = CeilDiv(p.rows, kTileRows);
  g.vector_load = (p.cols * BytesOf(p.x_type)) % 16 == 0 && IsAligned(p.x, 16);
  g.vector_y = p.y != nullptr && p.cols % 4 == 0 && IsAligned(p.y, 4 * BytesOf(p.y_type));
  g.vector_rowwise = p.rowwise != nullptr && p.cols % 4 == 0 && IsAligned(p.rowwise, 4);
  g.vector_columnwise = p.columnwise != nullptr && p.rows % 16 == 0 && IsAligned(p.columnwise, 16);
  const int shared_bytes = TileSharedBytes(g.cols_per_cta, p.x_type, p.columnwise != nullptr);

  int ctas_per_sm = 0;
  status = ResidentCtasPerSm(tile_kernel, shared_bytes, &ctas_per_sm);
  if (status != cudaSuccess) return status;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  const int64_t max_ctas = static_cast<int64_t>(usable_sms) * ctas_per_sm;
  int64_t groups_in_flight = max_ctas / g.slices;
  if (g.clustered) {
    int clusters = 0;
    status = MaxActiveClusters(tile_kernel, shared_bytes, g.slices, &clusters);
    if (status != cudaSuccess) return status;
    if (clusters < 1) return cudaErrorInvalidConfiguration;
    groups_in_flight = std::min<int64_t>(groups_in_flight, clusters);
  }
  groups_in_flight = std::max<int64_t>(1, std::min<int64_t>(groups_in_flight, g.row_groups));
  groups_in_flight = std::min<int64_t>(groups_in_flight, 65535);

  if (plan != nullptr) {
    plan->rows_per_cta = kTileRows;
    plan->cols_per_cta = g.cols_per_cta;
    plan->slices = g.slices;
    plan->cluster_size = g.clustered ? g.slices : 1;
    plan->separate_stats = !g.clustered;
    plan->register_tile = false;
    plan->stats_warp = false;
    plan->contiguous_row_groups = false;
    plan->quad_row_groups = false;
    plan->ctas = static_cast<int>(groups_in_flight * g.slices);
    plan->ctas_per_sm = ctas_per_sm;
    plan->usable_sms = usable_sms;
    plan->shared_bytes = shared_bytes;
  }
  if (!launch) return cudaSuccess;

  if (p.amax_bits != nullptr) {
    status = cudaMemsetAsync(p.amax_bits, 0, sizeof(uint32_t), stream);
    if (status != cudaSuccess) return status;
  }
  if (p.rows == 0) {
    WriteScaleInvKernel<<<1, 1, 0, stream>>>(p.scale_inv, p.rowwise_scale_inv, p.columnwise_scale_inv);
    return cudaGetLastError();
  }
  if (!g.clustered) {
    int stats_per_sm = 0;
    status = ResidentCtasPerSm(NormStatsKernel<kType>, 0, &stats_per_sm);
    if (status != cudaSuccess) return status;
    const int64_t stats_ctas =
        std::max<int64_t>(1, std::min<int64_t>(p.rows, static_cast<int64_t>(usable_sms) * stats_per_sm));
    NormStatsKernel<kType><<<static_cast<unsigned>(stats_ctas), kThreads, 0, stream>>>(p);
    status = cudaGetLastError();
    if (status != cudaSuccess) return status;
  }
  cudaLaunchAttribute attribute;
  const cudaLaunchConfig_t config =
      ClusterLaunchConfig(dim3(g.slices, static_cast<unsigned>(groups_in_flight), 1), g.clustered ? g.slices : 1,
                          kThreads, shared_bytes, stream, &attribute);
  status = cudaLaunchKernelEx(&config, tile_kernel, p, g);
  if (status != cudaSuccess) return status;
  return cudaGetLastError();
}

template <NormDType kType, Fp8Format kFormat>
cudaError_t DispatchEncoder(const NormForwardParams& p, NormForwardPlan* plan, cudaStream_t stream,
                            bool launch) {
  return p.encoder == Fp8Encoder::kHardware
             ? PlanOrLaunchForward<kType, kFormat, Fp8Encoder::kHardware>(p, plan, stream, launch)
             : PlanOrLaunchForward<kType, kFormat, Fp8Encoder::kCodec>(p, plan, stream, launch);
}

template <NormDType kType>
cudaError_t DispatchFormat(const NormForwardParams& p, NormForwardPlan* plan, cudaStream_t stream,
                           bool launch) {
  return p.format == Fp8Format::kE4M3
             ? DispatchEncoder<kType, Fp8Format::kE4M3>(p, plan, stream, launch)
             : DispatchEncoder<kType, Fp8Format::kE5M2>(p, plan, stream, launch);
}

cudaError_t DispatchForward(const NormForwardParams& p, NormForwardPlan* plan, cudaStream_t stream,
                            bool launch) {
  if (p.cols <= 0 || p.rows < 0) return cudaErrorInvalidValue;
  if (p.amax_sync != nullptr) {  // 8-byte aligned (a 64-bit atomic), and apart from the amax word
    const uintptr_t sync = reinterpret_cast<uintptr_t>(p.amax_sync);
    const uintptr_t amax = reinterpret_cast<uintptr_t>(p.amax_bits);
    if (sync % 8 != 0) return cudaErrorInvalidValue;
    if (p.amax_bits != nullptr && amax + 4 > sync && amax < sync + 16) return cudaErrorInvalidValue;
  }
  switch (p.x_type) {
    case NormDType::kFloat32: return DispatchFormat<NormDType::kFloat32>(p, plan, stream, launch);
    case NormDType::kFloat16: return DispatchFormat<NormDType::kFloat16>(p, plan, stream, launch);
    case NormDType::kBFloat16: return DispatchFormat<NormDType::kBFloat16>(p, plan, stream, launch);
  }
  return cudaErrorInvalidValue;
}
}  // namespace

cudaError_t PlanNormForward(const NormForwardParams& params, NormForwardPlan* plan) {
  return DispatchForward(params, plan, nullptr, /*launch=*/false);
}

cudaError_t LaunchNormForward(const NormForwardParams& params, cudaStream_t stream) {
  return DispatchForward(params, nullptr, stream, /*launch=*/true);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
