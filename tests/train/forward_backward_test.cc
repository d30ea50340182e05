// Session::ForwardBackward: equal bit for bit to Forward + the loss kernels + Backward
// on a twin session (loss, outputs, input gradients, parameter gradients, quantizer
// state, parameters after Step) under every recipe and both losses, over several steps;
// everything validated before any state changes, errors naming the field.
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/loss.h"
#include "layers/init.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

constexpr int64_t kTokens = 64;
constexpr int64_t kWidth = 32;  // also the cross-entropy vocabulary

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, std, t.mutable_floats());
  return t;
}

Tensor Int64(const std::vector<int64_t>& values, Shape shape) {
  Tensor t = Tensor::Zeros(DType::kInt64, shape).value();
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

// LayerNorm(32) -> Linear(32 -> 32) -> GroupedLinear(2 GEMMs, 32 -> 32).
v1::ModelSpec Model() {
  v1::ModelSpec spec;
  spec.set_seed(5);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(kWidth);
  auto* fc = spec.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(kWidth);
  fc->mutable_linear()->set_out_features(kWidth);
  fc->mutable_linear()->set_init_std(0.2f);
  auto* moe = spec.add_layers();
  moe->set_name("moe");
  moe->mutable_grouped_linear()->set_num_gemms(2);
  moe->mutable_grouped_linear()->set_in_features(kWidth);
  moe->mutable_grouped_linear()->set_out_features(kWidth);
  moe->mutable_grouped_linear()->set_init_std(0.2f);
  return spec;
}

v1::OptimizerSpec Sgd() {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(0.05f);
  return spec;
}

layers::SideInputs Splits(int64_t first) {
  layers::SideInputs side;
  side.Set("m_splits", Int64({first, kTokens - first}, {2}));
  return side;
}

struct Case {
  std::string name;
  v1::RecipeSpec recipe;
  LossOptions loss;
  int64_t first_split;  // rows of GEMM 0 (a multiple of the recipe's block size)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The target for step `step`: regression values or labels with some ignored.
Tensor Target(const LossOptions& loss, int step) {
  if (loss.kind == LossOptions::Kind::kMse) return Random({kTokens, kWidth}, 300 + step);
  std::vector<int64_t> labels(kTokens);
  for (int64_t r = 0; r < kTokens; ++r) labels[r] = r % 5 == 2 ? loss.ignore_index : (r * 11 + step) % kWidth;
  return Int64(labels, {kTokens});
}

// What a client would do without ForwardBackward: Forward, the loss kernels, Backward.
struct Manual {
  float loss;
  int64_t num_tokens;
  std::vector<Tensor> outputs, grad_inputs;
};

Manual ForwardLossBackward(Session& session, const Tensor& x, const layers::SideInputs& side, const LossOptions& loss,
                           const Tensor& target) {
  ForwardResult fwd = session.Forward({x}, true, side).value();
  Manual m;
  const Tensor& y = fwd.outputs[0];
  Tensor dy;
  if (loss.kind == LossOptions::Kind::kMse) {
    m.loss = kernels::MseForward(Context(), y, target).value().loss;
    m.num_tokens = kTokens;
    dy = kernels::MseBackward(Context(), y, target, 1.0f).value();
  } else {
    kernels::CrossEntropyOptions options;
    options.label_smoothing = loss.label_smoothing;
    options.ignore_index = loss.ignore_index;
    auto ce = kernels::CrossEntropyForward(Context(), y, target, options).value();
    m.loss = ce.loss;
    m.num_tokens = ce.num_valid;
    dy = kernels::CrossEntropyBackward(Context(), y, target, ce.lse, ce.num_valid, options, 1.0f).value();
  }
  m.grad_inputs = session.Backward(fwd.handle, {dy}).value();
  m.outputs = std::move(fwd.outputs);
  return m;
}

void ExpectSameTensors(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].name, b[i].name);
    EXPECT_TRUE(BitwiseEqual(a[i].tensor, b[i].tensor)) << what << " " << a[i].name;
  }
}

