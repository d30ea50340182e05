// TransformerLayer: central finite-difference gradients of hidden_states, encoder_output
// and every parameter per option family; bitwise equality with its sub-modules run by
// hand (pre- and post-LN residuals, decoder); hidden dropout and drop path (element and
// sample masks, keep rates, independent drop path sites, no dropout without
// save_for_backward, the backward regenerating its forward's masks);
// checkpoint_core_attention bit-exactness. Recipes and the ModelSpec are in
// transformer_layer_recipes_test.cc.
#include "layers/transformer_layer.h"

#include <cmath>
#include <functional>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layers/init.h"
#include "layers/multihead_attention_spec.h"
#include "layers/spec.h"
#include "layers/transformer_layer_spec.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/recipe_reference.h"
#include "tests/layers/side_grad_check.h"
#include "tests/layers/transformer_layer_test_util.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnMaskType;
using kernels::QkvFormat;
using ::testing::HasSubstr;
using testing_util::AllFinite;
using testing_util::CuSeqlens;
using testing_util::FindParameter;
using testing_util::MakeRecipe;
using testing_util::PerturbSmallParameters;
using testing_util::RandomTensor;
using testing_util::RelativeError;
using testing_tl::CopyParameters;
using testing_tl::NoSave;
using testing_tl::RunForwardBackward;
using testing_tl::RunResult;
using testing_tl::ZeroGrads;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// hidden 32, 4 heads of 8, ffn 64; no dropout, so the layer is deterministic.
TransformerLayerOptions BaseOptions() {
  TransformerLayerOptions o;
  MultiheadAttentionOptions& a = o.self_attention;
  a.hidden_size = 32;
  a.num_attention_heads = 4;
  a.attention_dropout = 0.0f;
  a.init_std = a.output_layer_init_std = 0.15f;
  o.mlp.hidden_size = 32;
  o.mlp.ffn_hidden_size = 64;
  o.mlp.init_std = 0.15f;
  o.hidden_dropout = 0.0f;
  o.seed = 7;
  return o;
}

// layer_type decoder: a cross attention with the self attention's options, no mask.
void MakeDecoder(TransformerLayerOptions* o) {
  MultiheadAttentionOptions cross = o->self_attention;
  cross.attention_type = AttentionType::kCross;
  cross.attn_mask_type = AttnMaskType::kNoMask;
  cross.rotary.reset();
  o->inter_attention = cross;
}

void SetNormalization(TransformerLayerOptions* o, NormKind kind) {
  o->self_attention.normalization = kind;
  o->mlp.normalization = kind;
}

// ---------------------------------------------------------------------------------
// Finite differences over hidden_states, encoder_output and every parameter.

struct GradCase {
  std::string name;
  std::function<void(TransformerLayerOptions*)> configure;
  Shape x_shape;
  Shape encoder_shape;        // decoder only
  std::vector<int32_t> cu_q;  // thd only (self attention: cu_seqlens_q = cu_seqlens_kv)
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class TransformerLayerGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(TransformerLayerGrad, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  TransformerLayerOptions o = BaseOptions();
  c.configure(&o);
  if (!c.encoder_shape.empty()) MakeDecoder(&o);
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe());
  ASSERT_TRUE(layer.ok()) << layer.status();
  PerturbSmallParameters(**layer);
  testing_util::SideProblem p;
  p.x = RandomTensor(c.x_shape, 11);
  if (!c.encoder_shape.empty()) p.SetEncoderOutput(RandomTensor(c.encoder_shape, 12));
  if (!c.cu_q.empty()) {
    p.side.Set("cu_seqlens_q", CuSeqlens(c.cu_q));
    p.side.Set("cu_seqlens_kv", CuSeqlens(c.cu_q));
  }
  testing_util::GradCheckOptions check;
  check.max_checks = 24;
  testing_util::CheckGradientsWithSide(**layer, p, check);
}

auto Set(std::function<void(TransformerLayerOptions*)> f) { return f; }

