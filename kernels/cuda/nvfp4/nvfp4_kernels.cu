// CUDA kernels for NVFP4 quantization (contract: kernels/nvfp4.h), its dequantization,
// the unscaled E2M1 casts and the 16-point random Hadamard transform.
//
// Design:
// - Bit-exactness with the CPU reference: block scales (the arithmetic of
//   kernels/quantize_math.h) and E2M1 codes through the branch-free codecs of
//   kernels/e2m1_encode.h (their host branch proven equal to the float_codec /
//   stochastic_rounding references on the CPU by tests/kernels/e2m1_encode_test.cc; the
//   device branch spells the same IEEE operations with intrinsics, and nvfp4_gpu_test
//   compares the kernels' output with the CPU bit for bit; sm_90 has no E2M1 conversion
//   instruction),
//   stochastic draws from the counter-based RNG of kernels/stochastic_rounding.h keyed
//   exactly like the CPU (copy id, linear index in the copy written; the counter is
//   stepped by kGoldenGamma per element instead of multiplied out), and the RHT in the
//   header's FP32 operation order with __fmul_rn/__fadd_rn/__fsub_rn so nothing is
//   contracted into an FMA.
// - Two passes, because every block scale depends on the global scale S: pass 1 reads x
//   for amax (and, with RHT, the amax of the transformed columnwise source); the host
//   derives S (it also returns it in QuantizedTensor); pass 2 reads x again and writes
//   both copies.
// - Pass 2 layout: a thread holds 16 consecutive rows x 4 consecutive columns (one
//   16-byte FP32 or 8-byte BF16 load per row), a warp 16 x 128, a 128-thread block
//   64 x 128 (4 warps stacked). A 1x16 rowwise block is 4 threads: a reduce-scatter of
//   the 16 row maxima (12 shuffles) gives each of them 4 rows whose block scales it
//   computes, and the encode factors come back by 16 shuffles. A 16x1 columnwise block
//   (and its RHT) is in-thread, a 16x16 block is 4 threads (two xor-shuffles).
//   Stores: per row 2 bytes (4 nibbles; 64 contiguous bytes per warp), per column 8
//   bytes (16 nibbles; the 4 warps of a block fill 32 contiguous bytes of an output row).
// - The 2D and stochastic variants are template parameters, so each kernel carries only
//   its own encoder.
// - Vectorized loads when cols % 4 == 0 and x is aligned; otherwise (columnwise-only
//   copies of odd widths) bounds-checked scalar loads. Stores need no variant: the
//   blocked dimensions are multiples of 16.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/nvfp4/nvfp4_kernels.h"
#include "kernels/cuda/source.cuh"
#include "kernels/e2m1_encode.h"
#include "kernels/quantize_math.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kBlock = 16;        // NVFP4 block length (both directions)
constexpr int kColsPerThread = 4;
constexpr int kWarpCols = 32 * kColsPerThread;
constexpr int kWarpsDown = 4;
constexpr int kThreads = 32 * kWarpsDown;
constexpr int kTileRows = kBlock * kWarpsDown;
constexpr int kTileCols = kWarpCols;
constexpr int kBlockThreads = kBlock / kColsPerThread;  // threads across a 1x16 block

constexpr uint32_t kMagnitudeMask = 0x7FFFFFFFu;
constexpr uint32_t kFullMask = 0xFFFFFFFFu;
constexpr int kElementwiseThreads = 256;
constexpr int kMaxElementwiseBlocks = 4096;

constexpr bool kVectorized = true;
constexpr bool kScalar = false;

// Walsh-Hadamard butterflies in Sylvester order (kernels/hadamard.h).
__device__ __forceinline__ void Butterflies(float (&w)[kBlock]) {
#pragma unroll
  for (int h = 1; h < kBlock; h *= 2) {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      if ((i & h) != 0) continue;
      const float a = w[i];
      const float b = w[i + h];
      w[i] = __fadd_rn(a, b);
      w[i + h] = __fsub_rn(a, b);
    }
  }
}

