// CUDA LayerNorm / RMSNorm (contract: kernels/normalization.h; launchers:
// normalization_kernels.h).
//
// Forward: one fused kernel reads x once and writes y (optional), mu, rsigma and the
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
//
// Backward: one CTA per row (persistent over rows). When the row fits in registers
// (16-byte vectors, up to 8 per thread) it is read once: the two row reductions
// (sum(dy w), sum(dy w xhat)) are block reductions in a fixed order, then dx is written.
// dgamma / dbeta partials accumulate in registers per CTA over its rows, are written
// once to a workspace [ctas, h], and a second kernel sums the ctas in a fixed order
// (two-stage, deterministic for a given grid). Other shapes use a streaming variant
// (two reads of the row; partials accumulate in the CTA's own workspace row).
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/float_codec.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/normalization_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 32;
constexpr int kSliceAlign = 32;         // tile widths are multiples of this many columns
constexpr int kMaxCluster = 8;          // portable cluster size
constexpr int kRowPadBytes = 16;        // x tile row padding (bank spread, keeps 16 B alignment)
constexpr int kTwoPerSmBudget = 100 * 1024;  // tile bytes that still allow 2 CTAs per SM
constexpr int kMaxBackwardIters = 8;    // 16-byte vectors per thread in the backward kernel

// ---------------------------------------------------------------------------------------
// Element types.

template <NormDType kType>
struct Elem;

template <>
struct Elem<NormDType::kFloat32> {
  using Storage = float;
  __device__ static float ToFloat(float v) { return v; }
};

template <>
struct Elem<NormDType::kBFloat16> {
  using Storage = uint16_t;
  __device__ static float ToFloat(uint16_t v) { return Bf16ToFloat(v); }
};

template <>
struct Elem<NormDType::kFloat16> {
  using Storage = uint16_t;
  // FP16 -> FP32 is exact, so the hardware conversion equals the codec.
  __device__ static float ToFloat(uint16_t v) { return __half2float(__ushort_as_half(v)); }
};

// Unpacks the 16-byte vector `v` (4 FP32 or 8 16-bit values) into floats.
template <NormDType kType>
__device__ __forceinline__ void Unpack16(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kType == NormDType::kFloat32) {
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = Elem<kType>::ToFloat(static_cast<uint16_t>(words[i] & 0xFFFFu));
      out[2 * i + 1] = Elem<kType>::ToFloat(static_cast<uint16_t>(words[i] >> 16));
    }
  }
}

// Four consecutive elements from shared memory (8- or 16-byte aligned).
template <NormDType kType>
__device__ __forceinline__ void LoadShared4(const unsigned char* p, float out[4]) {
  if constexpr (kType == NormDType::kFloat32) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.x & 0xFFFFu));
    out[1] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.x >> 16));
    out[2] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.y & 0xFFFFu));
    out[3] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.y >> 16));
  }
}

__device__ __forceinline__ uint16_t FloatTo16(NormDType type, float v) {
  return type == NormDType::kBFloat16 ? FloatToBf16(v) : __half_as_ushort(__float2half_rn(v));
}

template <NormDType kType>
__device__ __forceinline__ uint16_t FloatTo16(float v) {
  return FloatTo16(kType, v);
}

// Stores v[0..n) at y[index..index+n) in `type`; all four with one vector store when
// `vector` (index % 4 == 0 and y aligned).
__device__ __forceinline__ void StoreY4(void* y, NormDType type, int64_t index, const float v[4],
                                        int n, bool vector) {
  if (type == NormDType::kFloat32) {
    float* out = static_cast<float*>(y) + index;
    if (vector && n == 4) {
      *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i < n) out[i] = v[i];
      }
    }
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(y) + index;
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) h[i] = FloatTo16(type, v[i]);
  if (vector && n == 4) {
    *reinterpret_cast<uint2*>(out) =
        make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i < n) out[i] = h[i];
    }
  }
}

// ---------------------------------------------------------------------------------------
// FP8 encoding.