void RmsNormSwigluGqaRope(TransformerLayerOptions* o, bool qk_norm_before_rope) {
  SetNormalization(o, NormKind::kRmsNorm);
  o->mlp.activation = kernels::Activation::kSwiglu;
  o->self_attention.num_gqa_groups = 2;
  o->self_attention.rotary = RotaryEmbeddingOptions{};
  o->self_attention.qk_norm_type = QkNormType::kRmsNorm;
  o->self_attention.qk_norm_before_rope = qk_norm_before_rope;
}

INSTANTIATE_TEST_SUITE_P(
    Families, TransformerLayerGrad,
    ::testing::Values(
        GradCase{"DefaultEncoder_Sbhd_Causal", Set([](auto*) {}), {4, 2, 32}},
        GradCase{"PostLayerNormResidual",
                 Set([](auto* o) { o->apply_residual_connection_post_layernorm = true; }),
                 {4, 2, 32}},
        GradCase{"OutputLayerNorm", Set([](auto* o) { o->output_layernorm = true; }), {4, 2, 32}},
        GradCase{"OutputLayerNorm_PostLayerNormResidual",
                 Set([](auto* o) {
                   o->output_layernorm = true;
                   o->apply_residual_connection_post_layernorm = true;
                 }),
                 {4, 2, 32}},
        GradCase{"ParallelAttentionMlp", Set([](auto* o) { o->parallel_attention_mlp = true; }), {4, 2, 32}},
        GradCase{"Decoder", Set([](auto*) {}), {4, 2, 32}, {5, 2, 32}},
        GradCase{"Decoder_PostLayerNormResidual",
                 Set([](auto* o) { o->apply_residual_connection_post_layernorm = true; }),
                 {3, 2, 32},
                 {5, 2, 32}},
        GradCase{"RmsNorm_Swiglu_Gqa_Rotary_QkNormAfterRope",
                 Set([](auto* o) { RmsNormSwigluGqaRope(o, false); }),
                 {5, 2, 32}},
        GradCase{"RmsNorm_Swiglu_Gqa_Rotary_QkNormBeforeRope",
                 Set([](auto* o) { RmsNormSwigluGqaRope(o, true); }),
                 {5, 2, 32}},
        GradCase{"Bshd", Set([](auto* o) { o->self_attention.qkv_format = QkvFormat::kBshd; }), {2, 4, 32}},
        GradCase{"Thd_PaddingCausal_RaggedSequences",
                 Set([](auto* o) {
                   o->self_attention.qkv_format = QkvFormat::kThd;
                   o->self_attention.attn_mask_type = AttnMaskType::kPaddingCausal;
                   o->self_attention.rotary = RotaryEmbeddingOptions{};
                 }),
                 {8, 32},
                 {},
                 {0, 3, 7, 8}},
        GradCase{"NoBias",
                 Set([](auto* o) {
                   o->self_attention.bias = false;
                   o->mlp.bias = false;
                 }),
                 {4, 2, 32}},
        GradCase{"Decoder_NoBias_Bshd",
                 Set([](auto* o) {
                   o->self_attention.bias = false;
                   o->mlp.bias = false;
                   o->self_attention.qkv_format = QkvFormat::kBshd;
                 }),
                 {2, 3, 32},
                 {2, 4, 32}}),
    [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------
// The layer is its sub-modules composed by the documented formula, bitwise.

Tensor Add(const Tensor& a, const Tensor& b) {
  Tensor out = a.Clone().value();
  for (int64_t i = 0; i < out.numel(); ++i) out.mutable_floats()[i] += b.floats()[i];
  return out;
}

// residual + (h + bias), bias broadcast over rows.
Tensor Residual(const Tensor& residual, const Tensor& h, const Tensor& bias) {
  Tensor out = h.Clone().value();
  const int64_t hidden = h.shape().back();
  for (int64_t i = 0; i < out.numel(); ++i) {
    out.mutable_floats()[i] = residual.floats()[i] + (h.floats()[i] + bias.floats()[i % hidden]);
  }
  return out;
}

// The gradient of a broadcast bias: column sums of dy over all rows.
Tensor ColumnSums(const Tensor& dy) {
  const int64_t hidden = dy.shape().back();
  std::vector<double> sums(hidden, 0.0);
  for (int64_t i = 0; i < dy.numel(); ++i) sums[i % hidden] += dy.floats()[i];
  Tensor out = Tensor::Zeros(DType::kFloat32, {hidden}).value();
  for (int64_t j = 0; j < hidden; ++j) out.mutable_floats()[j] = static_cast<float>(sums[j]);
  return out;
}

// TE's sub-modules of a (bias = true) TransformerLayer, built by hand with the layer's
// seeds and the flags the layer sets.
struct HandLayer {
  std::unique_ptr<MultiheadAttention> self_attention;
  std::unique_ptr<MultiheadAttention> inter_attention;
  std::unique_ptr<LayerNormMLP> mlp;
  bool post_ln = false;
};

HandLayer MakeHandLayer(const TransformerLayerOptions& o, const recipes::Recipe& recipe) {
  HandLayer hand;
  hand.post_ln = o.apply_residual_connection_post_layernorm;
  MultiheadAttentionOptions sa = o.self_attention;
  sa.input_layernorm = true;
  sa.return_bias = true;
  sa.return_layernorm_output = hand.post_ln;
  sa.seed = DeriveSeed(o.seed, 1);
  hand.self_attention = MultiheadAttention::Create("tl.self_attention", sa, recipe).value();
  if (o.inter_attention.has_value()) {
    MultiheadAttentionOptions ca = *o.inter_attention;
    ca.input_layernorm = true;
    ca.return_bias = true;
    ca.return_layernorm_output = hand.post_ln;
    ca.seed = DeriveSeed(o.seed, 2);
    hand.inter_attention = MultiheadAttention::Create("tl.inter_attention", ca, recipe).value();
  }
  LayerNormMLPOptions mlp = o.mlp;
  mlp.return_bias = true;
  mlp.return_layernorm_output = hand.post_ln;
  mlp.seed = DeriveSeed(o.seed, 3);
  hand.mlp = LayerNormMLP::Create("tl.layernorm_mlp", mlp, recipe).value();
  return hand;
}

std::vector<Module*> Modules(const HandLayer& hand) {
  std::vector<Module*> modules{hand.self_attention.get()};
  if (hand.inter_attention != nullptr) modules.push_back(hand.inter_attention.get());
  modules.push_back(hand.mlp.get());
  return modules;
}

// Forward and backward of the documented formula (no dropout) over the hand modules.
RunResult RunHand(HandLayer& hand, const Tensor& x, const SideInputs& side, const Tensor& dy) {
  for (Module* m : Modules(hand)) ZeroGrads(*m);
  ForwardOptions options;
  options.side = &side;
  auto a = hand.self_attention->Forward(Context(), {x}, options).value();
  Tensor h = Residual(hand.post_ln ? a.outputs[2] : x, a.outputs[0], a.outputs[1]);
  ForwardOutput c;
  if (hand.inter_attention != nullptr) {
    c = hand.inter_attention->Forward(Context(), {h}, options).value();
    h = Residual(hand.post_ln ? c.outputs[2] : h, c.outputs[0], c.outputs[1]);
  }
  auto m = hand.mlp->Forward(Context(), {h}, options).value();
  RunResult r;
  r.out = Residual(hand.post_ln ? m.outputs[2] : h, m.outputs[0], m.outputs[1]);

  // Each block receives d(out), d(bias) = column sums, and d(ln) when its layernorm
  // output is the residual; otherwise the residual's gradient skips the block.
  auto grads = [&](const Tensor& d) {
    std::vector<Tensor> g{d, ColumnSums(d)};
    if (hand.post_ln) g.push_back(d);
    return g;
  };
  SideGrads side_grads;
  Tensor dh = hand.mlp->Backward(Context(), *m.saved, grads(dy), &side_grads).value()[0];
  if (!hand.post_ln) dh = Add(dh, dy);
  if (hand.inter_attention != nullptr) {
    Tensor dc = hand.inter_attention->Backward(Context(), *c.saved, grads(dh), &side_grads).value()[0];
    dh = hand.post_ln ? dc : Add(dc, dh);
  }
  Tensor da = hand.self_attention->Backward(Context(), *a.saved, grads(dh), &side_grads).value()[0];
  r.dx = hand.post_ln ? da : Add(da, dh);
  r.denc = side_grads.encoder_output;
  return r;
}

struct CompositionCase {
  std::string name;
  bool post_ln;
  bool decoder;
};

void PrintTo(const CompositionCase& c, std::ostream* os) { *os << c.name; }

class TransformerLayerComposition : public ::testing::TestWithParam<CompositionCase> {};

TEST_P(TransformerLayerComposition, EqualsSubModulesRunByHandBitwise) {
  const CompositionCase& c = GetParam();
  TransformerLayerOptions o = BaseOptions();
  o.apply_residual_connection_post_layernorm = c.post_ln;
  o.self_attention.rotary = RotaryEmbeddingOptions{};
  o.self_attention.num_gqa_groups = 2;
  if (c.decoder) MakeDecoder(&o);
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe()).value();
  HandLayer hand = MakeHandLayer(o, recipes::Recipe());

  // Same seeds: the same initial parameters, under the same names and in the same order.
  std::vector<Parameter*> hand_parameters;
  for (Module* m : Modules(hand)) {
    for (Parameter* p : m->Parameters()) hand_parameters.push_back(p);
  }
  ASSERT_EQ(layer->Parameters().size(), hand_parameters.size());
  for (size_t i = 0; i < hand_parameters.size(); ++i) {
    EXPECT_EQ(layer->Parameters()[i]->name, hand_parameters[i]->name);
    EXPECT_TRUE(BitwiseEqual(layer->Parameters()[i]->value, hand_parameters[i]->value)) << hand_parameters[i]->name;
  }
  PerturbSmallParameters(*layer);
  for (Module* m : Modules(hand)) CopyParameters(*layer, *m);

  const Tensor x = RandomTensor({5, 2, 32}, 3);
  const Tensor dy = RandomTensor({5, 2, 32}, 4);
  SideInputs side;
  if (c.decoder) side.Set("encoder_output", RandomTensor({6, 2, 32}, 5));
  const RunResult got = RunForwardBackward(*layer, x, side, dy);
  const RunResult want = RunHand(hand, x, side, dy);
  EXPECT_TRUE(BitwiseEqual(got.out, want.out)) << "output";
  EXPECT_TRUE(BitwiseEqual(got.dx, want.dx)) << "d hidden_states";
  EXPECT_EQ(got.denc.defined(), c.decoder);
  if (c.decoder) {
    EXPECT_TRUE(BitwiseEqual(got.denc, want.denc)) << "d encoder_output";
  }
  for (Parameter* p : hand_parameters) {
    const Parameter* q = FindParameter(*layer, p->name);
    ASSERT_NE(q, nullptr);
    EXPECT_TRUE(BitwiseEqual(q->grad, p->grad)) << p->name << " grad";
  }
}

INSTANTIATE_TEST_SUITE_P(Residuals, TransformerLayerComposition,
                         ::testing::Values(CompositionCase{"PreLayerNormResidual", false, false},
                                           CompositionCase{"PostLayerNormResidual", true, false},
                                           CompositionCase{"Decoder_PreLayerNormResidual", false, true},
                                           CompositionCase{"Decoder_PostLayerNormResidual", true, true}),
                         [](const ::testing::TestParamInfo<CompositionCase>& info) { return info.param.name; });

TEST(TransformerLayer, ParameterAndQuantizerNamesFollowTheSubModules) {
  TransformerLayerOptions o = BaseOptions();
  o.output_layernorm = true;
  MakeDecoder(&o);
  auto layer = TransformerLayer::Create("tl", o, MakeRecipe(recipes::CurrentScalingConfig())).value();
  std::vector<std::string> names;
  for (Parameter* p : layer->Parameters()) names.push_back(p->name);
  // output_layernorm: the self attention has no input layernorm (plain qkv Linear).
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "tl.self_attention.qkv.query_weight", "tl.self_attention.qkv.key_weight",
                         "tl.self_attention.qkv.value_weight", "tl.self_attention.qkv.query_bias",
                         "tl.self_attention.qkv.key_bias", "tl.self_attention.qkv.value_bias",
                         "tl.self_attention.proj.weight", "tl.self_attention.proj.bias",
                         "tl.inter_attention.layernorm_query.layer_norm_weight",
                         "tl.inter_attention.layernorm_query.layer_norm_bias",
                         "tl.inter_attention.layernorm_query.query_weight",
                         "tl.inter_attention.layernorm_query.query_bias",
                         "tl.inter_attention.key_value.key_weight", "tl.inter_attention.key_value.value_weight",
                         "tl.inter_attention.key_value.key_bias", "tl.inter_attention.key_value.value_bias",
                         "tl.inter_attention.proj.weight", "tl.inter_attention.proj.bias",
                         "tl.layernorm_mlp.layer_norm_weight", "tl.layernorm_mlp.layer_norm_bias",
                         "tl.layernorm_mlp.fc1_weight", "tl.layernorm_mlp.fc1_bias", "tl.layernorm_mlp.fc2_weight",
                         "tl.layernorm_mlp.fc2_bias", "tl.layernorm.weight", "tl.layernorm.bias"));
  int64_t elements = 0;
  for (Parameter* p : layer->Parameters()) elements += p->value.numel();
  EXPECT_EQ(elements, ParameterCount(o));
  std::set<std::string> quantized;
  for (const NamedQuantizer& q : layer->Quantizers()) quantized.insert(q.layer);
  EXPECT_THAT(quantized, ::testing::ElementsAre("tl.inter_attention.key_value", "tl.inter_attention.layernorm_query",
                                                "tl.inter_attention.proj", "tl.layernorm_mlp.fc1",
                                                "tl.layernorm_mlp.fc2", "tl.self_attention.proj",
                                                "tl.self_attention.qkv"));
}

