// GroupedLinear: equal (bitwise) to num_gemms separate Linears on the row groups under
// every recipe, across steps, in FP32 and in a 16-bit params_dtype; empty groups; an FP64 forward reference; finite-difference
// gradients; m_splits validation naming the field; TE's parameter and quantizer names.
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/grouped_linear.h"
#include "layers/init.h"
#include "layers/linear.h"
#include "layers/spec.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace layers {
namespace {

using testing_util::CheckGradients;
using testing_util::RandomTensor;

Tensor Splits(const std::vector<int64_t>& sizes) {
  Tensor t = Tensor::Zeros(DType::kInt64, {static_cast<int64_t>(sizes.size())}).value();
  for (size_t i = 0; i < sizes.size(); ++i) t.data<int64_t>()[i] = sizes[i];
  return t;
}

SideInputs SideWith(Tensor m_splits) {
  SideInputs side;
  side.Set("m_splits", std::move(m_splits));
  return side;
}

// Rows [begin, begin + count) of a 2-D tensor (any dtype), as a tensor of its own.
Tensor Rows(const Tensor& x, int64_t begin, int64_t count) {
  const Tensor x2d = x.As2D().value();
  Tensor out = Tensor::Zeros(x2d.dtype(), {count, x2d.dim(1)}).value();
  const int64_t row_bytes = x2d.dim(1) * DTypeBits(x2d.dtype()) / 8;
  if (count > 0) {
    std::memcpy(out.raw_data(), static_cast<const char*>(x2d.raw_data()) + begin * row_bytes, count * row_bytes);
  }
  return out;
}

void EndRegion(std::vector<NamedQuantizer> quantizers, bool forward) {
  for (const NamedQuantizer& q : quantizers) {
    if (recipes::IsForwardRole(q.quantizer->role()) == forward) q.quantizer->EndRegion();
  }
}

recipes::Recipe Make(recipes::Recipe::Config config) {
  recipes::Recipe r;
  r.config = config;
  return r;
}

struct RecipeCase {
  std::string name;
  recipes::Recipe recipe;
  std::vector<int64_t> splits;  // multiples of the recipe's block size
  int64_t in, out;
  DType params_dtype = DType::kFloat32;  // of the GroupedLinear and of the Linears
  DType input_dtype = DType::kFloat32;   // x's (and so dx's)
};

void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

class GroupedLinearRecipeTest : public testing::TestWithParam<RecipeCase> {};

// Three steps (forward, backward, region ends) of a GroupedLinear and of num_gemms
// separate Linears built from the same options: outputs, input gradients, parameter
// gradients and quantizer states agree bit for bit. Delayed scaling thus also checks
// that each GEMM's scaling state evolves on its own group's amaxes. In a 16-bit
// params_dtype, y comes out in it and dx in x's dtype; the groups' Linears read the same
// 16-bit rows whether x is cut before or after its conversion.
TEST_P(GroupedLinearRecipeTest, EqualsSeparateLinearsOnTheRowGroups) {
  const RecipeCase& c = GetParam();
  const int64_t n = static_cast<int64_t>(c.splits.size());
  int64_t tokens = 0;
  for (int64_t m : c.splits) tokens += m;

  GroupedLinearOptions options;
  options.num_gemms = n;
  options.in_features = c.in;
  options.out_features = c.out;
  options.init_std = 0.1f;
  options.seed = 21;
  options.params_dtype = c.params_dtype;
  auto grouped = GroupedLinear::Create("moe", options, c.recipe).value();
  std::vector<std::unique_ptr<Linear>> separate;
  for (int64_t i = 0; i < n; ++i) {
    LinearOptions lo;
    lo.in_features = c.in;
    lo.out_features = c.out;
    lo.init_std = 0.1f;
    lo.seed = DeriveSeed(21, i);
    lo.params_dtype = c.params_dtype;
    separate.push_back(Linear::Create("fc", lo, c.recipe).value());
  }
  // Non-zero biases, the same in both.
  std::vector<Parameter*> grouped_params = grouped->Parameters();
  for (int64_t i = 0; i < n; ++i) {
    FillNormal(100 + i, 0.5f, grouped_params[n + i]->value.mutable_floats());
    Parameter* bias = separate[i]->Parameters()[1];
    bias->value = grouped_params[n + i]->value.Clone().value();
  }

  const SideInputs side = SideWith(Splits(c.splits));
  ForwardOptions fwd_options;
  fwd_options.side = &side;
  Context ctx;
  ctx.seed = 5;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor x =
        kernels::Convert(ctx, RandomTensor({tokens, c.in}, 30 + step, 1.0f + step), c.input_dtype).value();
    const Tensor dy = RandomTensor({tokens, c.out}, 40 + step, 0.01f);
    auto fwd = grouped->Forward(ctx, {x}, fwd_options).value();
    EndRegion(grouped->Quantizers(), true);
    auto dx = grouped->Backward(ctx, *fwd.saved, {dy}).value();
    EndRegion(grouped->Quantizers(), false);
    ASSERT_EQ(fwd.outputs[0].shape(), (Shape{tokens, c.out}));
    ASSERT_EQ(fwd.outputs[0].dtype(), c.params_dtype);
    ASSERT_EQ(dx[0].shape(), x.shape());
    ASSERT_EQ(dx[0].dtype(), c.input_dtype);

    int64_t row = 0;
    for (int64_t i = 0; i < n; ++i) {
      SCOPED_TRACE("gemm " + std::to_string(i));
      const int64_t m = c.splits[i];
      auto fwd_i = separate[i]->Forward(ctx, {Rows(x, row, m)}, ForwardOptions()).value();
      EndRegion(separate[i]->Quantizers(), true);
      auto dx_i = separate[i]->Backward(ctx, *fwd_i.saved, {Rows(dy, row, m)}).value();
      EndRegion(separate[i]->Quantizers(), false);
      EXPECT_TRUE(BitwiseEqual(Rows(fwd.outputs[0], row, m), fwd_i.outputs[0]));
      EXPECT_TRUE(BitwiseEqual(Rows(dx[0], row, m), dx_i[0]));
      EXPECT_TRUE(BitwiseEqual(grouped_params[i]->grad, separate[i]->Parameters()[0]->grad));
      EXPECT_TRUE(BitwiseEqual(grouped_params[n + i]->grad, separate[i]->Parameters()[1]->grad));
      std::vector<NamedQuantizer> gq = grouped->Quantizers();
      std::vector<NamedQuantizer> sq = separate[i]->Quantizers();
      ASSERT_EQ(gq.size(), n * sq.size());
      for (size_t k = 0; k < sq.size(); ++k) {
        const recipes::QuantizerSnapshot a = gq[i * sq.size() + k].quantizer->Snapshot();
        const recipes::QuantizerSnapshot b = sq[k].quantizer->Snapshot();
        EXPECT_EQ(a.amax, b.amax);
        EXPECT_EQ(a.scale, b.scale);
        EXPECT_EQ(a.amax_history, b.amax_history);
        EXPECT_EQ(a.quantize_calls, b.quantize_calls);
      }
      row += m;
    }
  }
}

