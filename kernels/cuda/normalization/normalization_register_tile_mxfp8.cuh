// MXFP8 output of the register-tile forward kernels (normalization_register_tile.cu and
// normalization_stats_warp.cu, kMx):
// per-lane block maxima, E8M0 codes through kernels/quantize_math.h, and the codes of one
// tile. Those two files include this, inside their unnamed namespace after their helpers
// (MaxNaN, StoreY8 from normalization_register_tile_common.cuh; Unpack16, Encode2, CvtPair from
// normalization_common.cuh; Mxfp8ScaleCode, Mxfp8EncodeFactor from kernels/quantize_math.h,
// which it includes at the top), so this file includes nothing itself.
//
// A lane holds rows row0 .. row0 + 7 and columns col .. col + 7 of the tile (row k of its
// block at tile[k * row_stride]). It shares each 1x32 row block with the 3 lanes of the
// same row group whose column groups form an aligned quad (lane bits kRowBit0, kRowBit1),
// and each 32x1 column block with the 3 lanes of its column group (lane bits kColBit0,
// kColBit1: the tile's 32 rows are exactly one block, since rows % 32 == 0 whenever the
// columnwise copy is asked). The register-tile kernel's lanes (lane = 4 * column group +
// row group) use bits 4, 8 / 1, 2; the stats-warp kernel's (lane = 8 * row group + column
// group) 1, 2 / 8, 16.
// Per block: amax (max.NaN over the 32 |y|) -> Mxfp8ScaleCode -> Mxfp8EncodeFactor ->
// codes = cvt.rn.satfinite(y * factor), NaN patched to 0x7F only in blocks whose code is
// 0xFF (the only blocks where y * factor can be NaN). The factor multiply is the IEEE
// product (__fmul_rn), as QuantizeMxfp8 computes it.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_MXFP8_CUH_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_MXFP8_CUH_

// y of row k of this lane's block, exactly as the per-tensor path computes it.
template <NormDType kType>
__device__ __forceinline__ void NormalizeRow8(const uint4* tile, int row_stride, int k, float2 st,
                                              const float w[8], const float b[8], float v[8]) {
  Unpack16<kType>(tile[k * row_stride], v);
#pragma unroll
  for (int e = 0; e < 8; ++e) v[e] = fmaf((v[e] - st.x) * st.y, w[e], b[e]);
}

// Max (NaN wins) of m[0..8) over the 4 lanes lane ^ {0, bit0, bit1, bit0 | bit1}, in two
// transposing steps: afterwards m[0], m[1] hold entries 4 a + 2 c + {0, 1}, where a is
// the lane's bit0 and c its bit1 (every entry is held by exactly one of the 4 lanes).
__device__ __forceinline__ void QuadMaxTransposed(float m[8], int lane, int bit0, int bit1) {
  const bool upper0 = (lane & bit0) != 0;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float send = upper0 ? m[j] : m[4 + j];
    const float keep = upper0 ? m[4 + j] : m[j];
    m[j] = MaxNaN(keep, __shfl_xor_sync(0xFFFFFFFFu, send, bit0));
  }
  const bool upper1 = (lane & bit1) != 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const float send = upper1 ? m[j] : m[2 + j];
    const float keep = upper1 ? m[2 + j] : m[j];
    m[j] = MaxNaN(keep, __shfl_xor_sync(0xFFFFFFFFu, send, bit1));
  }
}

// E8M0 codes of the 8 entries reduced by QuadMaxTransposed (m[0], m[1] of each of the 4
// lanes) gathered back into every lane: byte k of the result is entry k's code. Each
// lane computes and returns in *own (bytes 0, 1) the codes of its two entries.
template <Fp8Format kFormat>
__device__ __forceinline__ uint2 QuadCodes(const float m[8], int lane, int bit0, int bit1,
                                           uint32_t* own) {
  constexpr float kFp8Max = kFormat == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
  const uint32_t pair = static_cast<uint32_t>(Mxfp8ScaleCode(m[0], kFp8Max)) |
                        (static_cast<uint32_t>(Mxfp8ScaleCode(m[1], kFp8Max)) << 8);
  *own = pair;
  const int base = lane & ~(bit0 | bit1);
  uint32_t pairs[4];  // pairs[2 a + c]: entries 4 a + 2 c + {0, 1}
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    pairs[q] = __shfl_sync(0xFFFFFFFFu, pair, base | ((q >> 1) ? bit0 : 0) | ((q & 1) ? bit1 : 0));
  }
  return make_uint2(pairs[0] | (pairs[1] << 16), pairs[2] | (pairs[3] << 16));
}

// The E8M0 codes of this lane's 8 blocks (maxima m, reduced across the quad of lanes
// bit0 / bit1 in place) as QuadCodes returns them; when `store`, the lane's own two codes go
// to e8m0[(first + j) * blocks + block] for its entries j = 0, 1 (first: base plus the lane's
// entry offset 4 a + 2 c); with `staged` (not null) to staged[(4 a + 2 c + j) * staged_stride]
// instead.
template <Fp8Format kFormat>
__device__ __forceinline__ uint2 BlockScaleCodes(float m[8], int lane, int bit0, int bit1, bool store, uint8_t* e8m0,
                                                 int64_t base, int64_t blocks, int64_t block,
                                                 uint8_t* staged = nullptr, int staged_stride = 0) {
  QuadMaxTransposed(m, lane, bit0, bit1);
  uint32_t own = 0;
  const uint2 codes = QuadCodes<kFormat>(m, lane, bit0, bit1, &own);
  const int offset = 4 * ((lane / bit0) & 1) + 2 * ((lane / bit1) & 1);
  if (staged != nullptr) {
    staged[offset * staged_stride] = static_cast<uint8_t>(own & 0xFFu);
    staged[(offset + 1) * staged_stride] = static_cast<uint8_t>(own >> 8);
  } else if (store) {
    const int64_t first = base + offset;
    e8m0[first * blocks + block] = static_cast<uint8_t>(own & 0xFFu);
    e8m0[(first + 1) * blocks + block] = static_cast<uint8_t>(own >> 8);
  }
  return codes;
}