template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t CodecEncode(float v) {
  return kFormat == Fp8Format::kE4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

// Codes of a (low byte) and b (high byte), exactly core/float_codec.h's (NaN -> 0x7F).
template <Fp8Format kFormat, Fp8Encoder kEncoder>
__device__ __forceinline__ uint32_t Encode2(float a, float b) {
  if constexpr (kEncoder == Fp8Encoder::kCodec) {
    return CodecEncode<kFormat>(a) | (CodecEncode<kFormat>(b) << 8);
  } else {
    uint32_t codes = CvtPair<kFormat>(a, b);
    if (a != a) codes = (codes & 0xFF00u) | 0x7Fu;
    if (b != b) codes = (codes & 0x00FFu) | 0x7F00u;
    return codes;
  }
}

// Four codes of v[0..3] * scale, v[0] in the low byte. kMayHaveNan = false skips the NaN
// patch of the hardware path (callers know no value is NaN).
template <Fp8Format kFormat, Fp8Encoder kEncoder, bool kMayHaveNan>
__device__ __forceinline__ uint32_t Encode4(const float v[4], float scale) {
  const float s0 = __fmul_rn(v[0], scale), s1 = __fmul_rn(v[1], scale);
  const float s2 = __fmul_rn(v[2], scale), s3 = __fmul_rn(v[3], scale);
  if constexpr (kEncoder == Fp8Encoder::kHardware && !kMayHaveNan) {
    return CvtPair<kFormat>(s0, s1) | (CvtPair<kFormat>(s2, s3) << 16);
  } else {
    return Encode2<kFormat, kEncoder>(s0, s1) | (Encode2<kFormat, kEncoder>(s2, s3) << 16);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

// Max over the block, valid in thread 0; every thread must call it.
__device__ uint32_t BlockMax(uint32_t value) {
  __shared__ uint32_t warp_max[kWarps];
  value = __reduce_max_sync(0xFFFFFFFFu, value);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? warp_max[lane] : 0u;
    value = __reduce_max_sync(0xFFFFFFFFu, value);
  }
  return value;
}

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
        // 4x4 byte transpose: word i holds column cbase + i for rows rbase .. rbase + 3.
        const uint32_t t0 = __byte_perm(row_codes[0], row_codes[1], 0x5140);
        const uint32_t t1 = __byte_perm(row_codes[2], row_codes[3], 0x5140);
        const uint32_t t2 = __byte_perm(row_codes[0], row_codes[1], 0x7362);
        const uint32_t t3 = __byte_perm(row_codes[2], row_codes[3], 0x7362);
        const uint32_t columns[4] = {__byte_perm(t0, t1, 0x5410), __byte_perm(t0, t1, 0x7632),
                                     __byte_perm(t2, t3, 0x5410), __byte_perm(t2, t3, 0x7632)};
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
    const uint32_t block_amax = BlockMax(local_amax);
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

// ---------------------------------------------------------------------------------------
// Backward kernels.

// One row per iteration, held in registers: kIters 16-byte vectors of dy and of x per
// thread. Partials: workspace[blockIdx.x, :] = dgamma part, workspace[gridDim.x +
// blockIdx.x, :] = dbeta part (LayerNorm).
template <NormDType kType, int kIters, bool kRms>
__global__ void __launch_bounds__(kThreads, kIters >= 8 ? 1 : 2)
    NormBackwardRowKernel(NormBackwardParams p) {
  using Storage = typename Elem<kType>::Storage;
  constexpr int kVec = 16 / sizeof(Storage);
  const int64_t nvec = p.cols / kVec;
  __shared__ float warp_sums[2][kWarps][2];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  float dgamma[kIters][kVec];
  float dbeta[kRms ? 1 : kIters][kVec];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int e = 0; e < kVec; ++e) {
      dgamma[k][e] = 0.0f;
      if (!kRms) dbeta[kRms ? 0 : k][e] = 0.0f;
    }
  }
  const float w_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  int parity = 0;

  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const uint4* dy_row = reinterpret_cast<const uint4*>(static_cast<const Storage*>(p.dy) + row * p.cols);
    const uint4* x_row = reinterpret_cast<const uint4*>(static_cast<const Storage*>(p.x) + row * p.cols);
    uint4 dy_v[kIters];
    uint4 x_v[kIters];
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v < nvec) {
        dy_v[k] = __ldcs(dy_row + v);
        x_v[k] = __ldcs(x_row + v);
      }
    }
    const float mean = kRms ? 0.0f : p.mu[row];
    const float rsigma = p.rsigma[row];
    float sum_dyw = 0.0f;
    float sum_dyw_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v >= nvec) continue;
      float dy[kVec], x[kVec], w[kVec];
      Unpack16<kType>(dy_v[k], dy);
      Unpack16<kType>(x_v[k], x);
      const float4* g4 = reinterpret_cast<const float4*>(p.gamma + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const float4 gv = __ldg(g4 + j);
        w[4 * j] = gv.x;
        w[4 * j + 1] = gv.y;
        w[4 * j + 2] = gv.z;
        w[4 * j + 3] = gv.w;
      }
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        const float xhat = (x[e] - mean) * rsigma;
        const float dyw = dy[e] * (w[e] + w_shift);
        sum_dyw += dyw;
        sum_dyw_xhat = fmaf(dyw, xhat, sum_dyw_xhat);
        dgamma[k][e] = fmaf(dy[e], xhat, dgamma[k][e]);
        if (!kRms) dbeta[kRms ? 0 : k][e] += dy[e];
      }
    }
    sum_dyw = WarpSum(sum_dyw);
    sum_dyw_xhat = WarpSum(sum_dyw_xhat);
    if (lane == 0) {
      warp_sums[parity][warp][0] = sum_dyw;
      warp_sums[parity][warp][1] = sum_dyw_xhat;
    }
    __syncthreads();
    float total_dyw = 0.0f;
    float total_dyw_xhat = 0.0f;
    for (int i = 0; i < kWarps; ++i) {
      total_dyw += warp_sums[parity][i][0];
      total_dyw_xhat += warp_sums[parity][i][1];
    }
    parity ^= 1;
    const float mean_dyw = kRms ? 0.0f : total_dyw * inv_cols;
    const float mean_dyw_xhat = total_dyw_xhat * inv_cols;

    uint4* dx_row = reinterpret_cast<uint4*>(static_cast<Storage*>(p.dx) + row * p.cols);