recipes::Recipe Calibrating() {
  recipes::Recipe r = Make(recipes::DelayedScalingConfig());
  r.calibrating = true;
  return r;
}

recipes::Recipe DelayedShortHistory() {
  recipes::DelayedScalingConfig c;
  c.amax_history_len = 4;
  return Make(c);
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, GroupedLinearRecipeTest,
    testing::Values(RecipeCase{"none_3gemms_5_0_7", recipes::Recipe(), {5, 0, 7}, 37, 23},
                    RecipeCase{"delayed_3gemms_4_9_3", DelayedShortHistory(), {4, 9, 3}, 16, 8},
                    RecipeCase{"delayed_empty_middle", Make(recipes::DelayedScalingConfig()), {6, 0, 2}, 16, 8},
                    RecipeCase{"calibrating_2gemms", Calibrating(), {3, 5}, 16, 8},
                    RecipeCase{"current_2gemms_11_6", Make(recipes::CurrentScalingConfig()), {11, 6}, 24, 16},
                    RecipeCase{"mxfp8_3gemms_32_0_64", Make(recipes::Mxfp8Config()), {32, 0, 64}, 64, 32},
                    RecipeCase{"block_weird_3gemms_3_37_23", Make(recipes::BlockScalingConfig()), {3, 37, 23}, 69, 23},
                    RecipeCase{"nvfp4_2gemms_16_32", Make(recipes::Nvfp4Config()), {16, 32}, 32, 16},
                    RecipeCase{"nvfp4_empty_first", Make(recipes::Nvfp4Config()), {0, 48}, 32, 16},
                    RecipeCase{"none_bf16_5_0_7", recipes::Recipe(), {5, 0, 7}, 37, 23, DType::kBFloat16},
                    RecipeCase{"none_fp16_bf16_input", recipes::Recipe(), {5, 0, 7}, 37, 23, DType::kFloat16,
                               DType::kBFloat16},
                    RecipeCase{"delayed_bf16_empty_middle", DelayedShortHistory(), {6, 0, 2}, 16, 8,
                               DType::kBFloat16, DType::kBFloat16},
                    RecipeCase{"delayed_fp16_4_9_3", DelayedShortHistory(), {4, 9, 3}, 16, 8, DType::kFloat16,
                               DType::kFloat16},
                    RecipeCase{"calibrating_bf16", Calibrating(), {3, 5}, 16, 8, DType::kBFloat16},
                    RecipeCase{"current_bf16_11_6", Make(recipes::CurrentScalingConfig()), {11, 6}, 24, 16,
                               DType::kBFloat16, DType::kBFloat16},
                    RecipeCase{"current_fp16_11_6", Make(recipes::CurrentScalingConfig()), {11, 6}, 24, 16,
                               DType::kFloat16},
                    RecipeCase{"mxfp8_bf16_32_0_64", Make(recipes::Mxfp8Config()), {32, 0, 64}, 64, 32,
                               DType::kBFloat16, DType::kBFloat16},
                    RecipeCase{"block_bf16_3_37_23", Make(recipes::BlockScalingConfig()), {3, 37, 23}, 69, 23,
                               DType::kBFloat16}),
    [](const testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

GroupedLinearOptions Options(int64_t num_gemms, int64_t in, int64_t out) {
  GroupedLinearOptions options;
  options.num_gemms = num_gemms;
  options.in_features = in;
  options.out_features = out;
  options.init_std = 0.5f;
  options.seed = 3;
  return options;
}

TEST(GroupedLinear, ForwardMatchesDoubleReference) {
  auto layer = GroupedLinear::Create("moe", Options(3, 13, 7), recipes::Recipe()).value();
  std::vector<Parameter*> p = layer->Parameters();
  for (int i = 0; i < 3; ++i) FillNormal(50 + i, 1.0f, p[3 + i]->value.mutable_floats());
  const std::vector<int64_t> splits{2, 0, 4};  // 6 tokens as [2, 3, 13]
  const SideInputs side = SideWith(Splits(splits));
  ForwardOptions options;
  options.side = &side;
  const Tensor x = RandomTensor({2, 3, 13}, 9);
  auto out = layer->Forward(Context(), {x}, options).value();
  ASSERT_EQ(out.outputs[0].shape(), (Shape{2, 3, 7}));
  int64_t row = 0;
  for (int g = 0; g < 3; ++g) {
    for (int64_t r = row; r < row + splits[g]; ++r) {
      for (int o = 0; o < 7; ++o) {
        double ref = p[3 + g]->value.floats()[o];
        for (int i = 0; i < 13; ++i) ref += double(x.floats()[r * 13 + i]) * p[g]->value.floats()[o * 13 + i];
        EXPECT_NEAR(out.outputs[0].floats()[r * 7 + o], ref, 1e-5 + 1.3e-6 * std::fabs(ref)) << "row " << r;
      }
    }
    row += splits[g];
  }
}

TEST(GroupedLinear, EmptyGroupsGetNoGradientAndAllEmptyInputWorks) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    GroupedLinearOptions o = Options(3, 8, 4);
    o.params_dtype = dtype;
    auto layer = GroupedLinear::Create("moe", o, recipes::Recipe()).value();
    const SideInputs side = SideWith(Splits({0, 5, 0}));
    ForwardOptions options;
    options.side = &side;
    auto fwd = layer->Forward(Context(), {RandomTensor({5, 8}, 1)}, options).value();
    auto dx = layer->Backward(Context(), *fwd.saved, {RandomTensor({5, 4}, 2)}).value();
    std::vector<Parameter*> p = layer->Parameters();
    for (int g : {0, 2}) {
      for (float v : p[g]->grad.floats()) EXPECT_EQ(v, 0.0f) << p[g]->name;
      for (float v : p[3 + g]->grad.floats()) EXPECT_EQ(v, 0.0f) << p[3 + g]->name;
    }
    double used = 0.0;
    for (float v : p[1]->grad.floats()) used += std::fabs(v);
    EXPECT_GT(used, 0.0);

    const SideInputs none = SideWith(Splits({0, 0, 0}));
    options.side = &none;
    auto empty = layer->Forward(Context(), {RandomTensor({0, 8}, 1)}, options).value();
    EXPECT_EQ(empty.outputs[0].shape(), (Shape{0, 4}));
    EXPECT_EQ(empty.outputs[0].dtype(), dtype);
    auto empty_dx = layer->Backward(Context(), *empty.saved, {RandomTensor({0, 4}, 2)}).value();
    EXPECT_EQ(empty_dx[0].shape(), (Shape{0, 8}));
  }
}

