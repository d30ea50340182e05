// The 128 x 128 register-tile FP8 cast-transpose behind LaunchQuantizePerTensor
// (cast_kernels.cu picks it for rows and cols multiples of 8, x 16-byte and outputs 8-byte
// aligned; FastCastTransposeKernel):
// - One 128 x 128 tile per 256-thread block; each thread owns 8 rows x 8 columns, read
//   with 16-byte loads (BF16: one per row; FP32: two, 32 columns apart), so a warp load
//   covers whole sectors. The thread transposes its 8 x 8 codes with byte permutes (two
//   4 x 4 transposes per 4-column group); both copies are staged in 32 KiB of shared memory
//   and leave as whole 128-byte lines (stored from registers they would leave as 64-byte
//   rowwise and 32-byte columnwise runs, three times the L2 write requests, ~2% slower).
// - Codes: q = cvt.rn.satfinite(x * scale) (Hopper's pair conversion, the encoder of
//   the normalization kernels (normalization_common.cuh) that its GPU test compares with core/float_codec.h for every
//   FP32 input), the product one FP32 multiply (__fmul_rn). satfinite saturates overflow
//   and +-Inf like the codec; NaN products get the codec's 0x7F, patched only in threads
//   whose fragment holds Inf or NaN (or when the scale is not finite), the only cases in
//   which a product can be NaN.
// - amax: BF16 magnitudes as packed 16-bit integers (max.u16x2), FP32 ones as 32-bit
//   integers (cast_kernels.cu says why the integer max propagates NaN), then a warp max and one
//   atomicMax per block.
// - Fused dbias (kDbias): after the stores each thread sums its 8 rows per column, the 4
//   lanes along rows add theirs with xor shuffles, the 4 warps along rows theirs in warp
//   order through 2 KiB of shared memory, and 128 threads write the tile's partial row;
//   cast_kernels.cu reduces the partial rows. Without dbias the kernel is unchanged.
// - rows % 32 != 0 (BF16 x, no dbias): FastCastTransposeHaloKernel writes each column's
//   runs shifted to whole 32-byte sectors, encoding the 32 rows above its tile again
//   (StoreColumnwiseWindows, HaloChunks).
// Target: close to a device copy of the same bytes. On an H200 (bench/cast_transpose_bench,
// 16384 x 8192 -> E4M3 rowwise + columnwise, device copy ~4.2 TB/s) BF16 x reaches ~3.75
// TB/s and FP32 x ~4 TB/s, about three times the 64 x 64 kernel. 41 registers, 5 blocks
// (40 warps) per SM, no spills; columnwise lines go under an L2 evict-last policy. With
// dbias ~3% slower: 80 registers, so 3 blocks per SM, plus the 4 MiB of tile partials and
// the FP64 reduce kernel.
#include "kernels/cuda/cast/cast_transpose_tile_kernels.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast/cast_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

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
  __device__ void Values(int k, int g, float v[4]) const { GroupValues(raw[k], g, v); }
  // Group g (columns 4 g .. 4 g + 3) of 8 BF16 values loaded as one uint4, widened.
  __device__ static void GroupValues(const uint4& r, int g, float v[4]) {
    const uint32_t lo = g == 0 ? r.x : r.z;
    const uint32_t hi = g == 0 ? r.y : r.w;
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

// dbias of a 128 x 128 tile, first half: the column sums of the 32 rows of the warp's
// row band for this thread's 8 columns (s[g][i]: group g, column i). Each thread sums its
// 8 rows in row order, then the 4 lanes along rows add theirs (xor shuffles), so every
// lane ends with its band's sums. Values outside the tensor are zero-filled by Load.
template <SourceType kType>
__device__ __forceinline__ void BandColumnSums(const Fragment<kType>& f, float s[2][4]) {
#pragma unroll
  for (int g = 0; g < 2; ++g) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[g][i] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < kUnit; ++k) {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      float v[4];
      f.Values(k, g, v);
#pragma unroll
      for (int i = 0; i < 4; ++i) s[g][i] += v[i];
    }
  }
#pragma unroll
  for (int g = 0; g < 2; ++g) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      s[g][i] += __shfl_xor_sync(0xFFFFFFFFu, s[g][i], 1);
      s[g][i] += __shfl_xor_sync(0xFFFFFFFFu, s[g][i], 2);
    }
  }
}