class ForwardBackwardTest : public testing::TestWithParam<Case> {};

TEST_P(ForwardBackwardTest, EqualsForwardLossBackwardBitwise) {
  const Case& c = GetParam();
  auto fused = Session::Create(Model(), c.recipe, Sgd(), Context()).value();
  auto manual = Session::Create(Model(), c.recipe, Sgd(), Context()).value();
  const layers::SideInputs side = Splits(c.first_split);
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor x = Random({kTokens, kWidth}, 100 + step);
    const Tensor target = Target(c.loss, step);
    auto got = fused->ForwardBackward({x}, side, c.loss, target, /*return_input_grad=*/true,
                                      /*return_outputs=*/true);
    ASSERT_TRUE(got.ok()) << got.status();
    const Manual want = ForwardLossBackward(*manual, x, side, c.loss, target);
    EXPECT_EQ(got->loss, want.loss);
    EXPECT_TRUE(std::isfinite(got->loss) && got->loss > 0.0f) << got->loss;
    EXPECT_EQ(got->num_tokens, want.num_tokens);
    ASSERT_EQ(got->outputs.size(), 1u);
    EXPECT_TRUE(BitwiseEqual(got->outputs[0], want.outputs[0]));
    ASSERT_EQ(got->grad_inputs.size(), 1u);
    EXPECT_TRUE(BitwiseEqual(got->grad_inputs[0], want.grad_inputs[0]));
    ExpectSameTensors(fused->GetGradients({}).value(), manual->GetGradients({}).value(), "grad");

    const std::vector<QuantizerReport> a = fused->QuantizationState();
    const std::vector<QuantizerReport> b = manual->QuantizationState();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].layer, b[i].layer);
      EXPECT_EQ(a[i].amax, b[i].amax) << a[i].layer << " " << a[i].tensor;
      EXPECT_EQ(a[i].scale, b[i].scale) << a[i].layer << " " << a[i].tensor;
      EXPECT_EQ(a[i].amax_history, b[i].amax_history) << a[i].layer << " " << a[i].tensor;
      EXPECT_EQ(a[i].quantize_calls, b[i].quantize_calls) << a[i].layer << " " << a[i].tensor;
    }
    EXPECT_EQ(fused->Summary().live_handles, 0);

    ASSERT_TRUE(fused->Step().ok());
    ASSERT_TRUE(manual->Step().ok());
    ASSERT_TRUE(fused->ZeroGrad().ok());
    ASSERT_TRUE(manual->ZeroGrad().ok());
    ExpectSameTensors(fused->GetParameters({}).value(), manual->GetParameters({}).value(), "parameter");
  }
}

v1::RecipeSpec DelayedShort() {
  v1::RecipeSpec r;
  r.mutable_delayed()->set_amax_history_len(4);
  return r;
}
v1::RecipeSpec Current() {
  v1::RecipeSpec r;
  r.mutable_current();
  return r;
}
v1::RecipeSpec Mxfp8() {
  v1::RecipeSpec r;
  r.mutable_mxfp8();
  return r;
}
v1::RecipeSpec Block() {
  v1::RecipeSpec r;
  r.mutable_block();
  return r;
}
v1::RecipeSpec Nvfp4() {
  v1::RecipeSpec r;
  r.mutable_nvfp4();
  return r;
}

LossOptions Mse() { return LossOptions(); }
LossOptions CrossEntropy(float smoothing, int64_t ignore_index = -100) {
  LossOptions loss;
  loss.kind = LossOptions::Kind::kCrossEntropy;
  loss.label_smoothing = smoothing;
  loss.ignore_index = ignore_index;
  return loss;
}

