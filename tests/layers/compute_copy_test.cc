// A Linear's compute copy (Parameter::compute_copy: the 16-bit params_dtype weight the
// GEMMs read, kept by the writers of the value) and its fresh wgrad (GEMM beta 0 onto a
// gradient marked zero), on the CPU reference:
//   - the copy equals kernels::Convert(value) bit for bit, and the forward reads it
//     (a copy that no longer matches its value is caught on the CPU, naming the
//     parameter) with results identical to converting per forward;
//   - the copy is stale by default, rebuilt by RefreshComputeCopy / PlaceParameters,
//     and a direct write of the value must invalidate it;
//   - wgrad written fresh equals wgrad accumulated onto zeros bit for bit, under every
//     recipe, and a second backward still accumulates.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "kernels/timing.h"
#include "layers/init.h"
#include "layers/layernorm_linear.h"
#include "layers/linear.h"
#include "layers/module.h"
#include "recipes/recipe.h"
#include "tests/layers/layer_test_util.h"
#include "tests/recipe_specs.h"

namespace teserve {
namespace layers {
namespace {

using testing::HasSubstr;

const Context kCpu = Context::Cpu();

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  FillNormal(seed, std, t.mutable_floats());
  return t;
}

Tensor As(const Tensor& t, DType dtype) { return kernels::Convert(kCpu, t, dtype).value(); }

recipes::Recipe RecipeOf(const std::string& name) {
  return recipes::RecipeFromProto(testing_util::RecipeSpecNamed(name)).value();
}

std::unique_ptr<Linear> MakeLinear(DType params_dtype, const std::string& recipe = "none", uint64_t seed = 5) {
  LinearOptions o;
  o.in_features = 64;
  o.out_features = 32;
  o.params_dtype = params_dtype;
  o.seed = seed;
  o.init_std = 0.1f;
  return Linear::Create("fc", o, RecipeOf(recipe)).value();
}

Parameter& Weight(Linear& linear) { return *linear.Parameters()[0]; }

class ComputeCopy : public testing::TestWithParam<DType> {};

TEST_P(ComputeCopy, IsStaleUntilRefreshedAndThenEqualsConvert) {
  auto linear = MakeLinear(GetParam());
  Parameter& w = Weight(*linear);
  EXPECT_EQ(w.compute_dtype, GetParam());
  EXPECT_FALSE(w.compute_copy_valid);
  ASSERT_TRUE(RefreshComputeCopy(kCpu, w).ok());
  ASSERT_TRUE(w.compute_copy_valid);
  EXPECT_TRUE(BitwiseEqual(w.compute_copy, As(w.value, GetParam())));
  // The forward's result is the same with the copy as with a per-forward conversion.
  const Tensor x = Random({8, 64}, 1);
  auto with_copy = linear->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(with_copy.ok()) << with_copy.status();
  InvalidateComputeCopy(w);
  auto converted = linear->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(converted.ok()) << converted.status();
  EXPECT_TRUE(BitwiseEqual(with_copy->outputs[0], converted->outputs[0]));
}

TEST_P(ComputeCopy, TheForwardReadsTheCopyAndCatchesAStaleOne) {
  auto linear = MakeLinear(GetParam());
  Parameter& w = Weight(*linear);
  ASSERT_TRUE(RefreshComputeCopy(kCpu, w).ok());
  const Tensor x = Random({8, 64}, 2);
  // A value written behind the copy's back: the forward, which would read the copy,
  // refuses on the CPU and names the parameter.
  w.value.mutable_floats()[3] += 0.5f;
  auto stale = linear->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_FALSE(stale.ok());
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(stale.status().message(), HasSubstr("'fc.weight'"));
  // Invalidated, the forward converts the new value; refreshed, it reads the copy again,
  // with the same result.
  InvalidateComputeCopy(w);
  auto converted = linear->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(converted.ok()) << converted.status();
  ASSERT_TRUE(RefreshComputeCopy(kCpu, w).ok());
  auto with_copy = linear->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(with_copy.ok()) << with_copy.status();
  EXPECT_TRUE(BitwiseEqual(converted->outputs[0], with_copy->outputs[0]));
}

TEST_P(ComputeCopy, ARefreshGivesANewBufferSoASavedForwardKeepsItsWeight) {
  auto linear = MakeLinear(GetParam());
  Parameter& w = Weight(*linear);
  ASSERT_TRUE(RefreshComputeCopy(kCpu, w).ok());
  const Tensor old_copy = w.compute_copy;
  const Tensor old_bits = old_copy.Clone().value();
  w.value.mutable_floats()[0] = 7.0f;
  ASSERT_TRUE(RefreshComputeCopy(kCpu, w).ok());
  EXPECT_NE(w.compute_copy.raw_data(), old_copy.raw_data());
  EXPECT_TRUE(BitwiseEqual(old_copy, old_bits));
  EXPECT_TRUE(BitwiseEqual(w.compute_copy, As(w.value, GetParam())));
}

TEST_P(ComputeCopy, PlaceParametersBuildsIt) {
  auto linear = MakeLinear(GetParam());
  ASSERT_TRUE(PlaceParameters(kCpu, linear->Parameters()).ok());
  Parameter& w = Weight(*linear);
  ASSERT_TRUE(w.compute_copy_valid);
  EXPECT_TRUE(BitwiseEqual(w.compute_copy, As(w.value, GetParam())));
  // The bias has no copy (FP32 compute dtype).
  EXPECT_FALSE(linear->Parameters()[1]->compute_copy.defined());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, ComputeCopy, testing::Values(DType::kBFloat16, DType::kFloat16),
                         [](const testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(ComputeCopyFp32, AnFp32LinearKeepsNone) {
  auto linear = MakeLinear(DType::kFloat32);
  ASSERT_TRUE(PlaceParameters(kCpu, linear->Parameters()).ok());
  ASSERT_TRUE(RefreshComputeCopy(kCpu, Weight(*linear)).ok());
  EXPECT_FALSE(Weight(*linear).compute_copy.defined());
  EXPECT_FALSE(Weight(*linear).compute_copy_valid);
}

// The copy of a parameters_split LayerNormLinear lives on the whole weight (the owner);
// its views' rows are rows of it.
TEST(ComputeCopySplit, TheOwnerHoldsTheCopy) {
  LayerNormLinearOptions o;
  o.in_features = 32;
  o.out_features = 48;
  o.params_dtype = DType::kBFloat16;
  o.parameters_split = {{"query", 16}, {"key", 16}, {"value", 16}};
  auto lnl = LayerNormLinear::Create("qkv", o, recipes::Recipe()).value();
  ASSERT_TRUE(PlaceParameters(kCpu, lnl->Parameters()).ok());
  Parameter* key = testing_util::FindParameter(*lnl, "qkv.key_weight");
  ASSERT_NE(key, nullptr);
  ASSERT_NE(key->view_of, nullptr);
  EXPECT_TRUE(key->view_of->compute_copy_valid);
  EXPECT_TRUE(BitwiseEqual(key->view_of->compute_copy, As(key->view_of->value, DType::kBFloat16)));
  InvalidateComputeCopy(*key);
  EXPECT_FALSE(key->view_of->compute_copy_valid);
}

// --- fresh wgrad ------------------------------------------------------------------------

// Two backwards of one Linear (different dy) from zero gradients, the first onto a
// gradient marked zero (beta 0) or not (accumulated onto the zeros): the weight and bias
// gradients after each are the same bits.
class FreshWgrad : public testing::TestWithParam<std::tuple<std::string, DType>> {};

TEST_P(FreshWgrad, EqualsAccumulatingOntoZerosAndTheSecondBackwardAccumulates) {
  const auto& [recipe, dtype] = GetParam();
  auto fresh = MakeLinear(dtype, recipe);
  auto accumulated = MakeLinear(dtype, recipe);
  EXPECT_TRUE(Weight(*fresh).grad_is_zero);  // created zero
  Weight(*accumulated).grad_is_zero = false;
  const Tensor x1 = Random({32, 64}, 11), x2 = Random({32, 64}, 12);
  const Tensor dy1 = Random({32, 32}, 13, 0.1f), dy2 = Random({32, 32}, 14, 0.1f);
  std::vector<Tensor> after_first;
  for (int pass = 0; pass < 2; ++pass) {
    const Tensor& x = pass == 0 ? x1 : x2;
    const Tensor& dy = pass == 0 ? dy1 : dy2;
    for (Linear* l : {fresh.get(), accumulated.get()}) {
      auto out = l->Forward(kCpu, {x}, ForwardOptions());
      ASSERT_TRUE(out.ok()) << out.status();
      testing_util::EndRegion(*l, true);
      auto dx = l->Backward(kCpu, *out->saved, {dy});
      ASSERT_TRUE(dx.ok()) << dx.status();
      testing_util::EndRegion(*l, false);
      EXPECT_FALSE(Weight(*l).grad_is_zero);
    }
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_TRUE(BitwiseEqual(fresh->Parameters()[i]->grad, accumulated->Parameters()[i]->grad))
          << "pass " << pass << " " << fresh->Parameters()[i]->name;
    }
    if (pass == 0) after_first.push_back(Weight(*fresh).grad.Clone().value());
  }
  // The second backward added to the first's gradient instead of overwriting it.
  EXPECT_FALSE(BitwiseEqual(Weight(*fresh).grad, after_first[0]));
}

// The same dy twice: the second backward adds the same product, so the gradient is
// exactly twice the first (p + p = 2p).
TEST(FreshWgradTwice, TheSecondBackwardDoublesTheGradient) {
  auto linear = MakeLinear(DType::kBFloat16);
  const Tensor x = Random({16, 64}, 21);
  const Tensor dy = Random({16, 32}, 22, 0.1f);
  Tensor first;
  for (int pass = 0; pass < 2; ++pass) {
    auto out = linear->Forward(kCpu, {x}, ForwardOptions());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(linear->Backward(kCpu, *out->saved, {dy}).ok());
    if (pass == 0) first = Weight(*linear).grad.Clone().value();
  }
  const absl::Span<const float> g = Weight(*linear).grad.floats();
  for (int64_t i = 0; i < first.numel(); ++i) ASSERT_EQ(g[i], 2.0f * first.floats()[i]) << i;
}

INSTANTIATE_TEST_SUITE_P(Recipes, FreshWgrad,
                         testing::Combine(testing::Values("none", "delayed", "current", "block", "mxfp8", "nvfp4"),
                                          testing::Values(DType::kFloat32, DType::kBFloat16)),
                         [](const testing::TestParamInfo<std::tuple<std::string, DType>>& info) {
                           return std::get<0>(info.param) + "_" + std::string(DTypeName(std::get<1>(info.param)));
                         });

TEST(ZeroGrads, MarksTheOwnersAndDefersTheFill) {
  LayerNormLinearOptions o;
  o.in_features = 32;
  o.out_features = 32;
  o.parameters_split = {{"a", 16}, {"b", 16}};
  auto lnl = LayerNormLinear::Create("lnl", o, recipes::Recipe()).value();
  auto out = lnl->Forward(kCpu, {Random({8, 32}, 31)}, ForwardOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_TRUE(lnl->Backward(kCpu, *out->saved, {Random({8, 32}, 32)}).ok());
  Parameter* a = testing_util::FindParameter(*lnl, "lnl.a_weight");
  ASSERT_NE(a, nullptr);
  EXPECT_FALSE(a->view_of->grad_is_zero);
  const std::vector<float> before(a->grad.floats().begin(), a->grad.floats().end());
  ASSERT_TRUE(ZeroGrads(kCpu, lnl->Parameters()).ok());
  for (Parameter* p : lnl->Parameters()) {
    EXPECT_TRUE(OwnerOf(*p).grad_is_zero) << p->name;
    EXPECT_TRUE(OwnerOf(*p).grad_fill_deferred) << p->name;
  }
  // Nothing was written yet: the memory still holds the backward's gradient.
  EXPECT_EQ(std::vector<float>(a->grad.floats().begin(), a->grad.floats().end()), before);
  ASSERT_TRUE(FillDeferredGrads(kCpu, lnl->Parameters()).ok());
  for (Parameter* p : lnl->Parameters()) {
    EXPECT_FALSE(OwnerOf(*p).grad_fill_deferred) << p->name;
    EXPECT_TRUE(OwnerOf(*p).grad_is_zero) << p->name;
    for (float g : p->grad.floats()) ASSERT_EQ(g, 0.0f) << p->name;
  }
}

// After a deferred ZeroGrads, a backward gives the gradients a backward onto zero-filled
// ones gives: Linear's wgrad overwrites its deferred weight gradient, the norm and bias
// gradients it adds into are filled first.
TEST(ZeroGrads, ABackwardAfterADeferredFillEqualsOneAfterAZeroFill) {
  LayerNormLinearOptions o;
  o.in_features = 32;
  o.out_features = 16;
  o.bias = true;
  auto deferred = LayerNormLinear::Create("lnl", o, recipes::Recipe()).value();
  auto filled = LayerNormLinear::Create("lnl", o, recipes::Recipe()).value();
  const Tensor x = Random({8, 32}, 51);
  const Tensor dy = Random({8, 16}, 52);
  for (auto* layer : {deferred.get(), filled.get()}) {  // gradients that are not zero
    auto out = layer->Forward(kCpu, {x}, ForwardOptions());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(layer->Backward(kCpu, *out->saved, {dy}).ok());
  }
  ASSERT_TRUE(ZeroGrads(kCpu, deferred->Parameters()).ok());
  for (Parameter* p : filled->Parameters()) {
    for (float& g : p->grad.mutable_floats()) g = 0.0f;
  }
  for (auto* layer : {deferred.get(), filled.get()}) {
    auto out = layer->Forward(kCpu, {Random({8, 32}, 53)}, ForwardOptions());
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_TRUE(layer->Backward(kCpu, *out->saved, {Random({8, 16}, 54)}).ok());
  }
  const std::vector<Parameter*> a = deferred->Parameters(), b = filled->Parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_FALSE(OwnerOf(*a[i]).grad_fill_deferred) << a[i]->name;
    const absl::Span<const float> ga = a[i]->grad.floats(), gb = b[i]->grad.floats();
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t j = 0; j < ga.size(); ++j) ASSERT_EQ(ga[j], gb[j]) << a[i]->name << " " << j;
  }
}

// Counts the calls of each kernel op a context runs (timing every call, recording none).
class CallCounter : public kernels::KernelTimingSink {
 public:
  CallCounter() : kernels::KernelTimingSink(1) {}
  void Record(kernels::KernelOp, const Device&, double) override {}
};

// A 16-bit weight is cast once per parameter update and scale: a forward that finds the
// same compute copy and the same delayed-scaling scale reuses the weight's cast (the same
// codes, counted and recorded as a quantization), and computes what a fresh cast gives.
TEST(WeightCast, OncePerUpdateAndScale) {
  auto linear = MakeLinear(DType::kBFloat16, "delayed");
  ASSERT_TRUE(RefreshComputeCopy(kCpu, Weight(*linear)).ok());  // as a session places it
  CallCounter counter;
  Context ctx = Context::Cpu();
  ctx.kernel_timing = &counter;
  const Tensor x = Random({8, 64}, 61);
  auto step = [&]() -> Tensor {
    auto out = linear->Forward(ctx, {x}, ForwardOptions());
    EXPECT_TRUE(out.ok()) << out.status();
    for (const NamedQuantizer& q : linear->Quantizers()) {
      if (recipes::IsForwardRole(q.quantizer->role())) q.quantizer->EndRegion();
    }
    return out.ok() ? out->outputs[0] : Tensor();
  };
  auto casts = [&] { return counter.calls(kernels::KernelOp::kQuantizePerTensor); };
  step();  // x and W, at the initial scale 1
  EXPECT_EQ(casts(), 2);
  const Tensor y2 = step();  // the first region's amaxes changed both scales: both cast
  EXPECT_EQ(casts(), 4);
  const Tensor y3 = step();  // the same amaxes again, so the same scales: W's cast reused
  EXPECT_EQ(casts(), 5);
  EXPECT_TRUE(BitwiseEqual(y2, y3));
  recipes::Quantizer* weight_quantizer = linear->Quantizers()[1].quantizer;
  ASSERT_EQ(weight_quantizer->role(), recipes::TensorRole::kWeight);
  EXPECT_EQ(weight_quantizer->ExportState().quantize_calls, 3);  // a reuse counts as a quantization

  // A new compute copy (what an optimizer step writes) is cast again.
  ASSERT_TRUE(RefreshComputeCopy(ctx, Weight(*linear)).ok());
  const Tensor y4 = step();
  EXPECT_EQ(casts(), 7);
  EXPECT_TRUE(BitwiseEqual(y3, y4));  // the same values in a new buffer
}

// Under current scaling the weight's cast depends on the weight alone (its scale is its
// own amax's): every forward on the same compute copy reuses it, whatever the input did.
TEST(WeightCast, CurrentScalingCastsAWeightOncePerUpdate) {
  auto linear = MakeLinear(DType::kBFloat16, "current");
  ASSERT_TRUE(RefreshComputeCopy(kCpu, Weight(*linear)).ok());
  CallCounter counter;
  Context ctx = Context::Cpu();
  ctx.kernel_timing = &counter;
  auto step = [&](uint32_t seed) -> Tensor {
    auto out = linear->Forward(ctx, {Random({8, 64}, seed)}, ForwardOptions());
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->outputs[0] : Tensor();
  };
  auto casts = [&] { return counter.calls(kernels::KernelOp::kQuantizePerTensor); };
  const Tensor y1 = step(71);
  EXPECT_EQ(casts(), 2);  // x and W
  step(72);
  EXPECT_EQ(casts(), 3);  // a new x; W's cast reused
  const Tensor y3 = step(71);
  EXPECT_EQ(casts(), 4);
  EXPECT_TRUE(BitwiseEqual(y1, y3));
  ASSERT_TRUE(RefreshComputeCopy(ctx, Weight(*linear)).ok());
  EXPECT_TRUE(BitwiseEqual(step(71), y1));  // a new buffer of the same values: cast again
  EXPECT_EQ(casts(), 6);
}

// A gradient marked zero that is not is caught on the CPU before the GEMM overwrites it.
TEST(FreshWgradCheck, AWrongFlagIsAnInternalError) {
  auto linear = MakeLinear(DType::kBFloat16);
  Weight(*linear).grad.mutable_floats()[5] = 1.0f;  // behind the flag's back
  auto out = linear->Forward(kCpu, {Random({8, 64}, 41)}, ForwardOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  auto dx = linear->Backward(kCpu, *out->saved, {Random({8, 32}, 42)});
  ASSERT_FALSE(dx.ok());
  EXPECT_EQ(dx.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(dx.status().message(), HasSubstr("'fc.weight'"));
}

}  // namespace
}  // namespace layers
}  // namespace teserve
