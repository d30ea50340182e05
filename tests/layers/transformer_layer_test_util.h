// Helpers shared by transformer_layer_test.cc and transformer_layer_recipes_test.cc:
// parameter copies, one forward + backward with zeroed gradients, non-saving forwards.
#ifndef TESERVE_TESTS_LAYERS_TRANSFORMER_LAYER_TEST_UTIL_H_
#define TESERVE_TESTS_LAYERS_TRANSFORMER_LAYER_TEST_UTIL_H_

#include <algorithm>

#include "core/context.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "layers/module.h"
#include "tests/layers/layer_test_util.h"

namespace teserve {
namespace layers {
namespace testing_tl {

// Copies every parameter of `to` from the parameter of the same name in `from`.
inline void CopyParameters(Module& from, Module& to) {
  for (Parameter* p : to.Parameters()) {
    const Parameter* source = testing_util::FindParameter(from, p->name);
    if (source == nullptr) continue;
    ASSERT_EQ(source->value.shape(), p->value.shape()) << p->name;
    std::copy_n(source->value.floats().begin(), p->value.numel(), p->value.mutable_floats().begin());
  }
}

inline void ZeroGrads(Module& m) {
  for (Parameter* p : m.Parameters()) {
    for (float& g : p->grad.mutable_floats()) g = 0.0f;
  }
}

struct RunResult {
  Tensor out, dx, denc;
};

// One forward (saving) and backward with grad_output dy; parameter gradients are zeroed first.
inline RunResult RunForwardBackward(Module& m, const Tensor& x, const SideInputs& side, const Tensor& dy,
                                    const Context& ctx = Context()) {
  ZeroGrads(m);
  ForwardOptions options;
  options.side = &side;
  RunResult r;
  auto fwd = m.Forward(ctx, {x}, options);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return r;
  r.out = fwd->outputs[0];
  SideGrads side_grads;
  auto dx = m.Backward(ctx, *fwd->saved, {dy}, &side_grads);
  EXPECT_TRUE(dx.ok()) << dx.status();
  if (dx.ok()) r.dx = (*dx)[0];
  r.denc = side_grads.encoder_output;
  return r;
}

inline ForwardOptions NoSave() {
  ForwardOptions o;
  o.save_for_backward = false;
  return o;
}

}  // namespace testing_tl
}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_TRANSFORMER_LAYER_TEST_UTIL_H_