// Forward RHT of one 16-element run: w <- (H diag(d) w) / 4.
__device__ __forceinline__ void ForwardRht(float (&w)[kBlock], const HadamardSigns& s) {
#pragma unroll
  for (int j = 0; j < kBlock; ++j) w[j] = __fmul_rn(s.d[j], w[j]);
  Butterflies(w);
#pragma unroll
  for (int j = 0; j < kBlock; ++j) w[j] = __fmul_rn(w[j], 0.25f);
}

__device__ __forceinline__ void InverseRht(float (&w)[kBlock], const HadamardSigns& s) {
  Butterflies(w);
#pragma unroll
  for (int j = 0; j < kBlock; ++j) w[j] = __fmul_rn(s.d[j], __fmul_rn(w[j], 0.25f));
}

// Max over the block into thread 0's return value; every thread must call it.
__device__ __forceinline__ uint32_t BlockMax(uint32_t value, uint32_t* scratch) {
  value = __reduce_max_sync(kFullMask, value);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarpsDown ? scratch[lane] : 0u;
    value = __reduce_max_sync(kFullMask, value);
  }
  return value;
}

// The thread's 16 x 4 values of the 64 x 128 tile of block blockIdx.x (0 outside x).
struct TilePosition {
  int64_t row0;  // first of the thread's 16 rows
  int64_t col0;  // first of its 4 columns
  int col_thread;
};

__device__ __forceinline__ TilePosition PositionOf(int64_t cols) {
  const int64_t tiles_across = (cols + kTileCols - 1) / kTileCols;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  // blockIdx.x < 2^32: a 32-bit division unless a row of tiles is wider than any grid.
  int64_t tile_row = 0;
  int64_t tile_col = blockIdx.x;
  if (tiles_across <= INT32_MAX) {
    const uint32_t across = static_cast<uint32_t>(tiles_across);
    tile_row = blockIdx.x / across;
    tile_col = blockIdx.x - static_cast<uint32_t>(tile_row) * across;
  }
  TilePosition p;
  p.row0 = tile_row * kTileRows + warp * kBlock;
  p.col0 = tile_col * kTileCols + lane * kColsPerThread;
  p.col_thread = lane;
  return p;
}

template <SourceType kType, bool kVectorizedLoads>
__device__ __forceinline__ void LoadTile(const void* x_raw, int64_t rows, int64_t cols,
                                         const TilePosition& p, float (&v)[kBlock][kColsPerThread]) {
  using Element = typename Source<kType>::Element;
  const Element* x = static_cast<const Element*>(x_raw);
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    const int64_t r = p.row0 + i;
    const Element* src = x + r * cols + p.col0;
    if (kVectorizedLoads) {
      if (r < rows && p.col0 < cols) {
        Source<kType>::Load4(src, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kColsPerThread; ++j) v[i][j] = 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kColsPerThread; ++j) {
        v[i][j] = r < rows && p.col0 + j < cols ? Source<kType>::ToFloat(src[j]) : 0.0f;
      }
    }
  }
}

struct AmaxArgs {
  const void* x;
  int64_t rows;
  int64_t cols;
  HadamardSigns signs;
  uint32_t* amax_bits;
  uint32_t* rht_amax_bits;  // null: no RHT amax
};

template <SourceType kType, bool kVectorizedLoads>
__global__ void __launch_bounds__(kThreads) Nvfp4AmaxKernel(const AmaxArgs a) {
  __shared__ uint32_t scratch[kWarpsDown];
  const TilePosition p = PositionOf(a.cols);
  float v[kBlock][kColsPerThread];
  LoadTile<kType, kVectorizedLoads>(a.x, a.rows, a.cols, p, v);
  uint32_t amax = 0u;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      amax = max(amax, __float_as_uint(v[i][j]) & kMagnitudeMask);
    }
  }
  uint32_t rht_amax = 0u;
  if (a.rht_amax_bits != nullptr) {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      float w[kBlock];
#pragma unroll
      for (int i = 0; i < kBlock; ++i) w[i] = v[i][j];
      ForwardRht(w, a.signs);
#pragma unroll
      for (int i = 0; i < kBlock; ++i) rht_amax = max(rht_amax, __float_as_uint(w[i]) & kMagnitudeMask);
    }
  }
  const uint32_t block_amax = BlockMax(amax, scratch);
  if (threadIdx.x == 0 && block_amax != 0u) atomicMax(a.amax_bits, block_amax);
  if (a.rht_amax_bits != nullptr) {
    __syncthreads();  // scratch is reused
    const uint32_t block_rht = BlockMax(rht_amax, scratch);
    if (threadIdx.x == 0 && block_rht != 0u) atomicMax(a.rht_amax_bits, block_rht);
  }
}

