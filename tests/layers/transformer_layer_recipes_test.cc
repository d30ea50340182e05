// TransformerLayer: TE's "small" config under every recipe and the "weird" config under
// delayed, current and block scaling against high precision (MXFP8 and NVFP4 blocks must
// tile it: rejected at spec time); ModelSpec defaults and errors. Gradients, composition,
// dropout and checkpointing are in transformer_layer_test.cc.
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

// ---------------------------------------------------------------------------------
// Recipes against high precision.

struct RecipeCase {
  std::string name;
  recipes::Recipe recipe;
  double rtol;  // TE's module rtol for the format (E4M3 0.125, E2M1 0.25)
};

void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.name; }

double Norm(const Tensor& t) {
  double sum = 0.0;
  for (float v : t.floats()) sum += static_cast<double>(v) * v;
  return std::sqrt(sum);
}

// a - b in float.
Tensor Difference(const Tensor& a, const Tensor& b) {
  Tensor out = a.Clone().value();
  for (int64_t i = 0; i < out.numel(); ++i) out.mutable_floats()[i] -= b.floats()[i];
  return out;
}

// TE's tolerance bounds one GEMM against its dequantized operands. Here n quantized
// GEMMs with independent errors lie between the input and what is compared, so the
// normalized error is held to rtol * sqrt(n). The residual stream passes x and dy
// through unquantized, so the blocks' contributions are compared: out - x follows the
// qkv, proj, fc1 and fc2 fprops (n = 4); every gradient follows at most the fprops that
// shape its activations, the fc2, fc1 and proj dgrads and one wgrad or the qkv dgrad
// (n = 8).
void ExpectCloseToHighPrecision(const TransformerLayerOptions& o, const RecipeCase& c, const Shape& shape) {
  auto reference = TransformerLayer::Create("tl", o, recipes::Recipe()).value();
  auto quantized = TransformerLayer::Create("tl", o, c.recipe).value();
  PerturbSmallParameters(*reference);
  CopyParameters(*reference, *quantized);
  const Tensor x = RandomTensor(shape, 31);
  const Tensor dy = RandomTensor(shape, 32);
  const RunResult want = RunForwardBackward(*reference, x, SideInputs(), dy);
  const RunResult got = RunForwardBackward(*quantized, x, SideInputs(), dy);
  ASSERT_TRUE(AllFinite(got.out));
  ASSERT_TRUE(AllFinite(got.dx));
  const double forward_bound = c.rtol * std::sqrt(4.0), backward_bound = c.rtol * std::sqrt(8.0);
  const double output_error = RelativeError(Difference(got.out, x), Difference(want.out, x));
  EXPECT_LT(output_error, forward_bound) << "out - x";
  EXPECT_GT(output_error, 1e-3) << "the GEMMs should have quantized";
  const double input_error = RelativeError(Difference(got.dx, dy), Difference(want.dx, dy));
  EXPECT_LT(input_error, backward_bound) << "d hidden_states - dy";
  EXPECT_GT(input_error, 1e-3);
  for (Parameter* p : quantized->Parameters()) {
    ASSERT_TRUE(AllFinite(p->grad)) << p->name;
    const Tensor& want_grad = FindParameter(*reference, p->name)->grad;
    if (absl::EndsWith(p->name, ".key_bias")) {
      // Zero in exact arithmetic (a key bias shifts each query's scores uniformly, which
      // softmax ignores), so both are rounding noise: compare with the value bias.
      const std::string value_bias = absl::StrCat(p->name.substr(0, p->name.size() - 8), "value_bias");
      const double scale = Norm(FindParameter(*reference, value_bias)->grad);
      EXPECT_LT(Norm(p->grad), 1e-4 * scale) << p->name;
      EXPECT_LT(Norm(want_grad), 1e-4 * scale) << p->name;
      continue;
    }
    EXPECT_LT(RelativeError(p->grad, want_grad), backward_bound) << p->name;
  }
}

// A TE test config without dropout; init_std ~1/sqrt(hidden) keeps activations of order 1.
TransformerLayerOptions ConfigOptions(int64_t hidden, int64_t heads, int64_t ffn, float init_std, uint64_t seed) {
  TransformerLayerOptions o;
  o.self_attention.hidden_size = hidden;
  o.self_attention.num_attention_heads = heads;
  o.self_attention.attention_dropout = 0.0f;
  o.self_attention.init_std = o.self_attention.output_layer_init_std = init_std;
  o.mlp.hidden_size = hidden;
  o.mlp.ffn_hidden_size = ffn;
  o.mlp.init_std = init_std;
  o.hidden_dropout = 0.0f;
  o.seed = seed;
  return o;
}

