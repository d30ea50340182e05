// Internal to normalization_stats_warp.cu (and NormalizeRow to normalization_row_per_cta.cu):
// the per-lane tile work of the compute warps: encoding four normalized values, BF16 / FP16 y
// by pair conversions, the normalize pass over a lane's 8 rows x 8 columns, the paired order's
// columnwise stores (StorePairColumns and the half it leaves for the next tile) and the MXFP8
// output's rowwise scale rows. The kernel and its protocol are described in
// normalization_stats_warp.cu.
//
// Included inside namespace teserve::kernels::cuda::{anonymous}, after
// normalization_register_tile_common.cuh (by normalization_stats_warp.cu and, for
// NormalizeRow, normalization_row_per_cta.cu).
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_TILE_CUH_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_TILE_CUH_

constexpr int kScaleRowBytes = 2 * kRtMaxWarps;  // rowwise E8M0 codes of one row of a CTA

// Codes of v[0..3] * scale (v[0] in the low byte), products by one FP32 multiply each, for
// values the caller knows hold no NaN product: the two pair conversions merge into one word
// without the shift and mask Encode4 spends (same cvt instructions, so the same codes).
template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t EncodeQuadFinite(const float v[4], float scale) {
  const float s0 = __fmul_rn(v[0], scale), s1 = __fmul_rn(v[1], scale);
  const float s2 = __fmul_rn(v[2], scale), s3 = __fmul_rn(v[3], scale);
  uint32_t out;
  if constexpr (kFormat == Fp8Format::kE4M3) {
    asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e4m3x2.f32 l, %2, %1;\n"
        " cvt.rn.satfinite.e4m3x2.f32 h, %4, %3;\n mov.b32 %0, {l, h};\n}"
        : "=r"(out) : "f"(s0), "f"(s1), "f"(s2), "f"(s3));
  } else {
    asm("{\n .reg .b16 l, h;\n cvt.rn.satfinite.e5m2x2.f32 l, %2, %1;\n"
        " cvt.rn.satfinite.e5m2x2.f32 h, %4, %3;\n mov.b32 %0, {l, h};\n}"
        : "=r"(out) : "f"(s0), "f"(s1), "f"(s2), "f"(s3));
  }
  return out;
}

// y[index .. index + 8) = v (index a multiple of 8, y 16-byte aligned) with the hardware's
// pair conversions (cvt.rn.bf16x2 / cvt.rn.f16x2: one instruction per two values instead of
// the integer rounding of FloatToBf16). For every non-NaN value they round as StoreY8 does
// (to nearest even, subnormals kept, overflow to Inf); NaNs may differ in sign and payload,
// so tiles holding a NaN are stored again with StoreY8 (NormalizeRows' kPatch pass).
__device__ __forceinline__ void StoreY8Pairs(void* y, NormDType type, int64_t index, const float v[8]) {
  if (type == NormDType::kFloat32) {
    StoreY8(y, type, index, v);
    return;
  }
  uint32_t words[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) words[i] = Cvt16Pair(type == NormDType::kBFloat16, v[2 * i], v[2 * i + 1]);
  StoreGlobal16(static_cast<uint16_t*>(y) + index, words[0], words[1], words[2], words[3]);
}