INSTANTIATE_TEST_SUITE_P(
    RecipesAndLosses, ForwardBackwardTest,
    testing::Values(Case{"none_mse", v1::RecipeSpec(), Mse(), 24}, Case{"none_ce", v1::RecipeSpec(), CrossEntropy(0.0f), 0},
                    Case{"delayed_mse", DelayedShort(), Mse(), 40},
                    Case{"delayed_ce_smoothing", DelayedShort(), CrossEntropy(0.1f), 40},
                    Case{"current_ce_ignore_3", Current(), CrossEntropy(0.2f, 3), 17},
                    Case{"mxfp8_mse", Mxfp8(), Mse(), 32}, Case{"mxfp8_ce", Mxfp8(), CrossEntropy(0.1f), 64},
                    Case{"block_ce", Block(), CrossEntropy(0.05f), 13}, Case{"nvfp4_mse", Nvfp4(), Mse(), 16},
                    Case{"nvfp4_ce", Nvfp4(), CrossEntropy(0.1f), 48}),
    [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

// A rejected call leaves gradients, scaling state and handles as they were.
struct BadCall {
  std::string name;
  LossOptions loss;
  Tensor target;
  layers::SideInputs side;
  Shape input_shape;
  std::string message;
};

void PrintTo(const BadCall& c, std::ostream* os) { *os << c.name; }

class ForwardBackwardErrorTest : public testing::TestWithParam<BadCall> {};

TEST_P(ForwardBackwardErrorTest, RejectedBeforeAnyStateChanges) {
  const BadCall& c = GetParam();
  auto session = Session::Create(Model(), DelayedShort(), Sgd(), Context()).value();
  auto result = session->ForwardBackward({Random(c.input_shape, 1)}, c.side, c.loss, c.target, true, true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(result.status().message()), c.message);
  const std::vector<NamedTensor> grads = session->GetGradients({}).value();
  for (const NamedTensor& g : grads) {
    for (float v : g.tensor.floats()) ASSERT_EQ(v, 0.0f) << g.name;
  }
  for (const QuantizerReport& r : session->QuantizationState()) {
    EXPECT_EQ(r.quantize_calls, 0) << r.layer << " " << r.tensor;
    for (float a : r.amax_history) EXPECT_EQ(a, 0.0f);
  }
  EXPECT_EQ(session->Summary().live_handles, 0);
}

Tensor Labels(std::vector<int64_t> values) { return Int64(values, {static_cast<int64_t>(values.size())}); }

Tensor LabelsWithBadOne() {
  std::vector<int64_t> labels(kTokens, 1);
  labels[9] = kWidth;
  return Labels(labels);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ForwardBackwardErrorTest,
    testing::Values(
        BadCall{"mse_target_shape", Mse(), Random({kTokens, kWidth + 1}, 2), Splits(32), {kTokens, kWidth},
                "target.shape: expected [64, 32] (the model output's shape), got [64, 33]"},
        BadCall{"mse_target_labels", Mse(), Labels(std::vector<int64_t>(kTokens, 0)), Splits(32), {kTokens, kWidth},
                "target.dtype: expected FLOAT32 (an mse target; BFLOAT16 / FLOAT16 on the wire), got INT64"},
        BadCall{"mse_no_target", Mse(), Tensor(), Splits(32), {kTokens, kWidth}, "target: expected a tensor, got none"},
        BadCall{"ce_float_target", CrossEntropy(0.0f), Random({kTokens}, 2), Splits(32), {kTokens, kWidth},
                "target.dtype: expected INT64 or INT32 (class labels), got FLOAT32"},
        BadCall{"ce_target_shape", CrossEntropy(0.0f), Int64(std::vector<int64_t>(kTokens, 0), {kTokens, 1}),
                Splits(32), {kTokens, kWidth},
                "target.shape: expected [64] (the leading dimensions of the logits), got [64, 1]"},
        BadCall{"ce_label_out_of_range", CrossEntropy(0.0f), LabelsWithBadOne(), Splits(32), {kTokens, kWidth},
                "target[9]: expected a class in [0, 32) or ignore_index -100, got 32"},
        BadCall{"ce_label_smoothing", CrossEntropy(2.0f), Labels(std::vector<int64_t>(kTokens, 0)), Splits(32),
                {kTokens, kWidth}, "loss.cross_entropy.label_smoothing: expected a value in [0, 1], got 2"},
        BadCall{"missing_m_splits", Mse(), Random({kTokens, kWidth}, 2), layers::SideInputs(), {kTokens, kWidth},
                "side_inputs.m_splits: expected an INT64 tensor [2] (the group sizes of GroupedLinear layer 'moe'), "
                "got none"},
        BadCall{"bad_input_width", Mse(), Random({kTokens, kWidth}, 2), Splits(32), {kTokens, 7},
                "inputs[0].shape: expected last dimension 32 (hidden_size of layer 'layers.0'), got [64, 7]"}),
    [](const testing::TestParamInfo<BadCall>& info) { return info.param.name; });

TEST(ForwardBackward, AllIgnoredBatchHasZeroLossAndNoGradient) {
  auto session = Session::Create(Model(), v1::RecipeSpec(), Sgd(), Context()).value();
  auto result = session->ForwardBackward({Random({kTokens, kWidth}, 1)}, Splits(32), CrossEntropy(0.1f),
                                         Labels(std::vector<int64_t>(kTokens, -100)), true, false);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->loss, 0.0f);
  EXPECT_EQ(result->num_tokens, 0);
  EXPECT_TRUE(result->outputs.empty());
  for (float v : result->grad_inputs[0].floats()) EXPECT_EQ(v, 0.0f);
  const std::vector<NamedTensor> grads = session->GetGradients({}).value();
  for (const NamedTensor& g : grads) {
    for (float v : g.tensor.floats()) EXPECT_EQ(v, 0.0f) << g.name;
  }
}

TEST(ForwardBackward, ReturnsOnlyWhatWasAskedFor) {
  auto session = Session::Create(Model(), v1::RecipeSpec(), Sgd(), Context()).value();
  auto result = session->ForwardBackward({Random({kTokens, kWidth}, 1)}, Splits(32), Mse(),
                                         Random({kTokens, kWidth}, 2), false, false);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->grad_inputs.empty());
  EXPECT_TRUE(result->outputs.empty());
  EXPECT_EQ(result->num_tokens, kTokens);
  double grad_sq = 0.0;
  const std::vector<NamedTensor> grads = session->GetGradients({}).value();
  for (const NamedTensor& g : grads) {
    for (float v : g.tensor.floats()) grad_sq += double(v) * v;
  }
  EXPECT_GT(grad_sq, 0.0);  // the parameter gradients accumulated all the same
}