// Injects fixed side inputs into every forward, so the generic gradient check can
// drive a layer that reads them.
class WithSide : public Module {
 public:
  WithSide(Module& inner, SideInputs side) : Module(inner.name()), inner_(inner), side_(std::move(side)) {}
  std::string kind() const override { return inner_.kind(); }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& shapes,
                                                  absl::string_view field) const override {
    return inner_.OutputShapes(shapes, field);
  }
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override {
    ForwardOptions with = options;
    with.side = &side_;
    return inner_.Forward(ctx, inputs, with);
  }
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads) override {
    return inner_.Backward(ctx, saved, grad_outputs, side_grads);
  }
  std::vector<Parameter*> Parameters() override { return inner_.Parameters(); }

 private:
  Module& inner_;
  SideInputs side_;
};

struct GradCase {
  std::string name;
  Shape input_shape;
  std::vector<int64_t> splits;
  int64_t out;
  bool bias, return_bias;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class GroupedLinearGradTest : public testing::TestWithParam<GradCase> {};

TEST_P(GroupedLinearGradTest, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  GroupedLinearOptions options = Options(static_cast<int64_t>(c.splits.size()), c.input_shape.back(), c.out);
  options.bias = c.bias;
  options.return_bias = c.return_bias;
  auto layer = GroupedLinear::Create("moe", options, recipes::Recipe()).value();
  if (c.bias) {
    for (Parameter* p : layer->Parameters()) {
      if (p->value.rank() == 1) FillNormal(77, 0.5f, p->value.mutable_floats());
    }
  }
  WithSide wrapped(*layer, SideWith(Splits(c.splits)));
  CheckGradients(wrapped, {RandomTensor(c.input_shape, 3)});
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GroupedLinearGradTest,
    testing::Values(GradCase{"2gemms_3_2_in5_out4", {5, 5}, {3, 2}, 4, true, false},
                    GradCase{"3gemms_empty_middle_rank3", {2, 3, 7}, {4, 0, 2}, 5, true, false},
                    GradCase{"1gemm_nobias", {4, 6}, {4}, 3, false, false},
                    GradCase{"4gemms_returnbias", {6, 8}, {1, 2, 0, 3}, 5, true, true}),
    [](const testing::TestParamInfo<GradCase>& info) { return info.param.name; });

TEST(GroupedLinear, ReturnBiasReturnsEachGemmsBiasUnadded) {
  GroupedLinearOptions options = Options(2, 4, 3);
  options.return_bias = true;
  auto layer = GroupedLinear::Create("moe", options, recipes::Recipe()).value();
  auto shapes = layer->OutputShapes({{5, 4}}, "inputs").value();
  EXPECT_EQ(shapes, (std::vector<Shape>{{5, 3}, {3}, {3}}));
  std::vector<Parameter*> p = layer->Parameters();
  FillNormal(1, 1.0f, p[2]->value.mutable_floats());
  FillNormal(2, 1.0f, p[3]->value.mutable_floats());
  const SideInputs side = SideWith(Splits({2, 3}));
  ForwardOptions fo;
  fo.side = &side;
  auto out = layer->Forward(Context(), {RandomTensor({5, 4}, 3)}, fo).value();
  ASSERT_EQ(out.outputs.size(), 3u);
  EXPECT_TRUE(BitwiseEqual(out.outputs[1], p[2]->value));
  EXPECT_TRUE(BitwiseEqual(out.outputs[2], p[3]->value));
}

TEST(GroupedLinear, ParameterAndQuantizerNamesFollowTe) {
  auto layer = GroupedLinear::Create("experts", Options(3, 32, 32), Make(recipes::DelayedScalingConfig())).value();
  std::vector<std::string> names;
  for (Parameter* p : layer->Parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"experts.weight0", "experts.weight1", "experts.weight2", "experts.bias0",
                                             "experts.bias1", "experts.bias2"}));
  std::vector<NamedQuantizer> q = layer->Quantizers();
  ASSERT_EQ(q.size(), 9u);
  EXPECT_EQ(q[0].layer, "experts.gemm0");
  EXPECT_EQ(q[3].layer, "experts.gemm1");
  EXPECT_EQ(q[8].layer, "experts.gemm2");
  // The weights are independent draws.
  EXPECT_FALSE(BitwiseEqual(layer->Parameters()[0]->value, layer->Parameters()[1]->value));
}

