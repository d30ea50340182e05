// Generic CUDA kernel for MXFP8 and FP8 block-scaling quantization (contract:
// kernels/block_quantize.h) and LaunchBlockQuantize, which sends MXFP8 shapes with rows
// and cols multiples of 32 to the register-tiled kernel of block_quantize_tile_kernels.cu
// and everything else here (block scaling, MXFP8 tails, the integer-codec encoder).
// Dequantization and the scale layouts: block_dequantize_kernels.cu.
//
// Design:
// - Bit-exactness with the CPU reference: the per-block scale arithmetic is the shared
//   host/device code of kernels/quantize_math.h, products are single FP32 multiplies
//   (__fmul_rn), and the FP8 encode is either the integer codec of core/float_codec.h
//   or the cvt.rn.satfinite instruction, whose rounding (RNE), saturation (finite
//   overflow and Inf to +-max) and signed zeros are those of the codec; NaN codes are
//   patched to 0x7F explicitly, and only in blocks whose amax is NaN.
// - One pass: every element is loaded once (16 bytes per thread per row: 4 FP32 or
//   8 BF16), both copies' block amaxes, the scales, the rowwise codes and the columnwise
//   (transposed) codes all come from registers. A thread holds kRowsPerThread
//   consecutive rows x kVec consecutive columns, so:
//     rowwise block amax    = in-thread max over kVec, then xor-shuffles across the
//                             kBlock / kVec threads of the block;
//     columnwise block amax = in-thread max over the rows, then xor-shuffles across the
//                             warp's row lanes (and, for 128-row blocks, shared memory
//                             across the 8 warps stacked down the tile);
//     columnwise codes      = kRowsPerThread consecutive bytes of one output row, one
//                             8- or 16-byte store per column: no shared-memory transpose.
// - Tiles. MXFP8: a warp owns 32 rows x 8 threads (32 FP32 / 64 BF16 columns), 4 row
//   lanes of 8 rows; 4 warps side by side per 128-thread block, no barrier besides the
//   final amax reduction. Per columnwise store instruction each output row receives 32
//   contiguous bytes (one full sector); per rowwise store each row 32/64 bytes.
//   Block scaling: a 256-thread block owns a 128x128 tile (8 warps stacked down; BF16
//   16 threads x 2 row lanes x 8 rows, FP32 32 threads x 16 rows), which is exactly one
//   2D block and 128 1x128 blocks per copy.
// - Vectorized variant (16-byte loads, 4/8/16-byte stores) when cols % kVec == 0,
//   rows % kRowsPerThread == 0 and the pointers are aligned; a scalar, bounds-checked
//   variant covers every other shape (1 row, 257x259, partial 128-blocks at the tails).
// - amax: FP32 magnitude bits in a uint32 (integer order is value order and NaN bits
//   exceed Inf's), warp __reduce_max_sync, shared memory across warps, one atomicMax
//   per block.
// - dbias (optional): FP32 column sums over the tile height (in-thread, xor-shuffles over
//   the row lanes, then column_amax_smem's storage across the warps stacked down), one
//   partial row per tile row written to the workspace and summed in FP64 by
//   LaunchDbiasReduce (block_quantize_tile_kernels.cu).
// Speed (H200, 16384x8192 BF16, rowwise+columnwise): this kernel gives MXFP8 237-242 us
// (2.26-2.30 TB/s; the tile kernel: 166 us) and FP32 288-292 us; block 1D 267 us
// (2.04 TB/s; 280-282 us while dbias was a run-time branch), 2D 217 us (2.47 TB/s); the
// integer codec encoder 0.5 TB/s (issue-bound). A variant with packed BF16 rows, 4x8 BF16
// thread tiles and persistent prefetching blocks measured slower for MXFP8 (265 / 312 us)
// and was not kept.
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "kernels/cuda/block_quantize/block_quantize_tile_kernels.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/source.cuh"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr uint32_t kInfBits = 0x7F800000u;
constexpr uint32_t kFullMask = 0xFFFFFFFFu;
constexpr uint8_t kFp8NanCode = 0x7Fu;

constexpr bool kVectorized = true;
constexpr bool kScalar = false;
constexpr bool kMxfp8Tiles = true;
constexpr bool kBlockTiles = false;

