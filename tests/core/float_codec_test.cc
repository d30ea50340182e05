// Exhaustive tests of core/float_codec.h against an independent reference.
//
// The reference decodes a code straight from the format definition (sign, biased
// exponent, mantissa; value computed with std::ldexp in double) and encodes by searching
// the nearest decoded value, ties going to the even code. It shares no code with the
// header, so a bug in the header's bit manipulation cannot hide in both.
#include "core/float_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace teserve {
namespace {

// How a format spends its all-ones exponent field.
enum class Specials {
  kIeee,         // all-ones exponent: mantissa 0 = Inf, else NaN (E5M2, FP16, BF16)
  kNanOnlyOnes,  // only S.1111.111 is NaN, no Inf (E4M3 "fn")
  kNone,         // every code is finite (E2M1)
};

struct FormatSpec {
  std::string name;
  int exp_bits;
  int man_bits;
  int bias;
  Specials specials;
  bool saturating;  // satfinite: overflow and Inf give +-max
  uint32_t (*encode)(float);
  float (*decode)(uint32_t);

  int total_bits() const { return 1 + exp_bits + man_bits; }
  uint32_t num_codes() const { return 1u << total_bits(); }
  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
};

// Keeps gtest from dumping the struct's bytes in failure messages.
void PrintTo(const FormatSpec& f, std::ostream* os) { *os << f.name; }

uint32_t EncodeE4M3(float x) { return FloatToE4M3(x); }
uint32_t EncodeE5M2(float x) { return FloatToE5M2(x); }
uint32_t EncodeE2M1(float x) { return FloatToE2M1(x); }
uint32_t EncodeFp16(float x) { return FloatToFp16(x); }
uint32_t EncodeBf16(float x) { return FloatToBf16(x); }
float DecodeE4M3(uint32_t c) { return E4M3ToFloat(static_cast<uint8_t>(c)); }
float DecodeE5M2(uint32_t c) { return E5M2ToFloat(static_cast<uint8_t>(c)); }
float DecodeE2M1(uint32_t c) { return E2M1ToFloat(static_cast<uint8_t>(c)); }
float DecodeFp16(uint32_t c) { return Fp16ToFloat(static_cast<uint16_t>(c)); }
float DecodeBf16(uint32_t c) { return Bf16ToFloat(static_cast<uint16_t>(c)); }

const FormatSpec kE4M3{"E4M3", 4, 3, 7, Specials::kNanOnlyOnes, true, EncodeE4M3, DecodeE4M3};
const FormatSpec kE5M2{"E5M2", 5, 2, 15, Specials::kIeee, true, EncodeE5M2, DecodeE5M2};
const FormatSpec kE2M1{"E2M1", 2, 1, 1, Specials::kNone, true, EncodeE2M1, DecodeE2M1};
const FormatSpec kFp16{"FP16", 5, 10, 15, Specials::kIeee, false, EncodeFp16, DecodeFp16};
const FormatSpec kBf16{"BF16", 8, 7, 127, Specials::kIeee, false, EncodeBf16, DecodeBf16};

// Value of `code` from the definition, in double. NaN/Inf per the format's specials.
double ReferenceDecode(const FormatSpec& f, uint32_t code) {
  const bool negative = (code & f.sign_bit()) != 0;
  const uint32_t exp_mask = (1u << f.exp_bits) - 1;
  const uint32_t man_mask = (1u << f.man_bits) - 1;
  const uint32_t exp_field = (code >> f.man_bits) & exp_mask;
  const uint32_t man = code & man_mask;
  double magnitude;
  if (f.specials == Specials::kIeee && exp_field == exp_mask) {
    magnitude = man == 0 ? std::numeric_limits<double>::infinity()
                         : std::numeric_limits<double>::quiet_NaN();
  } else if (f.specials == Specials::kNanOnlyOnes && exp_field == exp_mask && man == man_mask) {
    magnitude = std::numeric_limits<double>::quiet_NaN();
  } else if (exp_field == 0) {
    magnitude = std::ldexp(static_cast<double>(man), 1 - f.bias - f.man_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>((1u << f.man_bits) + man),
                           static_cast<int>(exp_field) - f.bias - f.man_bits);
  }
  return negative ? -magnitude : magnitude;
}

// Codes of the non-negative finite values, ascending (code order is value order).
std::vector<uint32_t> PositiveFiniteCodes(const FormatSpec& f) {
  std::vector<uint32_t> codes;
  for (uint32_t c = 0; c < f.sign_bit(); ++c) {
    if (std::isfinite(ReferenceDecode(f, c))) codes.push_back(c);
  }
  return codes;
}

uint32_t InfCode(const FormatSpec& f) { return ((1u << f.exp_bits) - 1) << f.man_bits; }
uint32_t MaxCode(const FormatSpec& f) { return PositiveFiniteCodes(f).back(); }

// Nearest-value encoder: satfinite clamps first; IEEE formats overflow to Inf, which
// takes part in the search as the value one quantum above max (its code is even).
class ReferenceEncoder {
 public:
  explicit ReferenceEncoder(const FormatSpec& f) : format_(f) {
    const std::vector<uint32_t> codes = PositiveFiniteCodes(f);
    for (uint32_t c : codes) candidates_.emplace_back(ReferenceDecode(f, c), c);
    max_ = candidates_.back().first;
    if (!f.saturating) {
      const double quantum = max_ - candidates_[candidates_.size() - 2].first;
      candidates_.emplace_back(max_ + quantum, InfCode(f));
    }
  }