TEST(GroupedLinear, RejectsNumGemmsBelowOne) {
  auto layer = GroupedLinear::Create("moe", Options(0, 4, 4), recipes::Recipe());
  EXPECT_EQ(layer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(layer.status().message()), "num_gemms: expected at least 1, got 0");
}

struct BadSplitsCase {
  std::string name;
  bool present;
  Tensor m_splits;
  std::string message;  // the whole message: field, expected, got
};

void PrintTo(const BadSplitsCase& c, std::ostream* os) { *os << c.name; }

class GroupedLinearBadSplitsTest : public testing::TestWithParam<BadSplitsCase> {};

// ValidateSide rejects them, and Forward (called without validation) returns the same
// error instead of reading out of bounds.
TEST_P(GroupedLinearBadSplitsTest, RejectedNamingTheField) {
  const BadSplitsCase& c = GetParam();
  auto layer = GroupedLinear::Create("moe", Options(3, 4, 2), recipes::Recipe()).value();
  SideInputs side;
  if (c.present) side.Set("m_splits", c.m_splits);
  absl::Status status = layer->ValidateSide(side, {{2, 3, 4}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()), c.message);
  ForwardOptions options;
  options.side = &side;
  auto fwd = layer->Forward(Context(), {RandomTensor({2, 3, 4}, 1)}, options);
  EXPECT_EQ(fwd.status(), status);
}