// Thread and tile geometry (see the file comment). kBlock is the block length along
// both dimensions: the tile is exactly one block tall.
template <bool kMx, SourceType kType>
struct Tile {
  static constexpr int kVec = Source<kType>::kVec;
  static constexpr int kBlock = kMx ? 32 : 128;
  static constexpr int kColThreads = kMx ? 8 : kBlock / kVec;
  static constexpr int kRowLanes = 32 / kColThreads;  // per warp
  static constexpr int kWarpsDown = kMx ? 1 : 8;
  static constexpr int kWarpsAcross = kMx ? 4 : 1;
  static constexpr int kRowsPerThread = kBlock / (kRowLanes * kWarpsDown);
  static constexpr int kThreads = 32 * kWarpsDown * kWarpsAcross;
  static constexpr int kTileRows = kBlock;
  static constexpr int kTileCols = kColThreads * kVec * kWarpsAcross;
  static constexpr int kRowBlockThreads = kBlock / kVec;  // threads sharing a row block
  static_assert(kRowBlockThreads <= kColThreads, "a row block must stay inside a warp row");
  static_assert(kRowsPerThread * kRowLanes * kWarpsDown == kTileRows, "tile rows");
  static_assert(kRowsPerThread % 4 == 0, "columnwise stores are whole words");
};

struct KernelArgs {
  const void* x;
  int64_t rows;
  int64_t cols;
  bool two_d;
  bool power_2_scale;
  float amax_epsilon;
  float fp8_max;
  uint8_t* rowwise;
  void* rowwise_scale_inv;
  uint8_t* columnwise;
  void* columnwise_scale_inv;
  uint32_t* amax_bits;
  float* dbias_partial;  // [ceil(rows / kTileRows), cols] or null
};

template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t SoftwareEncode(float v) {
  return kFormat == Fp8Format::kE4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

// Codes of (a, b) in the low two bytes, a first.
template <Fp8Format kFormat, Fp8Encoder kEncoder>
__device__ __forceinline__ uint32_t EncodePair(float a, float b) {
  if (kEncoder == Fp8Encoder::kSoftware) {
    return SoftwareEncode<kFormat>(a) | (SoftwareEncode<kFormat>(b) << 8);
  }
  const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(
      make_float2(a, b), __NV_SATFINITE, kFormat == Fp8Format::kE4M3 ? __NV_E4M3 : __NV_E5M2);
  return static_cast<uint32_t>(pair);
}

// Encodes n = 4 * kWords products into packed little-endian words (element k in byte
// k % 4 of word k / 4). `block_has_nan`: the block's amax is NaN, so some products may
// be NaN; their codes are forced to the canonical 0x7F (the codec's NaN).
template <Fp8Format kFormat, Fp8Encoder kEncoder, int kWords>
__device__ __forceinline__ void EncodeWords(const float (&p)[4 * kWords], bool block_has_nan,
                                            uint32_t (&words)[kWords]) {
#pragma unroll
  for (int w = 0; w < kWords; ++w) {
    words[w] = EncodePair<kFormat, kEncoder>(p[4 * w], p[4 * w + 1]) |
               (EncodePair<kFormat, kEncoder>(p[4 * w + 2], p[4 * w + 3]) << 16);
  }
  if (kEncoder == Fp8Encoder::kHardware && block_has_nan) {
#pragma unroll
    for (int w = 0; w < kWords; ++w) {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (p[4 * w + k] != p[4 * w + k]) {
          words[w] = (words[w] & ~(0xFFu << (8 * k))) | (uint32_t{kFp8NanCode} << (8 * k));
        }
      }
    }
  }
}