// ---------------------------------------------------------------------------------
// Hidden dropout and drop path.

// A parallel_attention_mlp layer (out = x + DropPath(Dropout(v)), v the sum of both
// blocks with their biases) with the given rates and no attention dropout.
TransformerLayerOptions ParallelOptions(float hidden_dropout, float drop_path, QkvFormat format) {
  TransformerLayerOptions o = BaseOptions();
  o.parallel_attention_mlp = true;
  o.hidden_dropout = hidden_dropout;
  o.drop_path_rate = drop_path;
  o.self_attention.qkv_format = format;
  return o;
}

// The factor out - x = factor * v of each element: 0 where out == x exactly (a dropped
// element: x + 0 is x), otherwise `keep`; checks the kept ones against the inference
// output (v = inference - x).
std::vector<float> DeduceFactors(const Tensor& x, const Tensor& out, const Tensor& inference, float keep) {
  std::vector<float> factors(x.numel());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = static_cast<double>(inference.floats()[i]) - x.floats()[i];
    const double got = static_cast<double>(out.floats()[i]) - x.floats()[i];
    if (out.floats()[i] == x.floats()[i]) {
      factors[i] = 0.0f;
      EXPECT_NE(v, 0.0) << "element " << i << " would read as dropped either way";
    } else {
      factors[i] = keep;
      EXPECT_NEAR(got, keep * v, 1e-5 * (1.0 + std::fabs(x.floats()[i]) + std::fabs(keep * v))) << "element " << i;
    }
  }
  return factors;
}

