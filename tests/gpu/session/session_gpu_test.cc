// A session on cuda:0 against the same session on the CPU reference: the demo's MLP
// (LayerNorm -> Linear -> RMSNorm -> Linear) under no recipe, FP8 delayed and current
// scaling and FP8 block scaling (native block-scaled cuBLASLt GEMMs on sm_90), trained a few steps with ForwardBackward + Step (AdamW, clipping) and with
// Forward / Backward. Unquantized, losses, outputs, input and parameter gradients and
// parameters agree within the FP32 tolerance over every step; under FP8 the first
// step agrees value by value (but for neighbouring-code flips) with equal scales, and
// the losses of the following steps stay close. Also: where the session lives, and a
// model without a GPU path staying on the CPU with the layer named.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "layers/init.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

using ::teserve::testing_kernels::AllClose;

constexpr int64_t kTokens = 64;
constexpr int64_t kHidden = 64;
constexpr int64_t kFfn = 96;

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, std, t.mutable_floats());
  return t;
}

v1::ModelSpec Mlp() {
  v1::ModelSpec spec;
  spec.set_seed(11);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(kHidden);
  auto* fc1 = spec.add_layers();
  fc1->set_name("fc1");
  fc1->mutable_linear()->set_in_features(kHidden);
  fc1->mutable_linear()->set_out_features(kFfn);
  fc1->mutable_linear()->set_init_std(0.1f);
  spec.add_layers()->mutable_rms_norm()->set_hidden_size(kFfn);
  auto* fc2 = spec.add_layers();
  fc2->set_name("fc2");
  fc2->mutable_linear()->set_in_features(kFfn);
  fc2->mutable_linear()->set_out_features(kHidden);
  fc2->mutable_linear()->set_init_std(0.1f);
  return spec;
}

v1::OptimizerSpec AdamW() {
  v1::OptimizerSpec spec;
  spec.mutable_adamw()->set_lr(1e-2f);
  spec.set_max_grad_norm(0.5f);
  return spec;
}

struct RecipeCase {
  std::string name;
  v1::RecipeSpec recipe;
};

std::vector<RecipeCase> Recipes() {
  std::vector<RecipeCase> cases;
  cases.push_back({"none", v1::RecipeSpec()});
  v1::RecipeSpec delayed;
  delayed.mutable_delayed()->set_amax_history_len(4);
  cases.push_back({"delayed", delayed});
  v1::RecipeSpec current;
  current.mutable_current();
  cases.push_back({"current", current});
  v1::RecipeSpec block;
  block.mutable_block();  // x and dy 1x128, W 128x128: every GEMM of the MLP native on sm_90
  cases.push_back({"block", block});
  return cases;
}

Context GpuContext() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

std::vector<double> Doubles(const Tensor& t) { return std::vector<double>(t.floats().begin(), t.floats().end()); }

// Unquantized: the GPU's GEMMs and reductions add in another order, so values agree to
// a few ulps of the terms' magnitude, compounded over the layers and steps; judged by
// the BF16 row (rtol 1e-2) against |want| + 1e-2.
::testing::AssertionResult Close(const Tensor& got, const Tensor& want) {
  std::vector<double> magnitude;
  for (float v : want.floats()) magnitude.push_back(std::fabs(v) + 1e-2);
  return AllClose(got.floats(), Doubles(want), DType::kBFloat16, magnitude);
}

// FP8 recipes: a value whose FP32 sum lands on the other side of a rounding boundary
// takes the neighbouring code (one E4M3 step is 12.5%, one E5M2 step 25%), and the
// next layers carry that element's difference on. So one forward and backward from
// the same state agree by the FP8 row for all but a small share of the values:
// kMaxFlippedShare of them may be off.
constexpr double kMaxFlippedShare = 0.01;

::testing::AssertionResult MostlyClose(const Tensor& got, const Tensor& want) {
  const auto tol = testing_kernels::ToleranceFor(DType::kFloat8E4M3);
  int64_t off = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.floats()[i];
    if (std::fabs(got.floats()[i] - w) > tol.atol + tol.rtol * (std::fabs(w) + 1e-2)) ++off;
  }
  if (off <= kMaxFlippedShare * want.numel()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << off << " of " << want.numel() << " values off by more than the FP8 row";
}