// One 4-, 8- or 16-byte store; p is aligned to its size.
template <int kWords>
__device__ __forceinline__ void StoreWords(uint8_t* p, const uint32_t (&w)[kWords]) {
  static_assert(kWords == 1 || kWords == 2 || kWords == 4, "4, 8 or 16 bytes");
  if constexpr (kWords == 1) {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  } else if constexpr (kWords == 2) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

__device__ __forceinline__ uint8_t ByteOf(const uint32_t* words, int k) {
  return static_cast<uint8_t>(words[k / 4] >> (8 * (k % 4)));
}

__device__ __forceinline__ bool IsNanBits(uint32_t magnitude) { return magnitude > kInfBits; }

// Per-block multiplier and what to store as the block's scale_inv.
struct BlockScaleValue {
  float multiplier;  // 2^(127 - code) for MXFP8, the scale for block scaling
  uint8_t code;      // MXFP8 E8M0 code
  float scale_inv;   // block scaling: 1 / scale
};

template <bool kMx>
__device__ __forceinline__ BlockScaleValue ScaleOf(uint32_t amax_bits, const KernelArgs& a) {
  const float amax = __uint_as_float(amax_bits);
  BlockScaleValue s;
  if (kMx) {
    s.code = Mxfp8ScaleCode(amax, a.fp8_max);
    s.multiplier = Mxfp8EncodeFactor(s.code);
    s.scale_inv = 0.0f;
  } else {
    s.multiplier = BlockScalingScaleOf(amax, a.fp8_max, a.power_2_scale, a.amax_epsilon);
    s.code = 0;
    s.scale_inv = DivRn(1.0f, s.multiplier);
  }
  return s;
}

// Max over the block into thread 0's return value; every thread must call it.
template <int kThreads>
__device__ __forceinline__ uint32_t BlockMax(uint32_t value, uint32_t* scratch) {
  constexpr int kWarps = kThreads / 32;
  value = __reduce_max_sync(kFullMask, value);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) scratch[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? scratch[lane] : 0u;
    value = __reduce_max_sync(kFullMask, value);
  }
  return value;
}

template <bool kMx, SourceType kType, Fp8Format kFormat, Fp8Encoder kEncoder, bool kVectorizedIo,
          bool kDbias>
__global__ void __launch_bounds__(Tile<kMx, kType>::kThreads)
    BlockQuantizeKernel(const KernelArgs a) {
  using T = Tile<kMx, kType>;
  using Element = typename Source<kType>::Element;
  constexpr int kVec = T::kVec;
  constexpr int kRows = T::kRowsPerThread;
  __shared__ uint32_t column_amax_smem[T::kWarpsDown][T::kTileCols];
  __shared__ uint32_t reduce_smem[T::kThreads / 32];

  const Element* x = static_cast<const Element*>(a.x);
  const int64_t rows = a.rows;
  const int64_t cols = a.cols;
  const int64_t tiles_across = (cols + T::kTileCols - 1) / T::kTileCols;
  const int64_t tile_row0 = (static_cast<int64_t>(blockIdx.x) / tiles_across) * T::kTileRows;
  const int64_t tile_col0 = (static_cast<int64_t>(blockIdx.x) % tiles_across) * T::kTileCols;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int warp_down = warp / T::kWarpsAcross;
  const int warp_across = warp % T::kWarpsAcross;
  const int col_thread = lane % T::kColThreads;
  const int row_lane = lane / T::kColThreads;
  const int local_col0 = (warp_across * T::kColThreads + col_thread) * kVec;
  const int64_t row0 = tile_row0 + (warp_down * T::kRowLanes + row_lane) * kRows;
  const int64_t col0 = tile_col0 + local_col0;

  // Validity: in the vectorized variant all kRows rows (rows % kRows == 0) and all kVec
  // columns (cols % kVec == 0) of a thread are inside or outside together.
  bool row_ok[kRows];
  bool col_ok[kVec];
#pragma unroll
  for (int i = 0; i < kRows; ++i) row_ok[i] = kVectorizedIo ? row0 < rows : row0 + i < rows;
#pragma unroll
  for (int j = 0; j < kVec; ++j) col_ok[j] = kVectorizedIo ? col0 < cols : col0 + j < cols;

  float v[kRows][kVec];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const Element* src = x + (row0 + i) * cols + col0;
    if (kVectorizedIo) {
      if (row_ok[i] && col_ok[0]) {
        Source<kType>::Load(src, v[i]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) v[i][j] = 0.0f;
      }
    } else {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        v[i][j] = row_ok[i] && col_ok[j] ? Source<kType>::ToFloat(src[j]) : 0.0f;
      }
    }
  }

  // Magnitude maxima: per row over the thread's columns, per column over its rows.
  uint32_t row_amax[kRows];
  uint32_t col_amax[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) col_amax[j] = 0u;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    row_amax[i] = 0u;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const uint32_t m = __float_as_uint(v[i][j]) & kMagnitudeMask;
      row_amax[i] = max(row_amax[i], m);
      col_amax[j] = max(col_amax[j], m);
    }
  }
  uint32_t thread_amax = 0u;