// Second half: the 4 warps along rows add their band sums in warp order through 2 KiB of
// shared memory, and 128 threads write the tile's FP32 partial row, partial_row[c] for
// the tile's columns.
template <SourceType kType>
__device__ __forceinline__ void WriteTileColumnSums(const float s[2][4], int warp, int lane,
                                                    int64_t tile_col0, int64_t cols,
                                                    float* partial_row) {
  __shared__ float sums[kWarpsDown][kFastTileCols];
  if (lane % kLanesDown == 0) {
    const int warp_col = (warp / kWarpsDown) * (kLanesAcross * kUnit);
#pragma unroll
    for (int g = 0; g < 2; ++g) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sums[warp % kWarpsDown][warp_col + Fragment<kType>::GroupColumn(lane / kLanesDown, g) + i] =
            s[g][i];
      }
    }
  }
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kFastTileCols && tile_col0 + t < cols) {
    partial_row[tile_col0 + t] = ((sums[0][t] + sums[1][t]) + sums[2][t]) + sums[3][t];
  }
}

// Columnwise lines of a tile when rows % 32 != 0 (kHalo). Column c's copy starts at byte
// c * rows, so when that is not a multiple of 32 every run of 128 rows starts and ends inside
// a 32-byte sector shared with the vertically adjacent tiles, and those half-written sectors
// cost an H200 12-19% of the kernel's time (a layout-free imitation with aligned runs ran at
// the aligned shapes' speed, and making the two halves arrive together did not help). So tile t writes rows [128 t - s, 128 t + 128 - s) of column c
// instead, s = (c * rows) % 32: whole sectors. The s rows above the tile come from the halo
// (the codes of the 32 rows above, HaloChunks); the tile's own last s rows are left to tile
// t + 1. Tile 0 starts at row 0 and the last tile ends at `rows`: only the sectors at column
// boundaries stay shared. A window spans at most 18 units (the last tile: up to 120 own rows
// plus 24 halo rows), so the lanes of a line take units u and u + 16.
template <typename Swizzle>
__device__ __forceinline__ void StoreColumnwiseWindows(uint8_t* out, int64_t rows, int64_t cols, int64_t tile_row0,
                                                       int64_t tile_col0, const uint2 (*tile)[kFastTileRows / 8],
                                                       const uint8_t (*halo)[kFastTileCols], Swizzle swizzle, int warp,
                                                       int lane) {
  const uint64_t policy = L2EvictLastPolicy();
  constexpr int kUnits = kFastTileRows / 8;                              // 16 per own line
  constexpr int kWarpLines = kFastTileCols / (kFastThreads / 32);        // 16 lines per warp
  const int unit = lane % kUnits;
  const bool last_tile = tile_row0 + kFastTileRows >= rows;
#pragma unroll
  for (int j = 0; j < kWarpLines / 2; ++j) {
    const int line = warp * kWarpLines + 2 * j + lane / kUnits;
    const int64_t c = tile_col0 + line;
    if (c >= cols) continue;
    const int64_t shift = (c * rows) & 31;
    const int64_t lo = tile_row0 == 0 ? 0 : tile_row0 - shift;
    const int64_t hi = last_tile ? rows : tile_row0 + kFastTileRows - shift;
    const int first = static_cast<int>((lo - (tile_row0 - 32)) / 8);  // unit in [halo 0-3 | own 4-19]
    const int n = static_cast<int>((hi - lo) / 8);
    uint8_t* dst = out + c * rows + lo;
#pragma unroll
    for (int pass = 0; pass < 2; ++pass) {
      const int u = unit + pass * kUnits;
      if (u < n) {
        const int k = first + u;
        uint2 v;
        if (k < 4) {  // rows 8 k .. 8 k + 7 above the tile, one byte per row
          v = make_uint2(0u, 0u);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            v.x |= static_cast<uint32_t>(halo[8 * k + r][line]) << (8 * r);
            v.y |= static_cast<uint32_t>(halo[8 * k + 4 + r][line]) << (8 * r);
          }
        } else {
          v = tile[line][(k - 4) ^ swizzle(line)];
        }
        StoreGlobal8EvictLast(dst + 8 * u, v.x, v.y, policy);
      }
    }
  }
}

// The halo kernel's 32 rows above the tile (row-major codes, row h = tile row - 32 + h; a
// function of its own so that the other kernels' shared-memory layout stays as it was).
__device__ __forceinline__ uint8_t (*HaloRows())[kFastTileCols] {
  __shared__ alignas(16) uint8_t halo_rows[32][kFastTileCols];
  return halo_rows;
}

