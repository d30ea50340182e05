// TransformerLayer with a 16-bit params_dtype (BF16 / FP16) on the CPU reference,
// against the FP32 layer with the same master parameters, forward and backward, per
// option family (default, hidden and attention dropout with drop path, decoder with
// cross attention, RMSNorm + swiglu, GQA, post-layernorm residuals, output_layernorm,
// parallel attention and MLP) under no recipe and FP8 delayed / current scaling: the
// output and the hidden_states gradient come out in the 16-bit dtype, the
// encoder_output gradient and every parameter and gradient in FP32. The spec builds
// the layer natively, its sub-modules in the 16-bit dtype.
//
// Tolerances (relative L2 errors), in units of the dtype's unit roundoff u (2^-8 for
// BF16, 2^-11 for FP16).
//   - No recipe: the 16-bit layer rounds, on top of its attention blocks' and MLP's
//     roundings (multihead_attention_params_dtype_test, params_dtype_test), each
//     residual sum once (the bias-dropout-adds compute in FP32) and, in the backward,
//     each block's dh and each residual gradient sum once. The residual stream carries
//     the input itself, so the output's error is about its final rounding plus the
//     blocks' errors scaled by their share of the output. Measured (this data, both
//     dtypes): output up to 1.5u, hidden_states and encoder_output gradients up to 1.9u,
//     parameter gradients up to 2.5u (the GQA case with its qk norm weights, whose
//     gradients sum every head's rounded channels); held to 3u forward and 6u backward,
//     as the MultiheadAttention test. A parameter gradient that vanishes analytically
//     (a key bias under softmax's shift invariance) is measured against the size of a
//     typical gradient of its length (GradientErrors).
//   - Delayed / current scaling: both layers quantize, the FP32 one the FP32 values and
//     the 16-bit one their roundings, so a value within its rounding error of an FP8
//     rounding boundary takes the neighbouring code, one FP8 step away
//     (params_dtype_test's FusedLayerParamsDType derives ~1.1e-2 per E4M3 operand for
//     BF16). After the first quantized GEMM the two layers' operands differ by those
//     flips (~1e-2 relative), far more than by u, so every later quantization flips
//     codes at a rate that no longer depends on the dtype: FP16 ends up only about
//     twice closer than BF16, not sqrt(8) times. Measured: output up to 5.0e-2 (BF16) /
//     2.7e-2 (FP16), input gradients up to 7.6e-2 / 7.4e-2, the encoder_output gradient
//     up to 0.116 / 9.3e-2, parameter gradients up to 0.128 / 0.115 (the QKV weights and
//     the input layernorm's weight); held to 0.1 forward and 0.2 backward for both
//     dtypes. A wrong dtype or operand gives errors of order 1, a different dropout
//     mask about 0.4 (the FP32 layer with and without its dropout measures 0.38 to 0.44).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/multihead_attention.h"
#include "layers/spec.h"
#include "layers/transformer_layer.h"
#include "recipes/recipe.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/recipe_reference.h"
#include "tests/layers/transformer_layer_test_util.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnMaskType;
using testing_util::MakeRecipe;
using testing_util::PerturbSmallParameters;
using testing_util::RandomTensor;
using testing_util::GradientErrors;
using testing_util::RelativeError;
using testing_util::UnitRoundoff;

const Context kCpu = Context::Cpu();

Tensor As(const Tensor& t, DType dtype) { return kernels::Convert(kCpu, t, dtype).value(); }

// t rounded to `dtype` and back: values that dtype represents exactly.
Tensor Rounded(const Tensor& t, DType dtype) { return As(As(t, dtype), DType::kFloat32); }


std::string DTypeLabel(DType dtype) { return dtype == DType::kBFloat16 ? "BF16" : "FP16"; }


// hidden 32, 4 heads of 8, ffn 64, sbhd; no dropout unless a case sets it.
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

