// The 16-bit compute copies of a session's weights (layers::Parameter::compute_copy)
// under every writer of the parameter values, on the CPU reference:
//   - the optimizer step (SGD, AdamW) writes each copy in the same pass as the update,
//     into a new buffer, equal to kernels::Convert of the updated master bit for bit
//     (for a whole weight and for the row views of a parameters_split weight; an owner
//     whose views are not all stepped keeps no copy);
//   - after each session writer (creation, Step, SetParameters of a whole weight and of a
//     split view, RestoreState), the forward equals a stack that converts the same
//     master weights per forward, bit for bit (and a stale copy, which the CPU forward
//     would report, never shows up);
//   - SessionSummary.state_bytes counts the copies.
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/init.h"
#include "layers/layernorm_linear.h"
#include "layers/linear.h"
#include "layers/spec.h"
#include "recipes/recipe.h"
#include "train/optimizer.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

const Context kCpu = Context::Cpu();

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, std, t.mutable_floats());
  return t;
}

Tensor As(const Tensor& t, DType dtype) { return kernels::Convert(kCpu, t, dtype).value(); }

v1::OptimizerSpec Sgd() {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.1f);
  spec.mutable_sgd()->set_momentum(0.9f);
  return spec;
}

v1::OptimizerSpec AdamW() {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(0.01f);
  return spec;
}

// --- the optimizer ----------------------------------------------------------------------

class OptimizerCopies : public testing::TestWithParam<std::tuple<std::string, DType>> {};

v1::OptimizerSpec SpecNamed(const std::string& name) { return name == "sgd" ? Sgd() : AdamW(); }

TEST_P(OptimizerCopies, TheStepWritesTheCopyInANewBuffer) {
  const auto& [optimizer_name, dtype] = GetParam();
  layers::LinearOptions o;
  o.in_features = 40;
  o.out_features = 24;
  o.params_dtype = dtype;
  auto linear = layers::Linear::Create("fc", o, recipes::Recipe()).value();
  std::vector<layers::Parameter*> params = linear->Parameters();
  layers::Parameter& w = *params[0];
  ASSERT_TRUE(layers::RefreshComputeCopy(kCpu, w).ok());
  const Tensor before = w.compute_copy;  // as a pending forward holds it
  const Tensor before_bits = before.Clone().value();
  auto optimizer = OptimizerFromProto(SpecNamed(optimizer_name)).value();
  for (int64_t step = 1; step <= 3; ++step) {
    for (layers::Parameter* p : params) layers::FillNormal(10 + step, 0.5f, p->grad.mutable_floats());
    ASSERT_TRUE(optimizer->Apply(kCpu, params, step).ok());
    ASSERT_TRUE(w.compute_copy_valid) << step;
    EXPECT_TRUE(BitwiseEqual(w.compute_copy, As(w.value, dtype))) << step;
    EXPECT_FALSE(params[1]->compute_copy.defined());  // the FP32 bias has none
  }
  EXPECT_NE(w.compute_copy.raw_data(), before.raw_data());
  EXPECT_TRUE(BitwiseEqual(before, before_bits));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerCopies,
                         testing::Combine(testing::Values("sgd", "adamw"),
                                          testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) + "_" + std::string(DTypeName(std::get<1>(info.param)));
                         });

std::unique_ptr<layers::LayerNormLinear> SplitQkv() {
  layers::LayerNormLinearOptions o;
  o.in_features = 32;
  o.out_features = 48;
  o.params_dtype = DType::kBFloat16;
  o.parameters_split = {{"query", 16}, {"key", 16}, {"value", 16}};
  return layers::LayerNormLinear::Create("qkv", o, recipes::Recipe()).value();
}

TEST(OptimizerCopiesSplit, TheViewsWriteTheirRowsOfTheOwnersCopy) {
  auto qkv = SplitQkv();
  std::vector<layers::Parameter*> params = qkv->Parameters();
  for (layers::Parameter* p : params) layers::FillNormal(p->name.size(), 0.5f, p->grad.mutable_floats());
  layers::Parameter* owner = nullptr;
  for (layers::Parameter* p : params) {
    if (p->view_of != nullptr && p->value.rank() == 2) owner = p->view_of;
  }
  ASSERT_NE(owner, nullptr);
  EXPECT_FALSE(owner->compute_copy_valid);  // stale until a writer builds it
  auto optimizer = OptimizerFromProto(AdamW()).value();
  ASSERT_TRUE(optimizer->Apply(kCpu, params, 1).ok());
  ASSERT_TRUE(owner->compute_copy_valid);
  EXPECT_TRUE(BitwiseEqual(owner->compute_copy, As(owner->value, DType::kBFloat16)));
}

TEST(OptimizerCopiesSplit, AnOwnerNotWhollySteppedKeepsNoCopy) {
  auto qkv = SplitQkv();
  std::vector<layers::Parameter*> params;
  layers::Parameter* owner = nullptr;
  for (layers::Parameter* p : qkv->Parameters()) {
    if (p->name == "qkv.query_weight") {
      params.push_back(p);
      owner = p->view_of;
    }
  }
  ASSERT_NE(owner, nullptr);
  ASSERT_TRUE(layers::RefreshComputeCopy(kCpu, *owner).ok());
  auto optimizer = OptimizerFromProto(Sgd()).value();
  ASSERT_TRUE(optimizer->Apply(kCpu, params, 1).ok());
  EXPECT_FALSE(owner->compute_copy_valid);
  EXPECT_FALSE(owner->compute_copy.defined());
}

// --- the session's writers ----------------------------------------------------------------

constexpr int64_t kTokens = 8, kHidden = 32;