TEST(TransformerLayerDropout, ParallelBlockElementsAreDroppedOrScaledByInverseKeep) {
  const float p = 0.25f;
  auto layer = TransformerLayer::Create("tl", ParallelOptions(p, 0.0f, QkvFormat::kSbhd), recipes::Recipe()).value();
  PerturbSmallParameters(*layer);
  const Tensor x = RandomTensor({8, 4, 32}, 1);
  const Tensor inference = layer->Forward(Context(), {x}, NoSave()).value().outputs[0];
  const Tensor out = layer->Forward(Context(), {x}, ForwardOptions()).value().outputs[0];
  const std::vector<float> factors = DeduceFactors(x, out, inference, 1.0f / (1.0f - p));
  int64_t kept = 0;
  for (float f : factors) kept += f > 0.0f;
  // Binomial(1024, 0.75): mean 768, standard deviation 13.9; five deviations.
  EXPECT_NEAR(static_cast<double>(kept), 768.0, 70.0);
}

class TransformerLayerDropPath : public ::testing::TestWithParam<QkvFormat> {};

TEST_P(TransformerLayerDropPath, ZeroesWholeSamplesOfTheBatchDimension) {
  const QkvFormat format = GetParam();
  const bool sbhd = format == QkvFormat::kSbhd;
  const int64_t S = 3, B = 8, hidden = 32;
  auto layer = TransformerLayer::Create("tl", ParallelOptions(0.0f, 0.5f, format), recipes::Recipe()).value();
  PerturbSmallParameters(*layer);
  const Tensor x = RandomTensor(sbhd ? Shape{S, B, hidden} : Shape{B, S, hidden}, 2);
  const Tensor inference = layer->Forward(Context(), {x}, NoSave()).value().outputs[0];
  int dropped = 0, draws = 0;
  for (int step = 0; step < 4; ++step) {
    const Tensor out = layer->Forward(Context(), {x}, ForwardOptions()).value().outputs[0];
    const std::vector<float> factors = DeduceFactors(x, out, inference, 2.0f);
    for (int64_t b = 0; b < B; ++b) {
      std::set<float> sample;
      for (int64_t s = 0; s < S; ++s) {
        const int64_t row = sbhd ? s * B + b : b * S + s;
        for (int64_t j = 0; j < hidden; ++j) sample.insert(factors[row * hidden + j]);
      }
      ASSERT_EQ(sample.size(), 1u) << "sample " << b << " of step " << step << " is partly dropped";
      dropped += *sample.begin() == 0.0f;
      ++draws;
    }
  }
  // 32 draws at rate 0.5: mean 16, standard deviation 2.8.
  EXPECT_GE(dropped, 4);
  EXPECT_LE(dropped, draws - 4);
}