struct Case {
  std::string name;
  std::function<void(TransformerLayerOptions*)> configure;
  bool decoder = false;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

auto Set(std::function<void(TransformerLayerOptions*)> f) { return f; }

// layer_type decoder: a cross attention with the self attention's options, no mask.
void MakeDecoder(TransformerLayerOptions* o) {
  MultiheadAttentionOptions cross = o->self_attention;
  cross.attention_type = AttentionType::kCross;
  cross.attn_mask_type = AttnMaskType::kNoMask;
  o->inter_attention = cross;
}

void Dropout(TransformerLayerOptions* o) {
  o->hidden_dropout = 0.2f;
  o->drop_path_rate = 0.25f;
  o->self_attention.attention_dropout = 0.2f;
  if (o->inter_attention.has_value()) o->inter_attention->attention_dropout = 0.2f;
}

std::vector<Case> Cases() {
  return {
      {"Default", Set([](auto*) {})},
      {"Dropout", Set([](auto* o) { Dropout(o); })},
      {"Decoder", Set([](auto*) {}), true},
      {"DecoderDropoutPostLn",
       Set([](auto* o) {
         Dropout(o);
         o->apply_residual_connection_post_layernorm = true;
       }),
       true},
      {"RmsNormSwiglu",
       Set([](auto* o) {
         o->self_attention.normalization = NormKind::kRmsNorm;
         o->mlp.normalization = NormKind::kRmsNorm;
         o->mlp.activation = kernels::Activation::kSwiglu;
       })},
      {"Gqa_QkRmsNorm", Set([](auto* o) {
         o->self_attention.num_gqa_groups = 2;
         o->self_attention.qk_norm_type = QkNormType::kRmsNorm;
       })},
      {"PostLnResidual", Set([](auto* o) { o->apply_residual_connection_post_layernorm = true; })},
      {"OutputLayerNorm", Set([](auto* o) { o->output_layernorm = true; })},
      {"ParallelAttentionMlp_Dropout",
       Set([](auto* o) {
         o->parallel_attention_mlp = true;
         Dropout(o);
       })},
  };
}

struct Bounds {
  double forward, backward;
};

Bounds BoundsFor(const std::string& recipe, DType dtype) {
  const double u = UnitRoundoff(dtype);
  if (recipe == "none") return {3 * u, 6 * u};
  return {0.1, 0.2};
}

recipes::Recipe RecipeNamed(const std::string& name) {
  if (name == "delayed") return MakeRecipe(recipes::DelayedScalingConfig());
  if (name == "current") return MakeRecipe(recipes::CurrentScalingConfig());
  return recipes::Recipe();
}

class TransformerLayerParamsDType : public testing::TestWithParam<std::tuple<Case, std::string, DType>> {};

TEST_P(TransformerLayerParamsDType, MatchesTheFloat32Layer) {
  const auto& [c, recipe_name, dtype] = GetParam();
  const recipes::Recipe recipe = RecipeNamed(recipe_name);
  const Bounds bound = BoundsFor(recipe_name, dtype);
  const double u = UnitRoundoff(dtype);
  TransformerLayerOptions o = BaseOptions();
  if (c.decoder) MakeDecoder(&o);
  c.configure(&o);
  TransformerLayerOptions o16 = o;
  o16.params_dtype = dtype;
  auto full = TransformerLayer::Create("tl", o, recipe);
  auto low = TransformerLayer::Create("tl", o16, recipe);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(low.ok()) << low.status();
  PerturbSmallParameters(**full);
  const std::vector<Parameter*> pf = (*full)->Parameters(), pl = (*low)->Parameters();
  ASSERT_EQ(pf.size(), pl.size());
  for (size_t i = 0; i < pf.size(); ++i) {
    ASSERT_EQ(pf[i]->name, pl[i]->name);
    ASSERT_EQ(pl[i]->value.dtype(), DType::kFloat32) << pl[i]->name;
    std::copy(pf[i]->value.floats().begin(), pf[i]->value.floats().end(), pl[i]->value.mutable_floats().begin());
  }

  const Shape shape{6, 2, 32};
  const Tensor x = Rounded(RandomTensor(shape, 11), dtype);
  SideInputs side;
  if (c.decoder) side.Set("encoder_output", RandomTensor({5, 2, 32}, 12));
  const Tensor dy = Rounded(RandomTensor(shape, 13, 0.1f), dtype);
  // The same seeds on both sides: the 16-bit layer draws the FP32 layer's dropout masks.
  const testing_tl::RunResult want = testing_tl::RunForwardBackward(**full, x, side, dy, kCpu);
  const testing_tl::RunResult got = testing_tl::RunForwardBackward(**low, As(x, dtype), side, As(dy, dtype), kCpu);
  ASSERT_TRUE(got.out.defined() && got.dx.defined() && want.out.defined() && want.dx.defined());
  const std::string label = absl::StrCat(c.name, " ", recipe_name, " ", DTypeLabel(dtype));

  ASSERT_EQ(got.out.dtype(), dtype);
  const double out_error = RelativeError(As(got.out, DType::kFloat32), want.out);
  std::printf("%s out: %.3g (%.2f u)\n", label.c_str(), out_error, out_error / u);
  EXPECT_LT(out_error, bound.forward);
  ASSERT_EQ(got.dx.dtype(), dtype);
  const double dx_error = RelativeError(As(got.dx, DType::kFloat32), want.dx);
  std::printf("%s dx: %.3g (%.2f u)\n", label.c_str(), dx_error, dx_error / u);
  EXPECT_LT(dx_error, bound.backward);
  if (c.decoder) {
    ASSERT_TRUE(got.denc.defined());
    ASSERT_EQ(got.denc.dtype(), DType::kFloat32);
    const double denc_error = RelativeError(got.denc, want.denc);
    std::printf("%s encoder_output grad: %.3g (%.2f u)\n", label.c_str(), denc_error, denc_error / u);
    EXPECT_LT(denc_error, bound.backward);
  }
  for (const Parameter* p : pl) ASSERT_EQ(p->grad.dtype(), DType::kFloat32) << p->name;
  const std::vector<double> errors = GradientErrors(pl, pf);
  double worst = 0.0;
  for (size_t i = 0; i < pl.size(); ++i) {
    EXPECT_LT(errors[i], bound.backward) << pl[i]->name;
    worst = std::max(worst, errors[i]);
  }
  std::printf("%s worst parameter grad: %.3g (%.2f u)\n", label.c_str(), worst, worst / u);

  if (o.hidden_dropout > 0.0f && recipe_name == "none") {
    // The masks matter: the FP32 layer without its dropout is more than ten times the
    // bound away from itself with it.
    TransformerLayerOptions plain = o;
    plain.hidden_dropout = 0.0f;
    plain.drop_path_rate = 0.0f;
    auto no_dropout = TransformerLayer::Create("tl", plain, recipe);
    ASSERT_TRUE(no_dropout.ok()) << no_dropout.status();
    testing_tl::CopyParameters(**full, **no_dropout);
    const testing_tl::RunResult r = testing_tl::RunForwardBackward(**no_dropout, x, side, dy, kCpu);
    EXPECT_GT(RelativeError(r.out, want.out), 10 * bound.forward);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, TransformerLayerParamsDType,
                         testing::Combine(testing::ValuesIn(Cases()), testing::Values("none", "delayed", "current"),
                                          testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const testing::TestParamInfo<std::tuple<Case, std::string, DType>>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_", std::get<1>(info.param), "_",
                                               DTypeLabel(std::get<2>(info.param)));
                         });

// hidden_states' gradient goes back in the dtype it came in: FP32 for an FP32 input to a
// BF16 layer (the first layer of a stack reading the session's FP32 input); the output
// is BF16 either way.
TEST(TransformerLayerParamsDType, InputGradientInTheInputsDType) {
  TransformerLayerOptions o = BaseOptions();
  o.params_dtype = DType::kBFloat16;
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe());
  ASSERT_TRUE(layer.ok()) << layer.status();
  const testing_tl::RunResult r = testing_tl::RunForwardBackward(**layer, RandomTensor({4, 2, 32}, 3), SideInputs(),
                                                                 RandomTensor({4, 2, 32}, 4), kCpu);
  ASSERT_TRUE(r.out.defined() && r.dx.defined());
  EXPECT_EQ(r.out.dtype(), DType::kBFloat16);
  EXPECT_EQ(r.dx.dtype(), DType::kFloat32);
}