#pragma unroll
    for (int k = 0; k < kIters; ++k) {
      const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (v >= nvec) continue;
      float dy[kVec], x[kVec], dx[kVec];
      Unpack16<kType>(dy_v[k], dy);
      Unpack16<kType>(x_v[k], x);
      const float4* g4 = reinterpret_cast<const float4*>(p.gamma + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const float4 gv = __ldg(g4 + j);
        const float w[4] = {gv.x, gv.y, gv.z, gv.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int e = 4 * j + i;
          const float xhat = (x[e] - mean) * rsigma;
          const float dyw = dy[e] * (w[i] + w_shift);
          dx[e] = rsigma * (dyw - mean_dyw - xhat * mean_dyw_xhat);
        }
      }
      uint4 out;
      if constexpr (kType == NormDType::kFloat32) {
        out = make_uint4(__float_as_uint(dx[0]), __float_as_uint(dx[1]), __float_as_uint(dx[2]),
                         __float_as_uint(dx[3]));
      } else {
        uint32_t words[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          words[i] = FloatTo16<kType>(dx[2 * i]) |
                     (static_cast<uint32_t>(FloatTo16<kType>(dx[2 * i + 1])) << 16);
        }
        out = make_uint4(words[0], words[1], words[2], words[3]);
      }
      __stcs(dx_row + v, out);
    }
  }

  // Partials of this CTA (zeros if it had no rows).
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int64_t v = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (v >= nvec) continue;
    float4* dg = reinterpret_cast<float4*>(p.workspace + blockIdx.x * p.cols + v * kVec);