// A 16-bit LayerNormLinear with a parameters_split (row views) and a 16-bit Linear.
v1::ModelSpec Model(v1::DType dtype, uint64_t seed = 3) {
  v1::ModelSpec spec;
  spec.set_seed(seed);
  v1::LayerSpec* qkv = spec.add_layers();
  qkv->set_name("qkv");
  qkv->set_params_dtype(dtype);
  auto* lnl = qkv->mutable_layer_norm_linear();
  lnl->set_in_features(kHidden);
  lnl->set_out_features(3 * kHidden);
  for (const char* name : {"query", "key", "value"}) {
    auto* split = lnl->add_parameters_split();
    split->set_name(name);
    split->set_size(kHidden);
  }
  v1::LayerSpec* fc = spec.add_layers();
  fc->set_name("fc");
  fc->set_params_dtype(dtype);
  fc->mutable_linear()->set_in_features(3 * kHidden);
  fc->mutable_linear()->set_out_features(kHidden);
  return spec;
}

// The session's output for x against a stack of the same model holding the session's
// parameters with no compute copies (each forward converts its masters).
void ExpectForwardMatchesConverting(Session& session, const Tensor& x, const std::string& where) {
  auto got = session.Forward({x}, /*save_for_backward=*/false);
  ASSERT_TRUE(got.ok()) << where << ": " << got.status();
  auto stack = layers::BuildStack(session.model_spec(), recipes::Recipe()).value();
  const std::vector<NamedTensor> params = session.GetParameters({}).value();
  for (layers::Parameter* p : stack->Parameters()) {
    for (const NamedTensor& named : params) {
      if (named.name != p->name) continue;
      std::copy(named.tensor.floats().begin(), named.tensor.floats().end(), p->value.mutable_floats().begin());
    }
    ASSERT_FALSE(layers::OwnerOf(*p).compute_copy_valid) << where;
  }
  auto want = stack->Forward(kCpu, {x}, layers::ForwardOptions());
  ASSERT_TRUE(want.ok()) << where << ": " << want.status();
  ASSERT_EQ(got->outputs.size(), 1u);
  EXPECT_TRUE(BitwiseEqual(As(got->outputs[0], DType::kFloat32), As(want->outputs[0], DType::kFloat32))) << where;
}

class SessionCopies : public testing::TestWithParam<std::tuple<std::string, v1::DType>> {};

TEST_P(SessionCopies, EveryWriterLeavesTheForwardExact) {
  const auto& [optimizer_name, dtype] = GetParam();
  auto session = Session::Create(Model(dtype), v1::RecipeSpec(), SpecNamed(optimizer_name), kCpu);
  ASSERT_TRUE(session.ok()) << session.status();
  Session& s = **session;
  const Tensor x = Random({kTokens, kHidden}, 1);
  ExpectForwardMatchesConverting(s, x, "created");

  for (int step = 0; step < 2; ++step) {
    auto fb = s.ForwardBackward({Random({kTokens, kHidden}, 10 + step)}, layers::SideInputs(), LossOptions(),
                                Random({kTokens, kHidden}, 20 + step), false, false);
    ASSERT_TRUE(fb.ok()) << fb.status();
    ASSERT_TRUE(s.Step(/*zero_grad=*/true).ok());
    ExpectForwardMatchesConverting(s, x, "after step " + std::to_string(step));
  }

  ASSERT_TRUE(s.SetParameters({{"qkv.key_weight", Random({kHidden, kHidden}, 30, 0.1f)},
                               {"fc.weight", Random({kHidden, 3 * kHidden}, 31, 0.1f)}})
                  .ok());
  ExpectForwardMatchesConverting(s, x, "after SetParameters");

  auto other = Session::Create(Model(dtype, /*seed=*/9), v1::RecipeSpec(), SpecNamed(optimizer_name), kCpu);
  ASSERT_TRUE(other.ok()) << other.status();
  auto fb = (*other)->ForwardBackward({x}, layers::SideInputs(), LossOptions(), Random({kTokens, kHidden}, 40),
                                      false, false);
  ASSERT_TRUE(fb.ok()) << fb.status();
  ASSERT_TRUE((*other)->Step().ok());
  auto state = (*other)->CaptureState();
  ASSERT_TRUE(state.ok()) << state.status();
  ASSERT_TRUE(s.RestoreState(*state).ok());
  ExpectForwardMatchesConverting(s, x, "after RestoreState");
  auto mine = s.Forward({x}, false);
  auto theirs = (*other)->Forward({x}, false);
  ASSERT_TRUE(mine.ok() && theirs.ok());
  EXPECT_TRUE(BitwiseEqual(mine->outputs[0], theirs->outputs[0]));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SessionCopies,
                         testing::Combine(testing::Values("sgd", "adamw"), testing::Values(v1::BFLOAT16, v1::FLOAT16)),
                         [](const testing::TestParamInfo<std::tuple<std::string, v1::DType>>& info) {
                           return std::get<0>(info.param) + "_" + v1::DType_Name(std::get<1>(info.param));
                         });

TEST(SessionCopiesBytes, StateBytesCountTheCopies) {
  auto bf16 = Session::Create(Model(v1::BFLOAT16), v1::RecipeSpec(), Sgd(), kCpu).value();
  auto fp32 = Session::Create(Model(v1::FLOAT32), v1::RecipeSpec(), Sgd(), kCpu).value();
  const int64_t weights = 3 * kHidden * kHidden + kHidden * 3 * kHidden;  // 2 bytes each in BF16
  EXPECT_EQ(bf16->Summary().state_bytes, fp32->Summary().state_bytes + 2 * weights);
}

}  // namespace
}  // namespace train
}  // namespace teserve