  uint32_t Encode(float x) const {
    const uint32_t sign = std::signbit(x) ? format_.sign_bit() : 0u;
    double magnitude = std::fabs(static_cast<double>(x));
    if (format_.saturating) {
      magnitude = std::min(magnitude, max_);
    } else if (std::isinf(magnitude)) {
      return sign | InfCode(format_);
    }
    const auto upper = std::lower_bound(candidates_.begin(), candidates_.end(),
                                        std::make_pair(magnitude, 0u));
    if (upper == candidates_.end()) return sign | candidates_.back().second;
    if (upper->first == magnitude || upper == candidates_.begin()) return sign | upper->second;
    const auto lower = upper - 1;
    const double below = magnitude - lower->first;
    const double above = upper->first - magnitude;
    if (below < above) return sign | lower->second;
    if (above < below) return sign | upper->second;
    return sign | ((lower->second & 1u) == 0 ? lower->second : upper->second);
  }

 private:
  const FormatSpec& format_;
  std::vector<std::pair<double, uint32_t>> candidates_;  // ascending value
  double max_ = 0.0;
};

float FloatFromBits(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

uint32_t BitsOfFloat(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

class FloatCodecTest : public ::testing::TestWithParam<FormatSpec> {};

TEST_P(FloatCodecTest, DecodesEveryCodeLikeTheDefinition) {
  const FormatSpec& f = GetParam();
  for (uint32_t code = 0; code < f.num_codes(); ++code) {
    const double expected = ReferenceDecode(f, code);
    const float got = f.decode(code);
    if (std::isnan(expected)) {
      EXPECT_TRUE(std::isnan(got)) << f.name << " code 0x" << std::hex << code;
    } else {
      EXPECT_EQ(static_cast<double>(got), expected) << f.name << " code 0x" << std::hex << code;
      EXPECT_EQ(std::signbit(got), (code & f.sign_bit()) != 0) << f.name << " code 0x" << std::hex
                                                               << code;
    }
  }
}

TEST_P(FloatCodecTest, EveryFiniteValueRoundTripsToItsCode) {
  const FormatSpec& f = GetParam();
  for (uint32_t code = 0; code < f.num_codes(); ++code) {
    const double value = ReferenceDecode(f, code);
    if (!std::isfinite(value)) continue;
    EXPECT_EQ(f.encode(static_cast<float>(value)), code) << f.name << " value " << value;
  }
}

// Midpoints of every pair of neighbours (zero/smallest subnormal, the subnormal range,
// binade boundaries), and one float ulp either side of each midpoint.
TEST_P(FloatCodecTest, MidpointsTieToEvenCodeAndNeighboursRoundToNearest) {
  const FormatSpec& f = GetParam();
  const std::vector<uint32_t> codes = PositiveFiniteCodes(f);
  for (size_t i = 0; i + 1 < codes.size(); ++i) {
    const uint32_t lo = codes[i], hi = codes[i + 1];
    const double mid = 0.5 * (ReferenceDecode(f, lo) + ReferenceDecode(f, hi));
    const float midpoint = static_cast<float>(mid);
    ASSERT_EQ(static_cast<double>(midpoint), mid) << "midpoint not representable in FP32";
    const uint32_t even = (lo & 1u) == 0 ? lo : hi;
    const float just_below = std::nextafter(midpoint, 0.0f);
    const float just_above = std::nextafter(midpoint, std::numeric_limits<float>::infinity());
    for (uint32_t sign : {0u, f.sign_bit()}) {
      const float s = sign ? -1.0f : 1.0f;
      EXPECT_EQ(f.encode(s * midpoint), sign | even) << f.name << " midpoint " << s * midpoint;
      EXPECT_EQ(f.encode(s * just_below), sign | lo) << f.name << " below " << s * just_below;
      EXPECT_EQ(f.encode(s * just_above), sign | hi) << f.name << " above " << s * just_above;
    }
  }
}

TEST_P(FloatCodecTest, OverflowSaturatesOrBecomesInf) {
  const FormatSpec& f = GetParam();
  const uint32_t max_code = MaxCode(f);
  const float max = static_cast<float>(ReferenceDecode(f, max_code));
  const uint32_t overflow_code = f.saturating ? max_code : InfCode(f);
  const float quantum =
      static_cast<float>(ReferenceDecode(f, max_code) - ReferenceDecode(f, max_code - 1));
  const float half_quantum_above = max + 0.5f * quantum;  // tie between max and "next"
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t sign : {0u, f.sign_bit()}) {
    const float s = sign ? -1.0f : 1.0f;
    EXPECT_EQ(f.encode(s * max), sign | max_code) << f.name;
    EXPECT_EQ(f.encode(s * std::nextafter(half_quantum_above, 0.0f)), sign | max_code) << f.name;
    // The tie goes up to Inf in FP16/BF16 (max's code is odd); satfinite formats give max.
    EXPECT_EQ(f.encode(s * half_quantum_above), sign | overflow_code) << f.name;
    EXPECT_EQ(f.encode(s * 2.0f * max), sign | overflow_code) << f.name;
    EXPECT_EQ(f.encode(s * std::numeric_limits<float>::max()), sign | overflow_code) << f.name;
    EXPECT_EQ(f.encode(s * inf), sign | overflow_code) << f.name << " Inf";
  }
}

TEST_P(FloatCodecTest, NegativeZeroKeepsItsSign) {
  const FormatSpec& f = GetParam();
  EXPECT_EQ(f.encode(0.0f), 0u);
  EXPECT_EQ(f.encode(-0.0f), f.sign_bit());
  EXPECT_TRUE(std::signbit(f.decode(f.sign_bit())));
}

TEST_P(FloatCodecTest, TinyValuesBecomeSignedZeroOrSmallestSubnormal) {
  const FormatSpec& f = GetParam();
  const float smallest = static_cast<float>(ReferenceDecode(f, 1));
  const float half = 0.5f * smallest;
  const float below_half = std::nextafter(half, 0.0f);
  const float above_half = std::nextafter(half, 1.0f);
  const float float_min_subnormal = std::numeric_limits<float>::denorm_min();
  for (uint32_t sign : {0u, f.sign_bit()}) {
    const float s = sign ? -1.0f : 1.0f;
    EXPECT_EQ(f.encode(s * below_half), sign) << f.name;
    EXPECT_EQ(f.encode(s * half), sign) << f.name << " tie to even (zero)";
    EXPECT_EQ(f.encode(s * above_half), sign | 1u) << f.name;
    if (f.name != "BF16") {  // BF16 reaches down into FP32's subnormal range
      EXPECT_EQ(f.encode(s * float_min_subnormal), sign) << f.name;
      EXPECT_EQ(f.encode(s * std::numeric_limits<float>::min()), sign) << f.name;
    }
  }
}

TEST_P(FloatCodecTest, FloatSubnormalsMatchReference) {
  const FormatSpec& f = GetParam();
  const ReferenceEncoder reference(f);
  for (uint32_t bits = 1; bits < 0x00800000u; bits += 0x1F1u) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const float x = FloatFromBits(sign | bits);
      EXPECT_EQ(f.encode(x), reference.Encode(x)) << f.name << " bits 0x" << std::hex << bits;
    }
  }
}

