// Exhaustive proofs that the branch-free encoders of kernels/e2m1_encode.h give the
// codes of the reference codecs:
// - E2M1EncodeNearest == FloatToE2M1 on all 2^32 FP32 bit patterns;
// - E2M1EncodeStochastic == StochasticRoundToE2M1 on every pattern of magnitude below
//   8 (the block-scaled NVFP4 range and past the saturation point), both signs, times
//   the draws 0, 1, 2^23 - 1, 2^23, 2^24 - 1 and a pattern-dependent one; every pattern
//   (including Inf/NaN and huge magnitudes) with the pattern-dependent draw; and all
//   2^24 draws for values around each grid point and rounding boundary;
// - E4M3EncodeFast == FloatToE4M3 on all 2^32 patterns, E4M3DecodeFast == E4M3ToFloat
//   on all 256 bytes, and Nvfp4BlockScaleFast == Nvfp4BlockScaleOf on sampled amaxes;
// - the stepped counter of RandomCounter / RandomBits24OfCounter == RandomBits24.
// The sweeps split the pattern range across threads.
#include "kernels/e2m1_encode.h"

#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "core/float_codec.h"
#include "gtest/gtest.h"
#include "kernels/quantize_math.h"
#include "kernels/stochastic_rounding.h"

namespace teserve {
namespace kernels {
namespace {

struct Mismatch {
  uint64_t count = 0;
  uint32_t first_bits = 0;
  uint32_t first_draw = 0;
  uint32_t got = 0;
  uint32_t want = 0;
};

// Runs check(bits, &mismatch) for bits in [begin, end) split over the hardware threads
// and merges the per-thread results (the first mismatch of the lowest range wins).
Mismatch SweepPatterns(uint64_t begin, uint64_t end,
                       const std::function<void(uint32_t, Mismatch*)>& check) {
  const unsigned threads = std::max(1u, std::min(8u, std::thread::hardware_concurrency()));
  std::vector<Mismatch> results(threads);
  std::vector<std::thread> workers;
  const uint64_t chunk = (end - begin + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const uint64_t lo = begin + t * chunk;
      const uint64_t hi = std::min(end, lo + chunk);
      for (uint64_t b = lo; b < hi; ++b) check(static_cast<uint32_t>(b), &results[t]);
    });
  }
  for (std::thread& w : workers) w.join();
  Mismatch total;
  for (const Mismatch& m : results) {
    if (m.count != 0 && total.count == 0) total = m;
    else total.count += m.count;
  }
  return total;
}

void Record(uint32_t bits, uint32_t draw, uint32_t got, uint32_t want, Mismatch* m) {
  if (m->count++ == 0) *m = Mismatch{1, bits, draw, got, want};
}

std::string Describe(const Mismatch& m) {
  return absl::StrFormat("%d mismatches; first: bits 0x%08x (%g) draw 0x%06x: got 0x%x want 0x%x",
                         m.count, m.first_bits, BitsToFloat(m.first_bits), m.first_draw, m.got,
                         m.want);
}

// A draw that varies with the pattern (SplitMix64 of the bits), covering all 24 bits.
uint32_t DrawFor(uint32_t bits) { return static_cast<uint32_t>(Mix64(bits) >> 40); }

TEST(E2M1Encode, NearestEqualsFloatToE2M1OnEveryFloat32Pattern) {
  const Mismatch m = SweepPatterns(0, uint64_t{1} << 32, [](uint32_t bits, Mismatch* out) {
    const float y = BitsToFloat(bits);
    const uint32_t got = E2M1EncodeNearest(y);
    const uint32_t want = FloatToE2M1(y);
    if (got != want) Record(bits, 0, got, want, out);
  });
  EXPECT_EQ(m.count, 0u) << Describe(m);
}

TEST(E2M1Encode, StochasticEqualsReferenceOnTheNvfp4RangeForFixedDraws) {
  // |y| < 8 covers the grid [0, 6], saturation and every subnormal.
  constexpr uint32_t kEightBits = 0x41000000u;
  const uint32_t draws[] = {0u, 1u, (1u << 23) - 1, 1u << 23, (1u << 24) - 1};
  const Mismatch m = SweepPatterns(0, kEightBits, [&](uint32_t magnitude, Mismatch* out) {
    for (uint32_t sign : {0u, 0x80000000u}) {
      const uint32_t bits = magnitude | sign;
      const float y = BitsToFloat(bits);
      for (uint32_t draw : draws) {
        const uint32_t got = E2M1EncodeStochastic(y, draw);
        const uint32_t want = StochasticRoundToE2M1(y, draw);
        if (got != want) Record(bits, draw, got, want, out);
      }
      const uint32_t draw = DrawFor(bits);
      const uint32_t got = E2M1EncodeStochastic(y, draw);
      const uint32_t want = StochasticRoundToE2M1(y, draw);
      if (got != want) Record(bits, draw, got, want, out);
    }
  });
  EXPECT_EQ(m.count, 0u) << Describe(m);
}

TEST(E2M1Encode, StochasticEqualsReferenceOnEveryFloat32PatternForOneDraw) {
  const Mismatch m = SweepPatterns(0, uint64_t{1} << 32, [](uint32_t bits, Mismatch* out) {
    const float y = BitsToFloat(bits);
    const uint32_t draw = DrawFor(bits);
    const uint32_t got = E2M1EncodeStochastic(y, draw);
    const uint32_t want = StochasticRoundToE2M1(y, draw);
    if (got != want) Record(bits, draw, got, want, out);
  });
  EXPECT_EQ(m.count, 0u) << Describe(m);
}

TEST(E2M1Encode, StochasticEqualsReferenceForEveryDrawNearGridPointsAndBoundaries) {
  // Grid points, midpoints, binade edges, the saturation point and zero; each with the
  // neighbouring patterns within 2 ulps, both signs.
  const float anchors[] = {0.0f,  0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f,
                           2.5f,  3.0f,  3.5f, 4.0f,  5.0f, 6.0f,  1e-30f, 0.1f, 4.6f};
  std::vector<uint32_t> patterns;
  for (float anchor : anchors) {
    const uint32_t center = FloatBits(anchor);
    for (int d = -2; d <= 2; ++d) {
      if (center == 0 && d < 0) continue;
      for (uint32_t sign : {0u, 0x80000000u}) patterns.push_back((center + d) | sign);
    }
  }
  const Mismatch m = SweepPatterns(0, uint64_t{1} << 24, [&](uint32_t draw, Mismatch* out) {
    for (uint32_t bits : patterns) {
      const float y = BitsToFloat(bits);
      const uint32_t got = E2M1EncodeStochastic(y, draw);
      const uint32_t want = StochasticRoundToE2M1(y, draw);
      if (got != want) Record(bits, draw, got, want, out);
    }
  });
  EXPECT_EQ(m.count, 0u) << Describe(m);
}

TEST(E2M1Encode, E4M3EncodeFastEqualsFloatToE4M3OnEveryFloat32Pattern) {
  const Mismatch m = SweepPatterns(0, uint64_t{1} << 32, [](uint32_t bits, Mismatch* out) {
    const float x = BitsToFloat(bits);
    const uint32_t got = E4M3EncodeFast(x);
    const uint32_t want = FloatToE4M3(x);
    if (got != want) Record(bits, 0, got, want, out);
  });
  EXPECT_EQ(m.count, 0u) << Describe(m);
}

TEST(E2M1Encode, E4M3DecodeFastEqualsE4M3ToFloatOnEveryByte) {
  for (uint32_t code = 0; code < 256; ++code) {
    EXPECT_EQ(FloatBits(E4M3DecodeFast(code)), FloatBits(E4M3ToFloat(static_cast<uint8_t>(code))))
        << "code 0x" << std::hex << code;
  }
}

// The composition is equal by the two codec proofs; this checks the wiring on block
// amaxes spread over all non-negative patterns (and NaN/Inf) for several global scales.
TEST(E2M1Encode, Nvfp4BlockScaleFastEqualsNvfp4BlockScaleOf) {
  const float scales[] = {1.0f, 2688.0f, 2688.0f / 3.75f, 2688.0f / 1e-30f, 1e-30f, FLT_MAX};
  for (float s : scales) {
    const float inv_s = 1.0f / s;
    const Mismatch m = SweepPatterns(0, uint64_t{1} << 31, [&](uint32_t bits, Mismatch* out) {
      if (bits % 61 != 0 && bits < 0x7F7FFFF0u) return;
      const float amax = BitsToFloat(bits);
      const Nvfp4BlockScale got = Nvfp4BlockScaleFast(amax, s, inv_s);
      const Nvfp4BlockScale want = Nvfp4BlockScaleOf(amax, s, inv_s);
      if (got.byte != want.byte || FloatBits(got.e) != FloatBits(want.e)) {
        Record(bits, 0, got.byte, want.byte, out);
      }
    });
    EXPECT_EQ(m.count, 0u) << "S " << s << ": " << Describe(m);
  }
}

TEST(E2M1Encode, SteppedCounterGivesTheKeyedDraws) {
  const uint64_t keys[] = {0ull, 1ull, RandomKey(0x1234ABCDull, 7, kRowwiseCopyId),
                           RandomKey(0x1234ABCDull, 7, kColumnwiseCopyId), ~0ull};
  const uint64_t starts[] = {0ull, 1ull, 16383ull * 8192ull, (1ull << 40) + 3, ~0ull - 20};
  for (uint64_t key : keys) {
    for (uint64_t start : starts) {
      uint64_t counter = RandomCounter(key, start);
      for (uint64_t i = start; i < start + 32; ++i) {
        ASSERT_EQ(RandomBits24OfCounter(counter), RandomBits24(key, i))
            << "key " << key << " index " << i;
        counter += kGoldenGamma;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