Tensor Int32Splits() { return Tensor::Zeros(DType::kInt32, {3}).value(); }

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupedLinearBadSplitsTest,
    testing::Values(
        BadSplitsCase{"missing", false, Tensor(),
                      "side_inputs.m_splits: expected an INT64 tensor [3] (the group sizes of GroupedLinear layer "
                      "'moe'), got none"},
        BadSplitsCase{"int32", true, Int32Splits(), "side_inputs.m_splits.dtype: expected INT64, got INT32"},
        BadSplitsCase{"wrong_count", true, Splits({3, 3}),
                      "side_inputs.m_splits.shape: expected [3] (num_gemms of layer 'moe'), got [2]"},
        BadSplitsCase{"negative", true, Splits({4, -1, 3}),
                      "side_inputs.m_splits[1]: expected a group size >= 0, got -1"},
        BadSplitsCase{"sum_short", true, Splits({1, 2, 2}),
                      "side_inputs.m_splits: expected group sizes summing to 6 (the token count of the input to layer "
                      "'moe'), got 5"},
        BadSplitsCase{"sum_over", true, Splits({5, 0, 9}),
                      "side_inputs.m_splits: expected group sizes summing to 6 (the token count of the input to layer "
                      "'moe'), got more than 6 by group 2"},
        BadSplitsCase{"huge", true, Splits({6, int64_t{1} << 62, int64_t{1} << 62}),
                      "side_inputs.m_splits: expected group sizes summing to 6 (the token count of the input to layer "
                      "'moe'), got more than 6 by group 1"}),
    [](const testing::TestParamInfo<BadSplitsCase>& info) { return info.param.name; });