class TransformerLayerRecipes : public ::testing::TestWithParam<RecipeCase> {};

// TE's "small" config: batch 2, seq 128, 8 heads of 16 (hidden 128), ffn 512, causal.
TEST_P(TransformerLayerRecipes, SmallConfigCloseToHighPrecision) {
  ExpectCloseToHighPrecision(ConfigOptions(128, 8, 512, 0.088f, 3), GetParam(), {128, 2, 128});
}

INSTANTIATE_TEST_SUITE_P(Recipes, TransformerLayerRecipes,
                         ::testing::Values(RecipeCase{"DelayedScaling", MakeRecipe(recipes::DelayedScalingConfig()),
                                                      testing_util::kE4M3.rtol},
                                           RecipeCase{"CurrentScaling", MakeRecipe(recipes::CurrentScalingConfig()),
                                                      testing_util::kE4M3.rtol},
                                           RecipeCase{"Mxfp8", MakeRecipe(recipes::Mxfp8Config()),
                                                      testing_util::kE4M3.rtol},
                                           RecipeCase{"BlockScaling", MakeRecipe(recipes::BlockScalingConfig()),
                                                      testing_util::kE4M3.rtol},
                                           RecipeCase{"Nvfp4", MakeRecipe(recipes::Nvfp4Config()),
                                                      testing_util::kE2M1.rtol}),
                         [](const ::testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

class TransformerLayerWeirdConfig : public ::testing::TestWithParam<RecipeCase> {};

// TE's "weird" config: 3 x 37 tokens, 3 heads of 23 (hidden 69), ffn 276, under the
// recipes whose blocks need not tile the GEMM dimensions.
TEST_P(TransformerLayerWeirdConfig, RunsAndStaysClose) {
  ExpectCloseToHighPrecision(ConfigOptions(69, 3, 276, 0.12f, 4), GetParam(), {37, 3, 69});
}

INSTANTIATE_TEST_SUITE_P(Recipes, TransformerLayerWeirdConfig,
                         ::testing::Values(RecipeCase{"DelayedScaling", MakeRecipe(recipes::DelayedScalingConfig()),
                                                      testing_util::kE4M3.rtol},
                                           RecipeCase{"CurrentScaling", MakeRecipe(recipes::CurrentScalingConfig()),
                                                      testing_util::kE4M3.rtol},
                                           // 1x128 / 128x128 blocks may be partial: no tiling requirement.
                                           RecipeCase{"BlockScaling", MakeRecipe(recipes::BlockScalingConfig()),
                                                      testing_util::kE4M3.rtol}),
                         [](const ::testing::TestParamInfo<RecipeCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------
// ModelSpec.

v1::ModelSpec TransformerModel(int64_t hidden, int64_t ffn, int64_t heads) {
  v1::ModelSpec spec;
  v1::LayerSpec* layer = spec.add_layers();
  layer->set_name("block");
  v1::TransformerLayerSpec* t = layer->mutable_transformer_layer();
  t->set_hidden_size(hidden);
  t->set_ffn_hidden_size(ffn);
  t->set_num_attention_heads(heads);
  return spec;
}

v1::TransformerLayerSpec* Transformer(v1::ModelSpec* spec) {
  return spec->mutable_layers(0)->mutable_transformer_layer();
}

TEST(TransformerLayerSpec, BuildsWithTeDefaultsAndRuns) {
  auto stack = BuildStack(TransformerModel(64, 128, 4), recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  auto* layer = dynamic_cast<TransformerLayer*>((*stack)->modules()[0].get());
  ASSERT_NE(layer, nullptr);
  const TransformerLayerOptions& o = layer->options();
  EXPECT_EQ(o.hidden_dropout, 0.1f);
  EXPECT_EQ(o.drop_path_rate, 0.0f);
  EXPECT_FALSE(o.inter_attention.has_value());  // encoder
  EXPECT_FALSE(o.apply_residual_connection_post_layernorm);
  EXPECT_FALSE(o.output_layernorm);
  EXPECT_FALSE(o.parallel_attention_mlp);
  EXPECT_EQ(o.self_attention.attention_dropout, 0.1f);
  EXPECT_EQ(o.self_attention.attn_mask_type, AttnMaskType::kCausal);
  EXPECT_EQ(o.self_attention.qkv_format, QkvFormat::kSbhd);
  EXPECT_EQ(o.self_attention.normalization, NormKind::kLayerNorm);
  EXPECT_EQ(o.self_attention.layernorm_epsilon, 1e-5f);
  EXPECT_EQ(o.self_attention.num_gqa_groups, 0);  // num_attention_heads
  EXPECT_EQ(o.self_attention.init_std, 0.023f);
  EXPECT_EQ(o.self_attention.output_layer_init_std, 0.023f);
  EXPECT_EQ(o.self_attention.qk_norm_type, QkNormType::kNone);
  EXPECT_FALSE(o.self_attention.rotary.has_value());
  EXPECT_FALSE(o.self_attention.checkpoint_core_attention);
  EXPECT_TRUE(o.self_attention.bias);
  EXPECT_EQ(o.mlp.normalization, NormKind::kLayerNorm);
  EXPECT_EQ(o.mlp.activation, kernels::Activation::kGelu);
  EXPECT_EQ(o.mlp.eps, 1e-5f);
  EXPECT_EQ(o.mlp.init_std, 0.023f);
  EXPECT_TRUE(o.mlp.bias);
  int64_t elements = 0;
  for (Parameter* p : (*stack)->Parameters()) elements += p->value.numel();
  EXPECT_EQ(elements, ParameterCount(o));
  EXPECT_EQ(FindParameter(**stack, "block.layernorm_mlp.fc1_weight")->value.shape(), (Shape{128, 64}));

  const Tensor x = RandomTensor({6, 2, 64}, 1);
  auto inference = (*stack)->Forward(Context(), {x}, NoSave());
  auto forward = (*stack)->Forward(Context(), {x}, ForwardOptions());
  ASSERT_TRUE(forward.ok()) << forward.status();
  ASSERT_EQ(forward->outputs[0].shape(), (Shape{6, 2, 64}));
  // TE's default dropouts are active in training forwards.
  EXPECT_FALSE(BitwiseEqual(forward->outputs[0], inference->outputs[0]));
  auto dx = (*stack)->Backward(Context(), *forward->saved, {RandomTensor({6, 2, 64}, 2)});
  ASSERT_TRUE(dx.ok()) << dx.status();
  EXPECT_EQ((*dx)[0].shape(), (Shape{6, 2, 64}));
  EXPECT_TRUE(AllFinite((*dx)[0]));
}

TEST(TransformerLayerSpec, CheckpointCoreAttentionReachesBothAttentionBlocks) {
  v1::TransformerLayerSpec s = TransformerModel(64, 128, 4).layers(0).transformer_layer();
  s.set_layer_type("decoder");
  s.set_checkpoint_core_attention(true);
  auto o = TransformerLayerOptionsFromSpec(s, recipes::Recipe(), "t");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->self_attention.checkpoint_core_attention);
  ASSERT_TRUE(o->inter_attention.has_value());
  EXPECT_TRUE(o->inter_attention->checkpoint_core_attention);
  EXPECT_EQ(o->inter_attention->attention_type, AttentionType::kCross);
  EXPECT_EQ(o->inter_attention->attn_mask_type, AttnMaskType::kNoMask);  // TE's enc_dec default

  v1::MultiheadAttentionSpec mha;
  mha.set_hidden_size(64);
  mha.set_num_attention_heads(4);
  EXPECT_FALSE(MultiheadAttentionOptionsFromSpec(mha, recipes::Recipe(), "m")->checkpoint_core_attention);
  mha.set_checkpoint_core_attention(true);
  EXPECT_TRUE(MultiheadAttentionOptionsFromSpec(mha, recipes::Recipe(), "m")->checkpoint_core_attention);
}

struct SpecError {
  std::string name;
  std::function<void(v1::TransformerLayerSpec*)> mutate;
  std::string message;  // after "model.layers[0].transformer_layer."
};

void PrintTo(const SpecError& c, std::ostream* os) { *os << c.name; }

class TransformerLayerSpecErrors : public ::testing::TestWithParam<SpecError> {};

TEST_P(TransformerLayerSpecErrors, NameTheTransformerLayerField) {
  v1::ModelSpec spec = TransformerModel(64, 128, 4);
  GetParam().mutate(Transformer(&spec));
  auto stack = BuildStack(spec, recipes::Recipe());
  EXPECT_EQ(stack.status().code(), kInvalid);
  EXPECT_THAT(std::string(stack.status().message()),
              HasSubstr("model.layers[0].transformer_layer." + GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Spec, TransformerLayerSpecErrors,
    ::testing::Values(
        SpecError{"SelfAttnMaskTypeName", [](auto* t) { t->set_self_attn_mask_type("causal_top_left"); },
                  "self_attn_mask_type: expected"},
        SpecError{"EncDecAttnMaskTypeName",
                  [](auto* t) {
                    t->set_layer_type("decoder");
                    t->set_enc_dec_attn_mask_type("bidirectional");
                  },
                  "enc_dec_attn_mask_type: expected"},
        SpecError{"AttnInputFormatName", [](auto* t) { t->set_attn_input_format("hbsd"); },
                  "attn_input_format: expected"},
        SpecError{"ThdNeedsPaddingMask", [](auto* t) { t->set_attn_input_format("thd"); },
                  "self_attn_mask_type: expected padding, padding_causal or padding_causal_bottom_right"},
        SpecError{"LayerTypeName", [](auto* t) { t->set_layer_type("encoder_decoder"); },
                  "layer_type: expected \"encoder\" or \"decoder\", got \"encoder_decoder\""},
        SpecError{"ParallelAttentionMlpWithDecoder",
                  [](auto* t) {
                    t->set_layer_type("decoder");
                    t->set_parallel_attention_mlp(true);
                  },
                  "parallel_attention_mlp: expected false for layer_type decoder"},
        SpecError{"ParallelAttentionMlpWithPostLayerNormResidual",
                  [](auto* t) {
                    t->set_parallel_attention_mlp(true);
                    t->set_apply_residual_connection_post_layernorm(true);
                  },
                  "apply_residual_connection_post_layernorm: expected false with parallel_attention_mlp"},
        SpecError{"DropPathWithThd",
                  [](auto* t) {
                    t->set_attn_input_format("thd");
                    t->set_self_attn_mask_type("padding_causal");
                    t->set_drop_path_rate(0.1f);
                  },
                  "drop_path_rate: expected 0 with attn_input_format thd"},
        SpecError{"HiddenDropoutOne", [](auto* t) { t->set_hidden_dropout(1.0f); },
                  "hidden_dropout: expected a probability in [0, 1), got 1"},
        SpecError{"DropPathNegative", [](auto* t) { t->set_drop_path_rate(-0.1f); }, "drop_path_rate: expected"},
        SpecError{"AttentionDropout", [](auto* t) { t->set_attention_dropout(1.5f); }, "attention_dropout"},
        SpecError{"HiddenNotDivisibleByHeads", [](auto* t) { t->set_num_attention_heads(5); },
                  "num_attention_heads: expected a divisor of hidden_size 64"},
        SpecError{"HeadsNotDivisibleByGroups", [](auto* t) { t->set_num_gqa_groups(3); },
                  "num_gqa_groups: expected a divisor of num_attention_heads 4"},
        SpecError{"ZeroFfnHiddenSize", [](auto* t) { t->set_ffn_hidden_size(0); }, "ffn_hidden_size: expected"},
        SpecError{"ActivationName", [](auto* t) { t->set_activation("gelu2"); }, "activation: expected"},
        SpecError{"NormalizationName", [](auto* t) { t->set_normalization("rmsnorm"); }, "normalization: expected"},
        SpecError{"LayerNormEpsilon", [](auto* t) { t->set_layernorm_epsilon(0.0f); },
                  "layernorm_epsilon: expected"},
        SpecError{"OutputLayerInitStdDiffersFromInitStd", [](auto* t) { t->set_output_layer_init_std(0.05f); },
                  "output_layer_init_std: expected init_std"}),
    [](const ::testing::TestParamInfo<SpecError>& info) { return info.param.name; });

TEST(TransformerLayerSpec, WeirdConfigRejectsTiledBlockRecipesNamingTheField) {
  const std::string f = "model.layers[0].transformer_layer.";
  for (const auto& [recipe, message] : std::vector<std::pair<recipes::Recipe, std::string>>{
           {MakeRecipe(recipes::Mxfp8Config()), f + "hidden_size: expected a multiple of 32 (mxfp8 blocks"},
           {MakeRecipe(recipes::Nvfp4Config()), f + "hidden_size: expected a multiple of 16 (nvfp4 blocks"}}) {
    auto stack = BuildStack(TransformerModel(69, 276, 3), recipe);
    EXPECT_EQ(stack.status().code(), kInvalid) << recipe.name();
    EXPECT_THAT(std::string(stack.status().message()), HasSubstr(message));
  }
  for (const recipes::Recipe& recipe : {recipes::Recipe(), MakeRecipe(recipes::DelayedScalingConfig()),
                                        MakeRecipe(recipes::CurrentScalingConfig()),
                                        MakeRecipe(recipes::BlockScalingConfig())}) {
    EXPECT_TRUE(BuildStack(TransformerModel(69, 276, 3), recipe).ok()) << recipe.name();
  }
}

}  // namespace
}  // namespace layers
}  // namespace teserve