__device__ __forceinline__ uint8_t CodeByte(uint2 codes, int k) {
  return static_cast<uint8_t>(((k < 4 ? codes.x : codes.y) >> (8 * (k % 4))) & 0xFFu);
}

// Codes of a (low byte) and b (high byte), both already scaled; the NaN patch only when
// the block's E8M0 code is 0xFF (the only way a scaled value can be NaN).
template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t EncodeScaledPair(float a, float b, bool nan_block) {
  return nan_block ? Encode2<kFormat, Fp8Encoder::kHardware>(a, b) : CvtPair<kFormat>(a, b);
}

// One tile's MXFP8 output for this lane (rows row0 .. row0 + 7 valid when row_valid;
// columns col .. col + 7; tile row group grp). Every lane of the warp calls it (shuffles).
// Pass 1 normalizes for the block maxima and the tensor amax; pass 2 normalizes again
// (same instructions, same values), writes y and the codes. The rowwise E8M0 codes go to
// p.rowwise_e8m0 one byte per store, or, with staged_row_scales, to
// staged_row_scales[k * staged_stride] for the lane's row k (the caller writes them out).
template <NormDType kType, Fp8Format kFormat, int kRowBit0, int kRowBit1, int kColBit0, int kColBit1>
__device__ __forceinline__ void Mxfp8Tile(const NormForwardParams& p, const uint4* tile, int row_stride,
                                          const float2* stats, const float w[8], const float b[8],
                                          int lane, int64_t row0, bool row_valid, int64_t col,
                                          int64_t grp, float& amax, uint8_t* staged_row_scales = nullptr,
                                          int staged_stride = 0) {
  float row_max[8], col_max[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) col_max[e] = 0.0f;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float v[8];
    NormalizeRow8<kType>(tile, row_stride, k, stats[k], w, b, v);
    float m = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float a = fabsf(v[e]);
      m = MaxNaN(m, a);
      col_max[e] = MaxNaN(col_max[e], a);
    }
    row_max[k] = m;
  }
  if (!row_valid) {  // zero-filled rows past the end: no part of any block or of amax
#pragma unroll
    for (int k = 0; k < 8; ++k) row_max[k] = col_max[k] = 0.0f;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) amax = MaxNaN(amax, row_max[k]);

  uint2 row_codes = make_uint2(0u, 0u), col_codes = make_uint2(0u, 0u);
  if (p.rowwise != nullptr) {
    row_codes = BlockScaleCodes<kFormat>(row_max, lane, kRowBit0, kRowBit1, row_valid, p.rowwise_e8m0, row0,
                                         p.cols / 32, col / 32, staged_row_scales, staged_stride);
  }
  if (p.columnwise != nullptr) {
    col_codes = BlockScaleCodes<kFormat>(col_max, lane, kColBit0, kColBit1, row_valid, p.columnwise_e8m0, col,
                                         p.rows / 32, grp);
  }

  float col_factor[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) col_factor[e] = Mxfp8EncodeFactor(CodeByte(col_codes, e));
  uint32_t col_words[2][8];  // rows 0-3 / 4-7 of columns col .. col + 7
  float prev[8];             // the even row's scaled values, paired with the odd row's
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    float v[8];
    NormalizeRow8<kType>(tile, row_stride, k, stats[k], w, b, v);
    const int64_t row = row0 + k;
    if (row_valid && p.y != nullptr) StoreY8(p.y, p.y_type, row * p.cols + col, v);
    if (p.rowwise != nullptr) {
      const uint8_t code = CodeByte(row_codes, k);
      const float factor = Mxfp8EncodeFactor(code);
      uint32_t words[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float* u = v + 4 * h;
        words[h] = EncodeScaledPair<kFormat>(__fmul_rn(u[0], factor), __fmul_rn(u[1], factor),
                                             code == 0xFFu) |
                   (EncodeScaledPair<kFormat>(__fmul_rn(u[2], factor), __fmul_rn(u[3], factor),
                                              code == 0xFFu)
                    << 16);
      }
      if (row_valid) {
        *reinterpret_cast<uint2*>(p.rowwise + row * p.cols + col) = make_uint2(words[0], words[1]);
      }
    }
    if (p.columnwise != nullptr) {
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float scaled = __fmul_rn(v[e], col_factor[e]);
        if (k % 2 == 0) {
          prev[e] = scaled;
        } else {
          const uint32_t pair =
              EncodeScaledPair<kFormat>(prev[e], scaled, CodeByte(col_codes, e) == 0xFFu);
          uint32_t& word = col_words[k / 4][e];
          word = (k % 4 == 1) ? pair : (word | (pair << 16));
        }
      }
    }
  }
  if (p.columnwise != nullptr && row_valid) {
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      *reinterpret_cast<uint2*>(p.columnwise + (col + e) * p.rows + row0) =
          make_uint2(col_words[0][e], col_words[1][e]);
    }
  }
}

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_MXFP8_CUH_
