#include "train/session.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layers/init.h"

namespace teserve {
namespace train {
namespace {

using testing::HasSubstr;

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, std, t.mutable_floats());
  return t;
}

v1::ModelSpec Model() {
  v1::ModelSpec spec;
  spec.set_seed(42);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(8);
  auto* fc = spec.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(8);
  fc->mutable_linear()->set_out_features(4);
  return spec;
}

v1::RecipeSpec Delayed(int history_len = 4) {
  v1::RecipeSpec recipe;
  recipe.mutable_delayed()->set_amax_history_len(history_len);
  return recipe;
}

v1::OptimizerSpec Sgd(float lr = 0.1f) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_lr(lr);
  return spec;
}

std::unique_ptr<Session> MakeSession(const v1::RecipeSpec& recipe = Delayed(),
                                     const v1::OptimizerSpec& optimizer = Sgd()) {
  auto session = Session::Create(Model(), recipe, optimizer, Context());
  EXPECT_TRUE(session.ok()) << session.status();
  return std::move(session).value();
}

std::vector<NamedTensor> Params(const Session& s) { return s.GetParameters({}).value(); }

void ExpectSameParameters(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BitwiseEqual(a[i].tensor, b[i].tensor)) << a[i].name;
}

// What a teacher of Model()'s architecture (other seed, larger output weights) outputs for
// x: a target the model can learn.
Tensor TeacherOutput(const Tensor& x) {
  v1::ModelSpec teacher_spec = Model();
  teacher_spec.set_seed(7);
  teacher_spec.mutable_layers(1)->mutable_linear()->set_init_std(0.5f);
  auto teacher = Session::Create(teacher_spec, v1::RecipeSpec(), Sgd(), Context()).value();
  return teacher->Forward({x}, false).value().outputs[0];
}

TEST(Session, TrainsARegressionTarget) {
  v1::OptimizerSpec adamw;
  adamw.mutable_adamw()->set_lr(0.05f);
  auto session = MakeSession(Delayed(), adamw);
  const Tensor x = Random({16, 8}, 1);
  const Tensor target = TeacherOutput(x);
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 100; ++step) {
    auto fwd = session->Forward({x}, true).value();
    Tensor dy = Tensor::Zeros(DType::kFloat32, {16, 4}).value();
    double loss = 0.0;
    for (int i = 0; i < 64; ++i) {
      const float d = fwd.outputs[0].floats()[i] - target.floats()[i];
      loss += d * d / 64.0;
      dy.mutable_floats()[i] = 2.0f * d / 64.0f;
    }
    if (step == 0) first = loss;
    last = loss;
    ASSERT_TRUE(session->Backward(fwd.handle, {dy}).ok());
    ASSERT_FALSE(session->Step().value().skipped);
    ASSERT_TRUE(session->ZeroGrad().ok());
  }
  EXPECT_LT(last, first / 10.0) << "first " << first << " last " << last;
  EXPECT_EQ(session->Summary().step, 100);
}

// ZeroGrad defers its fill (layers::ZeroGrads): every reader of the gradients still sees
// zeros. Gradients that a backward left nonzero come back as zeros from GetGradients and
// CaptureState after a ZeroGrad, and a Step with nothing accumulated sees a zero norm.
TEST(Session, GradientsReadAsZeroAfterADeferredZeroGrad) {
  auto session = MakeSession();
  const Tensor x = Random({16, 8}, 3);
  auto fwd = session->Forward({x}, true).value();
  ASSERT_TRUE(session->Backward(fwd.handle, {Random({16, 4}, 4)}).ok());
  bool any_nonzero = false;
  const std::vector<NamedTensor> written = session->GetGradients({}).value();
  for (const NamedTensor& g : written) {
    for (float v : g.tensor.floats()) any_nonzero = any_nonzero || v != 0.0f;
  }
  ASSERT_TRUE(any_nonzero) << "the backward wrote no gradient";

  ASSERT_TRUE(session->ZeroGrad().ok());
  const SessionState state = session->CaptureState().value();
  ASSERT_FALSE(state.gradients.empty());
  for (const NamedTensor& g : state.gradients) {
    for (float v : g.tensor.floats()) ASSERT_EQ(v, 0.0f) << g.name;
  }
  const std::vector<NamedTensor> zeroed = session->GetGradients({}).value();
  for (const NamedTensor& g : zeroed) {
    for (float v : g.tensor.floats()) ASSERT_EQ(v, 0.0f) << g.name;
  }
  const std::vector<NamedTensor> before = Params(*session);
  const StepResult step = session->Step().value();
  EXPECT_EQ(step.grad_norm, 0.0f);
  ExpectSameParameters(before, Params(*session));  // SGD on zero gradients changes nothing
}


