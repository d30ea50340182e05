// CUDA kernels for amax, fused per-tensor FP8 cast(+transpose) and dequantize.
//
// Fused cast-transpose, main kernel (rows and cols multiples of 8, x 16-byte and outputs
// 8-byte aligned; FastCastTransposeKernel):
// - One 128 x 128 tile per 256-thread block; each thread owns 8 rows x 8 columns, read
//   with 16-byte loads (BF16: one per row; FP32: two, 32 columns apart), so a warp load
//   covers whole sectors. No shared memory: the rowwise codes (8 or 2 x 4 bytes per row)
//   go out straight from registers, and the thread transposes its 8 x 8 codes with byte
//   permutes (two 4 x 4 transposes per 4-column group) into 8-byte columnwise stores of 8
//   source rows; the 4 lanes along rows write 32 contiguous bytes of each transposed row.
// - Codes: q = cvt.rn.satfinite(x * scale) (Hopper's pair conversion, the encoder of
//   normalization_kernels.cu that its GPU test compares with core/float_codec.h for every
//   FP32 input), the product one FP32 multiply (__fmul_rn). satfinite saturates overflow
//   and +-Inf like the codec; NaN products get the codec's 0x7F, patched only in threads
//   whose fragment holds Inf or NaN (or when the scale is not finite), the only cases in
//   which a product can be NaN.
// - amax: BF16 magnitudes as packed 16-bit integers (max.u16x2), FP32 ones as 32-bit
//   integers (see below for why the integer max propagates NaN), then a warp max and one
//   atomicMax per block.
// Fallback (every other shape: 1 x 259, 257 x 259, 128 x 129, ...; QuantizeTileKernel),
// also selectable with CastTransposeKernel::kTiled64:
// - Every conversion uses the integer-only codecs of core/float_codec.h (the same code the
//   CPU runs), and x * scale is one FP32 multiply (__fmul_rn).
// - amax is kept as the FP32 bits of |x| in a uint32: for non-negative floats integer
//   order is value order, and every NaN's magnitude bits exceed Inf's, so a plain
//   unsigned max (warp __reduce_max_sync, shared memory across warps, one atomicMax per
//   block) propagates NaN without a separate flag.
// - 64x64 tiles, one 256-thread block each (16 threads across a row, 4 elements per
//   thread, 4 passes down the tile). Rows are read once, coalesced; the rowwise codes are
//   stored straight away and also parked in a shared-memory tile; after one barrier the
//   block writes the tile transposed, 4 consecutive bytes per thread. The tile row is
//   padded by 4 bytes so the transposed reads spread over the shared-memory banks.
// - A vectorized variant (float4 / 8-byte BF16 loads, 32-bit packed stores) runs when
//   rows and cols are multiples of 4 and the pointers are aligned; a scalar, bounds-
//   checked variant handles every other shape.
// Both grids are 1-D over tiles, so no grid-dimension limit caps the row count.
// Measured on the H200 (bench/cast_transpose_bench, median of 100, 16384 x 8192 -> E4M3
// rowwise + columnwise; device copy 4.16 TB/s in the same run): BF16 x (537 MB) 145.8 us
// = 3.68 TB/s with the 128 x 128 kernel vs 427 us (1.26 TB/s) with the 64 x 64 one; FP32
// x (805 MB) 198 us = 4.06 TB/s vs 416 us. ncu (BF16): DRAM 76% of peak, 48 registers,
// 5 blocks (40 warps) per SM, no spills.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kTile = 64;                                  // tile is kTile x kTile
constexpr int kElementsPerThread = 4;                      // consecutive elements
constexpr int kThreadsPerTile = 256;
constexpr int kThreadsAcrossTile = kTile / kElementsPerThread;          // 16
constexpr int kRowsPerPass = kThreadsPerTile / kThreadsAcrossTile;      // 16
constexpr int kPasses = kTile / kRowsPerPass;                           // 4
constexpr int kTileRowPadBytes = 4;