struct QuantizeArgs {
  const void* x;
  int64_t rows;
  int64_t cols;
  bool random_hadamard;
  HadamardSigns signs;
  float s;
  float inv_s;
  uint64_t rowwise_key;
  uint64_t columnwise_key;
  uint8_t* rowwise;
  uint8_t* rowwise_scales;
  uint8_t* columnwise;
  uint8_t* columnwise_scales;
};

// Code of x * e; `counter` is the element's RandomCounter (unused when nearest).
template <bool kStochastic>
__device__ __forceinline__ uint32_t EncodeE2M1(float x, float e, uint64_t counter) {
  const float y = __fmul_rn(x, e);
  if (kStochastic) return E2M1EncodeStochastic(y, RandomBits24OfCounter(counter));
  return E2M1EncodeNearest(y);
}

template <int kCount>
__device__ __forceinline__ uint32_t MaxMagnitude(const float (&values)[kCount]) {
  uint32_t m = 0u;
#pragma unroll
  for (int k = 0; k < kCount; ++k) m = max(m, __float_as_uint(values[k]) & kMagnitudeMask);
  return m;
}

// Rowwise 1x16 block maxima of the thread's 16 rows, shared by the 4 threads of each
// block (lanes 4g .. 4g+3, position q = lane % 4 = 2 * b1 + b0): a reduce-scatter in two
// xor steps (8 + 4 shuffles) leaves position q with the block maxima of rows
// 8 * b0 + 4 * b1 + k, k < 4.
__device__ __forceinline__ void RowMaximaScatter(const uint32_t (&m)[kBlock], int q,
                                                 uint32_t (&out)[4]) {
  const bool b0 = (q & 1) != 0;
  const bool b1 = (q & 2) != 0;
  uint32_t half[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const uint32_t send = b0 ? m[k] : m[k + 8];
    const uint32_t keep = b0 ? m[k + 8] : m[k];
    half[k] = max(keep, __shfl_xor_sync(kFullMask, send, 1));
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const uint32_t send = b1 ? half[k] : half[k + 4];
    const uint32_t keep = b1 ? half[k + 4] : half[k];
    out[k] = max(keep, __shfl_xor_sync(kFullMask, send, 2));
  }
}

// Row whose block maximum position q holds in slot k of RowMaximaScatter.
__device__ __forceinline__ int ScatteredRow(int q, int k) { return 8 * (q & 1) + 4 * (q >> 1) + k; }

// Position holding row i after RowMaximaScatter.
__device__ __forceinline__ int PositionOfRow(int i) {
  return ((i >> 3) & 1) | (((i >> 2) & 1) << 1);
}