// params_dtype BFLOAT16 on every layer: outputs come back in BF16, the loss reads
// their FP32 values, the master weights and gradients stay FP32, and training learns
// the teacher as the FP32 session does.
TEST(Session, TrainsWithBf16Params) {
  v1::ModelSpec spec = Model();
  for (v1::LayerSpec& layer : *spec.mutable_layers()) layer.set_params_dtype(v1::BFLOAT16);
  v1::OptimizerSpec adamw;
  adamw.mutable_adamw()->set_lr(0.05f);
  auto session = Session::Create(spec, Delayed(), adamw, Context()).value();
  const Tensor x = Random({16, 8}, 1);
  const Tensor target = TeacherOutput(x);
  LossOptions mse;
  mse.kind = LossOptions::Kind::kMse;
  double first = 0.0, last = 0.0;
  for (int step = 0; step < 100; ++step) {
    auto result = session->ForwardBackward({x}, layers::SideInputs(), mse, target, true, true);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_EQ(result->outputs[0].dtype(), DType::kBFloat16);
    ASSERT_EQ(result->grad_inputs[0].dtype(), DType::kFloat32);
    if (step == 0) first = result->loss;
    last = result->loss;
    ASSERT_FALSE(session->Step().value().skipped);
    ASSERT_TRUE(session->ZeroGrad().ok());
  }
  EXPECT_LT(last, first / 10.0) << "first " << first << " last " << last;
  for (const NamedTensor& p : Params(*session)) EXPECT_EQ(p.tensor.dtype(), DType::kFloat32) << p.name;
}

// SessionInfo.attention: one entry per attention core, nested ones included (a
// decoder TransformerLayer has two), in stack order, with the path its device runs.
TEST(Session, SummaryNamesEachAttentionCoreAndItsPath) {
  v1::ModelSpec spec;
  auto* decoder = spec.add_layers();
  decoder->set_name("dec");
  decoder->mutable_transformer_layer()->set_hidden_size(32);
  decoder->mutable_transformer_layer()->set_ffn_hidden_size(64);
  decoder->mutable_transformer_layer()->set_num_attention_heads(4);
  decoder->mutable_transformer_layer()->set_layer_type("decoder");
  auto session = Session::Create(spec, v1::RecipeSpec(), Sgd(), Context());
  ASSERT_TRUE(session.ok()) << session.status();
  const SessionSummary summary = (*session)->Summary();
  ASSERT_EQ(summary.attention.size(), 2u);
  EXPECT_EQ(summary.attention[0].layer, "dec.self_attention.core_attention");
  EXPECT_EQ(summary.attention[1].layer, "dec.inter_attention.core_attention");
  for (const layers::AttentionPathInfo& a : summary.attention) {
    EXPECT_EQ(a.path, "cpu_reference") << a.layer;
    EXPECT_THAT(a.reason, ::testing::HasSubstr("FP64")) << a.layer;
  }
  auto linear_only = Session::Create(Model(), v1::RecipeSpec(), Sgd(), Context());
  ASSERT_TRUE(linear_only.ok());
  EXPECT_TRUE((*linear_only)->Summary().attention.empty());
}

TEST(Session, HandlesAreSingleUseAndUnknownOnesAreNotFound) {
  auto session = MakeSession();
  auto fwd = session->Forward({Random({2, 8}, 1)}, true).value();
  const Tensor dy = Random({2, 4}, 2);
  auto unknown = session->Backward(fwd.handle + 100, {dy});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("no activation handle"));
  ASSERT_TRUE(session->Backward(fwd.handle, {dy}).ok());
  auto again = session->Backward(fwd.handle, {dy});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("already used"));
}

TEST(Session, BadGradientKeepsTheHandleAndChangesNothing) {
  auto session = MakeSession();
  auto fwd = session->Forward({Random({2, 8}, 1)}, true).value();
  const auto before = session->GetGradients({}).value();
  auto bad = session->Backward(fwd.handle, {Random({2, 5}, 2)});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("grad_outputs[0].shape: expected [2, 4] (the shape of forward output 0), got [2, 5]"));
  ExpectSameParameters(before, session->GetGradients({}).value());
  EXPECT_TRUE(session->Backward(fwd.handle, {Random({2, 4}, 2)}).ok());
}