constexpr int kReduceThreads = 256;
constexpr int kMaxReduceBlocks = 1024;
constexpr int kElementwiseThreads = 256;
constexpr int kMaxElementwiseBlocks = 4096;

// Named flags for the kernel variants.
constexpr bool kVectorized = true;
constexpr bool kScalar = false;

template <SourceType kType>
struct Source;

template <>
struct Source<SourceType::kFloat32> {
  using Element = float;
  __device__ static float ToFloat(float v) { return v; }
  // Four consecutive elements from a 16-byte aligned address.
  __device__ static void Load4(const float* p, float out[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

template <>
struct Source<SourceType::kBFloat16> {
  using Element = uint16_t;
  __device__ static float ToFloat(uint16_t v) { return Bf16ToFloat(v); }
  // Four consecutive elements from an 8-byte aligned address.
  __device__ static void Load4(const uint16_t* p, float out[4]) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = Bf16ToFloat(static_cast<uint16_t>(v.x & 0xFFFFu));
    out[1] = Bf16ToFloat(static_cast<uint16_t>(v.x >> 16));
    out[2] = Bf16ToFloat(static_cast<uint16_t>(v.y & 0xFFFFu));
    out[3] = Bf16ToFloat(static_cast<uint16_t>(v.y >> 16));
  }
};

template <Fp8Format kFormat>
__device__ __forceinline__ uint8_t EncodeFp8(float v) {
  return kFormat == Fp8Format::kE4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

template <SourceType kType, bool kVectorizedAccess>
__global__ void __launch_bounds__(kReduceThreads)
    AmaxKernel(const typename Source<kType>::Element* x, int64_t numel, uint32_t* amax_bits) {
  uint32_t local = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (kVectorizedAccess) {
    const int64_t groups = numel / kElementsPerThread;
    for (int64_t g = first; g < groups; g += stride) {
      float v[kElementsPerThread];
      Source<kType>::Load4(x + g * kElementsPerThread, v);
      for (int k = 0; k < kElementsPerThread; ++k) local = max(local, MagnitudeBits(v[k]));
    }
  } else {
    for (int64_t i = first; i < numel; i += stride) {
      local = max(local, MagnitudeBits(Source<kType>::ToFloat(x[i])));
    }
  }
  const uint32_t block_max = BlockMax<kReduceThreads>(local);
  if (threadIdx.x == 0 && block_max != 0u) atomicMax(amax_bits, block_max);
}

// Loads the thread's 4 elements of row `r` starting at column `c`; `valid` marks those
// inside the tensor.
template <SourceType kType, bool kVectorizedAccess>
__device__ __forceinline__ void LoadRowSegment(const typename Source<kType>::Element* x,
                                               int64_t rows, int64_t cols, int64_t r,
                                               int64_t c, float v[4], bool valid[4]) {
  if (kVectorizedAccess) {
    const bool inside = r < rows && c < cols;  // cols % 4 == 0: all four or none
    if (inside) Source<kType>::Load4(x + r * cols + c, v);
    for (int k = 0; k < kElementsPerThread; ++k) valid[k] = inside;
  } else {
    for (int k = 0; k < kElementsPerThread; ++k) {
      valid[k] = r < rows && c + k < cols;
      v[k] = valid[k] ? Source<kType>::ToFloat(x[r * cols + c + k]) : 0.0f;
    }
  }
}

__device__ __forceinline__ uint32_t Pack4(const uint8_t codes[4]) {
  return static_cast<uint32_t>(codes[0]) | (static_cast<uint32_t>(codes[1]) << 8) |
         (static_cast<uint32_t>(codes[2]) << 16) | (static_cast<uint32_t>(codes[3]) << 24);
}

template <SourceType kType, Fp8Format kFormat, bool kVectorizedAccess>
__global__ void __launch_bounds__(kThreadsPerTile)
    QuantizeTileKernel(const typename Source<kType>::Element* x, int64_t rows, int64_t cols,
                       float scale, float scale_inv, uint8_t* rowwise, uint8_t* columnwise,
                       float* rowwise_scale_inv, float* columnwise_scale_inv,
                       uint32_t* amax_bits) {
  __shared__ uint8_t tile[kTile][kTile + kTileRowPadBytes];
  const int64_t tiles_across = (cols + kTile - 1) / kTile;
  const int64_t tile_row0 = (static_cast<int64_t>(blockIdx.x) / tiles_across) * kTile;
  const int64_t tile_col0 = (static_cast<int64_t>(blockIdx.x) % tiles_across) * kTile;
  const int lane_across = threadIdx.x % kThreadsAcrossTile;
  const int lane_down = threadIdx.x / kThreadsAcrossTile;

  uint32_t local_amax = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int tr = pass * kRowsPerPass + lane_down;
    const int tc = lane_across * kElementsPerThread;
    const int64_t r = tile_row0 + tr;
    const int64_t c = tile_col0 + tc;
    float v[kElementsPerThread];
    bool valid[kElementsPerThread];
    LoadRowSegment<kType, kVectorizedAccess>(x, rows, cols, r, c, v, valid);
    uint8_t codes[kElementsPerThread];
    for (int k = 0; k < kElementsPerThread; ++k) {
      if (valid[k]) local_amax = max(local_amax, MagnitudeBits(v[k]));
      codes[k] = EncodeFp8<kFormat>(__fmul_rn(v[k], scale));
    }
    if (rowwise != nullptr) {
      if (kVectorizedAccess) {
        if (valid[0]) *reinterpret_cast<uint32_t*>(rowwise + r * cols + c) = Pack4(codes);
      } else {
        for (int k = 0; k < kElementsPerThread; ++k) {
          if (valid[k]) rowwise[r * cols + c + k] = codes[k];
        }
      }
    }
    if (columnwise != nullptr) {
      for (int k = 0; k < kElementsPerThread; ++k) tile[tr][tc + k] = codes[k];
    }
  }

  if (columnwise != nullptr) {  // uniform across the block: the barrier is safe
    __syncthreads();
    for (int pass = 0; pass < kPasses; ++pass) {
      const int tc = pass * kRowsPerPass + lane_down;    // output row = source column
      const int tr = lane_across * kElementsPerThread;   // 4 consecutive source rows
      const int64_t c = tile_col0 + tc;
      const int64_t r = tile_row0 + tr;
      if (c >= cols) continue;
      uint8_t codes[kElementsPerThread];
      for (int k = 0; k < kElementsPerThread; ++k) codes[k] = tile[tr + k][tc];
      if (kVectorizedAccess) {
        if (r < rows) *reinterpret_cast<uint32_t*>(columnwise + c * rows + r) = Pack4(codes);
      } else {
        for (int k = 0; k < kElementsPerThread; ++k) {
          if (r + k < rows) columnwise[c * rows + r + k] = codes[k];
        }
      }
    }
  }

  const uint32_t block_amax = BlockMax<kThreadsPerTile>(local_amax);
  if (threadIdx.x == 0) {
    if (block_amax != 0u) atomicMax(amax_bits, block_amax);
    if (blockIdx.x == 0) {
      if (rowwise_scale_inv != nullptr) *rowwise_scale_inv = scale_inv;
      if (columnwise_scale_inv != nullptr) *columnwise_scale_inv = scale_inv;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Fast cast-transpose (rows % 8 == 0, cols % 8 == 0, x 16-byte and outputs 8-byte aligned).

constexpr int kFastThreads = 256;          // 8 warps
constexpr int kUnit = 8;                   // each thread owns 8 rows x 8 columns
constexpr int kLanesDown = 4;              // lanes of a warp along rows
constexpr int kLanesAcross = 8;            // lanes of a warp along columns
constexpr int kWarpsDown = 4;
constexpr int kWarpsAcross = 2;
constexpr int kFastTileRows = kWarpsDown * kLanesDown * kUnit;        // 128
constexpr int kFastTileCols = kWarpsAcross * kLanesAcross * kUnit;    // 128
constexpr uint32_t kInfBits = 0x7F800000u;

// Codes of v[0..3] * scale, v[0] in the low byte, each product one FP32 multiply. With
// kPatchNan a NaN product gets the codec's NaN code 0x7F; without it the caller knows no
// product is NaN (finite scale, no Inf or NaN among the inputs).
template <Fp8Format kFormat, bool kPatchNan>
__device__ __forceinline__ uint32_t EncodeQuad(const float v[4], float scale) {
  float s[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) s[i] = __fmul_rn(v[i], scale);
  uint32_t codes = CvtPair<kFormat>(s[0], s[1]) | (CvtPair<kFormat>(s[2], s[3]) << 16);
  if constexpr (kPatchNan) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (s[i] != s[i]) codes = (codes & ~(0xFFu << (8 * i))) | (0x7Fu << (8 * i));
    }
  }
  return codes;
}

// Per-thread register fragment: 8 rows x two groups of 4 columns, loaded with 16-byte
// accesses. BF16: one load per row covers both groups (columns 8 * lane .. + 7). FP32: one
// load per group, the groups 32 columns apart (so each warp load reads whole sectors).
template <SourceType kType>
struct Fragment;

template <>
struct Fragment<SourceType::kBFloat16> {
  using Element = uint16_t;
  uint4 raw[kUnit];  // row k: 8 BF16, group g in words 2g, 2g + 1
  // Column offset of group g relative to the warp's first column, for lane `across`.
  __device__ static int GroupColumn(int across, int g) { return across * kUnit + g * 4; }
  __device__ void Load(const uint16_t* x, int64_t cols, int64_t r, int64_t c0, bool valid[2]) {
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
      raw[k] = valid[0] ? *reinterpret_cast<const uint4*>(x + (r + k) * cols + c0)
                        : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  // max(|x|) as FP32 bits: the BF16 magnitudes are compared as packed 16-bit integers
  // (NaN's bits exceed Inf's as in FP32), and widened once at the end.
  __device__ uint32_t MagnitudeMax() const {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
      m = __vmaxu2(m, raw[k].x & 0x7FFF7FFFu);
      m = __vmaxu2(m, raw[k].y & 0x7FFF7FFFu);
      m = __vmaxu2(m, raw[k].z & 0x7FFF7FFFu);
      m = __vmaxu2(m, raw[k].w & 0x7FFF7FFFu);
    }
    return max(m & 0xFFFF0000u, m << 16);
  }
  __device__ void Values(int k, int g, float v[4]) const {
    const uint32_t lo = g == 0 ? raw[k].x : raw[k].z;
    const uint32_t hi = g == 0 ? raw[k].y : raw[k].w;
    v[0] = __uint_as_float(lo << 16);
    v[1] = __uint_as_float(lo & 0xFFFF0000u);
    v[2] = __uint_as_float(hi << 16);
    v[3] = __uint_as_float(hi & 0xFFFF0000u);
  }
};

template <>
struct Fragment<SourceType::kFloat32> {
  using Element = float;
  float4 raw[kUnit][2];
  __device__ static int GroupColumn(int across, int g) { return g * 32 + across * 4; }
  __device__ void Load(const float* x, int64_t cols, int64_t r, int64_t c0, bool valid[2]) {
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        raw[k][g] = valid[g] ? *reinterpret_cast<const float4*>(x + (r + k) * cols + c0 + g * 32)
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
  }
  __device__ uint32_t MagnitudeMax() const {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        m = max(m, MagnitudeBits(raw[k][g].x));
        m = max(m, MagnitudeBits(raw[k][g].y));
        m = max(m, MagnitudeBits(raw[k][g].z));
        m = max(m, MagnitudeBits(raw[k][g].w));
      }
    }
    return m;
  }
  __device__ void Values(int k, int g, float v[4]) const {
    v[0] = raw[k][g].x;
    v[1] = raw[k][g].y;
    v[2] = raw[k][g].z;
    v[3] = raw[k][g].w;
  }
};

// 4x4 byte transpose: in[k] holds row k's codes of 4 columns (column i in byte i); out[i]
// holds column i's codes of the 4 rows (row k in byte k).
__device__ __forceinline__ void Transpose4x4(const uint32_t in[4], uint32_t out[4]) {
  const uint32_t a0 = __byte_perm(in[0], in[1], 0x5140);  // r0c0 r1c0 r0c1 r1c1
  const uint32_t a1 = __byte_perm(in[0], in[1], 0x7362);  // r0c2 r1c2 r0c3 r1c3
  const uint32_t a2 = __byte_perm(in[2], in[3], 0x5140);  // r2c0 r3c0 r2c1 r3c1
  const uint32_t a3 = __byte_perm(in[2], in[3], 0x7362);  // r2c2 r3c2 r2c3 r3c3
  out[0] = __byte_perm(a0, a2, 0x5410);
  out[1] = __byte_perm(a0, a2, 0x7632);
  out[2] = __byte_perm(a1, a3, 0x5410);
  out[3] = __byte_perm(a1, a3, 0x7632);
}

// Encodes the fragment's 8 x 8 values: codes[k][g] = row k, group g (column i in byte i).
template <SourceType kType, Fp8Format kFormat, bool kPatchNan>
__device__ __forceinline__ void EncodeFragment(const Fragment<kType>& f, float scale,
                                               uint32_t codes[kUnit][2]) {
#pragma unroll
  for (int k = 0; k < kUnit; ++k) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      float v[4];
      f.Values(k, g, v);
      codes[k][g] = EncodeQuad<kFormat, kPatchNan>(v, scale);
    }
  }
}

