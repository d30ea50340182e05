#include "train/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace teserve {
namespace train {
namespace {

layers::Parameter MakeParam(std::vector<float> value, std::vector<float> grad) {
  layers::Parameter p;
  p.name = "p";
  p.value = Tensor::FromFloats(value, {static_cast<int64_t>(value.size())}).value();
  p.grad = Tensor::FromFloats(grad, {static_cast<int64_t>(grad.size())}).value();
  return p;
}

// Runs `steps` updates with gradients g_t = t * base_grad and compares with `reference`,
// a scalar model of the update in double.
void RunAndCompare(const v1::OptimizerSpec& spec, int steps,
                   const std::function<double(double p, double g, int t)>& reference) {
  auto optimizer = OptimizerFromProto(spec).value();
  const std::vector<float> p0 = {1.0f, -0.5f, 0.25f};
  const std::vector<float> g0 = {0.1f, 0.2f, -0.3f};
  layers::Parameter p = MakeParam(p0, g0);
  std::vector<double> expected(p0.begin(), p0.end());
  for (int t = 1; t <= steps; ++t) {
    for (size_t i = 0; i < g0.size(); ++i) p.grad.mutable_floats()[i] = g0[i] * t;
    ASSERT_TRUE(optimizer->Apply(Context::Cpu(), {&p}, t).ok());
    for (size_t i = 0; i < g0.size(); ++i) expected[i] = reference(expected[i], double(g0[i]) * t, t);
  }
  // `reference` keeps per-element state by element order, see callers.
  for (size_t i = 0; i < g0.size(); ++i) EXPECT_NEAR(p.value.floats()[i], expected[i], 1e-5) << i;
}

TEST(Sgd, PlainStepIsLrTimesGrad) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.1f);
  RunAndCompare(spec, 3, [](double p, double g, int) { return p - 0.1 * g; });
}

TEST(Sgd, MomentumAndNesterovFollowPyTorch) {
  for (bool nesterov : {false, true}) {
    v1::OptimizerSpec spec;
    spec.mutable_sgd()->set_lr(0.05f);
    spec.mutable_sgd()->set_momentum(0.9f);
    spec.mutable_sgd()->set_nesterov(nesterov);
    spec.mutable_sgd()->set_weight_decay(0.01f);
    std::vector<double> buf(3, 0.0);
    int index = 0;
    RunAndCompare(spec, 4, [&](double p, double g, int t) {
      const int i = index++ % 3;
      g += 0.01 * p;
      buf[i] = t == 1 ? g : 0.9 * buf[i] + g;
      const double d = nesterov ? g + 0.9 * buf[i] : buf[i];
      return p - 0.05 * d;
    });
  }
}

TEST(AdamW, FollowsDecoupledWeightDecayUpdate) {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  spec.mutable_adamw()->set_weight_decay(0.1f);
  std::vector<double> m(3, 0.0), v(3, 0.0);
  int index = 0;
  RunAndCompare(spec, 5, [&](double p, double g, int t) {
    const int i = index++ % 3;
    p *= 1.0 - 0.01 * 0.1;
    m[i] = 0.9 * m[i] + 0.1 * g;
    v[i] = 0.999 * v[i] + 0.001 * g * g;
    const double mhat = m[i] / (1.0 - std::pow(0.9, t));
    const double vhat = v[i] / (1.0 - std::pow(0.999, t));
    return p - 0.01 * mhat / (std::sqrt(vhat) + 1e-8);
  });
}

TEST(OptimizerFromProto, RejectsBadHyperparametersNamingTheField) {
  struct Case {
    std::function<void(v1::OptimizerSpec*)> mutate;
    std::string message;
  };
  const std::vector<Case> cases = {
      {[](v1::OptimizerSpec*) {}, "optimizer: expected one of sgd, adamw, got none set"},
      {[](v1::OptimizerSpec* s) { s->mutable_sgd()->set_lr(0); }, "optimizer.sgd.lr: expected a finite value > 0, got 0"},
      {[](v1::OptimizerSpec* s) { s->mutable_adamw()->set_lr(-1); }, "optimizer.adamw.lr"},
      {[](v1::OptimizerSpec* s) {
         s->mutable_adamw()->set_lr(1);
         s->mutable_adamw()->set_beta1(1.0f);
       },
       "optimizer.adamw.beta1: expected a value in [0, 1), got 1"},
      {[](v1::OptimizerSpec* s) {
         s->mutable_sgd()->set_lr(1);
         s->mutable_sgd()->set_nesterov(true);
       },
       "optimizer.sgd.nesterov: expected momentum > 0 and dampening 0"},
      {[](v1::OptimizerSpec* s) {
         s->mutable_sgd()->set_lr(1);
         s->set_max_grad_norm(-1);
       },
       "optimizer.max_grad_norm"},
  };
  for (const Case& c : cases) {
    v1::OptimizerSpec spec;
    c.mutate(&spec);
    auto opt = OptimizerFromProto(spec);
    EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(std::string(opt.status().message()), testing::HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace train
}  // namespace teserve