// The halo of a tile spread over the whole block (BF16 x): thread i takes 16-byte chunks i
// and i + 256 (8 columns each) of the 32 rows x 128 columns above the tile, loaded with the
// thread's own fragment so that their latency overlaps, encoded after it (always with the
// NaN-patching encoder: 16 values a thread) into HaloRows(). Two warps taking the halo as a
// second fragment after their own were ~10% slower.
struct HaloChunks {
  static constexpr int kColumns = 8;                                // per chunk
  static constexpr int kPerRow = kFastTileCols / kColumns;          // 16
  static constexpr int kPerThread = 32 * kPerRow / kFastThreads;    // 2
  uint4 raw[kPerThread];

  __device__ void Load(const uint16_t* x, int64_t cols, int64_t tile_row0, int64_t tile_col0) {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int q = static_cast<int>(threadIdx.x) + i * kFastThreads;
      const int64_t col = tile_col0 + (q % kPerRow) * kColumns;
      raw[i] = col < cols ? *reinterpret_cast<const uint4*>(x + (tile_row0 - 32 + q / kPerRow) * cols + col)
                          : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  template <Fp8Format kFormat>
  __device__ void Stage(float scale, uint8_t (*halo_rows)[kFastTileCols]) const {
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int q = static_cast<int>(threadIdx.x) + i * kFastThreads;
      float lo[4], hi[4];  // columns 0-3 and 4-7 of the chunk
      Fragment<SourceType::kBFloat16>::GroupValues(raw[i], 0, lo);
      Fragment<SourceType::kBFloat16>::GroupValues(raw[i], 1, hi);
      *reinterpret_cast<uint2*>(&halo_rows[q / kPerRow][(q % kPerRow) * kColumns]) =
          make_uint2(EncodeQuad<kFormat, true>(lo, scale), EncodeQuad<kFormat, true>(hi, scale));
    }
  }
};