// One 128 x 128 tile per block. Warp w covers rows 32 * (w % 4) .. + 31 and columns
// 64 * (w / 4) .. + 63 of the tile; lane l owns rows 8 * (l % 4) .. + 7 of those and the
// two 4-column groups Fragment::GroupColumn(l / 4, g). Every access is 16 bytes (loads)
// or 8 bytes (stores), and each warp instruction covers whole 32-byte sectors: loads 128
// (BF16) or 2 x 64 (FP32) contiguous bytes per row, rowwise stores 64 (BF16) or 32
// bytes per row, columnwise stores 32 bytes per transposed row (8 rows x 4 lanes).
template <SourceType kType, Fp8Format kFormat>
__global__ void __launch_bounds__(kFastThreads)
    FastCastTransposeKernel(const typename Source<kType>::Element* __restrict__ x, int64_t rows,
                            int64_t cols, float scale, float scale_inv,
                            uint8_t* __restrict__ rowwise, uint8_t* __restrict__ columnwise,
                            float* rowwise_scale_inv, float* columnwise_scale_inv,
                            uint32_t* amax_bits) {
  const int64_t tiles_across = (cols + kFastTileCols - 1) / kFastTileCols;
  const int64_t tile_row0 = (static_cast<int64_t>(blockIdx.x) / tiles_across) * kFastTileRows;
  const int64_t tile_col0 = (static_cast<int64_t>(blockIdx.x) % tiles_across) * kFastTileCols;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int down = lane % kLanesDown;
  const int across = lane / kLanesDown;
  const int64_t r0 = tile_row0 + (warp % kWarpsDown) * (kLanesDown * kUnit) + down * kUnit;
  const int64_t warp_col0 = tile_col0 + (warp / kWarpsDown) * (kLanesAcross * kUnit);
  int64_t c[2];
  bool valid[2];
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    c[g] = warp_col0 + Fragment<kType>::GroupColumn(across, g);
    valid[g] = r0 < rows && c[g] < cols;  // rows % 8 == 0, cols % 8 == 0: all or nothing
  }

  Fragment<kType> f;
  f.Load(x, cols, r0, c[0], valid);
  const uint32_t magnitude = f.MagnitudeMax();  // zero-filled outside the tensor
  uint32_t codes[kUnit][2];
  // Only fragments holding Inf or NaN (or a non-finite scale) can make a NaN product.
  if (magnitude >= kInfBits || !isfinite(scale)) {
    EncodeFragment<kType, kFormat, true>(f, scale, codes);
  } else {
    EncodeFragment<kType, kFormat, false>(f, scale, codes);
  }

  if (rowwise != nullptr) {
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
      if (kType == SourceType::kBFloat16) {  // both groups adjacent: one 8-byte store
        if (valid[0]) {
          *reinterpret_cast<uint2*>(rowwise + (r0 + k) * cols + c[0]) =
              make_uint2(codes[k][0], codes[k][1]);
        }
      } else {
#pragma unroll
        for (int g = 0; g < 2; ++g) {
          if (valid[g]) *reinterpret_cast<uint32_t*>(rowwise + (r0 + k) * cols + c[g]) = codes[k][g];
        }
      }
    }
  }
  if (columnwise != nullptr) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      uint32_t top_in[4], bottom_in[4], top[4], bottom[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        top_in[k] = codes[k][g];
        bottom_in[k] = codes[k + 4][g];
      }
      Transpose4x4(top_in, top);
      Transpose4x4(bottom_in, bottom);
      if (valid[g]) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          *reinterpret_cast<uint2*>(columnwise + (c[g] + i) * rows + r0) =
              make_uint2(top[i], bottom[i]);
        }
      }
    }
  }

  const uint32_t block_amax = BlockMax<kFastThreads>(magnitude);
  if (threadIdx.x == 0) {
    if (block_amax != 0u) atomicMax(amax_bits, block_amax);
    if (blockIdx.x == 0) {
      if (rowwise_scale_inv != nullptr) *rowwise_scale_inv = scale_inv;
      if (columnwise_scale_inv != nullptr) *columnwise_scale_inv = scale_inv;
    }
  }
}

