#include "recipes/quantizer.h"

#include <vector>

#include "core/float_codec.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"

namespace teserve {
namespace recipes {
namespace {

Tensor Make(std::vector<float> values, Shape shape) { return Tensor::FromFloats(values, shape).value(); }

Recipe DelayedRecipe(int history_len) {
  Recipe r;
  DelayedScalingConfig c;
  c.amax_history_len = history_len;
  r.config = c;
  return r;
}

TEST(DelayedScalingQuantizer, UsesScaleFromPreviousRegions) {
  auto q = MakeQuantizer(DelayedRecipe(4), TensorRole::kInput).value();
  const Context ctx;
  const Tensor x = Make({1.0f, -2.0f, 0.5f, 4.0f}, {2, 2});

  // Step 1 quantizes with the initial scale 1.
  QuantizedTensor q1 = q->Quantize(ctx, x, true, false).value();
  EXPECT_EQ(q1.amax, 4.0f);
  EXPECT_EQ(q1.rowwise_scale_inv.floats()[0], 1.0f);
  EXPECT_EQ(q1.rowwise_data.data<uint8_t>()[3], FloatToE4M3(4.0f));
  q->EndRegion();

  // Step 2 uses 448 / 4 from step 1's amax.
  const Tensor x2 = Make({0.1f, 0.2f, 0.3f, 0.4f}, {2, 2});
  QuantizedTensor q2 = q->Quantize(ctx, x2, true, true).value();
  EXPECT_EQ(q2.rowwise_scale_inv.floats()[0], 1.0f / 112.0f);
  EXPECT_EQ(q2.rowwise_data.data<uint8_t>()[1], FloatToE4M3(0.2f * 112.0f));
  // Columnwise copy is the transpose.
  EXPECT_EQ(q2.columnwise_data.data<uint8_t>()[2], q2.rowwise_data.data<uint8_t>()[1]);
  q->EndRegion();

  const QuantizerSnapshot snap = q->Snapshot();
  EXPECT_EQ(snap.recipe, "delayed");
  EXPECT_EQ(snap.format, DType::kFloat8E4M3);
  EXPECT_EQ(snap.quantize_calls, 2);
  EXPECT_FLOAT_EQ(snap.amax, 0.4f);
  EXPECT_EQ(snap.scale, 112.0f);  // window max is still 4
  EXPECT_EQ(snap.amax_history, (std::vector<float>{0.0f, 0.0f, 4.0f, 0.4f}));
}

TEST(DelayedScalingQuantizer, GradientsUseE5M2UnderHybrid) {
  auto q = MakeQuantizer(DelayedRecipe(16), TensorRole::kGradOutput).value();
  const Tensor x = Make({60000.0f, 1.0f}, {1, 2});
  QuantizedTensor out = q->Quantize(Context(), x, true, false).value();
  EXPECT_EQ(out.format, DType::kFloat8E5M2);
  EXPECT_EQ(out.rowwise_data.data<uint8_t>()[0], 0x7B);  // saturated to 57344
}

TEST(CurrentScalingQuantizer, ScalesByItsOwnAmax) {
  Recipe r;
  CurrentScalingConfig c;
  c.power_2_scale = true;
  r.config = c;
  auto q = MakeQuantizer(r, TensorRole::kWeight).value();
  const Tensor x = Make({3.0f, -1.0f}, {1, 2});
  QuantizedTensor out = q->Quantize(Context(), x, true, false).value();
  EXPECT_EQ(out.rowwise_scale_inv.floats()[0], 1.0f / 128.0f);
  EXPECT_EQ(out.rowwise_data.data<uint8_t>()[0], FloatToE4M3(384.0f));
  EXPECT_EQ(q->Snapshot().scale, 128.0f);
}

TEST(MakeQuantizer, ReturnsNullWithoutARecipe) {
  EXPECT_EQ(MakeQuantizer(Recipe(), TensorRole::kInput).value(), nullptr);
  Recipe disabled = DelayedRecipe(4);
  disabled.enabled = false;
  EXPECT_EQ(MakeQuantizer(disabled, TensorRole::kInput).value(), nullptr);
}

}  // namespace
}  // namespace recipes
}  // namespace teserve