// One 128 x 128 tile per block (the body of FastCastTransposeKernel and, with kHalo,
// FastCastTransposeHaloKernel below; they differ in their launch bounds). Warp w covers rows
// 32 * (w % 4) .. + 31 and columns 64 * (w / 4) .. + 63 of the tile; lane l owns rows
// 8 * (l % 4) .. + 7 of those and the two 4-column groups Fragment::GroupColumn(l / 4, g).
// Every access is 16 bytes (loads) or 8 bytes (stores), and each warp instruction covers
// whole 32-byte sectors: loads 128 (BF16) or 2 x 64 (FP32) contiguous bytes per row, rowwise
// stores 64 (BF16) or 32 bytes per row, columnwise stores 32 bytes per transposed row (8 rows
// x 4 lanes).
template <SourceType kType, Fp8Format kFormat, bool kDbias, bool kHalo>
__device__ __forceinline__ void CastTransposeTile(const typename Fragment<kType>::Element* __restrict__ x, int64_t rows,
                                                  int64_t cols, float scale, float scale_inv,
                                                  const float* scale_pair, uint8_t* __restrict__ rowwise,
                                                  uint8_t* __restrict__ columnwise, float* rowwise_scale_inv,
                                                  float* columnwise_scale_inv, uint32_t* amax_bits,
                                                  float* __restrict__ dbias_partial) {
  if (scale_pair != nullptr) {
    scale = scale_pair[0];
    scale_inv = scale_pair[1];
  }
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
  // kHalo: the 32 rows above the tile (StoreColumnwiseWindows says why).
  const bool has_halo = kHalo && columnwise != nullptr && tile_row0 > 0;
  static_assert(!kHalo || (kType == SourceType::kBFloat16 && !kDbias), "the halo kernel: BF16 x, no dbias");
  HaloChunks halo;
  if constexpr (kHalo) {
    if (has_halo) halo.Load(x, cols, tile_row0, tile_col0);
  }
  const uint32_t magnitude = f.MagnitudeMax();  // zero-filled outside the tensor
  uint32_t codes[kUnit][2];
  // Only fragments holding Inf or NaN (or a non-finite scale) can make a NaN product.
  if (magnitude >= kInfBits || !isfinite(scale)) {
    EncodeFragment<kType, kFormat, true>(f, scale, codes);
  } else {
    EncodeFragment<kType, kFormat, false>(f, scale, codes);
  }

  // Both copies go through shared memory and leave as whole 128-byte lines (16 lanes x 8
  // bytes per line): the per-fragment 8-byte stores made 64-byte rowwise and 32-byte
  // columnwise L2 write requests, three times as many as the bytes need. Tile lines are 16
  // units of 8 bytes; unit u of line l is kept at u ^ swizzle(l), which spreads each warp's
  // staging stores over all banks (two wavefronts per 256 bytes) and keeps each line whole.
  __shared__ uint2 row_tile[kFastTileRows][kFastTileCols / 8];   // row r, columns 8 u ..
  __shared__ uint2 col_tile[kFastTileCols][kFastTileRows / 8];   // column c, rows 8 u ..
  const int tile_r = static_cast<int>(r0 - tile_row0);
  if (rowwise != nullptr) {
#pragma unroll
    for (int k = 0; k < kUnit; ++k) {
      const int row = tile_r + k;
      if (kType == SourceType::kBFloat16) {  // both groups adjacent: one unit
        const int col = static_cast<int>(c[0] - tile_col0);
        row_tile[row][(col / 8) ^ RowLineSwizzle<kFastTileCols / 8>(row)] = make_uint2(codes[k][0], codes[k][1]);
      } else {
#pragma unroll
        for (int g = 0; g < 2; ++g) {  // 4 bytes per group, half a unit
          const int col = static_cast<int>(c[g] - tile_col0);
          uint2& unit = row_tile[row][(col / 8) ^ RowLineSwizzle<kFastTileCols / 8>(row)];
          reinterpret_cast<uint32_t*>(&unit)[(col / 4) & 1] = codes[k][g];
        }
      }
    }
  }
  uint8_t (*const halo_rows)[kFastTileCols] = kHalo ? HaloRows() : nullptr;  // kHalo: rows above the tile
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
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int col = static_cast<int>(c[g] - tile_col0) + i;
        col_tile[col][(tile_r / 8) ^ ColumnLineSwizzle<kType>(col)] = make_uint2(top[i], bottom[i]);
      }
    }
  }
  if constexpr (kHalo) {
    if (has_halo) halo.template Stage<kFormat>(scale, halo_rows);
  }
  if (rowwise != nullptr || columnwise != nullptr) {  // uniform across the block
    __syncthreads();
    if (rowwise != nullptr) {
      StoreStagedLines<kFastTileCols / 8, kFastTileRows, kFastThreads>(
          rowwise, cols, tile_row0, rows, tile_col0, cols, row_tile, RowLineSwizzle<kFastTileCols / 8>, warp, lane);
    }
    if (columnwise != nullptr) {
      if constexpr (kHalo) {
        StoreColumnwiseWindows(columnwise, rows, cols, tile_row0, tile_col0, col_tile, halo_rows,
                               ColumnLineSwizzle<kType>, warp, lane);
      } else {
        StoreStagedLines<kFastTileRows / 8, kFastTileCols, kFastThreads, true>(
            columnwise, rows, tile_col0, cols, tile_row0, rows, col_tile, ColumnLineSwizzle<kType>, warp, lane);
      }
    }
  }

  if constexpr (kDbias) {
    // Summed after the stores: taken before the encode, the unpacked BF16 values stay
    // live through it (120 instead of 80 registers).
    float band_sums[2][4];
    BandColumnSums<kType>(f, band_sums);
    WriteTileColumnSums<kType>(band_sums, warp, lane, tile_col0, cols,
                               dbias_partial + (static_cast<int64_t>(blockIdx.x) / tiles_across) * cols);
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

template <SourceType kType, Fp8Format kFormat, bool kDbias>
__global__ void __launch_bounds__(kFastThreads)
    FastCastTransposeKernel(const typename Fragment<kType>::Element* __restrict__ x, int64_t rows, int64_t cols,
                            float scale, float scale_inv, const float* scale_pair, uint8_t* __restrict__ rowwise,
                            uint8_t* __restrict__ columnwise, float* rowwise_scale_inv, float* columnwise_scale_inv,
                            uint32_t* amax_bits, float* __restrict__ dbias_partial) {
  CastTransposeTile<kType, kFormat, kDbias, false>(x, rows, cols, scale, scale_inv, scale_pair, rowwise, columnwise,
                                                   rowwise_scale_inv, columnwise_scale_inv, amax_bits, dbias_partial);
}

// The halo kernel: BF16 x without dbias only (the launcher says why), held to 4 blocks per SM
// (64 registers; at 5 blocks ptxas spills and the kernel is ~4% slower).
template <Fp8Format kFormat>
__global__ void __launch_bounds__(kFastThreads, 4)
    FastCastTransposeHaloKernel(const uint16_t* __restrict__ x, int64_t rows, int64_t cols, float scale,
                                float scale_inv, const float* scale_pair, uint8_t* __restrict__ rowwise,
                                uint8_t* __restrict__ columnwise, float* rowwise_scale_inv,
                                float* columnwise_scale_inv, uint32_t* amax_bits) {
  CastTransposeTile<SourceType::kBFloat16, kFormat, false, true>(x, rows, cols, scale, scale_inv, scale_pair,
                                                                 rowwise, columnwise, rowwise_scale_inv,
                                                                 columnwise_scale_inv, amax_bits, nullptr);
}

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

template <SourceType kType, Fp8Format kFormat, bool kDbias>
cudaError_t LaunchTyped(const QuantizeLaunchParams& p, cudaStream_t stream) {
  const int64_t tiles = ((p.rows + kFastTileRows - 1) / kFastTileRows) *
                        ((p.cols + kFastTileCols - 1) / kFastTileCols);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  // Columnwise runs that do not start on a 32-byte boundary (rows % 32 != 0): the halo
  // kernel for BF16 x without dbias, which it brings back to within ~4% of the aligned
  // shapes (the plain kernel loses 16-28% there on an H200). FP32 x and dbias lose more to
  // the halo's extra reads and registers than the misaligned sectors cost them, so they keep
  // the aligned kernel.
  if constexpr (kType == SourceType::kBFloat16 && !kDbias) {
    if (p.columnwise != nullptr && p.rows % 32 != 0) {
      FastCastTransposeHaloKernel<kFormat><<<static_cast<unsigned>(tiles), kFastThreads, 0, stream>>>(
          static_cast<const uint16_t*>(p.x), p.rows, p.cols, p.scale, p.scale_inv, p.scale_pair, p.rowwise,
          p.columnwise, p.rowwise_scale_inv, p.columnwise_scale_inv, p.amax_bits);
      return cudaGetLastError();
    }
  }
  FastCastTransposeKernel<kType, kFormat, kDbias><<<static_cast<unsigned>(tiles), kFastThreads, 0, stream>>>(
      static_cast<const typename Fragment<kType>::Element*>(p.x), p.rows, p.cols, p.scale,
      p.scale_inv, p.scale_pair, p.rowwise, p.columnwise, p.rowwise_scale_inv, p.columnwise_scale_inv, p.amax_bits,
      p.dbias_workspace);
  return cudaGetLastError();
}

template <SourceType kType, Fp8Format kFormat>
cudaError_t LaunchWithDbiasFlag(const QuantizeLaunchParams& p, cudaStream_t stream) {
  return p.dbias != nullptr ? LaunchTyped<kType, kFormat, true>(p, stream)
                            : LaunchTyped<kType, kFormat, false>(p, stream);
}

}  // namespace

static_assert(kFastTileRows == kCastTransposeTileRows, "tile height seen by the launcher");

bool CastTransposeTileApplies(const QuantizeLaunchParams& p) {
  return p.kernel == CastTransposeKernel::kAuto && p.rows % kUnit == 0 && p.cols % kUnit == 0 &&
         IsAligned(p.x, 16) && (p.rowwise == nullptr || IsAligned(p.rowwise, 8)) &&
         (p.columnwise == nullptr || IsAligned(p.columnwise, 8));
}

cudaError_t LaunchCastTransposeTile(const QuantizeLaunchParams& p, cudaStream_t stream) {
  const bool e4m3 = p.format == Fp8Format::kE4M3;
  if (p.type == SourceType::kFloat32) {
    return e4m3 ? LaunchWithDbiasFlag<SourceType::kFloat32, Fp8Format::kE4M3>(p, stream)
                : LaunchWithDbiasFlag<SourceType::kFloat32, Fp8Format::kE5M2>(p, stream);
  }
  return e4m3 ? LaunchWithDbiasFlag<SourceType::kBFloat16, Fp8Format::kE4M3>(p, stream)
              : LaunchWithDbiasFlag<SourceType::kBFloat16, Fp8Format::kE5M2>(p, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