// Quantized training on two backends then diverges chaotically (AdamW turns small
// gradient differences into unit-size steps). Over a few steps the losses stay within
// this relative drift of each other; the unquantized sessions are held to 1e-4.
constexpr double kFp8TrainingDrift = 5e-2;

class SessionGpu : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(SessionGpu, TrainsLikeTheCpuReference) {
  TESERVE_SKIP_WITHOUT_GPU();
  const RecipeCase& c = GetParam();
  const bool fp8 = c.name != "none";
  auto cpu = Session::Create(Mlp(), c.recipe, AdamW(), Context::Cpu());
  auto gpu = Session::Create(Mlp(), c.recipe, AdamW(), GpuContext());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->Summary().device, "cuda:0");
  EXPECT_EQ((*gpu)->Summary().device_note, "");
  EXPECT_EQ((*gpu)->Summary().state_bytes, (*cpu)->Summary().state_bytes);

  LossOptions mse;
  mse.kind = LossOptions::Kind::kMse;
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const Tensor x = Random({kTokens, kHidden}, 100 + step);
    const Tensor target = Random({kTokens, kHidden}, 200 + step, 0.5f);
    auto want = (*cpu)->ForwardBackward({x}, {}, mse, target, true, true);
    auto got = (*gpu)->ForwardBackward({x}, {}, mse, target, true, true);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->outputs.size(), 1u);
    EXPECT_TRUE(got->outputs[0].device().is_cpu());
    if (!fp8) {
      EXPECT_NEAR(got->loss, want->loss, 1e-4 * want->loss);
      EXPECT_TRUE(Close(got->outputs[0], want->outputs[0]));
      EXPECT_TRUE(Close(got->grad_inputs[0], want->grad_inputs[0]));
    } else if (step == 0) {
      // The same state on both sides: one forward and backward.
      const double fp8_rtol = testing_kernels::ToleranceFor(DType::kFloat8E4M3).rtol;
      EXPECT_NEAR(got->loss, want->loss, fp8_rtol * want->loss);
      EXPECT_TRUE(MostlyClose(got->outputs[0], want->outputs[0]));
      EXPECT_TRUE(MostlyClose(got->grad_inputs[0], want->grad_inputs[0]));
      auto want_grads = (*cpu)->GetGradients({});
      auto got_grads = (*gpu)->GetGradients({});
      ASSERT_TRUE(want_grads.ok() && got_grads.ok());
      for (size_t i = 0; i < got_grads->size(); ++i) {
        EXPECT_TRUE(MostlyClose((*got_grads)[i].tensor, (*want_grads)[i].tensor)) << (*want_grads)[i].name;
      }
      const std::vector<QuantizerReport> want_q = (*cpu)->QuantizationState();
      const std::vector<QuantizerReport> got_q = (*gpu)->QuantizationState();
      ASSERT_EQ(got_q.size(), want_q.size());
      for (size_t i = 0; i < got_q.size(); ++i) {
        SCOPED_TRACE(got_q[i].layer + " " + got_q[i].tensor);
        EXPECT_NEAR(got_q[i].amax, want_q[i].amax, fp8_rtol * want_q[i].amax);
        EXPECT_NEAR(got_q[i].scale, want_q[i].scale, fp8_rtol * want_q[i].scale);
        EXPECT_EQ(got_q[i].execution, "native") << "per-tensor and block-scaled FP8 GEMMs read the codes on sm_90";
        EXPECT_EQ(want_q[i].execution, "emulated");
      }
    } else {
      EXPECT_NEAR(got->loss, want->loss, kFp8TrainingDrift * want->loss);
    }
    auto want_step = (*cpu)->Step();
    auto got_step = (*gpu)->Step();
    ASSERT_TRUE(want_step.ok() && got_step.ok());
    EXPECT_NEAR(got_step->grad_norm, want_step->grad_norm, (fp8 ? kFp8TrainingDrift : 1e-4) * want_step->grad_norm);
    EXPECT_EQ(got_step->step, want_step->step);
    ASSERT_TRUE((*cpu)->ZeroGrad().ok());
    ASSERT_TRUE((*gpu)->ZeroGrad().ok());
  }

  // Forward / Backward with the client's gradient, then the parameters: equal within
  // the FP32 tolerance when unquantized; FP8 training has drifted apart by now.
  const Tensor x = Random({kTokens, kHidden}, 300);
  const Tensor dy = Random({kTokens, kHidden}, 301, 0.1f);
  auto want_fwd = (*cpu)->Forward({x}, true);
  auto got_fwd = (*gpu)->Forward({x}, true);
  ASSERT_TRUE(want_fwd.ok() && got_fwd.ok());
  if (!fp8) EXPECT_TRUE(Close(got_fwd->outputs[0], want_fwd->outputs[0]));
  auto want_dx = (*cpu)->Backward(want_fwd->handle, {dy});
  auto got_dx = (*gpu)->Backward(got_fwd->handle, {dy});
  ASSERT_TRUE(want_dx.ok()) << want_dx.status();
  ASSERT_TRUE(got_dx.ok()) << got_dx.status();
  if (!fp8) EXPECT_TRUE(Close((*got_dx)[0], (*want_dx)[0]));

  auto want_params = (*cpu)->GetParameters({});
  auto got_params = (*gpu)->GetParameters({});
  ASSERT_TRUE(want_params.ok() && got_params.ok());
  ASSERT_EQ(got_params->size(), want_params->size());
  for (size_t i = 0; i < got_params->size(); ++i) {
    EXPECT_EQ((*got_params)[i].name, (*want_params)[i].name);
    EXPECT_TRUE((*got_params)[i].tensor.device().is_cpu());
    if (!fp8) EXPECT_TRUE(Close((*got_params)[i].tensor, (*want_params)[i].tensor)) << (*want_params)[i].name;
  }
  auto want_grads = (*cpu)->GetGradients({});
  auto got_grads = (*gpu)->GetGradients({});
  ASSERT_TRUE(want_grads.ok() && got_grads.ok());
  for (size_t i = 0; i < got_grads->size(); ++i) {
    if (!fp8) EXPECT_TRUE(Close((*got_grads)[i].tensor, (*want_grads)[i].tensor)) << (*want_grads)[i].name;
  }
  // After training the optimizer state lives on the device too.
  EXPECT_EQ((*gpu)->Summary().state_bytes, (*cpu)->Summary().state_bytes);
  EXPECT_GT((*gpu)->Summary().state_bytes, 0);

  // SetParameters writes the device copy: reading it back gives the bytes sent.
  std::vector<NamedTensor> update{{(*want_params)[1].name, Random((*want_params)[1].tensor.shape(), 400)}};
  ASSERT_TRUE((*gpu)->SetParameters(update).ok());
  auto read_back = (*gpu)->GetParameters({update[0].name});
  ASSERT_TRUE(read_back.ok());
  EXPECT_TRUE(BitwiseEqual((*read_back)[0].tensor, update[0].tensor));
}