// 1D rowwise copy of the thread's 16 x 4 values (cols % 16 == 0: the thread's 4 columns
// are all inside x or all outside). Each of the 4 threads of a block computes the
// scales of 4 of the 16 rows and the encode factors go back by shuffles.
template <bool kStochastic>
__device__ __forceinline__ void QuantizeRowwise1D(const QuantizeArgs& a, const TilePosition& p,
                                                  const float (&v)[kBlock][kColsPerThread]) {
  const int64_t rows = a.rows;
  const int64_t cols = a.cols;
  const int q = p.col_thread % kBlockThreads;
  const int group_lane0 = (threadIdx.x % 32) - q;
  uint32_t m[kBlock];
#pragma unroll
  for (int i = 0; i < kBlock; ++i) m[i] = MaxMagnitude(v[i]);
  uint32_t mine[4];
  RowMaximaScatter(m, q, mine);
  float e_mine[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const Nvfp4BlockScale bs = Nvfp4BlockScaleFast(__uint_as_float(mine[k]), a.s, a.inv_s);
    e_mine[k] = bs.e;
    const int64_t r = p.row0 + ScatteredRow(q, k);
    if (r < rows && p.col0 < cols) {
      a.rowwise_scales[r * (cols / kBlock) + p.col0 / kBlock] = bs.byte;
    }
  }
  const bool inside_cols = p.col0 < cols;
  uint64_t counter = 0;
  uint64_t row_step = 0;
  if (kStochastic) {
    counter = RandomCounter(a.rowwise_key, static_cast<uint64_t>(p.row0 * cols + p.col0));
    row_step = static_cast<uint64_t>(cols) * kGoldenGamma;
  }
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    const float e = __shfl_sync(kFullMask, e_mine[i & 3], group_lane0 + PositionOfRow(i));
    const int64_t r = p.row0 + i;
    uint32_t word = 0u;
    uint64_t c = counter;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      word |= EncodeE2M1<kStochastic>(v[i][j], e, c) << (4 * j);
      if (kStochastic) c += kGoldenGamma;
    }
    if (kStochastic) counter += row_step;
    if (r < rows && inside_cols) {
      *reinterpret_cast<uint16_t*>(a.rowwise + (r * cols + p.col0) / 2) =
          static_cast<uint16_t>(word);
    }
  }
}

// 1D columnwise copy (optionally of the RHT of each 16-row run): rows % 16 == 0, so the
// thread's 16 rows are all inside x or all outside; every 16x1 block is in-thread.
template <bool kStochastic>
__device__ __forceinline__ void QuantizeColumnwise1D(const QuantizeArgs& a, const TilePosition& p,
                                                     const float (&v)[kBlock][kColsPerThread]) {
  const int64_t rows = a.rows;
  const int64_t cols = a.cols;
#pragma unroll
  for (int j = 0; j < kColsPerThread; ++j) {
    const int64_t c = p.col0 + j;
    float w[kBlock];
#pragma unroll
    for (int i = 0; i < kBlock; ++i) w[i] = v[i][j];
    if (a.random_hadamard) ForwardRht(w, a.signs);
    const Nvfp4BlockScale bs = Nvfp4BlockScaleFast(__uint_as_float(MaxMagnitude(w)), a.s, a.inv_s);
    uint64_t counter = 0;
    if (kStochastic) {
      counter = RandomCounter(a.columnwise_key, static_cast<uint64_t>(c * rows + p.row0));
    }
    uint32_t lo = 0u;
    uint32_t hi = 0u;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) {
      const uint32_t code = EncodeE2M1<kStochastic>(w[i], bs.e, counter);
      if (kStochastic) counter += kGoldenGamma;
      if (i < 8) {
        lo |= code << (4 * i);
      } else {
        hi |= code << (4 * (i - 8));
      }
    }
    if (p.row0 < rows && c < cols) {
      a.columnwise_scales[c * (rows / kBlock) + p.row0 / kBlock] = bs.byte;
      *reinterpret_cast<uint2*>(a.columnwise + (c * rows + p.row0) / 2) = make_uint2(lo, hi);
    }
  }
}