#pragma unroll
    for (int j = 0; j < kVec / 4; ++j) {
      dg[j] = make_float4(dgamma[k][4 * j], dgamma[k][4 * j + 1], dgamma[k][4 * j + 2],
                          dgamma[k][4 * j + 3]);
    }
    if (!kRms) {
      float4* db = reinterpret_cast<float4*>(p.workspace + (gridDim.x + blockIdx.x) * p.cols + v * kVec);
#pragma unroll
      for (int j = 0; j < kVec / 4; ++j) {
        const int kk = kRms ? 0 : k;
        db[j] = make_float4(dbeta[kk][4 * j], dbeta[kk][4 * j + 1], dbeta[kk][4 * j + 2],
                            dbeta[kk][4 * j + 3]);
      }
    }
  }
}

// Any shape: two passes over the row in memory; partials accumulate in the CTA's own
// (zeroed) workspace rows, each column always touched by the same thread.
template <NormDType kType>
__global__ void __launch_bounds__(kThreads) NormBackwardStreamKernel(NormBackwardParams p) {
  using Storage = typename Elem<kType>::Storage;
  __shared__ float warp_sums[2][kWarps][2];
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const float inv_cols = 1.0f / static_cast<float>(p.cols);
  const float w_shift = p.zero_centered_gamma ? 1.0f : 0.0f;
  float* dgamma = p.workspace + blockIdx.x * p.cols;
  float* dbeta = p.workspace + (gridDim.x + blockIdx.x) * p.cols;
  int parity = 0;
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const Storage* dy = static_cast<const Storage*>(p.dy) + row * p.cols;
    const Storage* x = static_cast<const Storage*>(p.x) + row * p.cols;
    const float mean = p.rms ? 0.0f : p.mu[row];
    const float rsigma = p.rsigma[row];
    float sum_dyw = 0.0f;
    float sum_dyw_xhat = 0.0f;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float d = Elem<kType>::ToFloat(dy[c]);
      const float xhat = (Elem<kType>::ToFloat(x[c]) - mean) * rsigma;
      const float dyw = d * (p.gamma[c] + w_shift);
      sum_dyw += dyw;
      sum_dyw_xhat = fmaf(dyw, xhat, sum_dyw_xhat);
      dgamma[c] = fmaf(d, xhat, dgamma[c]);
      if (!p.rms) dbeta[c] += d;
    }
    sum_dyw = WarpSum(sum_dyw);
    sum_dyw_xhat = WarpSum(sum_dyw_xhat);
    if (lane == 0) {
      warp_sums[parity][warp][0] = sum_dyw;
      warp_sums[parity][warp][1] = sum_dyw_xhat;
    }
    __syncthreads();
    float total_dyw = 0.0f;
    float total_dyw_xhat = 0.0f;
    for (int i = 0; i < kWarps; ++i) {
      total_dyw += warp_sums[parity][i][0];
      total_dyw_xhat += warp_sums[parity][i][1];
    }
    parity ^= 1;
    const float mean_dyw = p.rms ? 0.0f : total_dyw * inv_cols;
    const float mean_dyw_xhat = total_dyw_xhat * inv_cols;
    Storage* dx = static_cast<Storage*>(p.dx) + row * p.cols;
    for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
      const float xhat = (Elem<kType>::ToFloat(x[c]) - mean) * rsigma;
      const float dyw = Elem<kType>::ToFloat(dy[c]) * (p.gamma[c] + w_shift);
      const float v = rsigma * (dyw - mean_dyw - xhat * mean_dyw_xhat);
      if constexpr (kType == NormDType::kFloat32) {
        dx[c] = v;
      } else {
        dx[c] = FloatTo16<kType>(v);
      }
    }
  }
}

// out[c] = sum over parts b (in order of b, 8 strided lanes then a fixed 8-way sum) of
// partials[b, c]. Block (32, 8); blockIdx.y selects dgamma (0) or dbeta (1).
constexpr int kSumLanes = 8;

