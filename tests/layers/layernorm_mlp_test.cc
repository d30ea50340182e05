// LayerNormMLP: finite-difference gradient checks per activation and per option family,
// bitwise equality with Normalization -> Linear -> activation -> Linear under every
// recipe, checkpoint (recompute) bit-exact with the saving path including quantizer
// state, FP64 references on dequantized operands within TE's tolerances, and spec
// validation through BuildStack.
#include "layers/layernorm_mlp.h"

#include <cmath>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "kernels/elementwise.h"
#include "kernels/normalization.h"
#include "layers/layernorm_linear.h"
#include "layers/layernorm_spec.h"
#include "layers/linear.h"
#include "layers/normalization.h"
#include "layers/spec.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/recipe_reference.h"

namespace teserve {
namespace layers {
namespace {

using kernels::Activation;
using kernels::Copy;
using recipes::TensorRole;
using testing::ElementsAre;
using testing::HasSubstr;
using testing_util::At;
using testing_util::CheckGradients;
using testing_util::EndRegion;
using testing_util::ExpectClose;
using testing_util::ExpectSameQuantizerState;
using testing_util::MakeRecipe;
using testing_util::MatMul;
using testing_util::ParameterNames;
using testing_util::QuantizedReference;
using testing_util::RandomizeParameters;
using testing_util::RandomTensor;
using testing_util::RecipeCase;
using testing_util::Tolerance;

constexpr Activation kAllActivations[] = {
    Activation::kGelu,  Activation::kGeglu,  Activation::kQgelu,  Activation::kQgeglu,
    Activation::kRelu,  Activation::kReglu,  Activation::kSrelu,  Activation::kSreglu,
    Activation::kSilu,  Activation::kSwiglu, Activation::kClampedSwiglu,
};

LayerNormMLPOptions Options(int64_t hidden, int64_t ffn, Activation activation) {
  LayerNormMLPOptions o;
  o.hidden_size = hidden;
  o.ffn_hidden_size = ffn;
  o.activation = activation;
  o.init_std = 0.5f;
  o.seed = 3;
  return o;
}

// ---- Finite differences ---------------------------------------------------------------------

struct GradCase {
  std::string name;
  LayerNormMLPOptions options;
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

std::vector<GradCase> GradCases() {
  std::vector<GradCase> cases;
  for (Activation a : kAllActivations) cases.push_back({std::string(kernels::ActivationName(a)), Options(8, 6, a)});
  auto with = [&](std::string name, Activation a, const std::function<void(LayerNormMLPOptions*)>& change) {
    GradCase c{std::move(name), Options(8, 6, a)};
    change(&c.options);
    cases.push_back(c);
  };
  with("RMSNorm_NoBias_swiglu", Activation::kSwiglu, [](LayerNormMLPOptions* o) {
    o->normalization = NormKind::kRmsNorm;
    o->bias = false;
  });
  with("ZeroCenteredGamma_gelu", Activation::kGelu, [](LayerNormMLPOptions* o) { o->zero_centered_gamma = true; });
  with("ReturnBias_qgelu", Activation::kQgelu, [](LayerNormMLPOptions* o) { o->return_bias = true; });
  with("ReturnLayernormOutput_silu", Activation::kSilu,
       [](LayerNormMLPOptions* o) { o->return_layernorm_output = true; });
  with("ReturnBoth_geglu", Activation::kGeglu, [](LayerNormMLPOptions* o) {
    o->return_bias = true;
    o->return_layernorm_output = true;
  });
  with("Checkpoint_gelu", Activation::kGelu, [](LayerNormMLPOptions* o) { o->checkpoint = true; });
  with("Checkpoint_ReturnBoth_swiglu", Activation::kSwiglu, [](LayerNormMLPOptions* o) {
    o->checkpoint = true;
    o->return_bias = true;
    o->return_layernorm_output = true;
  });
  with("ClampedSwiglu_Limit1p5_Alpha1", Activation::kClampedSwiglu, [](LayerNormMLPOptions* o) {
    o->activation_params.limit = 1.5f;
    o->activation_params.alpha = 1.0f;
  });
  return cases;
}

class LayerNormMLPGradTest : public testing::TestWithParam<GradCase> {};

TEST_P(LayerNormMLPGradTest, MatchesFiniteDifferences) {
  auto layer = LayerNormMLP::Create("mlp", GetParam().options, recipes::Recipe()).value();
  RandomizeParameters(*layer, 40);
  CheckGradients(*layer, {RandomTensor({2, 3, 8}, 11)});
}

INSTANTIATE_TEST_SUITE_P(ActivationsAndOptions, LayerNormMLPGradTest, testing::ValuesIn(GradCases()),
                         [](const testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// ---- Recipes ----------------------------------------------------------------------------

class LayerNormMLPRecipeTest : public testing::TestWithParam<RecipeCase> {};

// x [rows, cols] FP32 quantized by the plain kernels as `plan` says (both copies).
QuantizedTensor QuantizeAs(const recipes::FusedCast& plan, const Tensor& x) {
  if (plan.mode == ScalingMode::kPerTensor) {
    kernels::PerTensorQuantizeOptions options;
    options.format = plan.format;
    options.scale = plan.scale;
    options.rowwise = true;
    options.columnwise = true;
    return kernels::QuantizePerTensor(Context(), x, options).value();
  }
  kernels::Mxfp8QuantizeOptions options;
  options.format = plan.format;
  options.rowwise = true;
  options.columnwise = true;
  return kernels::QuantizeMxfp8(Context(), x, options).value();
}

// The layer computes bitwise what its parts compute in sequence, for two steps with
// the session's region ends in between, in FP32 and in the 16-bit params_dtypes (the
// parts in that dtype: the norm's output, both Linears, the activation reading and
// writing 16-bit values, the returned ln_out's gradient added in FP32). Where a Linear's
// input cast can be fused into the kernel that produces the input (PlanInputCast:
// delayed scaling and MXFP8 for fc1, delayed scaling for fc2), the part quantizes the
// producer's FP32 output with the plain quantize kernel under that plan and hands the
// copies to ForwardQuantizedInput; in FP32 that is the unfused computation itself.
TEST_P(LayerNormMLPRecipeTest, EqualsItsPartsBitwise) {
  const recipes::Recipe& recipe = GetParam().recipe;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (Activation activation : {Activation::kGelu, Activation::kSwiglu}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", kernels::ActivationName(activation)));
      LayerNormMLPOptions o = Options(64, 32, activation);
      o.return_layernorm_output = true;
      o.params_dtype = dtype;
      auto mlp = LayerNormMLP::Create("mlp", o, recipe).value();
      RandomizeParameters(*mlp, 5);
      auto norm = CreateLayerNorm("norm", NormKind::kLayerNorm, 64, 1e-5f, false, dtype).value();
      // With a fused fc1 input cast in 16 bits the part is the same norm writing FP32
      // (what the fused cast quantizes); its backward depends on x's dtype only.
      auto norm32 = CreateLayerNorm("norm", NormKind::kLayerNorm, 64, 1e-5f, false, DType::kFloat32).value();
      const int64_t width = kernels::ActivationInputWidth(activation, 32);
      LinearOptions l1;
      l1.in_features = 64;
      l1.out_features = width;
      l1.params_dtype = dtype;
      auto fc1 = Linear::Create("mlp.fc1", l1, recipe).value();
      // gelu, 16 bits, no quantizer: the layer's fc1 applies the gelu in its GEMM's
      // epilogue (the part's does too; the activation kernel then has no forward to run).
      const bool gelu_epilogue =
          activation == Activation::kGelu && dtype != DType::kFloat32 && fc1->Quantizers().empty();
      if (gelu_epilogue) ASSERT_TRUE(fc1->set_fprop_gelu(true).ok());
      LinearOptions l2;
      l2.in_features = 32;
      l2.out_features = 64;
      l2.params_dtype = dtype;
      auto fc2 = Linear::Create("mlp.fc2", l2, recipe).value();
      const bool fused16 = fc1->PlanInputCast(32, ForwardOptions()).has_value() && dtype != DType::kFloat32;
      Normalization* part_norm = fused16 ? norm32.get() : norm.get();
      std::vector<Parameter*> parts = part_norm->Parameters();
      for (Parameter* p : fc1->Parameters()) parts.push_back(p);
      for (Parameter* p : fc2->Parameters()) parts.push_back(p);
      std::vector<Parameter*> whole = mlp->Parameters();
      ASSERT_EQ(parts.size(), whole.size());
      for (size_t i = 0; i < parts.size(); ++i) parts[i]->value = whole[i]->value.Clone().value();
      const kernels::ActivationParams params;
      kernels::ActivationForwardOptions act_options;
      act_options.y_dtype = dtype;

      for (int step = 0; step < 2; ++step) {
        const Tensor x = RandomTensor({32, 64}, 20 + step);
        const Tensor dy = RandomTensor({32, 64}, 30 + step);
        const Tensor d_ln = RandomTensor({32, 64}, 40 + step, 0.1f);
        auto m_out = mlp->Forward(Context(), {x}, ForwardOptions()).value();
        EndRegion(*mlp, true);
        const std::optional<recipes::FusedCast> plan1 = fc1->PlanInputCast(32, ForwardOptions());
        ForwardOutput n_out, h1, h2;
        if (fused16) {
          n_out = norm32->Forward(Context(), {x}, ForwardOptions()).value();
          h1 = fc1->ForwardQuantizedInput(Context(), QuantizeAs(*plan1, n_out.outputs[0]), {32, 64}, dtype,
                                          ForwardOptions())
                   .value();
          n_out.outputs[0] = kernels::Convert(Context(), n_out.outputs[0], dtype).value();
        } else {
          n_out = norm->Forward(Context(), {x}, ForwardOptions()).value();
          h1 = fc1->Forward(Context(), {n_out.outputs[0]}, ForwardOptions()).value();
        }
        const std::optional<recipes::FusedCast> plan2 = fc2->PlanInputCast(32, ForwardOptions());
        // fc1_out, the activation's input and its backward's.
        const Tensor pre_activation = gelu_epilogue ? h1.outputs.back() : h1.outputs[0];
        if (gelu_epilogue) {
          h2 = fc2->Forward(Context(), {h1.outputs[0]}, ForwardOptions()).value();
        } else if (plan2.has_value() && plan2->mode == ScalingMode::kPerTensor && dtype != DType::kFloat32) {
          kernels::ActivationForwardOptions act32;
          act32.y_dtype = DType::kFloat32;
          const Tensor a32 =
              kernels::FusedActivationForward(Context(), activation, params, h1.outputs[0], act32).value().y;
          h2 = fc2->ForwardQuantizedInput(Context(), QuantizeAs(*plan2, a32), {32, 32}, dtype, ForwardOptions())
                   .value();
        } else {
          const Tensor act =
              kernels::FusedActivationForward(Context(), activation, params, h1.outputs[0], act_options).value().y;
          h2 = fc2->Forward(Context(), {act}, ForwardOptions()).value();
        }
        EndRegion(*fc1, true);
        EndRegion(*fc2, true);
        ASSERT_EQ(m_out.outputs.size(), 2u);
        EXPECT_EQ(m_out.outputs[0].dtype(), dtype);
        EXPECT_EQ(m_out.outputs[1].dtype(), dtype);
        EXPECT_TRUE(BitwiseEqual(m_out.outputs[0], h2.outputs[0]));
        EXPECT_TRUE(BitwiseEqual(m_out.outputs[1], n_out.outputs[0]));

        auto m_dx = mlp->Backward(Context(), *m_out.saved, {dy, d_ln}).value();
        EndRegion(*mlp, false);
        std::vector<Tensor> d_norm;
        if (gelu_epilogue) {
          // fc2's dgrad applies gelu' and sums fc1's bias gradient (kDGeluBGrad).
          Tensor fc1_bias_grad;
          const Tensor d_h1 =
              fc2->BackwardThroughGelu(Context(), *h2.saved, {dy}, pre_activation.As2D().value(), &fc1_bias_grad)
                  .value();
          EXPECT_EQ(fc1_bias_grad.dtype(), dtype);
          d_norm = fc1->BackwardWithBiasGrad(Context(), *h1.saved, {d_h1}, fc1_bias_grad).value();
        } else {
          auto d_act = fc2->Backward(Context(), *h2.saved, {dy}).value();
          const Tensor d_h1 = kernels::FusedActivationBackward(Context(), activation, params, d_act[0],
                                                               pre_activation, kernels::ActivationBackwardOptions())
                                  .value()
                                  .dx;
          d_norm = fc1->Backward(Context(), *h1.saved, {d_h1}).value();
        }
        EndRegion(*fc1, false);
        EndRegion(*fc2, false);
        Tensor d_ln_out = kernels::Convert(Context(), d_norm[0], DType::kFloat32).value();
        ASSERT_TRUE(kernels::AddInto(Context(), d_ln, &d_ln_out).ok());
        auto n_dx = part_norm->Backward(Context(), *n_out.saved, {d_ln_out}).value();
        EXPECT_EQ(m_dx[0].dtype(), DType::kFloat32);  // x's
        EXPECT_TRUE(BitwiseEqual(m_dx[0], n_dx[0]));
        for (size_t i = 0; i < parts.size(); ++i) EXPECT_TRUE(BitwiseEqual(whole[i]->grad, parts[i]->grad)) << i;

        std::vector<NamedQuantizer> pq = fc1->Quantizers();
        for (const NamedQuantizer& q : fc2->Quantizers()) pq.push_back(q);
        ExpectSameQuantizerState(mlp->Quantizers(), pq);
      }
    }
  }
}

// checkpoint = true recomputes ln_out and fc1_out in the backward. Two microbatches
// are in flight (forward, forward, backward, backward, with the session's region ends
// after each), so under delayed scaling the second forward quantizes with a newer
// scale than the first: the first backward's recomputation must use the first's. In
// FP32 and in the 16-bit params_dtypes (a 16-bit fc1_out recomputed from the 16-bit
// ln_out and the rounded W1).
TEST_P(LayerNormMLPRecipeTest, CheckpointIsBitExactWithSavedActivations) {
  const recipes::Recipe& recipe = GetParam().recipe;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (Activation activation : {Activation::kGelu, Activation::kSwiglu, Activation::kSreglu}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " ", kernels::ActivationName(activation)));
      LayerNormMLPOptions o = Options(64, 32, activation);
      o.return_layernorm_output = true;
      o.params_dtype = dtype;
      auto saving = LayerNormMLP::Create("mlp", o, recipe).value();
      o.checkpoint = true;
      auto recomputing = LayerNormMLP::Create("mlp", o, recipe).value();
      RandomizeParameters(*saving, 5);
      RandomizeParameters(*recomputing, 5);
      for (int step = 0; step < 2; ++step) {
        std::vector<ForwardOutput> a, b;
        for (int micro = 0; micro < 2; ++micro) {
          const Tensor x = RandomTensor({2, 16, 64}, 100 * step + micro, 1.0f + micro);
          a.push_back(saving->Forward(Context(), {x}, ForwardOptions()).value());
          EndRegion(*saving, true);
          b.push_back(recomputing->Forward(Context(), {x}, ForwardOptions()).value());
          EndRegion(*recomputing, true);
          for (size_t k = 0; k < 2; ++k) {
            EXPECT_EQ(b[micro].outputs[k].dtype(), dtype);
            EXPECT_TRUE(BitwiseEqual(a[micro].outputs[k], b[micro].outputs[k]));
          }
        }
        for (int micro = 0; micro < 2; ++micro) {
          const Tensor dy = RandomTensor({2, 16, 64}, 50 + 100 * step + micro);
          const Tensor d_ln = RandomTensor({2, 16, 64}, 60 + 100 * step + micro, 0.1f);
          auto da = saving->Backward(Context(), *a[micro].saved, {dy, d_ln}).value();
          EndRegion(*saving, false);
          auto db = recomputing->Backward(Context(), *b[micro].saved, {dy, d_ln}).value();
          EndRegion(*recomputing, false);
          EXPECT_TRUE(BitwiseEqual(da[0], db[0])) << kernels::ActivationName(activation) << " step " << step;
        }
        std::vector<Parameter*> pa = saving->Parameters(), pb = recomputing->Parameters();
        for (size_t i = 0; i < pa.size(); ++i) {
          EXPECT_TRUE(BitwiseEqual(pa[i]->grad, pb[i]->grad)) << pa[i]->name << " step " << step;
        }
        ExpectSameQuantizerState(*saving, *recomputing);
      }
      if (recipe.quantizes()) {
        // fc1's input quantizer ran once per forward (4), not again in the backwards.
        EXPECT_EQ(recomputing->Quantizers()[0].quantizer->Snapshot().quantize_calls, 4);
      }
    }
  }
}

// Reference of one step on dequantized operands, GEMMs in FP64. The element-wise stages
// (activation, normalization backward) run through their FP32 kernels, tested against
// closed forms in tests/kernels; `recipe` decides how each GEMM operand is quantized.
struct MlpReference {
  std::vector<double> y, dw1, dw2;
  std::vector<double> dx;
};

MlpReference ReferenceStep(const recipes::Recipe& recipe, Activation activation, const Tensor& x, const Tensor& ln,
                           const std::vector<Parameter*>& p, const Tensor& dy) {
  // p: gamma, beta, W1 [w1, h], b1, W2 [h, f], b2.
  const int64_t rows = x.dim(0), h = x.dim(1), f = p[4]->value.dim(1), w1 = p[2]->value.dim(0);
  const kernels::ActivationParams params;
  auto q = [&](TensorRole role, const Tensor& t, Copy copy) { return QuantizedReference(recipe, role, t, copy); };
  auto to_tensor = [](const std::vector<double>& v, Shape shape) {
    return Tensor::FromFloats(std::vector<float>(v.begin(), v.end()), std::move(shape)).value();
  };
  auto add_bias = [](std::vector<double>* v, const Tensor& b) {
    const int64_t n = b.numel();
    for (size_t i = 0; i < v->size(); ++i) (*v)[i] += b.floats()[i % n];
  };
  MlpReference r;
  const Tensor ln_row = q(TensorRole::kInput, ln, Copy::kRowwise), ln_col = q(TensorRole::kInput, ln, Copy::kColumnwise);
  const Tensor w1_row = q(TensorRole::kWeight, p[2]->value, Copy::kRowwise);
  const Tensor w1_col = q(TensorRole::kWeight, p[2]->value, Copy::kColumnwise);
  std::vector<double> fc1 = MatMul(rows, w1, h, At(ln_row, h), [&](int64_t k, int64_t j) { return At(w1_row, h)(j, k); });
  add_bias(&fc1, p[3]->value);
  const Tensor h1 = to_tensor(fc1, {rows, w1});
  const Tensor act = kernels::ActivationForward(Context(), activation, params, h1).value();
  const Tensor act_row = q(TensorRole::kInput, act, Copy::kRowwise);
  const Tensor act_col = q(TensorRole::kInput, act, Copy::kColumnwise);
  const Tensor w2_row = q(TensorRole::kWeight, p[4]->value, Copy::kRowwise);
  const Tensor w2_col = q(TensorRole::kWeight, p[4]->value, Copy::kColumnwise);
  r.y = MatMul(rows, h, f, At(act_row, f), [&](int64_t k, int64_t j) { return At(w2_row, f)(j, k); });
  add_bias(&r.y, p[5]->value);

  const Tensor dy_row = q(TensorRole::kGradOutput, dy, Copy::kRowwise);
  const Tensor dy_col = q(TensorRole::kGradOutput, dy, Copy::kColumnwise);
  const Tensor d_act =
      to_tensor(MatMul(rows, f, h, At(dy_row, h), [&](int64_t k, int64_t j) { return At(w2_col, h)(j, k); }), {rows, f});
  r.dw2 = MatMul(h, f, rows, At(dy_col, rows), [&](int64_t k, int64_t j) { return At(act_col, rows)(j, k); });
  const Tensor d_h1 = kernels::ActivationBackward(Context(), activation, params, d_act, h1).value();
  const Tensor dh_row = q(TensorRole::kGradOutput, d_h1, Copy::kRowwise);
  const Tensor dh_col = q(TensorRole::kGradOutput, d_h1, Copy::kColumnwise);
  const Tensor d_ln = to_tensor(
      MatMul(rows, h, w1, At(dh_row, w1), [&](int64_t k, int64_t j) { return At(w1_col, w1)(j, k); }), {rows, h});
  r.dw1 = MatMul(w1, h, rows, At(dh_col, rows), [&](int64_t k, int64_t j) { return At(ln_col, rows)(j, k); });
  auto stats = kernels::LayerNormForward(Context(), x, p[0]->value, p[1]->value, 1e-5f, false).value();
  auto grads = kernels::LayerNormBackward(Context(), d_ln, x, stats.mu, stats.rsigma, p[0]->value, false).value();
  r.dx.assign(grads.dx.floats().begin(), grads.dx.floats().end());
  return r;
}

double RmsDifference(const Tensor& got, const std::vector<double>& want) {
  double sum = 0.0;
  for (size_t i = 0; i < want.size(); ++i) sum += (got.floats()[i] - want[i]) * (got.floats()[i] - want[i]);
  return std::sqrt(sum / want.size());
}

TEST_P(LayerNormMLPRecipeTest, MatchesFp64ReferenceOnDequantizedOperands) {
  const RecipeCase& c = GetParam();
  for (Activation activation : {Activation::kGelu, Activation::kSwiglu}) {
    SCOPED_TRACE(kernels::ActivationName(activation));
    LayerNormMLPOptions o = Options(64, 32, activation);
    o.init_std = 0.3f;
    o.return_layernorm_output = true;  // to read ln_out; its gradient is 0 here
    auto layer = LayerNormMLP::Create("mlp", o, c.recipe).value();
    RandomizeParameters(*layer, 9);
    std::vector<Parameter*> p = layer->Parameters();
    const Tensor x = RandomTensor({32, 64}, 5);
    const Tensor dy = RandomTensor({32, 64}, 6);
    auto fwd = layer->Forward(Context(), {x}, ForwardOptions()).value();
    auto dx = layer->Backward(Context(), *fwd.saved, {dy, Tensor::Zeros(DType::kFloat32, {32, 64}).value()}).value();
    for (const Tensor* t : {&fwd.outputs[0], &dx[0], &p[2]->grad, &p[4]->grad}) {
      for (float v : t->floats()) ASSERT_TRUE(std::isfinite(v));
    }
    const MlpReference ref = ReferenceStep(c.recipe, activation, x, fwd.outputs[1], p, dy);
    ExpectClose(fwd.outputs[0], ref.y, c.te, "y (TE tolerance)");
    ExpectClose(dx[0], ref.dx, c.te, "dx (TE tolerance)");
    ExpectClose(p[2]->grad, ref.dw1, c.te, "dW1 (TE tolerance)");
    ExpectClose(p[4]->grad, ref.dw2, c.te, "dW2 (TE tolerance)");
    if (c.recipe.quantizes()) {
      // The output follows the quantized computation, not the FP32 one.
      const MlpReference fp32 = ReferenceStep(recipes::Recipe(), activation, x, fwd.outputs[1], p, dy);
      EXPECT_LT(RmsDifference(fwd.outputs[0], ref.y), 0.25 * RmsDifference(fwd.outputs[0], fp32.y));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LayerNormMLPRecipeTest, testing::ValuesIn(testing_util::EveryRecipe()),
                         [](const testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

// ---- Parameters, quantizers and shapes -----------------------------------------------------

TEST(LayerNormMLP, ParameterAndQuantizerNamesFollowTe) {
  auto mlp = LayerNormMLP::Create("mlp", Options(32, 48, Activation::kSwiglu),
                                  MakeRecipe(recipes::DelayedScalingConfig()))
                 .value();
  EXPECT_THAT(ParameterNames(*mlp), ElementsAre("mlp.layer_norm_weight", "mlp.layer_norm_bias", "mlp.fc1_weight",
                                                "mlp.fc1_bias", "mlp.fc2_weight", "mlp.fc2_bias"));
  std::vector<Parameter*> p = mlp->Parameters();
  EXPECT_EQ(p[2]->value.shape(), (Shape{96, 32}));  // gated: fc1 produces [a | b]
  EXPECT_EQ(p[4]->value.shape(), (Shape{32, 48}));
  std::vector<std::string> layers;
  for (const NamedQuantizer& q : mlp->Quantizers()) {
    layers.push_back(absl::StrCat(q.layer, ":", recipes::TensorRoleName(q.quantizer->role())));
  }
  EXPECT_THAT(layers, ElementsAre("mlp.fc1:input", "mlp.fc1:weight", "mlp.fc1:grad_output", "mlp.fc2:input",
                                  "mlp.fc2:weight", "mlp.fc2:grad_output"));
  LayerNormMLPOptions o = Options(32, 48, Activation::kGelu);
  o.normalization = NormKind::kRmsNorm;
  o.bias = false;
  auto rms = LayerNormMLP::Create("ffn", o, recipes::Recipe()).value();
  EXPECT_THAT(ParameterNames(*rms), ElementsAre("ffn.layer_norm_weight", "ffn.fc1_weight", "ffn.fc2_weight"));
  EXPECT_EQ(rms->Parameters()[1]->value.shape(), (Shape{48, 32}));
  // fc1 and fc2 draw from different streams.
  EXPECT_NE(rms->Parameters()[1]->value.floats()[0], rms->Parameters()[2]->value.floats()[0]);
}

TEST(LayerNormMLP, OutputShapesFollowTheFlags) {
  LayerNormMLPOptions o = Options(16, 8, Activation::kGeglu);
  o.return_bias = true;
  o.return_layernorm_output = true;
  auto layer = LayerNormMLP::Create("mlp", o, recipes::Recipe()).value();
  auto shapes = layer->OutputShapes({{2, 3, 16}}, "inputs").value();
  EXPECT_THAT(shapes, ElementsAre(Shape{2, 3, 16}, Shape{16}, Shape{2, 3, 16}));
  auto forward = layer->Forward(Context(), {RandomTensor({2, 3, 16}, 1)}, ForwardOptions()).value();
  ASSERT_EQ(forward.outputs.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(forward.outputs[i].shape(), shapes[i]);
  EXPECT_TRUE(BitwiseEqual(forward.outputs[1], layer->Parameters()[5]->value));
  EXPECT_THAT(std::string(layer->OutputShapes({{4, 8}}, "inputs").status().message()),
              HasSubstr("inputs[0].shape: expected last dimension 16 (hidden_size of layer 'mlp'), got [4, 8]"));
  auto nv = LayerNormMLP::Create("mlp", Options(32, 32, Activation::kGelu), MakeRecipe(recipes::Nvfp4Config())).value();
  EXPECT_THAT(std::string(nv->OutputShapes({{3, 32}}, "inputs").status().message()), HasSubstr("divisible by 16"));
}

// ---- Spec ---------------------------------------------------------------------------------

v1::ModelSpec MlpModel() {
  v1::ModelSpec spec;
  auto* layer = spec.add_layers();
  layer->set_name("mlp");
  auto* s = layer->mutable_layer_norm_mlp();
  s->set_hidden_size(64);
  s->set_ffn_hidden_size(128);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(64);
  return spec;
}

TEST(LayerNormMLPSpec, BuildsTheLayerWithTeDefaults) {
  v1::ModelSpec spec = MlpModel();
  auto stack = BuildStack(spec, recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  Module& layer = *(*stack)->modules()[0];
  EXPECT_EQ(layer.kind(), "LayerNormMLP");
  std::vector<Parameter*> p = layer.Parameters();
  EXPECT_EQ(p[2]->value.shape(), (Shape{128, 64}));  // gelu by default: not gated
  // TE's default init: N(0, 0.023^2).
  double sum_sq = 0.0;
  for (float w : p[2]->value.floats()) sum_sq += double(w) * w;
  EXPECT_NEAR(std::sqrt(sum_sq / p[2]->value.numel()), 0.023, 0.002);
  auto y = (*stack)->Forward(Context(), {RandomTensor({4, 64}, 1)}, ForwardOptions());
  ASSERT_TRUE(y.ok()) << y.status();
}

TEST(LayerNormMLPSpec, PassesEveryOption) {
  v1::LayerNormMLPSpec s;
  s.set_hidden_size(64);
  s.set_ffn_hidden_size(32);
  s.set_eps(1e-3f);
  s.set_bias(false);
  s.set_normalization("RMSNorm");
  s.set_activation("clamped_swiglu");
  s.mutable_activation_params()->set_limit(3.0f);
  s.set_return_layernorm_output(true);
  s.set_return_bias(true);
  s.set_zero_centered_gamma(true);
  s.set_checkpoint(true);
  s.set_init_std(0.1f);
  auto o = LayerNormMLPOptionsFromSpec(s, recipes::Recipe(), "mlp").value();
  EXPECT_EQ(o.eps, 1e-3f);
  EXPECT_FALSE(o.bias);
  EXPECT_EQ(o.normalization, NormKind::kRmsNorm);
  EXPECT_EQ(o.activation, Activation::kClampedSwiglu);
  EXPECT_EQ(o.activation_params.limit, 3.0f);
  EXPECT_EQ(o.activation_params.alpha, 1.702f);
  EXPECT_TRUE(o.return_layernorm_output && o.return_bias && o.zero_centered_gamma && o.checkpoint);
  EXPECT_EQ(o.init_std, 0.1f);
  auto layer = LayerNormMLP::Create("mlp", o, recipes::Recipe()).value();
  int64_t count = 0;
  for (Parameter* p : layer->Parameters()) count += p->value.numel();
  EXPECT_EQ(count, ParameterCount(o));
  o.bias = true;
  o.normalization = NormKind::kLayerNorm;
  layer = LayerNormMLP::Create("mlp", o, recipes::Recipe()).value();
  count = 0;
  for (Parameter* p : layer->Parameters()) count += p->value.numel();
  EXPECT_EQ(count, ParameterCount(o));
}

using BadSpec = testing_util::BadLayerSpec<v1::LayerNormMLPSpec>;

class LayerNormMLPSpecErrors : public testing::TestWithParam<BadSpec> {};

TEST_P(LayerNormMLPSpecErrors, NameTheField) {
  v1::ModelSpec spec = MlpModel();
  GetParam().mutate(spec.mutable_layers(0)->mutable_layer_norm_mlp());
  testing_util::ExpectSpecError(spec, GetParam().recipe, GetParam().message);
}

const char kF[] = "model.layers[0].layer_norm_mlp.";

INSTANTIATE_TEST_SUITE_P(
    Cases, LayerNormMLPSpecErrors,
    testing::Values(
        BadSpec{"ZeroHidden", [](v1::LayerNormMLPSpec* s) { s->set_hidden_size(0); },
                absl::StrCat(kF, "hidden_size: expected a size in 1..16777216, got 0")},
        BadSpec{"HugeFfn", [](v1::LayerNormMLPSpec* s) { s->set_ffn_hidden_size(int64_t{1} << 40); },
                absl::StrCat(kF, "ffn_hidden_size: expected a size in 1..16777216, got 1099511627776")},
        BadSpec{"NanEps", [](v1::LayerNormMLPSpec* s) { s->set_eps(std::nanf("")); },
                absl::StrCat(kF, "eps: expected a finite value > 0, got nan")},
        BadSpec{"NegativeInitStd", [](v1::LayerNormMLPSpec* s) { s->set_init_std(-0.5f); },
                absl::StrCat(kF, "init_std: expected a finite value >= 0, got -0.5")},
        BadSpec{"UnknownNormalization", [](v1::LayerNormMLPSpec* s) { s->set_normalization("BatchNorm"); },
                absl::StrCat(kF, "normalization: expected one of LayerNorm, RMSNorm, got 'BatchNorm'")},
        BadSpec{"UnknownActivation", [](v1::LayerNormMLPSpec* s) { s->set_activation("swish"); },
                absl::StrCat(kF,
                             "activation: expected one of gelu, geglu, qgelu, qgeglu, relu, reglu, srelu, "
                             "sreglu, silu, swiglu, clamped_swiglu, got 'swish'")},
        BadSpec{"ActivationParamsWithoutClamp",
                [](v1::LayerNormMLPSpec* s) {
                  s->set_activation("swiglu");
                  s->mutable_activation_params()->set_limit(5.0f);
                },
                absl::StrCat(kF, "activation_params: expected unset (activation_params apply to clamped_swiglu "
                                 "only), got set with activation 'swiglu'")},
        BadSpec{"ZeroLimit",
                [](v1::LayerNormMLPSpec* s) {
                  s->set_activation("clamped_swiglu");
                  s->mutable_activation_params()->set_limit(0.0f);
                },
                absl::StrCat(kF, "activation_params.limit: expected a finite value > 0, got 0")},
        BadSpec{"InfiniteAlpha",
                [](v1::LayerNormMLPSpec* s) {
                  s->set_activation("clamped_swiglu");
                  s->mutable_activation_params()->set_alpha(INFINITY);
                },
                absl::StrCat(kF, "activation_params.alpha: expected a finite value > 0, got inf")},
        BadSpec{"ReturnBiasNotLast", [](v1::LayerNormMLPSpec* s) { s->set_return_bias(true); },
                absl::StrCat(kF, "return_bias: expected false (only the last layer of a stack may return extra "
                                 "outputs), got true")},
        BadSpec{"ReturnLayernormOutputNotLast",
                [](v1::LayerNormMLPSpec* s) { s->set_return_layernorm_output(true); },
                absl::StrCat(kF, "return_layernorm_output: expected false")},
        BadSpec{"Mxfp8Hidden",
                [](v1::LayerNormMLPSpec* s) { s->set_hidden_size(48); },
                absl::StrCat(kF, "hidden_size: expected a multiple of 32 (mxfp8 blocks must tile it), got 48"),
                MakeRecipe(recipes::Mxfp8Config())},
        BadSpec{"Nvfp4Ffn", [](v1::LayerNormMLPSpec* s) { s->set_ffn_hidden_size(24); },
                absl::StrCat(kF, "ffn_hidden_size: expected a multiple of 16 (nvfp4 blocks must tile it), got 24"),
                MakeRecipe(recipes::Nvfp4Config())}),
    [](const testing::TestParamInfo<BadSpec>& info) { return info.param.name; });

TEST(LayerNormMLPSpec, WidthMismatchNamesHiddenSize) {
  v1::ModelSpec spec;
  auto* fc = spec.add_layers()->mutable_linear();
  fc->set_in_features(8);
  fc->set_out_features(32);
  auto* s = spec.add_layers()->mutable_layer_norm_mlp();
  s->set_hidden_size(16);
  s->set_ffn_hidden_size(64);
  EXPECT_THAT(std::string(BuildStack(spec, recipes::Recipe()).status().message()),
              HasSubstr("model.layers[1].layer_norm_mlp.hidden_size: expected 32 (the output width of layer "
                        "'layers.0'), got 16"));
}

}  // namespace
}  // namespace layers
}  // namespace teserve