// 2D: one 16x16 block per 4 threads; rows % 16 == cols % 16 == 0, so a thread's values
// are all inside x or all outside. Draws keyed by the rowwise index for both copies.
template <bool kStochastic>
__device__ __forceinline__ void Quantize2D(const QuantizeArgs& a, const TilePosition& p,
                                           const float (&v)[kBlock][kColsPerThread]) {
  const int64_t rows = a.rows;
  const int64_t cols = a.cols;
  const bool inside = p.row0 < rows && p.col0 < cols;
  uint32_t m = 0u;
#pragma unroll
  for (int i = 0; i < kBlock; ++i) m = max(m, MaxMagnitude(v[i]));
#pragma unroll
  for (int offset = 1; offset < kBlockThreads; offset <<= 1) {
    m = max(m, __shfl_xor_sync(kFullMask, m, offset));
  }
  const Nvfp4BlockScale bs = Nvfp4BlockScaleFast(__uint_as_float(m), a.s, a.inv_s);
  if (inside && p.col_thread % kBlockThreads == 0) {
    const int64_t br = p.row0 / kBlock;
    const int64_t bc = p.col0 / kBlock;
    if (a.rowwise_scales != nullptr) a.rowwise_scales[br * (cols / kBlock) + bc] = bs.byte;
    if (a.columnwise_scales != nullptr) a.columnwise_scales[bc * (rows / kBlock) + br] = bs.byte;
  }
  uint64_t counter = 0;
  uint64_t row_step = 0;
  if (kStochastic) {
    counter = RandomCounter(a.rowwise_key, static_cast<uint64_t>(p.row0 * cols + p.col0));
    row_step = static_cast<uint64_t>(cols) * kGoldenGamma;
  }
  uint32_t col_lo[kColsPerThread] = {};
  uint32_t col_hi[kColsPerThread] = {};
#pragma unroll
  for (int i = 0; i < kBlock; ++i) {
    const int64_t r = p.row0 + i;
    uint32_t row_word = 0u;
    uint64_t c = counter;
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const uint32_t code = EncodeE2M1<kStochastic>(v[i][j], bs.e, c);
      if (kStochastic) c += kGoldenGamma;
      row_word |= code << (4 * j);
      if (i < 8) {
        col_lo[j] |= code << (4 * i);
      } else {
        col_hi[j] |= code << (4 * (i - 8));
      }
    }
    if (kStochastic) counter += row_step;
    if (inside && a.rowwise != nullptr) {
      *reinterpret_cast<uint16_t*>(a.rowwise + (r * cols + p.col0) / 2) =
          static_cast<uint16_t>(row_word);
    }
  }
  if (inside && a.columnwise != nullptr) {
#pragma unroll
    for (int j = 0; j < kColsPerThread; ++j) {
      const int64_t c = p.col0 + j;
      *reinterpret_cast<uint2*>(a.columnwise + (c * rows + p.row0) / 2) =
          make_uint2(col_lo[j], col_hi[j]);
    }
  }
}

template <SourceType kType, bool kVectorizedLoads, bool kTwoD, bool kStochastic>
__global__ void __launch_bounds__(kThreads) Nvfp4QuantizeKernel(const QuantizeArgs a) {
  const TilePosition p = PositionOf(a.cols);
  float v[kBlock][kColsPerThread];
  LoadTile<kType, kVectorizedLoads>(a.x, a.rows, a.cols, p, v);
  if (kTwoD) {
    Quantize2D<kStochastic>(a, p, v);
    return;
  }
  if (a.rowwise != nullptr) QuantizeRowwise1D<kStochastic>(a, p, v);
  if (a.columnwise != nullptr) QuantizeColumnwise1D<kStochastic>(a, p, v);
}

__device__ __forceinline__ void StoreValue(float v, float* out) { *out = v; }
__device__ __forceinline__ void StoreValue(float v, uint16_t* out) { *out = FloatToBf16(v); }

