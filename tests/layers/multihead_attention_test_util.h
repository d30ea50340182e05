// Helpers shared by multihead_attention_test.cc and multihead_attention_options_test.cc:
// the base options of the small test layer, option setters and one forward + backward.
#ifndef TESERVE_TESTS_LAYERS_MULTIHEAD_ATTENTION_TEST_UTIL_H_
#define TESERVE_TESTS_LAYERS_MULTIHEAD_ATTENTION_TEST_UTIL_H_

#include <functional>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "layers/module.h"
#include "layers/multihead_attention.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace layers {
namespace testing_mha {

// hidden 32, 4 heads of 8, 2 GQA groups; no dropout so the layer is deterministic.
inline MultiheadAttentionOptions BaseOptions() {
  MultiheadAttentionOptions o;
  o.hidden_size = 32;
  o.num_attention_heads = 4;
  o.num_gqa_groups = 2;
  o.attention_dropout = 0.0f;
  o.init_std = 0.15f;
  o.output_layer_init_std = 0.15f;
  o.seed = 5;
  return o;
}

inline auto Set(std::function<void(MultiheadAttentionOptions*)> f) { return f; }

inline void Rope(MultiheadAttentionOptions* o, bool interleaved, double percent = 1.0) {
  o->rotary = RotaryEmbeddingOptions{};
  o->rotary->rotary_percent = percent;
  o->rotary_pos_interleaved = interleaved;
}

struct RunResult {
  std::vector<Tensor> outputs;
  Tensor dx, denc;
};

inline RunResult RunForwardBackward(MultiheadAttention& m, const Tensor& x, const Tensor* encoder_output) {
  for (Parameter* p : m.Parameters()) {
    for (float& g : p->grad.mutable_floats()) g = 0.0f;
  }
  SideInputs side;
  if (encoder_output != nullptr) side.Set("encoder_output", *encoder_output);
  ForwardOptions options;
  options.side = &side;
  RunResult r;
  auto fwd = m.Forward(Context(), {x}, options);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return r;
  r.outputs = fwd->outputs;
  std::vector<Tensor> dy;
  for (size_t i = 0; i < r.outputs.size(); ++i) dy.push_back(testing_util::RandomTensor(r.outputs[i].shape(), 77 + i));
  SideGrads side_grads;
  auto dx = m.Backward(Context(), *fwd->saved, dy, &side_grads);
  EXPECT_TRUE(dx.ok()) << dx.status();
  if (dx.ok()) r.dx = (*dx)[0];
  r.denc = side_grads.encoder_output;
  return r;
}

}  // namespace testing_mha
}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_MULTIHEAD_ATTENTION_TEST_UTIL_H_
