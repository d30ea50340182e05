// The lazy region end of delayed (and current) scaling (recipes/quantizer.h): EndRegion only starts
// reading the region's amaxes, and the history roll and scale update run when the state
// is next needed. Every test runs two quantizers side by side on the same calls: an eager
// one (the CPU computes amaxes in place, so its EndRegion updates at once) and a lazy one
// (set_defer_host_amax_for_testing: its amaxes are handed over as a device hands them,
// so its EndRegion leaves the update pending). Quantized codes, snapshots and exported
// states must be equal bit for bit at every point.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"
#include "recipes/scaling.h"

namespace teserve {
namespace recipes {
namespace {

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

std::vector<uint32_t> Bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float x : v) out.push_back(Bits(x));
  return out;
}

Recipe Delayed(int history_len, AmaxComputeAlgo algo = AmaxComputeAlgo::kMax, float margin = 0.0f,
               Fp8Format format = Fp8Format::kHybrid) {
  DelayedScalingConfig c;
  c.amax_history_len = history_len;
  c.amax_compute_algo = algo;
  c.margin = margin;
  c.fp8_format = format;
  Recipe r;
  r.config = c;
  return r;
}

void ExpectSameSnapshot(const QuantizerSnapshot& a, const QuantizerSnapshot& b, const std::string& where) {
  EXPECT_EQ(a.recipe, b.recipe) << where;
  EXPECT_EQ(a.format, b.format) << where;
  EXPECT_EQ(Bits(a.amax), Bits(b.amax)) << where << ": amax " << a.amax << " vs " << b.amax;
  EXPECT_EQ(Bits(a.scale), Bits(b.scale)) << where << ": scale " << a.scale << " vs " << b.scale;
  EXPECT_EQ(Bits(a.scale_inv), Bits(b.scale_inv)) << where;
  EXPECT_EQ(Bits(a.amax_history), Bits(b.amax_history)) << where;
  EXPECT_EQ(a.quantize_calls, b.quantize_calls) << where;
}

void ExpectSameState(const QuantizerState& a, const QuantizerState& b, const std::string& where) {
  EXPECT_EQ(Bits(a.amax), Bits(b.amax)) << where;
  EXPECT_EQ(a.quantize_calls, b.quantize_calls) << where;
  EXPECT_EQ(Bits(a.scale), Bits(b.scale)) << where;
  EXPECT_EQ(Bits(a.amax_history), Bits(b.amax_history)) << where;
  EXPECT_EQ(a.rng_draws, b.rng_draws) << where;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  if (a.defined() != b.defined()) return false;
  return !a.defined() || BitwiseEqual(a, b);
}

// [rows, cols] FP32 values of magnitude ~scale; `special` puts a NaN (1), an Inf (2) or
// nothing but zeros (3) in.
Tensor Values(int64_t rows, int64_t cols, uint32_t seed, float scale, int special = 0) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(rows * cols);
  for (float& x : v) x = special == 3 ? 0.0f : normal(rng);
  if (special == 1) v[seed % v.size()] = NAN;
  if (special == 2) v[seed % v.size()] = -INFINITY;
  return Tensor::FromFloats(v, {rows, cols}).value();
}

// Three quantizers of one recipe and role, driven by the same calls:
//   in_place: the CPU's own path (amaxes computed in place, recorded at once);
//   eager:    amaxes handed over as a device does, read when the region ends (today's
//             device path, set_lazy_region_end(false));
//   lazy:     the same, with the lazy region end.
// lazy must equal eager bit for bit everywhere. in_place records an amax at once where the
// others record it at the region's end, so its latest amax differs when one region mixes
// both kinds (an Observe, or health statistics switched, between deferred quantizations);
// `mixed_regions` skips that one comparison for tests that do so.
struct Pair {
  std::unique_ptr<Quantizer> in_place, eager, lazy;
  const Context ctx;
  bool mixed_regions = false;

  Pair(const Recipe& recipe, TensorRole role) {
    in_place = MakeQuantizer(recipe, role).value();
    eager = MakeQuantizer(recipe, role).value();
    eager->set_defer_host_amax_for_testing(true);
    eager->set_lazy_region_end(false);
    lazy = MakeQuantizer(recipe, role).value();
    lazy->set_defer_host_amax_for_testing(true);
  }
  std::vector<Quantizer*> all() const { return {in_place.get(), eager.get(), lazy.get()}; }