// One thread per packed byte (two elements) of each row; grid-stride over rows. Out:
// float, or uint16_t holding BF16.
template <typename Out>
__global__ void __launch_bounds__(kElementwiseThreads)
    Nvfp4DequantizeKernel(const uint8_t* codes, int64_t rows, int64_t cols,
                          const uint8_t* scales, int block_rows_log2, float inv_s, Out* out) {
  const int64_t bytes_per_row = cols / 2;
  const int64_t scale_cols = cols / kBlock;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t scale_row = (r >> block_rows_log2) * scale_cols;
    for (int64_t b = threadIdx.x; b < bytes_per_row; b += blockDim.x) {
      const uint8_t byte = codes[r * bytes_per_row + b];
      const int64_t c = 2 * b;
      const float sd = E4M3DecodeFast(scales[scale_row + c / kBlock]);
      StoreValue(__fmul_rn(__fmul_rn(E2M1ToFloat(byte & 0xFu), sd), inv_s), &out[r * cols + c]);
      StoreValue(__fmul_rn(__fmul_rn(E2M1ToFloat(byte >> 4), sd), inv_s), &out[r * cols + c + 1]);
    }
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    CastToE2M1Kernel(const float* x, int64_t numel, uint8_t* packed) {
  const int64_t bytes = (numel + 1) / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < bytes;
       b += stride) {
    const uint32_t lo = E2M1EncodeNearest(x[2 * b]);
    const uint32_t hi = 2 * b + 1 < numel ? E2M1EncodeNearest(x[2 * b + 1]) : 0u;
    packed[b] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    E2M1ToFloatKernel(const uint8_t* packed, int64_t numel, float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    const uint8_t byte = packed[i / 2];
    out[i] = E2M1ToFloat((i & 1) ? (byte >> 4) : (byte & 0xFu));
  }
}

// One thread per 16-element run.
__global__ void __launch_bounds__(kElementwiseThreads)
    Hadamard16Kernel(const float* x, int64_t runs, const HadamardSigns signs, bool inverse,
                     float* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; t < runs;
       t += stride) {
    float w[kBlock];
#pragma unroll
    for (int j = 0; j < kBlock; ++j) w[j] = x[t * kBlock + j];
    if (inverse) {
      InverseRht(w, signs);
    } else {
      ForwardRht(w, signs);
    }
#pragma unroll
    for (int j = 0; j < kBlock; ++j) out[t * kBlock + j] = w[j];
  }
}

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int GridFor(int64_t items) {
  const int64_t blocks = (items + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxElementwiseBlocks ? kMaxElementwiseBlocks
                                                                            : blocks));
}

// Grid of 64 x 128 tiles, or an error when it would not fit one launch.
cudaError_t TileGrid(int64_t rows, int64_t cols, unsigned* blocks) {
  const int64_t tiles = ((rows + kTileRows - 1) / kTileRows) * ((cols + kTileCols - 1) / kTileCols);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  *blocks = static_cast<unsigned>(tiles);
  return cudaSuccess;
}

template <SourceType kType>
bool VectorizedLoads(const void* x, int64_t cols) {
  return cols % kColsPerThread == 0 && IsAligned(x, Source<kType>::kAlignment);
}