// Normalizes this lane's 8 rows x 8 columns of a staged tile (row k at tile[k * row_stride],
// its (mu, rsigma) at stats[k]) with the register-tile kernel's arithmetic; stores y rows
// when kY, encodes codes into lo / hi (columns 0-3 / 4-7 of row k) when kQuantize. kPatch
// (the pass for tiles holding a NaN): y by the exact per-value conversion and the encoder
// that maps NaN products to 0x7F; else the pair conversions and the encoder for finite
// products. Returns max |y| over the 64 values (NaN if any is NaN).
template <NormDType kType, Fp8Format kFormat, bool kY, bool kQuantize, bool kPatch>
__device__ __forceinline__ float NormalizeRows(const NormForwardParams& p, const uint4* tile, int row_stride,
                                               const float2* stats, const float w[8], const float b[8],
                                               int64_t row0, int64_t col, uint32_t* lo, uint32_t* hi) {
  float tile_max = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float2 st = stats[k];
    float v[8];
    Unpack16<kType>(tile[k * row_stride], v);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[e] = fmaf((v[e] - st.x) * st.y, w[e], b[e]);
      tile_max = MaxNaN(tile_max, fabsf(v[e]));
    }
    if constexpr (kY) {
      if constexpr (kPatch) {
        StoreY8(p.y, p.y_type, (row0 + k) * p.cols + col, v);
      } else {
        StoreY8Pairs(p.y, p.y_type, (row0 + k) * p.cols + col, v);
      }
    }
    if constexpr (kQuantize) {
      if constexpr (kPatch) {
        lo[k] = Encode4<kFormat, Fp8Encoder::kHardware, true>(v, p.scale);
        hi[k] = Encode4<kFormat, Fp8Encoder::kHardware, true>(v + 4, p.scale);
      } else {
        lo[k] = EncodeQuadFinite<kFormat>(v, p.scale);
        hi[k] = EncodeQuadFinite<kFormat>(v + 4, p.scale);
      }
    }
  }
  return tile_max;
}

// NormalizeRows' arithmetic for one row's 8 values (chunk; mu, rsigma in st): y stored at
// y_index when kY, codes into lo / hi when kQuantize, tile_max = max(tile_max, max |y|) (NaN if
// any is NaN). For the one-CTA-per-row kernel; NormalizeRows keeps its own loop body, because
// written through this helper it moved the SASS of 12 of the cluster kernel's instantiations.
template <NormDType kType, Fp8Format kFormat, bool kY, bool kQuantize, bool kPatch>
__device__ __forceinline__ void NormalizeRow(const NormForwardParams& p, const uint4& chunk, float2 st,
                                              const float w[8], const float b[8], int64_t y_index, uint32_t& lo,
                                              uint32_t& hi, float& tile_max) {
  float v[8];
  Unpack16<kType>(chunk, v);
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    v[e] = fmaf((v[e] - st.x) * st.y, w[e], b[e]);
    tile_max = MaxNaN(tile_max, fabsf(v[e]));
  }
  if constexpr (kY) {
    if constexpr (kPatch) {
      StoreY8(p.y, p.y_type, y_index, v);
    } else {
      StoreY8Pairs(p.y, p.y_type, y_index, v);
    }
  }
  if constexpr (kQuantize) {
    if constexpr (kPatch) {
      lo = Encode4<kFormat, Fp8Encoder::kHardware, true>(v, p.scale);
      hi = Encode4<kFormat, Fp8Encoder::kHardware, true>(v + 4, p.scale);
    } else {
      lo = EncodeQuadFinite<kFormat>(v, p.scale);
      hi = EncodeQuadFinite<kFormat>(v + 4, p.scale);
    }
  }
}