  // All quantize x; their codes and scale_inv must agree (the lazy one resolved its ended
  // regions first, so it used the same scale).
  void Quantize(const Tensor& x, const std::string& where, bool columnwise = true) {
    std::vector<QuantizedTensor> out;
    for (Quantizer* q : all()) {
      absl::StatusOr<QuantizedTensor> r = q->Quantize(ctx, x, true, columnwise);
      ASSERT_TRUE(r.ok()) << r.status();
      out.push_back(*std::move(r));
    }
    for (size_t i = 1; i < out.size(); ++i) {
      EXPECT_TRUE(SameBytes(out[0].rowwise_data, out[i].rowwise_data)) << where;
      EXPECT_TRUE(SameBytes(out[0].rowwise_scale_inv, out[i].rowwise_scale_inv)) << where;
      EXPECT_TRUE(SameBytes(out[0].columnwise_data, out[i].columnwise_data)) << where;
      EXPECT_TRUE(SameBytes(out[0].columnwise_scale_inv, out[i].columnwise_scale_inv)) << where;
    }
  }
  void Observe(const Tensor& x) {
    for (Quantizer* q : all()) ASSERT_TRUE(q->Observe(ctx, x).ok());
  }
  void EndRegion() {
    for (Quantizer* q : all()) q->EndRegion();
  }
  void Import(const QuantizerState& state) {
    for (Quantizer* q : all()) q->ImportState(state);
  }
  void HealthStats(bool on) {
    for (Quantizer* q : all()) q->set_health_stats(on);
  }
  void ExpectSame(const std::string& where) {
    const QuantizerSnapshot a = in_place->Snapshot(), b = eager->Snapshot(), c = lazy->Snapshot();
    ExpectSameSnapshot(b, c, where + " (eager, lazy)");
    QuantizerSnapshot c_amax = c;
    if (mixed_regions) {
      c_amax.amax = a.amax;
      if (a.recipe == "current") {  // its scale is the latest amax's
        c_amax.scale = a.scale;
        c_amax.scale_inv = a.scale_inv;
      }
    }
    ExpectSameSnapshot(a, c_amax, where + " (in place, lazy)");
  }
  // The exported state, after checking the three agree.
  QuantizerState Export(const std::string& where) {
    const QuantizerState a = in_place->ExportState(), b = eager->ExportState(), c = lazy->ExportState();
    ExpectSameState(b, c, where + " (eager, lazy)");
    QuantizerState c_amax = c;
    if (mixed_regions) {
      c_amax.amax = a.amax;
      if (in_place->current_rule().has_value()) c_amax.scale = a.scale;
    }
    ExpectSameState(a, c_amax, where + " (in place, lazy)");
    return b;
  }
};

TEST(LazyRegionEnd, EndRegionLeavesTheUpdateToTheNextUse) {
  Pair p(Delayed(4), TensorRole::kInput);
  p.Quantize(Values(4, 8, 1, 3.0f), "step 0");
  EXPECT_FALSE(p.lazy->region_pending());
  p.EndRegion();
  EXPECT_FALSE(p.eager->region_pending());
  EXPECT_TRUE(p.lazy->region_pending());
  // The next quantization needs the new scale: it resolves the ended region.
  p.Quantize(Values(4, 8, 2, 5.0f), "step 1");
  EXPECT_FALSE(p.lazy->region_pending());
  p.EndRegion();
  EXPECT_TRUE(p.lazy->region_pending());
  EXPECT_EQ(Bits(p.lazy->ScaleInUse()), Bits(p.eager->ScaleInUse()));
  EXPECT_FALSE(p.lazy->region_pending());
  p.ExpectSame("end");
}

TEST(LazyRegionEnd, RegionWithoutQuantizationsEndsAtOnce) {
  Pair p(Delayed(4), TensorRole::kWeight);
  p.EndRegion();
  EXPECT_FALSE(p.lazy->region_pending());
  p.ExpectSame("empty region");
}