TEST(Session, BadInputChangesNoState) {
  auto session = MakeSession();
  const auto quant_before = session->QuantizationState();
  auto bad = session->Forward({Random({3, 7}, 1)}, true);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("inputs[0].shape: expected last dimension 8 (hidden_size of layer 'layers.0'), got [3, 7]"));
  EXPECT_EQ(session->Summary().live_handles, 0);
  const auto quant_after = session->QuantizationState();
  ASSERT_EQ(quant_before.size(), quant_after.size());
  for (size_t i = 0; i < quant_before.size(); ++i) {
    EXPECT_EQ(quant_before[i].quantize_calls, quant_after[i].quantize_calls);
    EXPECT_EQ(quant_before[i].amax_history, quant_after[i].amax_history);
  }
  auto two = session->Forward({Random({3, 8}, 1), Random({3, 8}, 2)}, true);
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("inputs: expected 1 tensor, got 2"));
  Tensor int_input = Tensor::Zeros(DType::kInt32, {3, 8}).value();
  auto wrong_dtype = session->Forward({int_input}, true);
  EXPECT_THAT(std::string(wrong_dtype.status().message()), HasSubstr("inputs[0].dtype: expected FLOAT32, got INT32"));
}

TEST(Session, MicrobatchesMayPrecedeTheirBackwards) {
  auto session = MakeSession();
  auto f1 = session->Forward({Random({2, 8}, 1)}, true).value();
  auto f2 = session->Forward({Random({5, 8}, 2)}, true).value();
  EXPECT_NE(f1.handle, f2.handle);
  EXPECT_EQ(session->Summary().live_handles, 2);
  EXPECT_EQ(session->Backward(f2.handle, {Random({5, 4}, 3)}).value()[0].shape(), (Shape{5, 8}));
  EXPECT_EQ(session->Backward(f1.handle, {Random({2, 4}, 4)}).value()[0].shape(), (Shape{2, 8}));
  EXPECT_EQ(session->Summary().live_handles, 0);
}

TEST(Session, StateBytesCountParametersGradientsAndOptimizerState) {
  // LayerNorm(8): gamma, beta; Linear(8 -> 4): weight, bias. 8 + 8 + 32 + 4 = 52 FP32
  // values, each with its gradient; AdamW adds two moments once it has stepped.
  v1::OptimizerSpec adamw;
  adamw.mutable_adamw()->set_lr(1e-3f);
  auto session = MakeSession(Delayed(), adamw);
  EXPECT_EQ(session->Summary().state_bytes, 2 * 52 * 4);
  auto fwd = session->Forward({Random({2, 8}, 1)}, true).value();
  ASSERT_TRUE(session->Backward(fwd.handle, {Random({2, 4}, 2)}).ok());
  ASSERT_TRUE(session->Step().ok());
  EXPECT_EQ(session->Summary().state_bytes, 4 * 52 * 4);
  EXPECT_EQ(session->Summary().device, "cpu");
  EXPECT_EQ(session->Summary().device_note, "");
}

TEST(Session, NoGradForwardReturnsNoHandle) {
  auto session = MakeSession();
  auto fwd = session->Forward({Random({2, 8}, 1)}, false).value();
  EXPECT_EQ(fwd.handle, 0u);
  EXPECT_EQ(session->Summary().live_handles, 0);
}

TEST(Session, SetParametersIsAllOrNothing) {
  auto session = MakeSession();
  const auto before = Params(*session);
  std::vector<NamedTensor> update = {{"fc.bias", Random({4}, 1)}, {"fc.weight", Random({4, 7}, 2)}};
  auto status = session->SetParameters(update);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("parameters[1].tensor.shape: expected [4, 8] (shape of 'fc.weight'), got [4, 7]"));
  ExpectSameParameters(before, Params(*session));

  auto unknown = session->SetParameters({{"nope", Random({4}, 1)}});
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("no parameter named 'nope'"));

  const Tensor bias = Random({4}, 9);
  ASSERT_TRUE(session->SetParameters({{"fc.bias", bias}}).ok());
  EXPECT_TRUE(BitwiseEqual(session->GetParameters({"fc.bias"}).value()[0].tensor, bias));
}