TEST_P(FloatCodecTest, NanBecomesTheDocumentedNan) {
  const FormatSpec& f = GetParam();
  const float nans[] = {std::numeric_limits<float>::quiet_NaN(),
                        -std::numeric_limits<float>::quiet_NaN(), FloatFromBits(0x7F800001u),
                        FloatFromBits(0xFFBFFFFFu)};
  for (float nan : nans) {
    const uint32_t code = f.encode(nan);
    const bool negative = std::signbit(nan);
    if (f.name == "E4M3" || f.name == "E5M2") {
      EXPECT_EQ(code, 0x7Fu) << f.name;
    } else if (f.name == "E2M1") {
      EXPECT_EQ(code, 0x7u) << "E2M1 has no NaN; the header documents +6";
    } else if (f.name == "FP16") {
      EXPECT_EQ(code, (negative ? 0x8000u : 0u) | 0x7E00u);
    } else {
      EXPECT_TRUE(std::isnan(f.decode(code))) << "BF16 code 0x" << std::hex << code;
      EXPECT_EQ((code & 0x8000u) != 0, negative);
      EXPECT_NE(code & 0x0040u, 0u) << "BF16 NaN must be quiet";
    }
  }
}

// ~1e6 random floats (fixed seed): half with uniformly random bits (every exponent),
// half with exponents around the format's range and random mantissas.
TEST_P(FloatCodecTest, RandomFloatsMatchNearestValueSearch) {
  const FormatSpec& f = GetParam();
  const ReferenceEncoder reference(f);
  std::mt19937 rng(20240611u);
  std::uniform_int_distribution<uint32_t> bits_dist;
  const int low_exp = 1 - f.bias - f.man_bits - 3;
  const int high_exp = (1 << f.exp_bits) - f.bias + 2;
  std::uniform_int_distribution<int> exp_dist(std::max(low_exp, -149), std::min(high_exp, 127));
  constexpr int kSamples = 1 << 20;
  int mismatches = 0;
  for (int i = 0; i < kSamples && mismatches < 20; ++i) {
    float x;
    const uint32_t random_bits = bits_dist(rng);
    if (i % 2 == 0) {
      x = FloatFromBits(random_bits);
      if (std::isnan(x)) continue;
    } else {
      const float mantissa = 1.0f + static_cast<float>(random_bits & 0x7FFFFFu) * 0x1p-23f;
      x = std::ldexp(mantissa, exp_dist(rng)) * ((random_bits >> 31) ? -1.0f : 1.0f);
    }
    const uint32_t got = f.encode(x);
    const uint32_t expected = reference.Encode(x);
    if (got != expected) {
      ++mismatches;
      ADD_FAILURE() << f.name << " x=" << x << " (bits 0x" << std::hex << BitsOfFloat(x)
                    << ") got 0x" << got << " expected 0x" << expected;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllFormats, FloatCodecTest,
                         ::testing::Values(kE4M3, kE5M2, kE2M1, kFp16, kBf16),
                         [](const ::testing::TestParamInfo<FormatSpec>& info) {
                           return info.param.name;
                         });

TEST(FloatCodec, FormatMaximaMatchTheirConstants) {
  EXPECT_EQ(E4M3ToFloat(0x7E), kE4M3Max);
  EXPECT_EQ(E5M2ToFloat(0x7B), kE5M2Max);
  EXPECT_EQ(E2M1ToFloat(0x7), kE2M1Max);
  EXPECT_EQ(FloatToE4M3(448.0f), 0x7E);
  EXPECT_EQ(FloatToE5M2(57344.0f), 0x7B);
}

TEST(FloatCodec, E2M1DecodesTheEightDocumentedMagnitudes) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    const float expected = (code & 0x8u) ? -magnitudes[code & 0x7u] : magnitudes[code & 0x7u];
    EXPECT_EQ(E2M1ToFloat(code), expected) << "code " << int{code};
  }
  EXPECT_EQ(E2M1ToFloat(0xF3), 1.5f) << "only the low nibble is read";
}