INSTANTIATE_TEST_SUITE_P(Formats, TransformerLayerDropPath, ::testing::Values(QkvFormat::kSbhd, QkvFormat::kBshd),
                         [](const ::testing::TestParamInfo<QkvFormat>& info) {
                           return info.param == QkvFormat::kSbhd ? "Sbhd" : "Bshd";
                         });

TEST(TransformerLayerDropPath, SelfAttentionAndMlpResidualsDrawIndependentMasks) {
  // Sequential layer, drop path only: per sample, h = x + D1 (a + a_b) and
  // out = h + D2 (m(h) + m_b), with D1, D2 in {0, 2}. The four candidates are built from
  // the sub-modules by hand; each sample must match exactly one, and over several
  // forwards both sites drop samples, not always the same ones.
  TransformerLayerOptions o = BaseOptions();
  o.drop_path_rate = 0.5f;
  const int64_t S = 3, B = 8, hidden = 32;
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe()).value();
  PerturbSmallParameters(*layer);
  HandLayer hand = MakeHandLayer(o, recipes::Recipe());
  for (Module* m : Modules(hand)) CopyParameters(*layer, *m);
  const Tensor x = RandomTensor({S, B, hidden}, 6);
  auto scaled = [](const Tensor& h, const Tensor& bias) {  // 2 (h + bias)
    Tensor out = h.Clone().value();
    for (int64_t i = 0; i < out.numel(); ++i) {
      out.mutable_floats()[i] = (h.floats()[i] + bias.floats()[i % hidden]) * 2.0f;
    }
    return out;
  };
  auto a = hand.self_attention->Forward(Context(), {x}, NoSave()).value();
  const Tensor h[2] = {x, Add(x, scaled(a.outputs[0], a.outputs[1]))};
  Tensor candidates[2][2];
  for (int d1 = 0; d1 < 2; ++d1) {
    auto m = hand.mlp->Forward(Context(), {h[d1]}, NoSave()).value();
    candidates[d1][0] = h[d1];
    candidates[d1][1] = Add(h[d1], scaled(m.outputs[0], m.outputs[1]));
  }
  int counts[2][2] = {{0, 0}, {0, 0}};
  for (int step = 0; step < 4; ++step) {
    const Tensor out = layer->Forward(Context(), {x}, ForwardOptions()).value().outputs[0];
    for (int64_t b = 0; b < B; ++b) {
      int matches = 0;
      for (int d1 = 0; d1 < 2; ++d1) {
        for (int d2 = 0; d2 < 2; ++d2) {
          bool equal = true;
          for (int64_t s = 0; s < S && equal; ++s) {
            for (int64_t j = 0; j < hidden; ++j) {
              const int64_t i = (s * B + b) * hidden + j;
              const float want = candidates[d1][d2].floats()[i];
              if (std::fabs(out.floats()[i] - want) > 1e-5f * (1.0f + std::fabs(want))) {
                equal = false;
                break;
              }
            }
          }
          if (equal) {
            ++matches;
            ++counts[d1][d2];
          }
        }
      }
      EXPECT_EQ(matches, 1) << "sample " << b << " of step " << step;
    }
  }
  // Self attention dropped (d1 = 0) and MLP dropped (d2 = 0) each occur, and the masks
  // disagree on some samples.
  EXPECT_GT(counts[0][0] + counts[0][1], 0);
  EXPECT_GT(counts[1][0] + counts[1][1], 0);
  EXPECT_GT(counts[0][0] + counts[1][0], 0);
  EXPECT_GT(counts[0][1] + counts[1][0], 0);
}

