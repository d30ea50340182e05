// Finite-difference gradient checks for modules that read side inputs (attention layers):
// the gradient of hidden_states (inputs[0]), of the side input encoder_output (returned
// through SideGrads) and of every parameter, with the loss and central differences of
// tests/layers/grad_check.h.
#ifndef TESERVE_TESTS_LAYERS_SIDE_GRAD_CHECK_H_
#define TESERVE_TESTS_LAYERS_SIDE_GRAD_CHECK_H_

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/module.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace testing_util {

// One input with its side inputs. `encoder_output`, when defined, is the tensor stored
// under "encoder_output" in `side` (the same buffer), so perturbing it perturbs the
// side input.
struct SideProblem {
  Tensor x;
  Tensor encoder_output;
  layers::SideInputs side;

  void SetEncoderOutput(Tensor value) {
    encoder_output = value;
    side.Set("encoder_output", std::move(value));
  }
};

inline double SideLoss(layers::Module& module, const SideProblem& p, const std::vector<Tensor>& weights) {
  layers::ForwardOptions no_save;
  no_save.save_for_backward = false;
  no_save.side = &p.side;
  auto out = module.Forward(Context(), {p.x}, no_save);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? WeightedSum(out->outputs, weights) : 0.0;
}

// Checks ValidateSide and OutputShapes, then compares analytic and numerical gradients
// of p.x, p.encoder_output (when defined) and every parameter.
inline void CheckGradientsWithSide(layers::Module& module, SideProblem& p,
                                   const GradCheckOptions& options = GradCheckOptions()) {
  for (layers::Parameter* param : module.Parameters()) {
    for (float& g : param->grad.mutable_floats()) g = 0.0f;
  }
  const absl::Status side_status = module.ValidateSide(p.side, {p.x.shape()});
  ASSERT_TRUE(side_status.ok()) << side_status;
  auto shapes = module.OutputShapes({p.x.shape()}, "inputs");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  layers::ForwardOptions save;
  save.side = &p.side;
  auto forward = module.Forward(Context(), {p.x}, save);
  ASSERT_TRUE(forward.ok()) << forward.status();
  ASSERT_EQ(forward->outputs.size(), shapes->size());
  std::vector<Tensor> weights;
  for (size_t i = 0; i < forward->outputs.size(); ++i) {
    EXPECT_EQ(forward->outputs[i].shape(), (*shapes)[i]) << "output " << i;
    weights.push_back(RandomTensor(forward->outputs[i].shape(), 1000 + i));
  }
  layers::SideGrads side_grads;
  auto grads = module.Backward(Context(), *forward->saved, weights, &side_grads);
  ASSERT_TRUE(grads.ok()) << grads.status();
  ASSERT_EQ(grads->size(), 1u);
  ASSERT_EQ((*grads)[0].shape(), p.x.shape());
  ASSERT_EQ(side_grads.encoder_output.defined(), p.encoder_output.defined());

  auto loss = [&] { return SideLoss(module, p, weights); };
  ExpectCentralDifferences(p.x.mutable_floats(), (*grads)[0].floats(), "hidden_states", options, loss);
  if (p.encoder_output.defined()) {
    ASSERT_EQ(side_grads.encoder_output.shape(), p.encoder_output.shape());
    ExpectCentralDifferences(p.encoder_output.mutable_floats(), side_grads.encoder_output.floats(), "encoder_output",
                             options, loss);
  }
  for (layers::Parameter* param : module.Parameters()) {
    ExpectCentralDifferences(param->value.mutable_floats(), param->grad.floats(), param->name, options, loss);
  }
}

}  // namespace testing_util
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_SIDE_GRAD_CHECK_H_
