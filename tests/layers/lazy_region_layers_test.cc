// The lazy region end of delayed scaling (recipes/quantizer.h) through the layers, on the
// CPU: a module whose quantizers hand their amaxes over as a device does and end their
// regions lazily must compute what an eager copy of it computes, bit for bit: outputs,
// gradients and quantizer state. Two microbatches are in flight (forward, forward,
// backward, backward, each followed by the session's region end), and LayerNormMLP's
// checkpoint records the fprop scale mid-region (Quantizer::ScaleInUse).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "layers/layernorm_mlp.h"
#include "layers/linear.h"
#include "recipes/quantizer.h"
#include "recipes/recipe.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"

namespace teserve {
namespace {

using layers::ForwardOptions;
using layers::ForwardOutput;
using layers::Module;
using testing_util::EndRegion;
using testing_util::RandomTensor;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

recipes::Recipe Delayed() {
  recipes::DelayedScalingConfig c;
  c.amax_history_len = 3;
  recipes::Recipe r;
  r.config = c;
  return r;
}

void MakeLazy(Module& m, bool lazy) {
  for (const layers::NamedQuantizer& q : m.Quantizers()) {
    q.quantizer->set_defer_host_amax_for_testing(true);
    q.quantizer->set_lazy_region_end(lazy);
  }
}

bool AnyPending(Module& m) {
  for (const layers::NamedQuantizer& q : m.Quantizers()) {
    if (q.quantizer->region_pending()) return true;
  }
  return false;
}

void ExpectSameState(Module& a, Module& b, const std::string& where) {
  const std::vector<layers::NamedQuantizer> qa = a.Quantizers(), qb = b.Quantizers();
  ASSERT_EQ(qa.size(), qb.size());
  for (size_t i = 0; i < qa.size(); ++i) {
    const recipes::QuantizerSnapshot sa = qa[i].quantizer->Snapshot(), sb = qb[i].quantizer->Snapshot();
    const std::string what = absl::StrCat(where, " ", qa[i].layer, " ", recipes::TensorRoleName(qa[i].quantizer->role()));
    EXPECT_EQ(Bits(sa.amax), Bits(sb.amax)) << what;
    EXPECT_EQ(Bits(sa.scale), Bits(sb.scale)) << what;
    EXPECT_EQ(sa.quantize_calls, sb.quantize_calls) << what;
    ASSERT_EQ(sa.amax_history.size(), sb.amax_history.size()) << what;
    for (size_t k = 0; k < sa.amax_history.size(); ++k) {
      EXPECT_EQ(Bits(sa.amax_history[k]), Bits(sb.amax_history[k])) << what << " slot " << k;
    }
  }
}

// Steps of two microbatches on `eager` and `lazy` (modules built alike, inputs of
// `shape`, outputs of out_features), comparing as it goes.
void RunSteps(Module& eager, Module& lazy, const Shape& shape, int64_t out_features) {
  MakeLazy(eager, false);
  MakeLazy(lazy, true);
  for (int step = 0; step < 4; ++step) {
    std::vector<ForwardOutput> a, b;
    for (int micro = 0; micro < 2; ++micro) {
      const std::string where = absl::StrCat("step ", step, " forward ", micro);
      // Magnitudes change between steps, so every scale moves.
      const Tensor x = RandomTensor(shape, 100 * step + micro, 1.0f + 3.0f * ((step + micro) % 3));
      a.push_back(eager.Forward(Context(), {x}, ForwardOptions()).value());
      EndRegion(eager, true);
      b.push_back(lazy.Forward(Context(), {x}, ForwardOptions()).value());
      EndRegion(lazy, true);
      EXPECT_TRUE(AnyPending(lazy)) << where;
      ASSERT_EQ(a.back().outputs.size(), b.back().outputs.size());
      for (size_t k = 0; k < a.back().outputs.size(); ++k) {
        EXPECT_TRUE(BitwiseEqual(a.back().outputs[k], b.back().outputs[k])) << where << " output " << k;
      }
    }
    for (int micro = 0; micro < 2; ++micro) {
      const std::string where = absl::StrCat("step ", step, " backward ", micro);
      Shape dy_shape = shape;
      dy_shape.back() = out_features;
      const Tensor dy = RandomTensor(dy_shape, 50 + 100 * step + micro, 0.01f * (1 + step));
      auto da = eager.Backward(Context(), *a[micro].saved, {dy}).value();
      EndRegion(eager, false);
      auto db = lazy.Backward(Context(), *b[micro].saved, {dy}).value();
      EndRegion(lazy, false);
      EXPECT_TRUE(BitwiseEqual(da[0], db[0])) << where;
    }
    std::vector<layers::Parameter*> pa = eager.Parameters(), pb = lazy.Parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(pa[i]->grad, pb[i]->grad)) << pa[i]->name << " step " << step;
    }
    if (step % 2 == 1) ExpectSameState(eager, lazy, absl::StrCat("step ", step));
  }
  ExpectSameState(eager, lazy, "end");
}

TEST(LazyRegionEndLayers, LinearMatchesEager) {
  layers::LinearOptions o;
  o.in_features = 32;
  o.out_features = 16;
  o.bias = true;  // the bias gradient is fused into dy's quantization
  o.init_std = 0.3f;
  auto eager = layers::Linear::Create("fc", o, Delayed()).value();
  auto lazy = layers::Linear::Create("fc", o, Delayed()).value();
  RunSteps(*eager, *lazy, {2, 8, 32}, 16);
}

TEST(LazyRegionEndLayers, LayerNormMlpMatchesEager) {
  for (bool checkpoint : {false, true}) {
    SCOPED_TRACE(checkpoint ? "checkpoint" : "saved activations");
    layers::LayerNormMLPOptions o;
    o.hidden_size = 32;
    o.ffn_hidden_size = 64;
    o.init_std = 0.5f;
    o.seed = 3;
    o.checkpoint = checkpoint;
    auto eager = layers::LayerNormMLP::Create("mlp", o, Delayed()).value();
    auto lazy = layers::LayerNormMLP::Create("mlp", o, Delayed()).value();
    RunSteps(*eager, *lazy, {2, 8, 32}, 32);
  }
}

}  // namespace
}  // namespace teserve
