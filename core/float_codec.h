// Exact codecs between FP32 and the narrow formats teserve moves around:
// BF16, FP16 (IEEE), FP8 E4M3 (the "fn" variant: no infinities, one NaN pattern per
// sign), FP8 E5M2 (IEEE-like), FP4 E2M1 (no Inf/NaN) and E8M0 (unsigned power of two).
//
// Encoding is round-to-nearest-even on the exact value. FP8 and FP4 casts saturate
// (satfinite, as TE's casts do): finite values beyond the largest normal become it,
// and so does +-Inf. BF16 and FP16 follow IEEE (overflow gives Inf). NaN becomes the
// format's canonical NaN (0x7F for both FP8 formats, sign kept for BF16/FP16); E2M1
// has no NaN, so a NaN input encodes as +6 (0x7) and callers that care check amax first.
//
// Everything is integer bit manipulation, so one header serves the CPU reference and
// the CUDA kernels (TESERVE_HD) with identical results on both.
#ifndef TESERVE_CORE_FLOAT_CODEC_H_
#define TESERVE_CORE_FLOAT_CODEC_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TESERVE_HD __host__ __device__ __forceinline__
#else
#define TESERVE_HD inline
#endif

namespace teserve {

TESERVE_HD uint32_t FloatBits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
#endif
}

TESERVE_HD float BitsToFloat(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
#endif
}

TESERVE_HD int CountLeadingZeros32(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __clz(x);
#else
  return x == 0 ? 32 : __builtin_clz(x);
#endif
}

// A binary floating-point format of 1 sign bit (optional), `kExpBits` exponent bits and
// `kManBits` mantissa bits. `kMaxCode` is the largest finite positive code; `kSaturate`
// selects satfinite overflow; `kInfCode` is used when not saturating.
template <int kExpBits, int kManBits, int kBias, uint32_t kMaxCode, bool kSaturate,
          uint32_t kInfCode, uint32_t kNanCode, bool kNanKeepsSign>
struct MiniFloat {
  static constexpr int kBits = 1 + kExpBits + kManBits;
  static constexpr uint32_t kSignBit = 1u << (kExpBits + kManBits);

  // Decodes a code whose NaN/Inf patterns the caller has already handled.
  TESERVE_HD static float DecodeFinite(uint32_t code) {
    const uint32_t sign = code & kSignBit;
    const uint32_t exp_field = (code >> kManBits) & ((1u << kExpBits) - 1);
    const uint32_t man = code & ((1u << kManBits) - 1);
    // value = man * 2^(1 - bias - M) for subnormals, (2^M + man) * 2^(e - bias - M) else.
    uint32_t significand = exp_field == 0 ? man : ((1u << kManBits) | man);
    int exponent = (exp_field == 0 ? 1 : static_cast<int>(exp_field)) - kBias - kManBits;
    if (significand == 0) return sign ? -0.0f : 0.0f;
    // Normalize into an FP32 bit pattern (every value of these formats is an FP32 normal).
    const int lz = CountLeadingZeros32(significand);
    const int top = 31 - lz;  // index of the leading one
    const uint32_t frac = (significand << (23 - top)) & 0x7FFFFFu;
    const uint32_t fexp = static_cast<uint32_t>(exponent + top + 127);
    return BitsToFloat((sign ? 0x80000000u : 0u) | (fexp << 23) | frac);
  }

  // Rounds |x| (finite, non-NaN, given as FP32 bits without sign) to the format and
  // returns the positive code, saturated or overflowed to kInfCode.
  TESERVE_HD static uint32_t EncodeMagnitude(uint32_t abs_bits) {
    if (abs_bits == 0) return 0;
    const uint32_t fexp = abs_bits >> 23;
    const uint32_t fman = abs_bits & 0x7FFFFFu;
    // |x| = sig * 2^exp exactly.
    const uint32_t sig = fexp == 0 ? fman : (fman | 0x800000u);
    const int exp = fexp == 0 ? -149 : static_cast<int>(fexp) - 150;
    const int e = exp + 31 - CountLeadingZeros32(sig);  // floor(log2 |x|)
    const int emin = 1 - kBias;
    const int step = (e > emin ? e : emin) - kManBits;  // quantum of the target binade
    const int shift = step - exp;                       // >= 0 for all formats here
    uint32_t q;
    if (shift <= 0) {
      q = sig << (-shift);
    } else if (shift > 25) {
      q = 0;  // below half a quantum
    } else {
      q = sig >> shift;
      const uint32_t rem = sig & ((1u << shift) - 1);
      const uint32_t half = 1u << (shift - 1);
      if (rem > half || (rem == half && (q & 1u))) ++q;
    }
    if (q == 0) return 0;
    // q * 2^step is the rounded value; q <= 2^(M+1).
    int exp_field;
    uint32_t man;
    if (q < (1u << kManBits)) {
      exp_field = 0;  // subnormal (only reachable when step is the minimum)
      man = q;
    } else {
      int s = step;
      if (q == (2u << kManBits)) {
        q >>= 1;
        ++s;
      }
      exp_field = s + kManBits + kBias;
      man = q - (1u << kManBits);
    }
    if (exp_field >= (1 << kExpBits)) return kSaturate ? kMaxCode : kInfCode;
    const uint32_t code = (static_cast<uint32_t>(exp_field) << kManBits) | man;
    if (code > kMaxCode) return kSaturate ? kMaxCode : kInfCode;
    return code;
  }