#pragma unroll
  for (int j = 0; j < kVec; ++j) thread_amax = max(thread_amax, col_amax[j]);

  const bool rowwise = a.rowwise != nullptr;
  const bool columnwise = a.columnwise != nullptr;
  const bool two_d = !kMx && a.two_d;

  // Column maxima over the whole tile height (columnwise copy, and 2D tiles).
  if (columnwise || two_d) {
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
#pragma unroll
      for (int offset = T::kColThreads; offset < 32; offset <<= 1) {
        col_amax[j] = max(col_amax[j], __shfl_xor_sync(kFullMask, col_amax[j], offset));
      }
    }
    if (T::kWarpsDown > 1) {
      if (row_lane == 0) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) column_amax_smem[warp_down][local_col0 + j] = col_amax[j];
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        uint32_t m = 0u;
#pragma unroll
        for (int w = 0; w < T::kWarpsDown; ++w) m = max(m, column_amax_smem[w][local_col0 + j]);
        col_amax[j] = m;
      }
    }
  }

  if (two_d) {
    // One 128x128 block: the tile amax is the max over the column maxima.
    uint32_t tile_amax = 0u;
#pragma unroll
    for (int j = 0; j < kVec; ++j) tile_amax = max(tile_amax, col_amax[j]);
#pragma unroll
    for (int offset = 1; offset < T::kColThreads; offset <<= 1) {
      tile_amax = max(tile_amax, __shfl_xor_sync(kFullMask, tile_amax, offset));
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i) row_amax[i] = tile_amax;
#pragma unroll
    for (int j = 0; j < kVec; ++j) col_amax[j] = tile_amax;
  } else if (rowwise) {
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
#pragma unroll
      for (int offset = 1; offset < T::kRowBlockThreads; offset <<= 1) {
        row_amax[i] = max(row_amax[i], __shfl_xor_sync(kFullMask, row_amax[i], offset));
      }
    }
  }

  const int64_t tile_row_block = tile_row0 / T::kBlock;
  if (rowwise) {
    const bool writes_scale =
        two_d ? threadIdx.x == 0 : col_thread % T::kRowBlockThreads == 0 && col_ok[0];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      const BlockScaleValue s = ScaleOf<kMx>(row_amax[i], a);
      const int64_t r = row0 + i;
      if (writes_scale && row_ok[i]) {
        if (kMx) {
          static_cast<uint8_t*>(a.rowwise_scale_inv)[r * (cols / T::kBlock) + col0 / T::kBlock] =
              s.code;
        } else if (two_d) {
          if (i == 0) {
            const int64_t col_blocks = (cols + T::kBlock - 1) / T::kBlock;
            static_cast<float*>(a.rowwise_scale_inv)[tile_row_block * col_blocks +
                                                     tile_col0 / T::kBlock] = s.scale_inv;
          }
        } else {
          const int64_t col_blocks = (cols + T::kBlock - 1) / T::kBlock;
          static_cast<float*>(a.rowwise_scale_inv)[r * col_blocks + col0 / T::kBlock] =
              s.scale_inv;
        }
      }
      float p[kVec];
#pragma unroll
      for (int j = 0; j < kVec; ++j) p[j] = __fmul_rn(v[i][j], s.multiplier);
      uint32_t words[kVec / 4];
      EncodeWords<kFormat, kEncoder, kVec / 4>(p, IsNanBits(row_amax[i]), words);
      uint8_t* dst = a.rowwise + r * cols + col0;
      if (kVectorizedIo) {
        if (row_ok[i] && col_ok[0]) StoreWords<kVec / 4>(dst, words);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          if (row_ok[i] && col_ok[j]) dst[j] = ByteOf(words, j);
        }
      }
    }
  }

  if (columnwise) {
    const bool writes_scale = two_d ? false : warp_down == 0 && row_lane == 0;
    if (two_d && threadIdx.x == 0) {
      const BlockScaleValue s = ScaleOf<kMx>(col_amax[0], a);
      const int64_t row_blocks = (rows + T::kBlock - 1) / T::kBlock;
      static_cast<float*>(a.columnwise_scale_inv)[(tile_col0 / T::kBlock) * row_blocks +
                                                  tile_row_block] = s.scale_inv;
    }
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      const BlockScaleValue s = ScaleOf<kMx>(col_amax[j], a);
      const int64_t c = col0 + j;
      if (writes_scale && col_ok[j]) {
        if (kMx) {
          static_cast<uint8_t*>(a.columnwise_scale_inv)[c * (rows / T::kBlock) + tile_row_block] =
              s.code;
        } else {
          const int64_t row_blocks = (rows + T::kBlock - 1) / T::kBlock;
          static_cast<float*>(a.columnwise_scale_inv)[c * row_blocks + tile_row_block] =
              s.scale_inv;
        }
      }
      float p[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) p[i] = __fmul_rn(v[i][j], s.multiplier);
      uint32_t words[kRows / 4];
      EncodeWords<kFormat, kEncoder, kRows / 4>(p, IsNanBits(col_amax[j]), words);
      uint8_t* dst = a.columnwise + c * rows + row0;
      if (kVectorizedIo) {
        if (row_ok[0] && col_ok[j]) StoreWords<kRows / 4>(dst, words);
      } else {
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          if (row_ok[i] && col_ok[j]) dst[i] = ByteOf(words, i);
        }
      }
    }
  }

  // A template flag, not a run-time test of a.dbias_partial: with the test, the no-dbias
  // kernels carried this code too (block 1D BF16 ~4% slower); with the flag their PTX is
  // that of a kernel written without dbias, apart from the parameter size and names.
  if constexpr (kDbias) {
    // FP32 column sums over the tile height (zero-filled outside the tensor). Across the
    // warps stacked down they meet in column_amax_smem's storage (no extra shared memory).
    float* column_sum_smem = reinterpret_cast<float*>(&column_amax_smem[0][0]);
    float s[kVec];
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      s[j] = v[0][j];
#pragma unroll
      for (int i = 1; i < kRows; ++i) s[j] = __fadd_rn(s[j], v[i][j]);
#pragma unroll
      for (int offset = T::kColThreads; offset < 32; offset <<= 1) {
        s[j] = __fadd_rn(s[j], __shfl_xor_sync(kFullMask, s[j], offset));
      }
    }
    if (T::kWarpsDown > 1) {
      __syncthreads();  // every thread is done reading the column maxima
      if (row_lane == 0) {
#pragma unroll
        for (int j = 0; j < kVec; ++j) {
          column_sum_smem[warp_down * T::kTileCols + local_col0 + j] = s[j];
        }
      }
      __syncthreads();
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        s[j] = column_sum_smem[local_col0 + j];
#pragma unroll
        for (int w = 1; w < T::kWarpsDown; ++w) {
          s[j] = __fadd_rn(s[j], column_sum_smem[w * T::kTileCols + local_col0 + j]);
        }
      }
    }
    if (warp_down == 0 && row_lane == 0) {
#pragma unroll
      for (int j = 0; j < kVec; ++j) {
        if (col_ok[j]) a.dbias_partial[tile_row_block * cols + col0 + j] = s[j];
      }
    }
  }

  const uint32_t block_amax = BlockMax<T::kThreads>(thread_amax, reduce_smem);
  if (threadIdx.x == 0 && block_amax != 0u) atomicMax(a.amax_bits, block_amax);
}