TEST(TransformerLayerDropout, NoDropoutWithoutSaveForBackwardAndFreshMasksPerTrainingForward) {
  TransformerLayerOptions o = BaseOptions();
  o.hidden_dropout = 0.3f;
  o.drop_path_rate = 0.3f;
  o.self_attention.attention_dropout = 0.3f;
  MakeDecoder(&o);
  TransformerLayerOptions plain = o;  // the same weights (same seed) without any dropout
  plain.hidden_dropout = 0.0f;
  plain.drop_path_rate = 0.0f;
  plain.self_attention.attention_dropout = 0.0f;
  plain.inter_attention->attention_dropout = 0.0f;
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe()).value();
  auto reference = TransformerLayer::Create("tl", plain, recipes::Recipe()).value();
  const Tensor x = RandomTensor({4, 4, 32}, 7);
  SideInputs side;
  side.Set("encoder_output", RandomTensor({5, 4, 32}, 8));
  ForwardOptions train, inference = NoSave();
  train.side = inference.side = &side;
  const Tensor want = reference->Forward(Context(), {x}, train).value().outputs[0];
  const Tensor first = layer->Forward(Context(), {x}, inference).value().outputs[0];
  const Tensor t1 = layer->Forward(Context(), {x}, train).value().outputs[0];
  const Tensor t2 = layer->Forward(Context(), {x}, train).value().outputs[0];
  const Tensor second = layer->Forward(Context(), {x}, inference).value().outputs[0];
  EXPECT_TRUE(BitwiseEqual(first, want));
  EXPECT_TRUE(BitwiseEqual(second, want));
  EXPECT_FALSE(BitwiseEqual(t1, want));
  EXPECT_FALSE(BitwiseEqual(t2, want));
  int64_t differing = 0;
  for (int64_t i = 0; i < t1.numel(); ++i) differing += t1.floats()[i] != t2.floats()[i];
  EXPECT_GT(differing, t1.numel() / 4) << "the two training forwards should draw different masks";
}