TEST(FloatCodec, E8M0DecodesEveryCodeAsPowerOfTwo) {
  for (uint32_t code = 0; code < 256; ++code) {
    const float got = E8M0ToFloat(static_cast<uint8_t>(code));
    if (code == 0xFF) {
      EXPECT_TRUE(std::isnan(got));
    } else {
      EXPECT_EQ(static_cast<double>(got), std::ldexp(1.0, static_cast<int>(code) - 127))
          << "code " << code;
    }
  }
}

TEST(FloatCodec, E8M0RoundUpIsExactOnPowersOfTwo) {
  for (int e = -127; e <= 127; ++e) {
    const float x = std::ldexp(1.0f, e);
    EXPECT_EQ(FloatToE8M0RoundUp(x), e + 127) << "2^" << e;
  }
}

TEST(FloatCodec, E8M0RoundUpRoundsNonPowersUp) {
  for (int e = -126; e <= 126; ++e) {
    const float p = std::ldexp(1.0f, e);
    EXPECT_EQ(FloatToE8M0RoundUp(std::nextafter(p, 1e38f)), e + 128) << "just above 2^" << e;
    EXPECT_EQ(FloatToE8M0RoundUp(p * 1.5f), e + 128) << "1.5 * 2^" << e;
    EXPECT_EQ(FloatToE8M0RoundUp(std::nextafter(p, 0.0f)), e + 127) << "just below 2^" << e;
  }
  // FP32 subnormals: at most 2^-127 gives code 0, above it 2^-126 (code 1).
  EXPECT_EQ(FloatToE8M0RoundUp(std::numeric_limits<float>::denorm_min()), 0);
  EXPECT_EQ(FloatToE8M0RoundUp(std::ldexp(1.0f, -127)), 0);
  EXPECT_EQ(FloatToE8M0RoundUp(std::nextafter(std::ldexp(1.0f, -127), 1.0f)), 1);
  EXPECT_EQ(FloatToE8M0RoundUp(std::nextafter(std::ldexp(1.0f, -126), 0.0f)), 1);
}

TEST(FloatCodec, E8M0RoundUpSaturatesAndHandlesSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToE8M0RoundUp(std::nextafter(std::ldexp(1.0f, 127), inf)), 0xFE);
  EXPECT_EQ(FloatToE8M0RoundUp(std::numeric_limits<float>::max()), 0xFE);
  EXPECT_EQ(FloatToE8M0RoundUp(inf), 0xFE);
  EXPECT_EQ(FloatToE8M0RoundUp(0.0f), 0x00);
  EXPECT_EQ(FloatToE8M0RoundUp(-0.0f), 0x00);
  EXPECT_EQ(FloatToE8M0RoundUp(-4.0f), 0x00);
  EXPECT_EQ(FloatToE8M0RoundUp(-inf), 0x00);
  EXPECT_EQ(FloatToE8M0RoundUp(std::numeric_limits<float>::quiet_NaN()), 0xFF);
  EXPECT_EQ(FloatToE8M0RoundUp(-std::numeric_limits<float>::quiet_NaN()), 0xFF);
}

}  // namespace
}  // namespace teserve
