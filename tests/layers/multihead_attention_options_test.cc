// MultiheadAttention: every recipe against high precision (normalized error within TE's
// per-GEMM rtol compounded over the GEMMs on the path) and quantizer names; option and
// side-input errors; the ModelSpec with TE defaults and its field errors. Gradients, the
// double-precision forward and the layouts are in multihead_attention_test.cc.
#include "layers/multihead_attention.h"

#include <cmath>
#include <functional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layers/init.h"
#include "layers/spec.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/multihead_attention_test_util.h"
#include "tests/layers/recipe_reference.h"
#include "tests/layers/side_grad_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnMaskType;
using kernels::QkvFormat;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing_util::AllFinite;
using testing_util::CheckGradientsWithSide;
using testing_util::CuSeqlens;
using testing_util::FindParameter;
using testing_util::GradCheckOptions;
using testing_util::MakeRecipe;
using testing_util::ParameterNames;
using testing_util::PerturbSmallParameters;
using testing_util::RandomTensor;
using testing_util::RelativeError;
using testing_util::SideProblem;
using testing_mha::BaseOptions;
using testing_mha::Rope;
using testing_mha::RunForwardBackward;
using testing_mha::RunResult;
using testing_mha::Set;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// ---------------------------------------------------------------------------------
// Recipes.

struct RecipeCase {
  std::string name;
  recipes::Recipe recipe;
  double rtol;  // TE's module rtol for the format (E4M3 0.125, E2M1 0.25)
};

void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

class MultiheadAttentionRecipes : public ::testing::TestWithParam<RecipeCase> {};

TEST_P(MultiheadAttentionRecipes, ForwardAndBackwardCloseToHighPrecision) {
  const RecipeCase& c = GetParam();
  // Every GEMM dimension and the token count (16 x 2) tile the 32- and 16-blocks.
  MultiheadAttentionOptions o;
  o.hidden_size = 64;
  o.num_attention_heads = 4;
  o.num_gqa_groups = 2;
  o.attention_dropout = 0.0f;
  o.input_layernorm = true;
  o.fuse_qkv_params = true;
  // qk norm in FP32 either way; L2 has no weights, whose gradients (sums that cancel)
  // would measure cancellation rather than the recipe.
  o.qk_norm_type = QkNormType::kL2Normalization;
  o.init_std = o.output_layer_init_std = 0.125f;  // ~1/sqrt(hidden): activations of order 1
  o.seed = 3;
  Rope(&o, false);
  auto reference = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  auto quantized = MultiheadAttention::Create("mha", o, c.recipe).value();
  const Tensor x = RandomTensor({16, 2, 64}, 31);
  const RunResult want = RunForwardBackward(*reference, x, nullptr);
  const RunResult got = RunForwardBackward(*quantized, x, nullptr);
  ASSERT_EQ(got.outputs.size(), 1u);
  ASSERT_TRUE(AllFinite(got.outputs[0]));
  ASSERT_TRUE(AllFinite(got.dx));
  // TE's tolerance bounds one GEMM against its dequantized operands; here n quantized
  // GEMMs with independent errors lie between the input and what is compared, so the
  // normalized error is held to rtol * sqrt(n): the output follows the qkv and proj
  // fprops (n = 2); the gradients add the proj and qkv dgrads or a wgrad to the
  // forward's activations (n = 3).
  const double forward_bound = c.rtol * std::sqrt(2.0), backward_bound = c.rtol * std::sqrt(3.0);
  const double output_error = RelativeError(got.outputs[0], want.outputs[0]);
  EXPECT_LT(output_error, forward_bound) << "output";
  EXPECT_GT(output_error, 1e-3) << "the GEMMs should have quantized";
  EXPECT_LT(RelativeError(got.dx, want.dx), backward_bound) << "d hidden_states";
  for (Parameter* p : quantized->Parameters()) {
    ASSERT_TRUE(AllFinite(p->grad)) << p->name;
    EXPECT_LT(RelativeError(p->grad, FindParameter(*reference, p->name)->grad), backward_bound) << p->name;
  }
  std::vector<std::string> layers;
  for (const NamedQuantizer& q : quantized->Quantizers()) layers.push_back(q.layer);
  EXPECT_THAT(layers, ElementsAre("mha.layernorm_qkv", "mha.layernorm_qkv", "mha.layernorm_qkv", "mha.proj", "mha.proj",
                                  "mha.proj"));
}