TEST(LazyRegionEnd, ForwardAndBackwardRegionsMatchEager) {
  struct Config {
    Recipe recipe;
    std::string name;
  };
  const std::vector<Config> configs = {
      {Delayed(1), "len1"},
      {Delayed(2), "len2"},
      {Delayed(16), "len16"},
      {Delayed(5, AmaxComputeAlgo::kMostRecent), "most_recent"},
      {Delayed(4, AmaxComputeAlgo::kMax, 2.0f), "margin2"},
      {Delayed(4, AmaxComputeAlgo::kMax, 0.0f, Fp8Format::kE4M3), "e4m3"},
  };
  for (const Config& c : configs) {
    for (bool snapshot_every_step : {false, true}) {
      SCOPED_TRACE(absl::StrCat(c.name, snapshot_every_step ? " snapshots" : ""));
      Pair input(c.recipe, TensorRole::kInput), weight(c.recipe, TensorRole::kWeight),
          grad(c.recipe, TensorRole::kGradOutput);
      for (int step = 0; step < 24; ++step) {
        const std::string where = absl::StrCat("step ", step);
        // Magnitudes wander over steps; now and then a layer does not run in a region
        // (skipped roll), or a tensor holds NaN, Inf or only zeros.
        const float magnitude = std::ldexp(1.0f, (step * 5) % 11 - 5);
        const int special = step % 7 == 3 ? 1 + step % 3 : 0;
        if (step % 9 != 4) {
          input.Quantize(Values(6, 8, 100 + step, magnitude, special), where);
          if (step % 4 == 1) input.Quantize(Values(6, 8, 200 + step, 2.0f * magnitude), where);  // microbatches
        }
        weight.Quantize(Values(8, 8, 300 + step, 0.05f), where);
        input.EndRegion();
        weight.EndRegion();
        EXPECT_TRUE(weight.lazy->region_pending()) << where;
        if (snapshot_every_step) {
          input.ExpectSame(where + " forward");
          weight.ExpectSame(where + " forward");
        }
        if (step % 6 != 5) grad.Quantize(Values(6, 8, 400 + step, 1e-3f * magnitude, special), where);
        grad.EndRegion();
        if (snapshot_every_step) grad.ExpectSame(where + " backward");
      }
      for (Pair* p : {&input, &weight, &grad}) {
        p->Export("export");
        p->ExpectSame("end");
      }
    }
  }
}

TEST(LazyRegionEnd, SnapshotAndExportStateRightAfterEndRegion) {
  Pair p(Delayed(3), TensorRole::kInput);
  for (int step = 0; step < 5; ++step) {
    const std::string where = absl::StrCat("step ", step);
    p.Quantize(Values(4, 4, step, 1.0f + step), where);
    p.EndRegion();
    ASSERT_TRUE(p.lazy->region_pending());
    if (step % 2 == 0) {
      p.ExpectSame(where);
    } else {
      p.Export(where);
    }
    EXPECT_FALSE(p.lazy->region_pending());
  }
  p.ExpectSame("end");
}

// A second EndRegion before the first is resolved still runs its own update after it:
// here the window loses the first region's amax, so the empty region changes the scale.
TEST(LazyRegionEnd, TwoEndRegionsInARow) {
  Pair p(Delayed(2), TensorRole::kInput);
  p.Quantize(Values(2, 2, 1, 1.0f, 3), "zeros");  // amax 0: no roll
  p.EndRegion();
  const Tensor eight = Tensor::FromFloats({8.0f, 1.0f, -2.0f, 0.5f}, {2, 2}).value();
  const Tensor one = Tensor::FromFloats({1.0f, -0.5f, 0.25f, 0.0f}, {2, 2}).value();
  p.Quantize(eight, "eight");
  p.EndRegion();
  p.Quantize(one, "one");
  p.EndRegion();
  p.EndRegion();
  EXPECT_TRUE(p.lazy->region_pending());
  p.EndRegion();
  p.ExpectSame("three ends");
  // Window [0, 1] after the empty region: the scale comes from 1 alone.
  EXPECT_EQ(p.eager->Snapshot().scale, 448.0f);

  // Unresolved twice in a row, then resolved by a quantization.
  p.Quantize(eight, "eight again");
  p.EndRegion();
  p.EndRegion();
  p.Quantize(one, "after two ends");
  p.EndRegion();
  p.ExpectSame("end");
}

TEST(LazyRegionEnd, QuantizationsAfterEndRegionBelongToTheNextRegion) {
  Pair p(Delayed(4), TensorRole::kInput);
  const Tensor four = Tensor::FromFloats({4.0f, 1.0f}, {1, 2}).value();
  const Tensor hundred = Tensor::FromFloats({100.0f, 1.0f}, {1, 2}).value();
  p.Quantize(four, "four");
  p.EndRegion();
  p.Quantize(hundred, "hundred");  // quantized with 448 / 4, recorded in the next region
  p.Quantize(four, "four again");
  p.EndRegion();
  p.ExpectSame("end");
  const QuantizerSnapshot s = p.lazy->Snapshot();
  EXPECT_EQ(s.amax_history, (std::vector<float>{0.0f, 0.0f, 4.0f, 100.0f}));
  EXPECT_EQ(s.amax, 4.0f);
  EXPECT_EQ(s.scale, 448.0f / 100.0f);
}