__global__ void __launch_bounds__(32 * kSumLanes)
    ColumnSumKernel(const float* workspace, int parts, int64_t cols, float* dgamma, float* dbeta) {
  __shared__ float sums[kSumLanes][33];
  const float* partials = workspace + static_cast<int64_t>(blockIdx.y) * parts * cols;
  float* out = blockIdx.y == 0 ? dgamma : dbeta;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    int b = threadIdx.y;
    for (; b + 3 * kSumLanes < parts; b += 4 * kSumLanes) {
      const float a0 = partials[b * cols + c];
      const float a1 = partials[(b + kSumLanes) * cols + c];
      const float a2 = partials[(b + 2 * kSumLanes) * cols + c];
      const float a3 = partials[(b + 3 * kSumLanes) * cols + c];
      s += ((a0 + a1) + (a2 + a3));
    }
    for (; b < parts; b += kSumLanes) s += partials[b * cols + c];
  }
  sums[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float total = 0.0f;
    for (int i = 0; i < kSumLanes; ++i) total += sums[i][threadIdx.x];
    out[c] = total;
  }
}

// ---------------------------------------------------------------------------------------
// Encoder comparison (test hook).

template <Fp8Format kFormat>
__global__ void CompareEncodersKernel(uint64_t first, uint64_t count,
                                      unsigned long long* mismatches, uint32_t* first_mismatch) {
  unsigned long long local = 0;
  uint32_t smallest = 0xFFFFFFFFu;
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const uint32_t bits = static_cast<uint32_t>(first + i);
    // Each pattern in the low byte, and its negation in the high byte.
    const float a = __uint_as_float(bits);
    const float b = __uint_as_float(bits ^ 0x80000000u);
    const uint32_t hw = Encode2<kFormat, Fp8Encoder::kHardware>(a, b);
    const uint32_t codec = Encode2<kFormat, Fp8Encoder::kCodec>(a, b);
    if (hw != codec) {
      ++local;
      smallest = min(smallest, bits);
    }
  }
  if (local != 0) {
    atomicAdd(mismatches, local);
    atomicMin(first_mismatch, smallest);
  }
}

// ---------------------------------------------------------------------------------------
// Host side.

int BytesOf(NormDType type) { return type == NormDType::kFloat32 ? 4 : 2; }

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct DeviceLimits {
  int sms = 0;
  int max_shared_optin = 0;
};

cudaError_t GetDeviceLimits(DeviceLimits* limits) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<int, DeviceLimits> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) {
    DeviceLimits l;
    status = cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device);
    if (status != cudaSuccess) return status;
    status = cudaDeviceGetAttribute(&l.max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device);
    if (status != cudaSuccess) return status;
    it = cache.emplace(device, l).first;
  }
  *limits = it->second;
  return cudaSuccess;
}

// Occupancy answers are cached per (device, kernel, shared bytes, cluster size).
using OccupancyKey = std::tuple<int, const void*, int, int>;

template <typename Kernel>
cudaError_t ResidentCtasPerSm(Kernel kernel, int shared_bytes, int* ctas) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<OccupancyKey, int> cache;
  const OccupancyKey key{device, reinterpret_cast<const void*>(kernel), shared_bytes, 0};
  static std::map<std::pair<int, const void*>, int> shared_limit;  // only ever raised
  std::lock_guard<std::mutex> lock(mutex);
  int& limit = shared_limit[{device, reinterpret_cast<const void*>(kernel)}];
  if (shared_bytes > 48 * 1024 && shared_bytes > limit) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
    if (status != cudaSuccess) return status;
    limit = shared_bytes;
  }
  auto it = cache.find(key);
  if (it == cache.end()) {
    int n = 0;
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, shared_bytes);
    if (status != cudaSuccess) return status;
    it = cache.emplace(key, n).first;
  }
  *ctas = it->second;
  return cudaSuccess;
}