template <SourceType kType>
cudaError_t LaunchAmaxTyped(const AmaxArgs& args, unsigned blocks, cudaStream_t stream) {
  if (VectorizedLoads<kType>(args.x, args.cols)) {
    Nvfp4AmaxKernel<kType, kVectorized><<<blocks, kThreads, 0, stream>>>(args);
  } else {
    Nvfp4AmaxKernel<kType, kScalar><<<blocks, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

template <SourceType kType, bool kVectorizedLoads>
cudaError_t LaunchQuantizeVariant(const QuantizeArgs& args, bool two_d, bool stochastic,
                                  unsigned blocks, cudaStream_t stream) {
  constexpr bool k2D = true;
  constexpr bool k1D = false;
  constexpr bool kStochastic = true;
  constexpr bool kNearest = false;
  if (two_d) {
    if (stochastic) {
      Nvfp4QuantizeKernel<kType, kVectorizedLoads, k2D, kStochastic>
          <<<blocks, kThreads, 0, stream>>>(args);
    } else {
      Nvfp4QuantizeKernel<kType, kVectorizedLoads, k2D, kNearest>
          <<<blocks, kThreads, 0, stream>>>(args);
    }
  } else if (stochastic) {
    Nvfp4QuantizeKernel<kType, kVectorizedLoads, k1D, kStochastic>
        <<<blocks, kThreads, 0, stream>>>(args);
  } else {
    Nvfp4QuantizeKernel<kType, kVectorizedLoads, k1D, kNearest>
        <<<blocks, kThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

template <SourceType kType>
cudaError_t LaunchQuantizeTyped(const QuantizeArgs& args, bool two_d, bool stochastic,
                                unsigned blocks, cudaStream_t stream) {
  if (VectorizedLoads<kType>(args.x, args.cols)) {
    return LaunchQuantizeVariant<kType, kVectorized>(args, two_d, stochastic, blocks, stream);
  }
  return LaunchQuantizeVariant<kType, kScalar>(args, two_d, stochastic, blocks, stream);
}

}  // namespace

cudaError_t LaunchNvfp4Amax(const void* x, SourceType type, int64_t rows, int64_t cols,
                            const HadamardSigns& signs, uint32_t* amax_bits,
                            uint32_t* rht_amax_bits, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream);
  if (status == cudaSuccess && rht_amax_bits != nullptr) {
    status = cudaMemsetAsync(rht_amax_bits, 0, sizeof(uint32_t), stream);
  }
  if (status != cudaSuccess || rows == 0 || cols == 0) return status;
  unsigned blocks = 0;
  status = TileGrid(rows, cols, &blocks);
  if (status != cudaSuccess) return status;
  const AmaxArgs args{x, rows, cols, signs, amax_bits, rht_amax_bits};
  return type == SourceType::kFloat32 ? LaunchAmaxTyped<SourceType::kFloat32>(args, blocks, stream)
                                      : LaunchAmaxTyped<SourceType::kBFloat16>(args, blocks, stream);
}

cudaError_t LaunchNvfp4Quantize(const Nvfp4QuantizeLaunchParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  unsigned blocks = 0;
  const cudaError_t status = TileGrid(p.rows, p.cols, &blocks);
  if (status != cudaSuccess) return status;
  QuantizeArgs args;
  args.x = p.x;
  args.rows = p.rows;
  args.cols = p.cols;
  args.random_hadamard = p.random_hadamard && !p.two_d;
  args.signs = p.signs;
  args.s = p.global_scale;
  args.inv_s = p.global_scale_inv;
  args.rowwise_key = p.rowwise_key;
  args.columnwise_key = p.columnwise_key;
  args.rowwise = p.rowwise;
  args.rowwise_scales = p.rowwise_scales;
  args.columnwise = p.columnwise;
  args.columnwise_scales = p.columnwise_scales;
  return p.type == SourceType::kFloat32
             ? LaunchQuantizeTyped<SourceType::kFloat32>(args, p.two_d, p.stochastic_rounding,
                                                         blocks, stream)
             : LaunchQuantizeTyped<SourceType::kBFloat16>(args, p.two_d, p.stochastic_rounding,
                                                          blocks, stream);
}

cudaError_t LaunchNvfp4Dequantize(const uint8_t* codes, int64_t rows, int64_t cols,
                                  const uint8_t* scales, bool two_d, float global_scale_inv,
                                  void* out, bool bf16_out, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return cudaSuccess;
  constexpr int64_t kMaxRowBlocks = 65535;
  const int blocks = static_cast<int>(rows < kMaxRowBlocks ? rows : kMaxRowBlocks);
  if (bf16_out) {
    Nvfp4DequantizeKernel<<<blocks, kElementwiseThreads, 0, stream>>>(
        codes, rows, cols, scales, two_d ? 4 : 0, global_scale_inv, static_cast<uint16_t*>(out));
  } else {
    Nvfp4DequantizeKernel<<<blocks, kElementwiseThreads, 0, stream>>>(
        codes, rows, cols, scales, two_d ? 4 : 0, global_scale_inv, static_cast<float*>(out));
  }
  return cudaGetLastError();
}

cudaError_t LaunchCastToE2M1(const float* x, int64_t numel, uint8_t* packed,
                             cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  CastToE2M1Kernel<<<GridFor((numel + 1) / 2), kElementwiseThreads, 0, stream>>>(x, numel, packed);
  return cudaGetLastError();
}

cudaError_t LaunchE2M1ToFloat(const uint8_t* packed, int64_t numel, float* out,
                              cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  E2M1ToFloatKernel<<<GridFor(numel), kElementwiseThreads, 0, stream>>>(packed, numel, out);
  return cudaGetLastError();
}

cudaError_t LaunchHadamard16(const float* x, int64_t numel, const HadamardSigns& signs,
                             bool inverse, float* out, cudaStream_t stream) {
  const int64_t runs = numel / kBlock;
  if (runs == 0) return cudaSuccess;
  Hadamard16Kernel<<<GridFor(runs), kElementwiseThreads, 0, stream>>>(x, runs, signs, inverse, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