TEST(LazyRegionEnd, ImportStateWhileRegionPending) {
  for (bool from_before : {true, false}) {
    SCOPED_TRACE(from_before ? "state from before the region" : "state of another quantizer");
    Pair p(Delayed(4), TensorRole::kGradOutput);
    p.Quantize(Values(4, 4, 1, 2.0f), "first");
    p.EndRegion();
    // The session's mark before a call, then the call's region, then its rewind.
    QuantizerState mark = p.Export("mark");
    if (!from_before) {
      Pair other(Delayed(4), TensorRole::kGradOutput);
      other.Quantize(Values(4, 4, 7, 9.0f), "other");
      other.EndRegion();
      other.Quantize(Values(4, 4, 8, 3.0f), "other");
      mark = other.Export("other");
    }
    p.Quantize(Values(4, 4, 2, 50.0f), "second");
    p.EndRegion();
    ASSERT_TRUE(p.lazy->region_pending());
    EXPECT_TRUE(p.lazy->CheckState(mark, "state").ok());
    EXPECT_TRUE(p.lazy->region_pending());  // CheckState needs no update
    p.Import(mark);
    EXPECT_FALSE(p.lazy->region_pending());
    p.ExpectSame("after import");
    // And the imported state goes on as the eager one's.
    p.Quantize(Values(4, 4, 3, 0.5f), "third");
    p.EndRegion();
    p.ExpectSame("end");
  }
}

TEST(LazyRegionEnd, ImportStateWithTheOpenRegionPending) {
  Pair p(Delayed(4), TensorRole::kInput);
  p.Quantize(Values(4, 4, 1, 2.0f), "first");
  p.EndRegion();
  const QuantizerState mark = p.Export("mark");
  p.Quantize(Values(4, 4, 2, 7.0f), "open");  // its amax is still unread
  p.Import(mark);
  p.EndRegion();  // an empty region on both
  p.ExpectSame("end");
}

TEST(LazyRegionEnd, HealthStatisticsReadTheAmaxAtOnce) {
  Pair p(Delayed(4), TensorRole::kInput);
  p.Quantize(Values(4, 4, 1, 2.0f), "deferred");
  p.EndRegion();
  p.HealthStats(true);
  p.Quantize(Values(4, 4, 2, 3.0f), "health");
  p.EndRegion();
  EXPECT_FALSE(p.lazy->region_pending());  // nothing deferred in this region
  p.HealthStats(false);
  p.Quantize(Values(4, 4, 3, 4.0f), "deferred again");
  p.EndRegion();
  EXPECT_TRUE(p.lazy->region_pending());
  p.ExpectSame("end");
  const QuantizerSnapshot a = p.eager->Snapshot(), b = p.lazy->Snapshot();
  EXPECT_EQ(a.health.valid, b.health.valid);
  EXPECT_EQ(a.health.mse, b.health.mse);
  EXPECT_EQ(a.health.overflow_ratio, b.health.overflow_ratio);
}

TEST(LazyRegionEnd, ObserveResolvesFirst) {
  Pair p(Delayed(4), TensorRole::kInput);
  p.Quantize(Values(4, 4, 1, 2.0f), "quantize");
  p.EndRegion();
  p.Observe(Values(4, 4, 2, 6.0f));
  EXPECT_FALSE(p.lazy->region_pending());
  p.EndRegion();
  p.ExpectSame("end");
}

TEST(LazyRegionEnd, DestroyedWithARegionPending) {
  Pair p(Delayed(4), TensorRole::kInput);
  p.Quantize(Values(4, 4, 1, 2.0f), "quantize");
  p.EndRegion();
  ASSERT_TRUE(p.lazy->region_pending());
  p.lazy.reset();  // its read is waited for, its update dropped
}

// Recipes that read their amax at once (or have none per tensor) never defer.
Recipe Current(float amax_epsilon = 0.0f, bool power_2_scale = false) {
  CurrentScalingConfig c;
  c.amax_epsilon = amax_epsilon;
  c.power_2_scale = power_2_scale;
  Recipe r;
  r.config = c;
  return r;
}

// Current scaling takes its scale from the tensor inside the cast and leaves the amax on
// the device as well; the scale it reports follows from the amax once that is read.
TEST(LazyRegionEnd, CurrentScalingReportsItsScaleOnceTheAmaxIsRead) {
  Pair p(Current(), TensorRole::kInput);
  p.Quantize(Values(4, 4, 1, 2.0f), "quantize");
  p.EndRegion();
  EXPECT_TRUE(p.lazy->region_pending());
  p.ExpectSame("current");
  EXPECT_FALSE(p.lazy->region_pending());
  const QuantizerSnapshot s = p.lazy->Snapshot();
  EXPECT_EQ(Bits(s.scale), Bits(CurrentScale(s.amax, 448.0f, 0.0f, false)));
  // Mid-region: the snapshot reads the open region's amax.
  p.Quantize(Values(4, 4, 2, 1024.0f), "quantize again");
  p.ExpectSame("open region");
}