TEST(TransformerLayerDropout, BackwardRegeneratesItsForwardsMasks) {
  // With element masks F (deduced from the forward), the dropout layer's backward for dy
  // is the dropout-free layer's backward for F * dy: identical parameter gradients, and
  // dx - dy equal to the dropout-free dx - F * dy. A second training forward in between
  // draws other masks, which the first backward must not use.
  const float p = 0.25f, keep = 1.0f / (1.0f - p);
  auto layer = TransformerLayer::Create("tl", ParallelOptions(p, 0.0f, QkvFormat::kSbhd), recipes::Recipe()).value();
  auto plain = TransformerLayer::Create("tl", ParallelOptions(0.0f, 0.0f, QkvFormat::kSbhd), recipes::Recipe()).value();
  PerturbSmallParameters(*layer);
  CopyParameters(*layer, *plain);
  const Tensor x = RandomTensor({6, 2, 32}, 9);
  const Tensor dy = RandomTensor({6, 2, 32}, 10);
  const Tensor inference = layer->Forward(Context(), {x}, NoSave()).value().outputs[0];
  ZeroGrads(*layer);
  auto first = layer->Forward(Context(), {x}, ForwardOptions()).value();
  auto second = layer->Forward(Context(), {x}, ForwardOptions()).value();
  const std::vector<float> f1 = DeduceFactors(x, first.outputs[0], inference, keep);
  const std::vector<float> f2 = DeduceFactors(x, second.outputs[0], inference, keep);
  ASSERT_NE(f1, f2);
  const Tensor dx = layer->Backward(Context(), *first.saved, {dy}).value()[0];

  Tensor masked = dy.Clone().value();
  for (int64_t i = 0; i < masked.numel(); ++i) masked.mutable_floats()[i] *= f1[i];
  const RunResult want = RunForwardBackward(*plain, x, SideInputs(), masked);
  for (Parameter* q : plain->Parameters()) {
    EXPECT_TRUE(BitwiseEqual(FindParameter(*layer, q->name)->grad, q->grad)) << q->name;
  }
  for (int64_t i = 0; i < dx.numel(); ++i) {
    const double got = static_cast<double>(dx.floats()[i]) - dy.floats()[i];
    const double expected = static_cast<double>(want.dx.floats()[i]) - masked.floats()[i];
    EXPECT_NEAR(got, expected, 1e-5 * (1.0 + std::fabs(dx.floats()[i]))) << "element " << i;
  }
}

