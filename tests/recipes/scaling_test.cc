#include "recipes/scaling.h"

#include <cfloat>
#include <cmath>
#include <limits>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "recipes/recipe.h"

namespace teserve {
namespace recipes {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

DelayedScalingConfig Delayed(int len, AmaxComputeAlgo algo = AmaxComputeAlgo::kMax, float margin = 0.0f) {
  DelayedScalingConfig c;
  c.amax_history_len = len;
  c.amax_compute_algo = algo;
  c.margin = margin;
  return c;
}

TEST(DelayedScale, IsFp8MaxOverAmaxOverTwoToTheMargin) {
  EXPECT_EQ(DelayedScale(2.0f, 448.0f, 0.0f, 1.0f), 224.0f);
  EXPECT_EQ(DelayedScale(2.0f, 448.0f, 1.0f, 1.0f), 112.0f);
  EXPECT_EQ(DelayedScale(3.5f, 57344.0f, 2.0f, 1.0f), (57344.0f / 3.5f) / 4.0f);
}

TEST(DelayedScale, KeepsPreviousScaleWhenAmaxIsZeroInfOrNaN) {
  EXPECT_EQ(DelayedScale(0.0f, 448.0f, 0.0f, 7.0f), 7.0f);
  EXPECT_EQ(DelayedScale(kInf, 448.0f, 0.0f, 7.0f), 7.0f);
  EXPECT_EQ(DelayedScale(kNaN, 448.0f, 0.0f, 7.0f), 7.0f);
}

TEST(DelayedScale, ClampsInfiniteScaleToFltMax) {
  // 448 / 1e-39 (an FP32 subnormal) overflows to Inf.
  EXPECT_EQ(DelayedScale(1e-39f, 448.0f, 0.0f, 1.0f), FLT_MAX);
}

TEST(CurrentScale, UsesEpsilonFloorAndPowerOfTwoRounding) {
  EXPECT_EQ(CurrentScale(2.0f, 448.0f, 0.0f, false), 224.0f);
  EXPECT_EQ(CurrentScale(1e-6f, 448.0f, 1e-3f, false), 448.0f / 1e-3f);
  EXPECT_EQ(CurrentScale(3.0f, 448.0f, 0.0f, true), 128.0f);  // 149.33 rounded down
  EXPECT_EQ(CurrentScale(3.5f, 448.0f, 0.0f, true), 128.0f);  // exactly 128
  EXPECT_EQ(CurrentScale(0.0f, 448.0f, 0.0f, false), 1.0f);
  EXPECT_EQ(CurrentScale(kInf, 448.0f, 0.0f, false), 1.0f);
  EXPECT_EQ(CurrentScale(kNaN, 448.0f, 1.0f, false), 1.0f);
  EXPECT_EQ(CurrentScale(1e-39f, 448.0f, 0.0f, false), FLT_MAX);
  EXPECT_EQ(CurrentScale(1e-39f, 448.0f, 0.0f, true), std::ldexp(1.0f, 127));
  // Zero amax with an epsilon floor scales by the floor.
  EXPECT_EQ(CurrentScale(0.0f, 448.0f, 0.5f, false), 896.0f);
}

TEST(ScalingState, StartsWithScaleOneAndZeroHistory) {
  ScalingState s(Delayed(4), 448.0f);
  EXPECT_EQ(s.scale(), 1.0f);
  EXPECT_THAT(s.history(), testing::ElementsAre(0, 0, 0, 0));
}

TEST(ScalingState, RollsHistoryAndTakesWindowMax) {
  ScalingState s(Delayed(3), 448.0f);
  s.RecordAmax(4.0f);
  EXPECT_THAT(s.history(), testing::ElementsAre(4, 0, 0));
  s.Update();
  EXPECT_EQ(s.scale(), 112.0f);
  EXPECT_THAT(s.history(), testing::ElementsAre(0, 0, 4));
  s.RecordAmax(2.0f);
  s.Update();
  EXPECT_EQ(s.scale(), 112.0f);  // window max is still 4
  EXPECT_THAT(s.history(), testing::ElementsAre(0, 4, 2));
  s.RecordAmax(1.0f);
  s.Update();
  EXPECT_THAT(s.history(), testing::ElementsAre(0, 2, 1));  // 4 left the window
  EXPECT_EQ(s.scale(), 112.0f);  // computed before the roll: window {1, 4, 2}
  s.RecordAmax(1.0f);
  s.Update();
  EXPECT_EQ(s.scale(), 224.0f);  // window {1, 2, 1}
}

TEST(ScalingState, MostRecentUsesTheNewestAmax) {
  ScalingState s(Delayed(8, AmaxComputeAlgo::kMostRecent), 448.0f);
  s.RecordAmax(8.0f);
  s.Update();
  EXPECT_EQ(s.scale(), 56.0f);
  s.RecordAmax(2.0f);
  s.Update();
  EXPECT_EQ(s.scale(), 224.0f);
}

TEST(ScalingState, SkipsRollWhenTheLayerDidNotRun) {
  ScalingState s(Delayed(3), 448.0f);
  s.RecordAmax(4.0f);
  s.Update();
  s.Update();  // nothing recorded in this region
  EXPECT_THAT(s.history(), testing::ElementsAre(0, 0, 4));
  EXPECT_EQ(s.scale(), 112.0f);
}

TEST(ScalingState, KeepsScaleWhenAmaxIsNonFinite) {
  ScalingState s(Delayed(2), 448.0f);
  s.RecordAmax(4.0f);
  s.Update();
  s.RecordAmax(kInf);
  s.Update();
  EXPECT_EQ(s.scale(), 112.0f);
  ScalingState n(Delayed(2), 448.0f);
  n.RecordAmax(kNaN);
  n.Update();
  EXPECT_EQ(n.scale(), 1.0f);
}

TEST(ScalingState, MarginHalvesTheScalePerUnit) {
  ScalingState s(Delayed(1, AmaxComputeAlgo::kMax, 2.0f), 448.0f);
  s.RecordAmax(1.0f);
  s.Update();
  EXPECT_EQ(s.scale(), 112.0f);
}

TEST(ScalingState, SlotZeroKeepsTheMaxOfARegion) {
  ScalingState s(Delayed(2), 448.0f);
  s.RecordAmax(1.0f);
  s.RecordAmax(3.0f);
  s.RecordAmax(2.0f);
  EXPECT_EQ(s.history()[0], 3.0f);
}

TEST(Recipe, HybridIsE4M3ForwardAndE5M2Backward) {
  EXPECT_EQ(FormatFor(Fp8Format::kHybrid, TensorRole::kInput), DType::kFloat8E4M3);
  EXPECT_EQ(FormatFor(Fp8Format::kHybrid, TensorRole::kWeight), DType::kFloat8E4M3);
  EXPECT_EQ(FormatFor(Fp8Format::kHybrid, TensorRole::kGradOutput), DType::kFloat8E5M2);
  EXPECT_EQ(FormatFor(Fp8Format::kE4M3, TensorRole::kGradOutput), DType::kFloat8E4M3);
}

TEST(RecipeFromProto, AppliesTeDefaults) {
  v1::RecipeSpec spec;
  spec.mutable_delayed();
  auto recipe = RecipeFromProto(spec);
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  const auto& c = absl::get<DelayedScalingConfig>(recipe->config);
  EXPECT_EQ(c.amax_history_len, 1024);
  EXPECT_EQ(c.margin, 0.0f);
  EXPECT_EQ(c.fp8_format, Fp8Format::kHybrid);
  EXPECT_EQ(c.amax_compute_algo, AmaxComputeAlgo::kMax);
  EXPECT_TRUE(c.reduce_amax);
  EXPECT_TRUE(recipe->quantizes());
  EXPECT_EQ(recipe->name(), "delayed");
}

TEST(RecipeFromProto, RejectsInvalidConfigurationsNamingTheField) {
  struct Case {
    std::function<void(v1::RecipeSpec*)> mutate;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {[](v1::RecipeSpec* s) { s->mutable_delayed()->set_amax_history_len(0); },
       "recipe.delayed.amax_history_len: expected 1..65536, got 0"},
      {[](v1::RecipeSpec* s) { s->mutable_delayed()->set_fp8_format(v1::E5M2); },
       "recipe.delayed.fp8_format: expected HYBRID or E4M3"},
      {[](v1::RecipeSpec* s) { s->mutable_delayed()->set_amax_compute_algo("mean"); },
       "recipe.delayed.amax_compute_algo: expected \"max\" or \"most_recent\", got \"mean\""},
      {[](v1::RecipeSpec* s) { s->mutable_delayed()->set_margin(-1); },
       "recipe.delayed.margin: expected a finite value >= 0, got -1"},
      {[](v1::RecipeSpec* s) { s->mutable_current()->set_amax_epsilon(-1); },
       "recipe.current.amax_epsilon"},
      {[](v1::RecipeSpec* s) { s->mutable_current()->set_fp8_format(v1::E5M2); },
       "recipe.current.fp8_format"},
      {[](v1::RecipeSpec* s) { s->mutable_mxfp8()->set_fp8_format(v1::E5M2); },
       "recipe.mxfp8.fp8_format: expected HYBRID or E4M3"},
      {[](v1::RecipeSpec* s) { s->mutable_block()->set_w_block_scaling_dim(3); },
       "recipe.block.w_block_scaling_dim: expected 1 (1x128) or 2 (128x128), got 3"},
      {[](v1::RecipeSpec* s) { s->mutable_block()->set_x_block_scaling_dim(2); },
       "recipe.block.x_block_scaling_dim: expected 1 (inputs use 1x128 blocks), got 2"},
      {[](v1::RecipeSpec* s) { s->mutable_nvfp4()->set_fp8_format(v1::HYBRID); },
       "recipe.nvfp4.fp8_format: expected E4M3 (NVFP4 block scales are E4M3; per-direction formats do not "
       "apply), got HYBRID"},
      {[](v1::RecipeSpec* s) { s->mutable_nvfp4()->set_fp8_format(v1::E5M2); },
       "recipe.nvfp4.fp8_format: expected E4M3 (NVFP4 block scales are E4M3; per-direction formats do not "
       "apply), got E5M2"},
      {[](v1::RecipeSpec* s) { s->set_calibrating(true); }, "recipe.calibrating: expected a recipe to calibrate"},
  };
  for (const Case& c : cases) {
    v1::RecipeSpec spec;
    c.mutate(&spec);
    auto recipe = RecipeFromProto(spec);
    EXPECT_EQ(recipe.status().code(), absl::StatusCode::kInvalidArgument) << c.fragment;
    EXPECT_THAT(std::string(recipe.status().message()), testing::HasSubstr(c.fragment));
  }
}

TEST(RecipeFromProto, Nvfp4AcceptsE4M3ScalesExplicitly) {
  v1::RecipeSpec spec;
  spec.mutable_nvfp4()->set_fp8_format(v1::E4M3);
  auto recipe = RecipeFromProto(spec);
  ASSERT_TRUE(recipe.ok()) << recipe.status();
  EXPECT_EQ(recipe->name(), "nvfp4");
}

TEST(RecipeFromProto, DisabledRecipeDoesNotQuantize) {
  v1::RecipeSpec spec;
  spec.mutable_current();
  spec.set_enabled(false);
  auto recipe = RecipeFromProto(spec);
  ASSERT_TRUE(recipe.ok());
  EXPECT_FALSE(recipe->quantizes());
}

}  // namespace
}  // namespace recipes
}  // namespace teserve