// ---- Launch helpers ----

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <bool kMx, SourceType kType, Fp8Format kFormat, Fp8Encoder kEncoder>
cudaError_t LaunchTyped(const BlockQuantizeLaunchParams& p, const KernelArgs& args,
                        cudaStream_t stream) {
  using T = Tile<kMx, kType>;
  const bool vectorized = p.cols % T::kVec == 0 && p.rows % T::kRowsPerThread == 0 &&
                          IsAligned(p.x, 16) &&
                          (p.rowwise == nullptr || IsAligned(p.rowwise, T::kVec)) &&
                          (p.columnwise == nullptr || IsAligned(p.columnwise, T::kRowsPerThread));
  const int64_t tiles = ((p.rows + T::kTileRows - 1) / T::kTileRows) *
                        ((p.cols + T::kTileCols - 1) / T::kTileCols);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  const unsigned blocks = static_cast<unsigned>(tiles);
  const bool dbias = args.dbias_partial != nullptr;
  if (vectorized && !dbias) {
    BlockQuantizeKernel<kMx, kType, kFormat, kEncoder, kVectorized, false>
        <<<blocks, T::kThreads, 0, stream>>>(args);
  } else if (vectorized) {
    BlockQuantizeKernel<kMx, kType, kFormat, kEncoder, kVectorized, true>
        <<<blocks, T::kThreads, 0, stream>>>(args);
  } else if (!dbias) {
    BlockQuantizeKernel<kMx, kType, kFormat, kEncoder, kScalar, false>
        <<<blocks, T::kThreads, 0, stream>>>(args);
  } else {
    BlockQuantizeKernel<kMx, kType, kFormat, kEncoder, kScalar, true>
        <<<blocks, T::kThreads, 0, stream>>>(args);
  }
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess || p.dbias == nullptr) return status;
  return LaunchDbiasReduce(p.dbias_workspace, (p.rows + T::kTileRows - 1) / T::kTileRows, p.cols,
                           p.dbias, stream);
}