// A random mix of every call the session makes, against the eager quantizer.
TEST(LazyRegionEnd, RandomCallSequencesMatchEager) {
  for (uint32_t seed = 0; seed < 9; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 rng(seed);
    // Seeds 6 and up: current scaling (its scale follows the latest amax).
    const Recipe recipe =
        seed >= 6 ? Current(seed % 2 == 0 ? 0.0f : 1e-3f, seed == 7)
                  : Delayed(1 + seed % 5, seed % 3 == 2 ? AmaxComputeAlgo::kMostRecent : AmaxComputeAlgo::kMax,
                            static_cast<float>(seed % 2));
    Pair p(recipe, seed % 2 == 0 ? TensorRole::kInput : TensorRole::kGradOutput);
    p.mixed_regions = true;
    std::vector<QuantizerState> marks{p.Export("start")};
    for (int i = 0; i < 400; ++i) {
      const std::string where = absl::StrCat("call ", i);
      const int op = std::uniform_int_distribution<int>(0, 99)(rng);
      if (op < 45) {
        const float magnitude = std::ldexp(1.0f, std::uniform_int_distribution<int>(-12, 12)(rng));
        const int special = std::uniform_int_distribution<int>(0, 29)(rng);
        p.Quantize(Values(3, 5, rng(), magnitude, special < 3 ? special + 1 : 0), where, op % 2 == 0);
      } else if (op < 75) {
        p.EndRegion();
      } else if (op < 80) {
        p.Observe(Values(3, 5, rng(), 4.0f));
      } else if (op < 85) {
        p.ExpectSame(where);
      } else if (op < 92) {
        marks.push_back(p.Export(where));
      } else if (op < 96) {
        p.Import(marks[rng() % marks.size()]);
      } else {
        p.HealthStats(op % 2 == 0);
      }
    }
    p.ExpectSame("end");
  }
}

// A session's region end: the lazy quantizers of several pairs end together through one
// RegionEnd (one read of all their amaxes) while the eager and in-place ones end one by
// one. Some pairs sit regions out (their ended region stays unresolved, holding the
// previous read, so the next one must not reuse its staging), some import a state in the
// middle; every pair's three must still agree bit for bit.
TEST(LazyRegionEnd, RegionEndTogetherMatchesEager) {
  for (uint32_t seed = 0; seed < 4; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed ", seed));
    std::mt19937 rng(seed);
    std::vector<std::unique_ptr<Pair>> pairs;
    for (int i = 0; i < 6; ++i) {
      pairs.push_back(std::make_unique<Pair>(Delayed(1 + (seed + i) % 4), i % 3 == 2 ? TensorRole::kGradOutput
                                                                                       : TensorRole::kInput));
    }
    RegionEnd together;
    std::vector<QuantizerState> marks{pairs[0]->Export("start")};
    for (int step = 0; step < 120; ++step) {
      const std::string where = absl::StrCat("step ", step);
      for (size_t i = 0; i < pairs.size(); ++i) {
        Pair& p = *pairs[i];
        const int op = std::uniform_int_distribution<int>(0, 9)(rng);
        if (op < 6) {
          const float magnitude = std::ldexp(1.0f, std::uniform_int_distribution<int>(-10, 10)(rng));
          p.Quantize(Values(3, 4, rng(), magnitude), absl::StrCat(where, " pair ", i), op % 2 == 0);
          if (op == 0) p.Quantize(Values(2, 4, rng(), magnitude), absl::StrCat(where, " pair ", i, " again"));
        } else if (op == 6 && i == 0) {
          marks.push_back(p.Export(where));
        } else if (op == 7 && i == 0) {
          p.Import(marks[rng() % marks.size()]);
        } else if (op == 8) {
          p.ExpectSame(absl::StrCat(where, " pair ", i));
        }
      }
      std::vector<Quantizer*> lazy;
      for (auto& p : pairs) {
        p->in_place->EndRegion();
        p->eager->EndRegion();
        lazy.push_back(p->lazy.get());
      }
      together.End(lazy);
    }
    for (size_t i = 0; i < pairs.size(); ++i) pairs[i]->ExpectSame(absl::StrCat("end, pair ", i));
  }
}

}  // namespace
}  // namespace recipes
}  // namespace teserve