// ---------------------------------------------------------------------------------
// checkpoint_core_attention.

TEST(TransformerLayer, CheckpointCoreAttentionIsBitExact) {
  TransformerLayerOptions o = BaseOptions();
  o.hidden_dropout = 0.1f;
  o.self_attention.attention_dropout = 0.2f;
  o.self_attention.rotary = RotaryEmbeddingOptions{};
  MakeDecoder(&o);
  TransformerLayerOptions checkpointed = o;
  checkpointed.self_attention.checkpoint_core_attention = true;
  checkpointed.inter_attention->checkpoint_core_attention = true;
  auto plain = TransformerLayer::Create("tl", o, recipes::Recipe()).value();
  auto layer = TransformerLayer::Create("tl", checkpointed, recipes::Recipe()).value();
  PerturbSmallParameters(*plain);
  CopyParameters(*plain, *layer);
  const Tensor x = RandomTensor({4, 2, 32}, 12);
  const Tensor dy = RandomTensor({4, 2, 32}, 13);
  SideInputs side;
  side.Set("encoder_output", RandomTensor({6, 2, 32}, 14));
  Context ctx;
  ctx.seed = 99;
  const RunResult want = RunForwardBackward(*plain, x, side, dy, ctx);
  const RunResult got = RunForwardBackward(*layer, x, side, dy, ctx);
  EXPECT_TRUE(BitwiseEqual(got.out, want.out));
  EXPECT_TRUE(BitwiseEqual(got.dx, want.dx));
  EXPECT_TRUE(BitwiseEqual(got.denc, want.denc));
  for (Parameter* p : plain->Parameters()) {
    EXPECT_TRUE(BitwiseEqual(FindParameter(*layer, p->name)->grad, p->grad)) << p->name;
  }
  // Dropout was active: the training output differs from the inference output.
  ForwardOptions inference = NoSave();
  inference.side = &side;
  EXPECT_FALSE(BitwiseEqual(got.out, layer->Forward(ctx, {x}, inference).value().outputs[0]));
}

}  // namespace
}  // namespace layers
}  // namespace teserve