template <bool kMx, SourceType kType, Fp8Format kFormat>
cudaError_t LaunchForEncoder(const BlockQuantizeLaunchParams& p, const KernelArgs& args,
                             cudaStream_t stream) {
  return p.encoder == Fp8Encoder::kHardware
             ? LaunchTyped<kMx, kType, kFormat, Fp8Encoder::kHardware>(p, args, stream)
             : LaunchTyped<kMx, kType, kFormat, Fp8Encoder::kSoftware>(p, args, stream);
}

template <bool kMx, SourceType kType>
cudaError_t LaunchForFormat(const BlockQuantizeLaunchParams& p, const KernelArgs& args,
                            cudaStream_t stream) {
  return p.format == Fp8Format::kE4M3
             ? LaunchForEncoder<kMx, kType, Fp8Format::kE4M3>(p, args, stream)
             : LaunchForEncoder<kMx, kType, Fp8Format::kE5M2>(p, args, stream);
}

template <bool kMx>
cudaError_t LaunchForSource(const BlockQuantizeLaunchParams& p, const KernelArgs& args,
                            cudaStream_t stream) {
  return p.type == SourceType::kFloat32
             ? LaunchForFormat<kMx, SourceType::kFloat32>(p, args, stream)
             : LaunchForFormat<kMx, SourceType::kBFloat16>(p, args, stream);
}

}  // namespace

int64_t BlockQuantizeDbiasSlabs(const BlockQuantizeLaunchParams& p) {
  const int64_t slab_rows = p.recipe == BlockRecipe::kMxfp8 && !Mxfp8TileKernelApplies(p)
                                ? Tile<kMxfp8Tiles, SourceType::kFloat32>::kTileRows
                                : kMxfp8TileRows;
  static_assert(Tile<kBlockTiles, SourceType::kFloat32>::kTileRows == kMxfp8TileRows &&
                    Tile<kBlockTiles, SourceType::kBFloat16>::kTileRows == kMxfp8TileRows &&
                    Tile<kMxfp8Tiles, SourceType::kBFloat16>::kTileRows ==
                        Tile<kMxfp8Tiles, SourceType::kFloat32>::kTileRows,
                "slab heights");
  return (p.rows + slab_rows - 1) / slab_rows;
}

cudaError_t LaunchBlockQuantize(const BlockQuantizeLaunchParams& p, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(p.amax_bits, 0, sizeof(uint32_t), stream);
  if (status != cudaSuccess) return status;
  if (p.rows == 0 || p.cols == 0) {
    if (p.dbias == nullptr || p.cols == 0) return cudaSuccess;
    return cudaMemsetAsync(p.dbias, 0, p.cols * sizeof(float), stream);
  }
  if (Mxfp8TileKernelApplies(p)) return LaunchMxfp8TileQuantize(p, stream);
  KernelArgs args;
  args.x = p.x;
  args.rows = p.rows;
  args.cols = p.cols;
  args.two_d = p.recipe == BlockRecipe::kBlock2D;
  args.power_2_scale = p.power_2_scale;
  args.amax_epsilon = p.amax_epsilon;
  args.fp8_max = p.format == Fp8Format::kE4M3 ? kE4M3Max : kE5M2Max;
  args.rowwise = p.rowwise;
  args.rowwise_scale_inv = p.rowwise_scale_inv;
  args.columnwise = p.columnwise;
  args.columnwise_scale_inv = p.columnwise_scale_inv;
  args.amax_bits = p.amax_bits;
  args.dbias_partial = p.dbias != nullptr ? p.dbias_workspace : nullptr;
  return p.recipe == BlockRecipe::kMxfp8 ? LaunchForSource<kMxfp8Tiles>(p, args, stream)
                                         : LaunchForSource<kBlockTiles>(p, args, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