TEST(Session, GetParametersRejectsRepeatedNamesAndReportsLayouts) {
  auto session = MakeSession();
  auto repeated = session->GetParameters({"fc.bias", "fc.weight", "fc.bias"});
  EXPECT_EQ(repeated.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(repeated.status().message()),
              HasSubstr("names[2]: expected each parameter at most once, got 'fc.bias' again"));
  EXPECT_EQ(session->GetGradients({"fc.weight", "fc.weight"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(session->Layouts({"fc.weight", "fc.weight"}, false).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto layouts = session->Layouts({"fc.weight"}, /*grads=*/true);
  ASSERT_TRUE(layouts.ok()) << layouts.status();
  ASSERT_EQ(layouts->size(), 1u);
  EXPECT_EQ((*layouts)[0].name, "fc.weight");
  EXPECT_EQ((*layouts)[0].shape, (Shape{4, 8}));
  EXPECT_EQ((*layouts)[0].nbytes, 4 * 8 * 4);
  auto all = session->Layouts({}, /*grads=*/false);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), Params(*session).size());

  // An unknown name is quoted truncated, with its length.
  const std::string huge(200000, 'x');
  auto unknown = session->GetParameters({huge});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_LT(unknown.status().message().size(), 1024u);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("...' (200000 bytes)"));
}

TEST(Session, StepSkipsNonFiniteGradients) {
  auto session = MakeSession();
  auto fwd = session->Forward({Random({2, 8}, 1)}, true).value();
  Tensor dy = Random({2, 4}, 2);
  dy.mutable_floats()[0] = NAN;
  ASSERT_TRUE(session->Backward(fwd.handle, {dy}).ok());
  const auto before = Params(*session);
  auto step = session->Step().value();
  EXPECT_TRUE(step.skipped);
  EXPECT_EQ(step.step, 0);
  ExpectSameParameters(before, Params(*session));
}

TEST(Session, ClipsTheGlobalGradientNorm) {
  v1::OptimizerSpec clipped = Sgd(1.0f);
  clipped.set_max_grad_norm(0.01f);
  auto session = MakeSession(v1::RecipeSpec(), clipped);
  auto fwd = session->Forward({Random({4, 8}, 1)}, true).value();
  ASSERT_TRUE(session->Backward(fwd.handle, {Random({4, 4}, 2)}).ok());
  const auto before = Params(*session);
  auto step = session->Step().value();
  EXPECT_GT(step.grad_norm, 0.01f);
  // With lr 1, the parameters moved by exactly the clipped gradient: norm 0.01.
  double moved = 0.0;
  const auto after = Params(*session);
  for (size_t i = 0; i < before.size(); ++i) {
    for (int64_t k = 0; k < before[i].tensor.numel(); ++k) {
      const double d = after[i].tensor.floats()[k] - before[i].tensor.floats()[k];
      moved += d * d;
    }
  }
  EXPECT_NEAR(std::sqrt(moved), 0.01, 1e-5);
}

TEST(Session, DelayedScalingUpdatesForwardAndBackwardRegionsSeparately) {
  auto session = MakeSession(Delayed(4));
  auto state = session->QuantizationState();
  ASSERT_EQ(state.size(), 3u);
  EXPECT_EQ(state[0].layer, "fc");
  EXPECT_EQ(state[0].tensor, "input");
  EXPECT_EQ(state[1].tensor, "weight");
  EXPECT_EQ(state[2].tensor, "grad_output");
  EXPECT_EQ(state[2].format, DType::kFloat8E5M2);
  EXPECT_EQ(state[0].execution, "emulated");

  auto fwd = session->Forward({Random({2, 8}, 1)}, true).value();
  state = session->QuantizationState();
  EXPECT_EQ(state[0].amax_history[0], 0.0f);  // rolled at the end of the forward region
  EXPECT_EQ(state[0].amax_history[3], state[0].amax);
  EXPECT_EQ(state[0].scale, 448.0f / state[0].amax);
  EXPECT_EQ(state[2].quantize_calls, 0);
  EXPECT_EQ(state[2].scale, 1.0f);

  ASSERT_TRUE(session->Backward(fwd.handle, {Random({2, 4}, 2, 0.01f)}).ok());
  state = session->QuantizationState();
  EXPECT_EQ(state[2].quantize_calls, 1);
  EXPECT_EQ(state[2].amax_history[3], state[2].amax);
  EXPECT_EQ(state[2].scale, 57344.0f / state[2].amax);
}

TEST(Session, RejectsInvalidSpecsWithTheFieldName) {
  v1::RecipeSpec recipe;
  recipe.mutable_delayed()->set_amax_history_len(0);
  auto bad_recipe = Session::Create(Model(), recipe, Sgd(), Context());
  EXPECT_THAT(std::string(bad_recipe.status().message()), HasSubstr("recipe.delayed.amax_history_len"));
  auto empty = Session::Create(v1::ModelSpec(), Delayed(), Sgd(), Context());
  EXPECT_THAT(std::string(empty.status().message()), HasSubstr("model.layers: expected at least one layer"));
  auto no_opt = Session::Create(Model(), Delayed(), v1::OptimizerSpec(), Context());
  EXPECT_THAT(std::string(no_opt.status().message()), HasSubstr("optimizer: expected one of sgd, adamw"));
}

TEST(Session, RejectsRecipesWhoseBlocksDoNotTileTheModel) {
  v1::RecipeSpec mxfp8;
  mxfp8.mutable_mxfp8();
  auto a = Session::Create(Model(), mxfp8, Sgd(), Context());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(a.status().message()),
              HasSubstr("model.layers[1].linear.in_features: expected a multiple of 32 (mxfp8 blocks must tile it), got 8"));
  v1::RecipeSpec nvfp4;
  nvfp4.mutable_nvfp4();
  auto b = Session::Create(Model(), nvfp4, Sgd(), Context());
  EXPECT_THAT(std::string(b.status().message()), HasSubstr("expected a multiple of 16 (nvfp4 blocks must tile it)"));
  v1::RecipeSpec block;
  block.mutable_block()->set_x_block_scaling_dim(2);
  auto c = Session::Create(Model(), block, Sgd(), Context());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("recipe.block.x_block_scaling_dim: expected 1 (inputs use 1x128 blocks), got 2"));
  block.mutable_block()->set_x_block_scaling_dim(1);
  block.mutable_block()->set_w_block_scaling_dim(3);
  auto d = Session::Create(Model(), block, Sgd(), Context());
  EXPECT_THAT(std::string(d.status().message()), HasSubstr("recipe.block.w_block_scaling_dim: expected 1 (1x128) or 2"));
  v1::RecipeSpec e5m2;
  e5m2.mutable_current()->set_fp8_format(v1::E5M2);
  auto e = Session::Create(Model(), e5m2, Sgd(), Context());
  EXPECT_THAT(std::string(e.status().message()), HasSubstr("pure E5M2 is not supported"));
}