TEST(ForwardBackward, RejectsModelsWithSeveralOutputs) {
  v1::ModelSpec spec;
  auto* fc = spec.add_layers()->mutable_linear();
  fc->set_in_features(4);
  fc->set_out_features(3);
  fc->set_return_bias(true);
  auto session = Session::Create(spec, v1::RecipeSpec(), Sgd(), Context()).value();
  auto result = session->ForwardBackward({Random({2, 4}, 1)}, layers::SideInputs(), Mse(), Random({2, 3}, 2), true,
                                         true);
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(result.status().message()),
            "loss: expected a model with one output (the last layer must not return its bias), got 2 outputs");
}

TEST(LossFromProto, NamesTheFieldAndDefaultsIgnoreIndex) {
  auto none = LossFromProto(v1::LossSpec());
  EXPECT_EQ(std::string(none.status().message()), "loss: expected one of mse, cross_entropy, got none");
  v1::LossSpec spec;
  spec.mutable_cross_entropy()->set_label_smoothing(0.25f);
  LossOptions loss = LossFromProto(spec).value();
  EXPECT_EQ(loss.kind, LossOptions::Kind::kCrossEntropy);
  EXPECT_EQ(loss.label_smoothing, 0.25f);
  EXPECT_EQ(loss.ignore_index, -100);
  spec.mutable_cross_entropy()->set_ignore_index(0);
  EXPECT_EQ(LossFromProto(spec)->ignore_index, 0);
  spec.mutable_cross_entropy()->set_label_smoothing(-0.5f);
  EXPECT_EQ(std::string(LossFromProto(spec).status().message()),
            "loss.cross_entropy.label_smoothing: expected a value in [0, 1], got -0.5");
}

}  // namespace
}  // namespace train
}  // namespace teserve