template <Fp8Format kFormat>
__global__ void __launch_bounds__(kElementwiseThreads)
    DequantizeKernel(const uint8_t* codes, int64_t numel, const float* scale_inv, float* out) {
  const float inv = *scale_inv;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    out[i] = __fmul_rn(DecodeFp8<kFormat>(codes[i]), inv);
  }
}

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int BlocksFor(int64_t work_items, int threads, int max_blocks) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

template <SourceType kType>
cudaError_t LaunchAmaxTyped(const void* x_raw, int64_t numel, uint32_t* amax_bits,
                            cudaStream_t stream) {
  using Element = typename Source<kType>::Element;
  const Element* x = static_cast<const Element*>(x_raw);
  const bool vectorized = numel % kElementsPerThread == 0 &&
                          IsAligned(x, sizeof(Element) * kElementsPerThread);
  const int64_t items = vectorized ? numel / kElementsPerThread : numel;
  const int blocks = BlocksFor(items, kReduceThreads, kMaxReduceBlocks);
  if (vectorized) {
    AmaxKernel<kType, kVectorized><<<blocks, kReduceThreads, 0, stream>>>(x, numel, amax_bits);
  } else {
    AmaxKernel<kType, kScalar><<<blocks, kReduceThreads, 0, stream>>>(x, numel, amax_bits);
  }
  return cudaGetLastError();
}