TEST(Session, ReportsBlockRecipesAndHealthStatistics) {
  v1::ModelSpec model;
  auto* fc = model.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(32);
  fc->mutable_linear()->set_out_features(32);
  v1::RecipeSpec recipe;
  recipe.mutable_nvfp4()->set_disable_stochastic_rounding(true);
  recipe.set_fp8_health_stats(true);
  auto session = Session::Create(model, recipe, Sgd(), Context()).value();
  auto fwd = session->Forward({Random({16, 32}, 1)}, true).value();
  ASSERT_TRUE(session->Backward(fwd.handle, {Random({16, 32}, 2)}).ok());
  const auto state = session->QuantizationState();
  ASSERT_EQ(state.size(), 3u);
  for (const QuantizerReport& r : state) {
    EXPECT_EQ(r.recipe, "nvfp4");
    EXPECT_EQ(r.format, DType::kFloat4E2M1);
    EXPECT_TRUE(r.block_scales.valid) << r.tensor;
    EXPECT_GT(r.block_scales.max, 0.0) << r.tensor;
    ASSERT_TRUE(r.health.valid) << r.tensor;
    EXPECT_GT(r.health.mse, 0.0) << r.tensor;
    EXPECT_EQ(r.health.overflow_ratio, 0.0) << r.tensor;  // scales come from the tensor itself
  }
  EXPECT_EQ(state[1].scaling_mode, "nvfp4_2d");  // weights use 16x16 blocks
  EXPECT_EQ(state[0].scaling_mode, "nvfp4_1d");
}

}  // namespace
}  // namespace train
}  // namespace teserve