// Columnwise codes of a pair of row groups, 64 rows from `row0` (the first group's rows
// 8 rg .. 8 rg + 7 in held_*, the second's in now_*; columns col .. col + 7, lane =
// 8 rg + cg8). Lanes cg8 = 2 j and 2 j + 1 swap the second tile's codes, and then each
// store instruction writes 64 contiguous bytes of 4 columns (8 lanes each: the 4 row blocks
// of both groups) instead of 32 bytes of 8: one L2 request per 64 bytes. Store A goes to
// the even lane's column, rows 32 h .. (h = cg8 & 1): the even lane its first-group block,
// the odd lane the even lane's second-group block; store B to the odd lane's column,
// mirrored. Columns 0-3 (8 stores) go out now; those of columns 4-7 are returned in
// later_a / later_b (two words per column and store) for StoreLaterPairColumns in the next
// tile, so that each tile issues about the same number of stores: storing all 16 in the
// pair's second tile measured no faster than 32-byte runs.
// Every lane of the warp must take part (shuffles).
__device__ __forceinline__ void StorePairColumns(const NormForwardParams& p, const uint32_t held_first[8],
                                                 const uint32_t held_second[8], const uint32_t now_first[8],
                                                 const uint32_t now_second[8], int64_t col, int64_t row0, int rg,
                                                 int cg8, uint32_t later_a[8], uint32_t later_b[8]) {
  const uint64_t policy = L2EvictLastPolicy();
  const int h = cg8 & 1;
  uint8_t* a = p.columnwise + (col - 8 * h) * p.rows + row0 + 32 * h + 8 * rg;
  uint8_t* b = p.columnwise + (col + 8 - 8 * h) * p.rows + row0 + 32 * (1 - h) + 8 * rg;
#pragma unroll
  for (int e = 0; e < 8; ++e, a += p.rows, b += p.rows) {
    const uint32_t swap_first = __shfl_xor_sync(0xFFFFFFFFu, now_first[e], 1);
    const uint32_t swap_second = __shfl_xor_sync(0xFFFFFFFFu, now_second[e], 1);
    const uint2 held = make_uint2(held_first[e], held_second[e]);
    const uint2 swapped = make_uint2(swap_first, swap_second);
    const uint2 va = h ? swapped : held, vb = h ? held : swapped;
    if (e < 4) {
      StoreGlobal8EvictLast(a, va.x, va.y, policy);
      StoreGlobal8EvictLast(b, vb.x, vb.y, policy);
    } else {
      later_a[2 * (e - 4)] = va.x;
      later_a[2 * (e - 4) + 1] = va.y;
      later_b[2 * (e - 4)] = vb.x;
      later_b[2 * (e - 4) + 1] = vb.y;
    }
  }
}

// Columns 4-7 of a pair that StorePairColumns left for later (same lanes and row0).
// later_b: the shared-memory slots [word][thread] of this thread.
__device__ __forceinline__ void StoreLaterPairColumns(const NormForwardParams& p, const uint32_t later_a[8],
                                                      const uint32_t (*later_b)[kRtMaxWarps * 32], int64_t col,
                                                      int64_t row0, int rg, int cg8) {
  const uint64_t policy = L2EvictLastPolicy();
  const int h = cg8 & 1;
  uint8_t* a = p.columnwise + (col - 8 * h + 4) * p.rows + row0 + 32 * h + 8 * rg;
  uint8_t* b = p.columnwise + (col + 8 - 8 * h + 4) * p.rows + row0 + 32 * (1 - h) + 8 * rg;
#pragma unroll
  for (int k = 0; k < 4; ++k, a += p.rows, b += p.rows) {
    StoreGlobal8EvictLast(a, later_a[2 * k], later_a[2 * k + 1], policy);
    StoreGlobal8EvictLast(b, later_b[2 * k][threadIdx.x], later_b[2 * k + 1][threadIdx.x], policy);
  }
}

// Rowwise E8M0 codes of row group `grp` (lane = row of the tile), blocks [first, first + n)
// of each row, from the staged codes[row][0 .. n): two 16-byte stores per row when the CTA
// has all 32 blocks and the row start is 16-byte aligned, else byte by byte. One store per
// 32-byte run instead of one per code: the per-code stores made the MXFP8 norm write
// 15.0M L2 sectors for 8.65M of output.
__device__ __forceinline__ void WriteRowScales(const NormForwardParams& p, const uint8_t (*codes)[kScaleRowBytes],
                                               int64_t grp, int64_t first, int n, int lane) {
  const int64_t row = grp * kRtRows + lane;
  if (row >= p.rows) return;
  uint8_t* dst = p.rowwise_e8m0 + row * (p.cols / 32) + first;
  if (n == kScaleRowBytes && (reinterpret_cast<uintptr_t>(dst) & 15u) == 0) {
    const uint4* src = reinterpret_cast<const uint4*>(codes[lane]);
    const uint4 lo = src[0], hi = src[1];
    StoreGlobal16(dst, lo.x, lo.y, lo.z, lo.w);
    StoreGlobal16(dst + 16, hi.x, hi.y, hi.z, hi.w);
  } else {
    for (int j = 0; j < n; ++j) dst[j] = codes[lane][j];
  }
}

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_TILE_CUH_