template <SourceType kType, Fp8Format kFormat>
cudaError_t LaunchQuantizeTyped(const QuantizeLaunchParams& p, cudaStream_t stream) {
  using Element = typename Source<kType>::Element;
  const Element* x = static_cast<const Element*>(p.x);
  const bool fast = p.kernel == CastTransposeKernel::kAuto && p.rows % kUnit == 0 && p.cols % kUnit == 0 && IsAligned(x, 16) &&
                    (p.rowwise == nullptr || IsAligned(p.rowwise, 8)) &&
                    (p.columnwise == nullptr || IsAligned(p.columnwise, 8));
  if (fast) {
    const int64_t tiles = ((p.rows + kFastTileRows - 1) / kFastTileRows) *
                          ((p.cols + kFastTileCols - 1) / kFastTileCols);
    if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
    FastCastTransposeKernel<kType, kFormat>
        <<<static_cast<unsigned>(tiles), kFastThreads, 0, stream>>>(
            x, p.rows, p.cols, p.scale, p.scale_inv, p.rowwise, p.columnwise,
            p.rowwise_scale_inv, p.columnwise_scale_inv, p.amax_bits);
    return cudaGetLastError();
  }
  const bool vectorized =
      p.rows % kElementsPerThread == 0 && p.cols % kElementsPerThread == 0 &&
      IsAligned(x, sizeof(Element) * kElementsPerThread) &&
      (p.rowwise == nullptr || IsAligned(p.rowwise, kElementsPerThread)) &&
      (p.columnwise == nullptr || IsAligned(p.columnwise, kElementsPerThread));
  const int64_t tiles = ((p.rows + kTile - 1) / kTile) * ((p.cols + kTile - 1) / kTile);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  const unsigned blocks = static_cast<unsigned>(tiles);
  if (vectorized) {
    QuantizeTileKernel<kType, kFormat, kVectorized><<<blocks, kThreadsPerTile, 0, stream>>>(
        x, p.rows, p.cols, p.scale, p.scale_inv, p.rowwise, p.columnwise, p.rowwise_scale_inv,
        p.columnwise_scale_inv, p.amax_bits);
  } else {
    QuantizeTileKernel<kType, kFormat, kScalar><<<blocks, kThreadsPerTile, 0, stream>>>(
        x, p.rows, p.cols, p.scale, p.scale_inv, p.rowwise, p.columnwise, p.rowwise_scale_inv,
        p.columnwise_scale_inv, p.amax_bits);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchAmax(const void* x, SourceType type, int64_t numel, uint32_t* amax_bits,
                       cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream);
  if (status != cudaSuccess || numel == 0) return status;
  return type == SourceType::kFloat32
             ? LaunchAmaxTyped<SourceType::kFloat32>(x, numel, amax_bits, stream)
             : LaunchAmaxTyped<SourceType::kBFloat16>(x, numel, amax_bits, stream);
}

cudaError_t LaunchQuantizePerTensor(const QuantizeLaunchParams& p, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(p.amax_bits, 0, sizeof(uint32_t), stream);
  if (status != cudaSuccess) return status;
  if (p.rows == 0 || p.cols == 0) {
    // No elements: only the scale_inv values need writing.
    if (p.rowwise_scale_inv != nullptr) {
      status = cudaMemcpyAsync(p.rowwise_scale_inv, &p.scale_inv, sizeof(float),
                               cudaMemcpyHostToDevice, stream);
      if (status != cudaSuccess) return status;
    }
    if (p.columnwise_scale_inv != nullptr) {
      status = cudaMemcpyAsync(p.columnwise_scale_inv, &p.scale_inv, sizeof(float),
                               cudaMemcpyHostToDevice, stream);
      if (status != cudaSuccess) return status;
    }
    return cudaStreamSynchronize(stream);  // the source is a host stack value
  }
  const bool e4m3 = p.format == Fp8Format::kE4M3;
  if (p.type == SourceType::kFloat32) {
    return e4m3 ? LaunchQuantizeTyped<SourceType::kFloat32, Fp8Format::kE4M3>(p, stream)
                : LaunchQuantizeTyped<SourceType::kFloat32, Fp8Format::kE5M2>(p, stream);
  }
  return e4m3 ? LaunchQuantizeTyped<SourceType::kBFloat16, Fp8Format::kE4M3>(p, stream)
              : LaunchQuantizeTyped<SourceType::kBFloat16, Fp8Format::kE5M2>(p, stream);
}

cudaError_t LaunchDequantize(const uint8_t* codes, Fp8Format format, int64_t numel,
                             const float* scale_inv, float* out, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  const int blocks = BlocksFor(numel, kElementwiseThreads, kMaxElementwiseBlocks);
  if (format == Fp8Format::kE4M3) {
    DequantizeKernel<Fp8Format::kE4M3>
        <<<blocks, kElementwiseThreads, 0, stream>>>(codes, numel, scale_inv, out);
  } else {
    DequantizeKernel<Fp8Format::kE5M2>
        <<<blocks, kElementwiseThreads, 0, stream>>>(codes, numel, scale_inv, out);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