recipes::Nvfp4Config Nvfp4NoStochasticRounding() {
  recipes::Nvfp4Config c;
  c.stochastic_rounding = false;
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, MultiheadAttentionRecipes,
    ::testing::Values(RecipeCase{"DelayedScaling", MakeRecipe(recipes::DelayedScalingConfig()), 0.125},
                      RecipeCase{"CurrentScaling", MakeRecipe(recipes::CurrentScalingConfig()), 0.125},
                      RecipeCase{"Mxfp8", MakeRecipe(recipes::Mxfp8Config()), 0.125},
                      RecipeCase{"BlockScaling", MakeRecipe(recipes::BlockScalingConfig()), 0.125},
                      RecipeCase{"Nvfp4", MakeRecipe(recipes::Nvfp4Config()), 0.25},
                      RecipeCase{"Nvfp4NoStochasticRounding", MakeRecipe(Nvfp4NoStochasticRounding()), 0.25}),
    [](const ::testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

TEST(MultiheadAttentionRecipes, BlockRecipesCheckTokenCountsOfBothInputs) {
  MultiheadAttentionOptions o = BaseOptions();
  o.attention_type = AttentionType::kCross;
  o.attn_mask_type = AttnMaskType::kNoMask;
  auto m = MultiheadAttention::Create("mha", o, MakeRecipe(recipes::Mxfp8Config())).value();
  EXPECT_THAT(m->OutputShapes({{5, 2, 32}}, "inputs").status().message(), HasSubstr("divisible by 32"));
  SideInputs side;
  side.Set("encoder_output", RandomTensor({3, 2, 32}, 1));
  const absl::Status status = m->ValidateSide(side, {{16, 2, 32}});
  EXPECT_EQ(status.code(), kInvalid);
  EXPECT_THAT(status.message(), HasSubstr("side_inputs.encoder_output[0].shape"));
  EXPECT_THAT(status.message(), HasSubstr("divisible by 32"));
}

// ---------------------------------------------------------------------------------
// Errors.

struct OptionError {
  std::string name;
  std::function<void(MultiheadAttentionOptions*)> mutate;
  std::string message;
};

void PrintTo(const OptionError& c, std::ostream* os) { *os << c.name; }

class MultiheadAttentionOptionErrors : public ::testing::TestWithParam<OptionError> {};

TEST_P(MultiheadAttentionOptionErrors, NameTheField) {
  MultiheadAttentionOptions o = BaseOptions();
  GetParam().mutate(&o);
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe());
  EXPECT_EQ(m.status().code(), kInvalid);
  EXPECT_THAT(std::string(m.status().message()), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Options, MultiheadAttentionOptionErrors,
    ::testing::Values(
        OptionError{"HiddenNotDivisibleByHeads", Set([](auto* o) { o->num_attention_heads = 5; }),
                    "options.num_attention_heads: expected a divisor of hidden_size 32"},
        OptionError{"HeadsNotDivisibleByGroups", Set([](auto* o) { o->num_gqa_groups = 3; }),
                    "options.num_gqa_groups: expected a divisor of num_attention_heads 4"},
        OptionError{"NegativeKvChannels", Set([](auto* o) { o->kv_channels = -2; }), "options.kv_channels"},
        OptionError{"NoHeads", Set([](auto* o) { o->num_attention_heads = 0; }), "options.num_attention_heads"},
        OptionError{"OddRotaryDim", Set([](auto* o) { Rope(o, false, 0.375); }),
                    "options.rotary.rotary_percent: expected a rotary dimension floor(8 * rotary_percent) that is "
                    "even and > 0, got 3"},
        OptionError{"OddHeadDimRotary", Set([](auto* o) {
                      o->kv_channels = 7;
                      Rope(o, false);
                    }),
                    "options.rotary.rotary_percent"},
        OptionError{"RotaryPercentAboveOne", Set([](auto* o) { Rope(o, false, 1.5); }),
                    "options.rotary.rotary_percent: expected a value in (0, 1]"},
        OptionError{"RotaryBase", Set([](auto* o) {
                      Rope(o, false);
                      o->rotary->rotary_base = -1.0f;
                    }),
                    "options.rotary.rotary_base"},
        OptionError{"ThdWithoutPadding", Set([](auto* o) { o->qkv_format = QkvFormat::kThd; }),
                    "options.attn_mask_type: expected padding, padding_causal or padding_causal_bottom_right with "
                    "qkv_format thd"},
        OptionError{"Dropout", Set([](auto* o) { o->attention_dropout = 1.0f; }), "options.attention_dropout"},
        OptionError{"CausalWindow", Set([](auto* o) {
                      o->window_size = AttentionWindow{4, 2};
                    }),
                    "options.window_size.right"},
        OptionError{"QkNormEps", Set([](auto* o) { o->qk_norm_eps = 0.0f; }), "options.qk_norm_eps"},
        OptionError{"LayerNormEps", Set([](auto* o) { o->layernorm_epsilon = NAN; }), "options.layernorm_epsilon"},
        OptionError{"InitStd", Set([](auto* o) { o->output_layer_init_std = -1.0f; }),
                    "options.output_layer_init_std"}),
    [](const ::testing::TestParamInfo<OptionError>& info) { return info.param.name; });

TEST(MultiheadAttention, ParsesTeNames) {
  EXPECT_EQ(ParseAttentionType("cross", "f").value(), AttentionType::kCross);
  EXPECT_EQ(ParseQkNormType("", "f").value(), QkNormType::kNone);
  EXPECT_EQ(ParseQkNormType("L2Normalization", "f").value(), QkNormType::kL2Normalization);
  EXPECT_EQ(ParseQkNormType("RMSNorm", "f").value(), QkNormType::kRmsNorm);
  EXPECT_EQ(ParseQkNormType("LayerNorm", "f").value(), QkNormType::kLayerNorm);
  EXPECT_THAT(ParseQkNormType("rmsnorm", "qk_norm_type").status().message(),
              HasSubstr("qk_norm_type: expected one of none, L2Normalization, RMSNorm, LayerNorm, got 'rmsnorm'"));
  EXPECT_THAT(ParseAttentionType("encoder", "attention_type").status().message(),
              HasSubstr("attention_type: expected one of self, cross, got 'encoder'"));
}

TEST(MultiheadAttention, RejectsBadInputsAndSideInputsWithoutCrashing) {
  MultiheadAttentionOptions o = BaseOptions();
  o.attention_type = AttentionType::kCross;
  o.attn_mask_type = AttnMaskType::kNoMask;
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  EXPECT_THAT(m->OutputShapes({{4, 32}}, "inputs").status().message(),
              HasSubstr("inputs[0].shape: expected [S, B, hidden_size] (qkv_format sbhd of layer 'mha'), got [4, 32]"));
  EXPECT_THAT(m->OutputShapes({{4, 2, 31}}, "inputs").status().message(),
              HasSubstr("expected last dimension 32 (hidden_size of layer 'mha')"));
  const Shape x{4, 2, 32};
  SideInputs side;
  EXPECT_THAT(m->ValidateSide(side, {x}).message(), HasSubstr("side_inputs.encoder_output: expected an FP32 tensor"));
  side.Set("encoder_output", RandomTensor({6, 3, 32}, 1));
  EXPECT_THAT(m->ValidateSide(side, {x}).message(),
              HasSubstr("side_inputs.encoder_output.shape: expected [S_kv, B, 32] with the batch size of "
                        "hidden_states (cross-attention of layer 'mha'), got [6, 3, 32]"));
  side.Set("encoder_output", Tensor::Zeros(DType::kInt32, {6, 2, 32}).value());
  EXPECT_THAT(m->ValidateSide(side, {x}).message(),
              HasSubstr("side_inputs.encoder_output.dtype: expected FLOAT32, got INT32"));
  // Forward checks too (it never reads a missing side input).
  ForwardOptions no_side;
  auto out = m->Forward(Context(), {RandomTensor(x, 2)}, no_side);
  EXPECT_EQ(out.status().code(), kInvalid);
  EXPECT_THAT(out.status().message(), HasSubstr("side_inputs.encoder_output"));
  side.Set("encoder_output", RandomTensor({6, 2, 32}, 1));
  EXPECT_TRUE(m->ValidateSide(side, {x}).ok()) << m->ValidateSide(side, {x});

  // thd: the sequence lengths are required (by the attention and the rotary embedding).
  MultiheadAttentionOptions t = BaseOptions();
  t.qkv_format = QkvFormat::kThd;
  t.attn_mask_type = AttnMaskType::kPadding;
  Rope(&t, false);
  auto thd = MultiheadAttention::Create("mha", t, recipes::Recipe()).value();
  SideInputs none;
  EXPECT_FALSE(thd->ValidateSide(none, {{6, 32}}).ok());
  ForwardOptions with_none;
  with_none.side = &none;
  EXPECT_EQ(thd->Forward(Context(), {RandomTensor({6, 32}, 3)}, with_none).status().code(), kInvalid);
}

// ---------------------------------------------------------------------------------
// ModelSpec.

v1::ModelSpec AttentionModel() {
  v1::ModelSpec spec;
  v1::LayerSpec* layer = spec.add_layers();
  layer->set_name("attn");
  v1::MultiheadAttentionSpec* a = layer->mutable_multihead_attention();
  a->set_hidden_size(32);
  a->set_num_attention_heads(4);
  a->set_num_gqa_groups(2);
  a->set_attention_dropout(0.0f);
  a->set_qk_norm_type("RMSNorm");
  a->mutable_rotary()->set_rotary_percent(0.5);
  a->set_rotary_pos_interleaved(true);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(32);
  return spec;
}

TEST(MultiheadAttentionSpec, BuildsTheLayerWithTeDefaultsAndRuns) {
  auto stack = BuildStack(AttentionModel(), recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  auto* attention = dynamic_cast<MultiheadAttention*>((*stack)->modules()[0].get());
  ASSERT_NE(attention, nullptr);
  const MultiheadAttentionOptions& o = attention->options();
  EXPECT_EQ(o.attn_mask_type, AttnMaskType::kCausal);
  EXPECT_EQ(o.qkv_format, QkvFormat::kSbhd);
  EXPECT_EQ(o.layernorm_epsilon, 1e-5f);
  EXPECT_EQ(o.qk_norm_eps, 1e-6f);
  EXPECT_EQ(o.init_std, 0.023f);
  ASSERT_TRUE(o.rotary.has_value());
  EXPECT_EQ(o.rotary->rotary_percent, 0.5);
  EXPECT_EQ(o.rotary->rotary_base, 10000.0f);
  EXPECT_TRUE(o.rotary_pos_interleaved);
  EXPECT_THAT(
      ParameterNames(**stack),
      ElementsAre("attn.qkv.query_weight", "attn.qkv.key_weight", "attn.qkv.value_weight", "attn.qkv.query_bias",
                  "attn.qkv.key_bias", "attn.qkv.value_bias", "attn.q_norm.weight", "attn.k_norm.weight",
                  "attn.proj.weight", "attn.proj.bias", "layers.1.weight", "layers.1.bias"));
  auto out = (*stack)->Forward(Context(), {RandomTensor({3, 2, 32}, 1)}, ForwardOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->outputs[0].shape(), (Shape{3, 2, 32}));
  // TE's default attention_dropout is 0.1.
  v1::ModelSpec defaults = AttentionModel();
  defaults.mutable_layers(0)->mutable_multihead_attention()->clear_attention_dropout();
  auto with_dropout = BuildStack(defaults, recipes::Recipe()).value();
  EXPECT_EQ(dynamic_cast<MultiheadAttention*>(with_dropout->modules()[0].get())->options().attention_dropout, 0.1f);
}

struct SpecError {
  std::string name;
  std::function<void(v1::ModelSpec*)> mutate;
  std::string message;
  recipes::Recipe recipe;
};

void PrintTo(const SpecError& c, std::ostream* os) { *os << c.name; }

class MultiheadAttentionSpecErrors : public ::testing::TestWithParam<SpecError> {};

TEST_P(MultiheadAttentionSpecErrors, NameTheField) {
  v1::ModelSpec spec = AttentionModel();
  GetParam().mutate(&spec);
  auto stack = BuildStack(spec, GetParam().recipe);
  EXPECT_EQ(stack.status().code(), kInvalid);
  EXPECT_THAT(std::string(stack.status().message()), HasSubstr(GetParam().message));
}

v1::MultiheadAttentionSpec* Attention(v1::ModelSpec* spec) {
  return spec->mutable_layers(0)->mutable_multihead_attention();
}

std::vector<SpecError> SpecErrors() {
  const std::string f = "model.layers[0].multihead_attention.";
  recipes::Recipe mxfp8 = MakeRecipe(recipes::Mxfp8Config());
  return {
      {"HiddenNotDivisibleByHeads", [](auto* s) { Attention(s)->set_num_attention_heads(5); },
       f + "num_attention_heads: expected a divisor of hidden_size 32"},
      {"HeadsNotDivisibleByGroups", [](auto* s) { Attention(s)->set_num_gqa_groups(3); },
       f + "num_gqa_groups: expected a divisor of num_attention_heads 4"},
      {"ZeroHidden", [](auto* s) { Attention(s)->set_hidden_size(0); }, f + "hidden_size: expected a size in 1.."},
      {"ZeroKvChannels", [](auto* s) { Attention(s)->set_kv_channels(0); }, f + "kv_channels: expected a size in 1.."},
      {"QueryWidthTooLarge",
       [](auto* s) {
         Attention(s)->set_num_attention_heads(1 << 13);
         Attention(s)->set_num_gqa_groups(1);
         Attention(s)->set_kv_channels(1 << 12);
       },
       f + "num_attention_heads: expected num_attention_heads * kv_channels in 1..16777216, got 33554432"},
      {"OddRotaryDim", [](auto* s) { Attention(s)->mutable_rotary()->set_rotary_percent(0.375); },
       f + "rotary.rotary_percent: expected a rotary dimension floor(8 * rotary_percent) that is even and > 0, got 3"
           " (rotary_percent 0.375)"},
      {"RotaryBase", [](auto* s) { Attention(s)->mutable_rotary()->set_rotary_base(0.0f); },
       f + "rotary.rotary_base: expected a finite value > 0, got 0"},
      {"QkNormType", [](auto* s) { Attention(s)->set_qk_norm_type("l2"); },
       f + "qk_norm_type: expected one of none, L2Normalization, RMSNorm, LayerNorm, got 'l2'"},
      {"AttentionType", [](auto* s) { Attention(s)->set_attention_type("decoder"); },
       f + "attention_type: expected one of self, cross, got 'decoder'"},
      {"Normalization", [](auto* s) { Attention(s)->set_normalization("rmsnorm"); },
       f + "normalization: expected one of LayerNorm, RMSNorm, got 'rmsnorm'"},
      {"MaskTypeName", [](auto* s) { Attention(s)->set_attn_mask_type("causal_top_left"); }, f + "attn_mask_type"},
      {"QkvFormatName", [](auto* s) { Attention(s)->set_qkv_format("hbsd"); }, f + "qkv_format"},
      {"SoftmaxTypeName", [](auto* s) { Attention(s)->set_softmax_type("sink"); }, f + "softmax_type"},
      {"ThdNeedsPaddingMask", [](auto* s) { Attention(s)->set_qkv_format("thd"); },
       f + "attn_mask_type: expected padding, padding_causal or padding_causal_bottom_right with qkv_format thd, "
           "got causal"},
      {"CausalWindow",
       [](auto* s) {
         Attention(s)->mutable_window_size()->set_left(3);
         Attention(s)->mutable_window_size()->set_right(1);
       },
       f + "window_size.right: expected 0 for attn_mask_type causal"},
      {"Dropout", [](auto* s) { Attention(s)->set_attention_dropout(-0.5f); }, f + "attention_dropout"},
      {"LayerNormEpsilon", [](auto* s) { Attention(s)->set_layernorm_epsilon(0.0f); },
       f + "layernorm_epsilon: expected a finite value > 0, got 0"},
      {"QkNormEps", [](auto* s) { Attention(s)->set_qk_norm_eps(-1.0f); }, f + "qk_norm_eps"},
      {"InitStd", [](auto* s) { Attention(s)->set_init_std(-0.1f); }, f + "init_std: expected a finite value >= 0"},
      {"ReturnBiasNotLast", [](auto* s) { Attention(s)->set_return_bias(true); },
       f + "return_bias: expected false (only the last layer of a stack may return extra outputs)"},
      {"ReturnLayerNormOutputNotLast",
       [](auto* s) {
         Attention(s)->set_input_layernorm(true);
         Attention(s)->set_return_layernorm_output(true);
       },
       f + "return_layernorm_output: expected false"},
      {"WidthMismatch", [](auto* s) { s->mutable_layers(1)->mutable_layer_norm()->set_hidden_size(16); },
       "model.layers[1].layer_norm.hidden_size: expected 32 (the output width of layer 'attn'), got 16"},
      {"Mxfp8HiddenNotTiled",
       [](auto* s) {
         Attention(s)->set_hidden_size(48);
         s->mutable_layers(1)->mutable_layer_norm()->set_hidden_size(48);
       },
       f + "hidden_size: expected a multiple of 32 (mxfp8 blocks must tile it), got 48", mxfp8},
      {"Mxfp8KeyValueWidthNotTiled",
       [](auto* s) {
         Attention(s)->set_hidden_size(64);
         Attention(s)->set_num_attention_heads(8);
         Attention(s)->set_num_gqa_groups(2);
         s->mutable_layers(1)->mutable_layer_norm()->set_hidden_size(64);
       },
       f + "num_gqa_groups: expected num_gqa_groups * the head size (the key/value width) to be a multiple of 32 "
           "(mxfp8 blocks must tile it), got 16",
       mxfp8},
  };
}

INSTANTIATE_TEST_SUITE_P(Spec, MultiheadAttentionSpecErrors, ::testing::ValuesIn(SpecErrors()),
                         [](const ::testing::TestParamInfo<SpecError>& info) { return info.param.name; });

}  // namespace
}  // namespace layers
}  // namespace teserve