TEST(TransformerLayerParamsDType, RejectsOtherDTypes) {
  TransformerLayerOptions o = BaseOptions();
  o.params_dtype = DType::kFloat8E4M3;
  auto layer = TransformerLayer::Create("tl", o, recipes::Recipe());
  ASSERT_FALSE(layer.ok());
  EXPECT_THAT(layer.status().message(), testing::HasSubstr("options.params_dtype: expected FLOAT32, BFLOAT16 or FLOAT16"));
}

// The spec builds a 16-bit TransformerLayer natively: the layer itself (no wrapper)
// with params_dtype in its options, its attention core described for 16-bit q, k, v.
TEST(TransformerLayerParamsDType, SpecBuildsItNatively) {
  v1::ModelSpec spec;
  spec.set_seed(3);
  v1::LayerSpec* layer = spec.add_layers();
  layer->set_name("tl");
  auto* tl = layer->mutable_transformer_layer();
  tl->set_hidden_size(32);
  tl->set_ffn_hidden_size(64);
  tl->set_num_attention_heads(4);
  tl->set_hidden_dropout(0.0f);
  tl->set_attention_dropout(0.0f);
  v1::ModelSpec low_spec = spec;
  low_spec.mutable_layers(0)->set_params_dtype(v1::BFLOAT16);
  auto low = BuildStack(low_spec, recipes::Recipe());
  auto full = BuildStack(spec, recipes::Recipe());
  ASSERT_TRUE(low.ok()) << low.status();
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(testing_util::ParameterNames(**low), testing_util::ParameterNames(**full));
  auto* native = dynamic_cast<TransformerLayer*>((*low)->modules()[0].get());
  ASSERT_NE(native, nullptr) << "a 16-bit TransformerLayer is built as itself";
  EXPECT_EQ(native->options().params_dtype, DType::kBFloat16);

  std::vector<AttentionPathInfo> paths;
  native->DescribeAttention(Device::Cuda(0), &paths);
  ASSERT_EQ(paths.size(), 1u);
#if TESERVE_WITH_CUDA
  EXPECT_THAT(paths[0].reason, testing::Not(testing::HasSubstr("not BF16 / FP16")));
#else
  EXPECT_EQ(paths[0].path, "cuda_unfused");
  EXPECT_THAT(paths[0].reason, testing::HasSubstr("not fused: built without the CUDA backend"));
#endif

  // The stack's FP32 input: a BF16 output, an FP32 input gradient.
  testing_util::ExpectNearFloat32Module(**low, **full, {5, 2, 32}, 31, DType::kBFloat16, 3, 6);
}

}  // namespace
}  // namespace layers
}  // namespace teserve