TEST(GroupedLinear, BlockRecipesRejectGroupsThatDoNotTile) {
  auto layer = GroupedLinear::Create("moe", Options(2, 32, 32), Make(recipes::Mxfp8Config())).value();
  // 64 tokens in total (a multiple of 32) but split 40 + 24.
  absl::Status status = layer->ValidateSide(SideWith(Splits({40, 24})), {{64, 32}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(status.message()),
            "side_inputs.m_splits[0]: expected a multiple of 32 (the recipe's block size, for layer 'moe'), got 40");
  EXPECT_TRUE(layer->ValidateSide(SideWith(Splits({32, 32})), {{64, 32}}).ok());
  EXPECT_TRUE(layer->ValidateSide(SideWith(Splits({0, 64})), {{64, 32}}).ok());
}

TEST(GroupedLinear, OutputShapesNameTheInputField) {
  auto layer = GroupedLinear::Create("moe", Options(2, 8, 4), recipes::Recipe()).value();
  auto shapes = layer->OutputShapes({{3, 5}}, "inputs");
  EXPECT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(shapes.status().message()),
            "inputs[0].shape: expected last dimension 8 (in_features of layer 'moe'), got [3, 5]");
}

// ModelSpec -> stack: Linear(32 -> 32) then GroupedLinear(32 -> 8, 3 GEMMs).
v1::ModelSpec GroupedModel() {
  v1::ModelSpec spec;
  auto* fc = spec.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(32);
  fc->mutable_linear()->set_out_features(32);
  auto* moe = spec.add_layers();
  moe->set_name("moe");
  moe->mutable_grouped_linear()->set_num_gemms(3);
  moe->mutable_grouped_linear()->set_in_features(32);
  moe->mutable_grouped_linear()->set_out_features(8);
  return spec;
}