INSTANTIATE_TEST_SUITE_P(Recipes, SessionGpu, ::testing::ValuesIn(Recipes()),
                         [](const ::testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

TEST(SessionGpuPlacement, AModelWithoutAGpuPathStaysOnTheCpuAndSaysWhy) {
  TESERVE_SKIP_WITHOUT_GPU();
  v1::ModelSpec spec;
  auto* attention = spec.add_layers();
  attention->set_name("attn");
  attention->mutable_dot_product_attention()->set_num_attention_heads(2);
  attention->mutable_dot_product_attention()->set_kv_channels(8);
  auto session = Session::Create(spec, v1::RecipeSpec(), AdamW(), GpuContext());
  ASSERT_TRUE(session.ok()) << session.status();
  const SessionSummary summary = (*session)->Summary();
  EXPECT_EQ(summary.device, "cpu");
  EXPECT_NE(summary.device_note.find("layer 'attn' (DotProductAttention) has no cuda:0 path yet"), std::string::npos)
      << summary.device_note;

  v1::RecipeSpec mxfp8;
  mxfp8.mutable_mxfp8();
  auto block = Session::Create(Mlp(), mxfp8, AdamW(), GpuContext());
  ASSERT_TRUE(block.ok()) << block.status();
  EXPECT_EQ((*block)->Summary().device, "cpu");
  EXPECT_NE((*block)->Summary().device_note.find("recipe: 'mxfp8' has no cuda:0 path yet"), std::string::npos);
}

}  // namespace
}  // namespace train
}  // namespace teserve