  TESERVE_HD static uint32_t Encode(float x) {
    const uint32_t u = FloatBits(x);
    const uint32_t sign = (u >> 31) ? kSignBit : 0u;
    const uint32_t abs_bits = u & 0x7FFFFFFFu;
    if (abs_bits > 0x7F800000u) return kNanKeepsSign ? (sign | kNanCode) : kNanCode;
    if (abs_bits == 0x7F800000u) return sign | (kSaturate ? kMaxCode : kInfCode);
    return sign | EncodeMagnitude(abs_bits);
  }
};

// E4M3: bias 7, max 448 (0x7E), NaN S.1111.111, no infinities.
using E4M3Format = MiniFloat<4, 3, 7, 0x7Eu, true, 0x7Eu, 0x7Fu, false>;
// E5M2: bias 15, max 57344 (0x7B), Inf 0x7C, NaN 0x7D-0x7F.
using E5M2Format = MiniFloat<5, 2, 15, 0x7Bu, true, 0x7Cu, 0x7Fu, false>;
// E2M1: bias 1, max 6 (0x7), neither Inf nor NaN.
using E2M1Format = MiniFloat<2, 1, 1, 0x7u, true, 0x7u, 0x7u, false>;
// IEEE binary16 and bfloat16 (overflow to Inf, quiet NaN keeps the sign).
using Fp16Format = MiniFloat<5, 10, 15, 0x7BFFu, false, 0x7C00u, 0x7E00u, true>;
using Bf16Format = MiniFloat<8, 7, 127, 0x7F7Fu, false, 0x7F80u, 0x7FC0u, true>;

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

TESERVE_HD uint8_t FloatToE4M3(float x) { return static_cast<uint8_t>(E4M3Format::Encode(x)); }
TESERVE_HD uint8_t FloatToE5M2(float x) { return static_cast<uint8_t>(E5M2Format::Encode(x)); }
// Returns the 4-bit code in the low nibble.
TESERVE_HD uint8_t FloatToE2M1(float x) { return static_cast<uint8_t>(E2M1Format::Encode(x)); }
TESERVE_HD uint16_t FloatToFp16(float x) { return static_cast<uint16_t>(Fp16Format::Encode(x)); }

// BF16 shares FP32's exponent range, so rounding is a carry into the top 16 bits.
TESERVE_HD uint16_t FloatToBf16(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  const uint32_t rounding = 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding) >> 16);
}

TESERVE_HD float E4M3ToFloat(uint8_t code) {
  if ((code & 0x7Fu) == 0x7Fu) return BitsToFloat(0x7FC00000u | ((code & 0x80u) << 24));
  return E4M3Format::DecodeFinite(code);
}

TESERVE_HD float E5M2ToFloat(uint8_t code) {
  const uint32_t mag = code & 0x7Fu;
  const uint32_t sign = (code & 0x80u) << 24;
  if (mag == 0x7Cu) return BitsToFloat(sign | 0x7F800000u);
  if (mag > 0x7Cu) return BitsToFloat(sign | 0x7FC00000u);
  return E5M2Format::DecodeFinite(code);
}

TESERVE_HD float E2M1ToFloat(uint8_t code) { return E2M1Format::DecodeFinite(code & 0xFu); }

TESERVE_HD float Fp16ToFloat(uint16_t code) {
  const uint32_t mag = code & 0x7FFFu;
  const uint32_t sign = static_cast<uint32_t>(code & 0x8000u) << 16;
  if (mag == 0x7C00u) return BitsToFloat(sign | 0x7F800000u);
  if (mag > 0x7C00u) return BitsToFloat(sign | 0x7F800000u | ((mag & 0x3FFu) << 13) | 0x400000u);
  return Fp16Format::DecodeFinite(code);
}

TESERVE_HD float Bf16ToFloat(uint16_t code) { return BitsToFloat(static_cast<uint32_t>(code) << 16); }

// E8M0: value 2^(code - 127); code 0xFF is NaN. There is no zero and no sign.
TESERVE_HD float E8M0ToFloat(uint8_t code) {
  if (code == 0xFFu) return BitsToFloat(0x7FC00000u);
  if (code == 0) return BitsToFloat(0x00400000u);  // 2^-127, an FP32 subnormal
  return BitsToFloat(static_cast<uint32_t>(code) << 23);
}

// Rounds x up to a power of two and returns its E8M0 code (MXFP8 scales are rounded up
// so block data cannot overflow). Saturating: results above 2^127 give 0xFE, results
// below 2^-127 (zero, negatives, tiny values) give 0x00; NaN gives 0xFF.
TESERVE_HD uint8_t FloatToE8M0RoundUp(float x) {
  const uint32_t u = FloatBits(x);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0xFFu;
  if ((u >> 31) || u == 0) return 0x00u;
  if (u >= 0x7F800000u) return 0xFEu;
  const uint32_t fexp = u >> 23;
  const uint32_t fman = u & 0x7FFFFFu;
  if (fexp == 0) {
    // FP32 subnormal: 2^-149 <= x < 2^-126, rounds up to 2^-127 or 2^-126.
    return fman <= 0x400000u ? 0x00u : 0x01u;
  }
  uint32_t code = fexp + (fman != 0 ? 1u : 0u);
  return static_cast<uint8_t>(code > 0xFEu ? 0xFEu : code);
}

}  // namespace teserve

#endif  // TESERVE_CORE_FLOAT_CODEC_H_