TEST(GroupedLinearSpec, BuildsAStackThatReadsMSplits) {
  auto stack = BuildStack(GroupedModel(), recipes::Recipe()).value();
  std::vector<std::string> names;
  for (Parameter* p : stack->Parameters()) names.push_back(p->name);
  EXPECT_EQ(names, (std::vector<std::string>{"fc.weight", "fc.bias", "moe.weight0", "moe.weight1", "moe.weight2",
                                             "moe.bias0", "moe.bias1", "moe.bias2"}));
  EXPECT_EQ(std::string(stack->ValidateSide(SideInputs(), {{4, 32}}).message()),
            "side_inputs.m_splits: expected an INT64 tensor [3] (the group sizes of GroupedLinear layer 'moe'), "
            "got none");
  const SideInputs side = SideWith(Splits({1, 0, 3}));
  ASSERT_TRUE(stack->ValidateSide(side, {{4, 32}}).ok());
  ForwardOptions options;
  options.side = &side;
  auto out = stack->Forward(Context(), {RandomTensor({4, 32}, 2)}, options).value();
  EXPECT_EQ(out.outputs[0].shape(), (Shape{4, 8}));
}

struct BadGroupedSpec {
  std::string name;
  std::function<void(v1::GroupedLinearSpec*)> mutate;
  recipes::Recipe::Config recipe;
  std::string message;
};

void PrintTo(const BadGroupedSpec& c, std::ostream* os) { *os << c.name; }

class GroupedLinearSpecErrorTest : public testing::TestWithParam<BadGroupedSpec> {};

TEST_P(GroupedLinearSpecErrorTest, NamesTheField) {
  const BadGroupedSpec& c = GetParam();
  v1::ModelSpec spec = GroupedModel();
  c.mutate(spec.mutable_layers(1)->mutable_grouped_linear());
  auto stack = BuildStack(spec, Make(c.recipe));
  EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(stack.status().message()), c.message);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, GroupedLinearSpecErrorTest,
    testing::Values(
        BadGroupedSpec{"zero_gemms", [](v1::GroupedLinearSpec* s) { s->set_num_gemms(0); }, absl::monostate(),
                       "model.layers[1].grouped_linear.num_gemms: expected a count in 1..4096, got 0"},
        BadGroupedSpec{"too_many_gemms", [](v1::GroupedLinearSpec* s) { s->set_num_gemms(4097); }, absl::monostate(),
                       "model.layers[1].grouped_linear.num_gemms: expected a count in 1..4096, got 4097"},
        BadGroupedSpec{"no_out_features", [](v1::GroupedLinearSpec* s) { s->set_out_features(0); }, absl::monostate(),
                       "model.layers[1].grouped_linear.out_features: expected a size in 1..16777216, got 0"},
        BadGroupedSpec{"negative_init_std", [](v1::GroupedLinearSpec* s) { s->set_init_std(-1.0f); },
                       absl::monostate(), "model.layers[1].grouped_linear.init_std: expected a finite value >= 0, got -1"},
        BadGroupedSpec{"width_mismatch", [](v1::GroupedLinearSpec* s) { s->set_in_features(31); }, absl::monostate(),
                       "model.layers[1].grouped_linear.in_features: expected 32 (the output width of layer 'fc'), "
                       "got 31"},
        BadGroupedSpec{"mxfp8_out_features", [](v1::GroupedLinearSpec* s) { s->set_out_features(48); },
                       recipes::Mxfp8Config(),
                       "model.layers[1].grouped_linear.out_features: expected a multiple of 32 (mxfp8 blocks must "
                       "tile it), got 48"}),
    [](const testing::TestParamInfo<BadGroupedSpec>& info) { return info.param.name; });

TEST(GroupedLinearSpec, OnlyTheLastLayerReturnsItsBiases) {
  v1::ModelSpec spec = GroupedModel();
  spec.mutable_layers(1)->mutable_grouped_linear()->set_return_bias(true);
  EXPECT_TRUE(BuildStack(spec, recipes::Recipe()).ok());
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(8);
  auto stack = BuildStack(spec, recipes::Recipe());
  EXPECT_EQ(std::string(stack.status().message()),
            "model.layers[1].grouped_linear.return_bias: expected false (only the last layer of a stack may return "
            "its biases), got true");
}

}  // namespace
}  // namespace layers
}  // namespace teserve