template <typename Kernel>
cudaError_t MaxActiveClusters(Kernel kernel, int shared_bytes, int cluster, int* clusters) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<OccupancyKey, int> cache;
  const OccupancyKey key{device, reinterpret_cast<const void*>(kernel), shared_bytes, cluster};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(cluster, 1, 1);
    config.blockDim = dim3(kThreads, 1, 1);
    config.dynamicSmemBytes = shared_bytes;
    cudaLaunchAttribute attribute;
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = cluster;
    attribute.val.clusterDim.y = 1;
    attribute.val.clusterDim.z = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    int n = 0;
    status = cudaOccupancyMaxActiveClusters(&n, kernel, &config);
    if (status != cudaSuccess) return status;
    it = cache.emplace(key, n).first;
  }
  *clusters = it->second;
  return cudaSuccess;
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
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(g.slices, static_cast<unsigned>(groups_in_flight), 1);
  config.blockDim = dim3(kThreads, 1, 1);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute;
  attribute.id = cudaLaunchAttributeClusterDimension;
  attribute.val.clusterDim.x = g.clustered ? g.slices : 1;
  attribute.val.clusterDim.y = 1;
  attribute.val.clusterDim.z = 1;
  config.attrs = &attribute;
  config.numAttrs = 1;
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
  switch (p.x_type) {
    case NormDType::kFloat32: return DispatchFormat<NormDType::kFloat32>(p, plan, stream, launch);
    case NormDType::kFloat16: return DispatchFormat<NormDType::kFloat16>(p, plan, stream, launch);
    case NormDType::kBFloat16: return DispatchFormat<NormDType::kBFloat16>(p, plan, stream, launch);
  }
  return cudaErrorInvalidValue;
}

// Backward.

struct BackwardChoice {
  bool register_resident = false;
  int iters = 0;
};

BackwardChoice ChooseBackward(const NormBackwardParams& p) {
  const int bytes = BytesOf(p.type);
  const int vec = 16 / bytes;
  BackwardChoice choice;
  const bool aligned = (p.cols * bytes) % 16 == 0 && IsAligned(p.dy, 16) && IsAligned(p.x, 16) &&
                       IsAligned(p.dx, 16) && IsAligned(p.gamma, 16);
  if (!aligned) return choice;
  const int64_t nvec = p.cols / vec;
  for (int iters = 1; iters <= kMaxBackwardIters; iters *= 2) {
    if (nvec <= static_cast<int64_t>(kThreads) * iters) {
      choice.register_resident = true;
      choice.iters = iters;
      return choice;
    }
  }
  return choice;
}

template <NormDType kType, int kIters>
const void* RowKernelFor(bool rms) {
  return rms ? reinterpret_cast<const void*>(NormBackwardRowKernel<kType, kIters, true>)
             : reinterpret_cast<const void*>(NormBackwardRowKernel<kType, kIters, false>);
}

template <NormDType kType>
const void* BackwardKernelFor(const NormBackwardParams& p, const BackwardChoice& choice) {
  if (!choice.register_resident) return reinterpret_cast<const void*>(NormBackwardStreamKernel<kType>);
  switch (choice.iters) {
    case 1: return RowKernelFor<kType, 1>(p.rms);
    case 2: return RowKernelFor<kType, 2>(p.rms);
    case 4: return RowKernelFor<kType, 4>(p.rms);
    default: return RowKernelFor<kType, 8>(p.rms);
  }
}

const void* BackwardKernel(const NormBackwardParams& p, const BackwardChoice& choice) {
  switch (p.type) {
    case NormDType::kFloat32: return BackwardKernelFor<NormDType::kFloat32>(p, choice);
    case NormDType::kFloat16: return BackwardKernelFor<NormDType::kFloat16>(p, choice);
    case NormDType::kBFloat16: return BackwardKernelFor<NormDType::kBFloat16>(p, choice);
  }
  return nullptr;
}

cudaError_t PlanBackward(const NormBackwardParams& p, NormBackwardPlan* plan, const void** kernel) {
  if (p.cols <= 0 || p.rows < 0) return cudaErrorInvalidValue;
  DeviceLimits limits;
  cudaError_t status = GetDeviceLimits(&limits);
  if (status != cudaSuccess) return status;
  if (p.sm_margin < 0 || p.sm_margin >= limits.sms) return cudaErrorInvalidValue;
  const BackwardChoice choice = ChooseBackward(p);
  *kernel = BackwardKernel(p, choice);
  int ctas_per_sm = 0;
  status = ResidentCtasPerSm(*kernel, 0, &ctas_per_sm);
  if (status != cudaSuccess) return status;
  if (ctas_per_sm < 1) return cudaErrorInvalidConfiguration;
  plan->register_resident = choice.register_resident;
  plan->threads = kThreads;
  plan->vectors_per_thread = choice.iters;
  plan->usable_sms = limits.sms - p.sm_margin;
  plan->ctas_per_sm = ctas_per_sm;
  plan->ctas = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(p.rows, static_cast<int64_t>(plan->usable_sms) * ctas_per_sm)));
  return cudaSuccess;
}

template <Fp8Format kFormat>
cudaError_t LaunchCompare(uint64_t first, uint64_t count, unsigned long long* mismatches,
                          uint32_t* first_mismatch, cudaStream_t stream) {
  const int blocks = 132 * 8;
  CompareEncodersKernel<kFormat><<<blocks, kThreads, 0, stream>>>(first, count, mismatches, first_mismatch);
  return cudaGetLastError();
}

}  // namespace

cudaError_t PlanNormForward(const NormForwardParams& params, NormForwardPlan* plan) {
  return DispatchForward(params, plan, nullptr, /*launch=*/false);
}

cudaError_t LaunchNormForward(const NormForwardParams& params, cudaStream_t stream) {
  return DispatchForward(params, nullptr, stream, /*launch=*/true);
}

cudaError_t PlanNormBackward(const NormBackwardParams& params, NormBackwardPlan* plan) {
  const void* kernel = nullptr;
  return PlanBackward(params, plan, &kernel);
}

cudaError_t NormBackwardWorkspaceFloats(const NormBackwardParams& params, int64_t* floats) {
  NormBackwardPlan plan;
  const void* kernel = nullptr;
  const cudaError_t status = PlanBackward(params, &plan, &kernel);
  if (status != cudaSuccess) return status;
  *floats = static_cast<int64_t>(plan.ctas) * params.cols * (params.rms ? 1 : 2);
  return cudaSuccess;
}

cudaError_t LaunchNormBackward(const NormBackwardParams& p, cudaStream_t stream) {
  NormBackwardPlan plan;
  const void* kernel = nullptr;
  cudaError_t status = PlanBackward(p, &plan, &kernel);
  if (status != cudaSuccess) return status;
  const int parts_per_output = plan.ctas;
  if (p.rows == 0) {
    status = cudaMemsetAsync(p.dgamma, 0, p.cols * sizeof(float), stream);
    if (status == cudaSuccess && !p.rms) {
      status = cudaMemsetAsync(p.dbeta, 0, p.cols * sizeof(float), stream);
    }
    return status;
  }
  if (!plan.register_resident) {
    status = cudaMemsetAsync(p.workspace, 0,
                             static_cast<size_t>(plan.ctas) * p.cols * (p.rms ? 1 : 2) * sizeof(float),
                             stream);
    if (status != cudaSuccess) return status;
  }
  NormBackwardParams args = p;
  void* kernel_args[] = {&args};
  status = cudaLaunchKernel(kernel, dim3(plan.ctas), dim3(kThreads), kernel_args, 0, stream);
  if (status != cudaSuccess) return status;
  status = cudaGetLastError();
  if (status != cudaSuccess) return status;
  const dim3 sum_grid(static_cast<unsigned>(CeilDiv(p.cols, 32)), p.rms ? 1 : 2, 1);
  ColumnSumKernel<<<sum_grid, dim3(32, kSumLanes), 0, stream>>>(p.workspace, parts_per_output,
                                                                 p.cols, p.dgamma, p.dbeta);
  return cudaGetLastError();
}

cudaError_t LaunchCompareFp8Encoders(Fp8Format format, uint64_t first, uint64_t count,
                                     unsigned long long* mismatches, uint32_t* first_mismatch,
                                     cudaStream_t stream) {
  return format == Fp8Format::kE4M3
             ? LaunchCompare<Fp8Format::kE4M3>(first, count, mismatches, first_mismatch, stream)
             : LaunchCompare<Fp8Format::kE5M2>(first, count, mismatches, first_mismatch, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
