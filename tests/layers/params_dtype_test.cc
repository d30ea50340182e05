// LayerSpec.params_dtype on the CPU reference: Linear computes in the 16-bit dtype
// (x and the weight rounded to it, y and dx in it, FP32 master weights and gradients),
// DotProductAttention hands 16-bit q, k, v to the attention kernels; every other layer
// computes in FP32 behind a PrecisionBoundary that converts its
// activations; a quantized 16-bit Linear reads the same FP8 codes as an FP32 Linear
// given the same (16-bit representable) values.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/init.h"
#include "layers/spec.h"
#include "recipes/recipe.h"
#include "tests/layers/layer_test_util.h"
#include "tests/recipe_specs.h"

namespace teserve {
namespace layers {
namespace {

using testing_util::RelativeError;

const Context kCpu = Context::Cpu();

Tensor Random(Shape shape, uint64_t seed, float std = 1.0f) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  FillNormal(seed, std, t.mutable_floats());
  return t;
}

Tensor As(const Tensor& t, DType dtype) { return kernels::Convert(kCpu, t, dtype).value(); }

// t rounded to `dtype` and back: values that dtype represents exactly.
Tensor Rounded(const Tensor& t, DType dtype) { return As(As(t, dtype), DType::kFloat32); }

v1::ModelSpec OneLinear(int64_t in, int64_t out, v1::DType params_dtype) {
  v1::ModelSpec spec;
  spec.set_seed(7);
  v1::LayerSpec* fc = spec.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(in);
  fc->mutable_linear()->set_out_features(out);
  fc->set_params_dtype(params_dtype);
  return spec;
}

recipes::Recipe RecipeOf(const std::string& name) {
  return recipes::RecipeFromProto(testing_util::RecipeSpecNamed(name)).value();
}

TEST(ParamsDType, LinearReadsItsWeightRoundedToBf16) {
  // W = 1 + 2^-12 is not a BF16 value: an FP32 Linear sums it, a BF16 one reads 1.0.
  auto stack = BuildStack(OneLinear(16, 4, v1::BFLOAT16), recipes::Recipe()).value();
  Parameter* w = testing_util::FindParameter(*stack, "fc.weight");
  for (float& v : w->value.mutable_floats()) v = 1.0f + 1.0f / 4096;
  Tensor x = Tensor::Zeros(DType::kFloat32, {3, 16}).value();
  for (float& v : x.mutable_floats()) v = 1.0f;
  auto out = stack->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->outputs[0].dtype(), DType::kBFloat16);
  const Tensor y = As(out->outputs[0], DType::kFloat32);
  for (float v : y.floats()) EXPECT_EQ(v, 16.0f);
  // The master weight itself is untouched FP32.
  EXPECT_EQ(w->value.dtype(), DType::kFloat32);
  EXPECT_EQ(w->value.floats()[0], 1.0f + 1.0f / 4096);
}

class LinearParamsDType : public testing::TestWithParam<std::tuple<std::string, v1::DType>> {};

// A 16-bit Linear against an FP32 Linear with the same master weights.
//   - Unquantized: y and dx within a few 16-bit rounding steps, the FP32 weight and bias
//     gradients within the rounding of the operands (relative 1e-2).
//   - Quantized, with x, W and b representable in the 16-bit dtype: the FP8 codes are
//     the same on both sides, so y equals the FP32 Linear's y rounded to the 16-bit
//     dtype, bit for bit (the bias is added in FP32 before that rounding on both).
TEST_P(LinearParamsDType, MatchesTheFloat32Linear) {
  const auto& [recipe_name, wire_dtype] = GetParam();
  const DType dtype = wire_dtype == v1::BFLOAT16 ? DType::kBFloat16 : DType::kFloat16;
  const recipes::Recipe recipe = RecipeOf(recipe_name);
  const bool quantized = recipe_name != "none";
  auto low = BuildStack(OneLinear(128, 128, wire_dtype), recipe).value();
  auto full = BuildStack(OneLinear(128, 128, v1::FLOAT32), recipe).value();
  for (const char* name : {"fc.weight", "fc.bias"}) {
    Parameter* a = testing_util::FindParameter(*low, name);
    Parameter* b = testing_util::FindParameter(*full, name);
    const Tensor init = Rounded(Random(a->value.shape(), name[3] == 'w' ? 1 : 2, 0.1f), dtype);
    std::copy(init.floats().begin(), init.floats().end(), a->value.mutable_floats().begin());
    std::copy(init.floats().begin(), init.floats().end(), b->value.mutable_floats().begin());
  }
  const Tensor x = Rounded(Random({128, 128}, 3), dtype);
  const Tensor dy = Random({128, 128}, 4, 0.1f);

  auto y_low = low->Forward(kCpu, {As(x, dtype)}, ForwardOptions());
  auto y_full = full->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs[0].dtype(), dtype);
  if (quantized && recipe_name != "nvfp4") {
    // NVFP4 draws random streams per quantization (stochastic rounding): not compared
    // code for code here.
    EXPECT_TRUE(BitwiseEqual(y_low->outputs[0], As(y_full->outputs[0], dtype))) << recipe_name;
  }
  EXPECT_LT(RelativeError(As(y_low->outputs[0], DType::kFloat32), y_full->outputs[0]),
            quantized ? 2e-2 : 1e-2);

  auto dx_low = low->Backward(kCpu, *y_low->saved, {dy});
  auto dx_full = full->Backward(kCpu, *y_full->saved, {dy});
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  // dx comes back in the dtype x came in.
  ASSERT_EQ((*dx_low)[0].dtype(), dtype);
  EXPECT_LT(RelativeError(As((*dx_low)[0], DType::kFloat32), (*dx_full)[0]), quantized ? 0.1 : 1e-2);
  for (const char* name : {"fc.weight", "fc.bias"}) {
    const Parameter* a = testing_util::FindParameter(*low, name);
    const Parameter* b = testing_util::FindParameter(*full, name);
    ASSERT_EQ(a->grad.dtype(), DType::kFloat32) << name;
    EXPECT_LT(RelativeError(a->grad, b->grad), quantized ? 0.1 : 1e-2) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LinearParamsDType,
                         testing::Combine(testing::Values("none", "delayed", "current", "block", "mxfp8", "nvfp4"),
                                          testing::Values(v1::BFLOAT16, v1::FLOAT16)),
                         [](const testing::TestParamInfo<std::tuple<std::string, v1::DType>>& info) {
                           return std::get<0>(info.param) + "_" + v1::DType_Name(std::get<1>(info.param));
                         });

// Every other layer kind computes in FP32 behind the boundary: its output is the FP32
// layer's output rounded once, and the gradient of an FP32 input comes back FP32.
TEST(ParamsDType, OtherLayersConvertAtTheirBoundary) {
  v1::ModelSpec spec;
  spec.set_seed(3);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(64);
  auto* mlp = spec.add_layers()->mutable_layer_norm_mlp();
  mlp->set_hidden_size(64);
  mlp->set_ffn_hidden_size(128);
  auto* tl = spec.add_layers()->mutable_transformer_layer();
  tl->set_hidden_size(64);
  tl->set_ffn_hidden_size(128);
  tl->set_num_attention_heads(4);
  tl->set_hidden_dropout(0.0f);
  tl->set_attention_dropout(0.0f);
  v1::ModelSpec low_spec = spec;
  for (v1::LayerSpec& layer : *low_spec.mutable_layers()) layer.set_params_dtype(v1::BFLOAT16);
  auto low = BuildStack(low_spec, recipes::Recipe()).value();
  auto full = BuildStack(spec, recipes::Recipe()).value();
  EXPECT_EQ(testing_util::ParameterNames(*low), testing_util::ParameterNames(*full));
  ASSERT_EQ(low->modules().size(), 3u);
  EXPECT_EQ(low->modules()[1]->kind(), "LayerNormMLP");
  EXPECT_EQ(low->modules()[2]->name(), "layers.2");

  // Layer by layer: the 16-bit stack's first layer is the FP32 one rounded.
  const Tensor x = Random({8, 2, 64}, 5);
  auto first_low = low->modules()[0]->Forward(kCpu, {x}, ForwardOptions());
  auto first_full = full->modules()[0]->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(first_low.ok() && first_full.ok());
  EXPECT_TRUE(BitwiseEqual(first_low->outputs[0], As(first_full->outputs[0], DType::kBFloat16)));

  auto y_low = low->Forward(kCpu, {x}, ForwardOptions());
  auto y_full = full->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs[0].dtype(), DType::kBFloat16);
  EXPECT_LT(RelativeError(As(y_low->outputs[0], DType::kFloat32), y_full->outputs[0]), 2e-2);
  const Tensor dy = Random({8, 2, 64}, 6, 0.1f);
  auto dx_low = low->Backward(kCpu, *y_low->saved, {dy});
  auto dx_full = full->Backward(kCpu, *y_full->saved, {dy});
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  ASSERT_EQ((*dx_low)[0].dtype(), DType::kFloat32);
  EXPECT_LT(RelativeError((*dx_low)[0], (*dx_full)[0]), 5e-2);
  const std::vector<Parameter*> pl = low->Parameters(), pf = full->Parameters();
  for (size_t i = 0; i < pl.size(); ++i) {
    EXPECT_EQ(pl[i]->value.dtype(), DType::kFloat32) << pl[i]->name;
    // Relative to a floor: some gradients are ~0 analytically (a key bias under softmax).
    double diff = 0.0;
    for (int64_t j = 0; j < pf[i]->grad.numel(); ++j) {
      diff += std::pow(static_cast<double>(pl[i]->grad.floats()[j]) - pf[i]->grad.floats()[j], 2);
    }
    double want = 0.0;
    for (float v : pf[i]->grad.floats()) want += static_cast<double>(v) * v;
    const double floor = 1e-3 * std::sqrt(static_cast<double>(pf[i]->grad.numel()));
    EXPECT_LT(std::sqrt(diff) / std::max(std::sqrt(want), floor), 5e-2) << pl[i]->name;
  }
}

// DotProductAttention hands q, k, v to the attention kernels in the 16-bit dtype: on the
// CPU they widen them, run the FP32 reference and round the outputs, so the 16-bit layer's
// out and input gradients are the FP32 layer's (on the same 16-bit values) rounded.
TEST(ParamsDType, DotProductAttentionTakesBf16QkvAsTheyAre) {
  v1::ModelSpec spec;
  spec.set_seed(4);
  v1::LayerSpec* layer = spec.add_layers();
  layer->set_name("attn");
  auto* dpa = layer->mutable_dot_product_attention();
  dpa->set_num_attention_heads(2);
  dpa->set_kv_channels(8);
  dpa->set_attn_mask_type("causal");
  v1::ModelSpec low_spec = spec;
  low_spec.mutable_layers(0)->set_params_dtype(v1::BFLOAT16);
  auto low = BuildStack(low_spec, recipes::Recipe()).value();
  auto full = BuildStack(spec, recipes::Recipe()).value();
  ASSERT_EQ(low->modules()[0]->kind(), "DotProductAttention");
  const Tensor q = Rounded(Random({6, 2, 2, 8}, 1), DType::kBFloat16);
  const Tensor k = Rounded(Random({6, 2, 2, 8}, 2), DType::kBFloat16);
  const Tensor v = Rounded(Random({6, 2, 2, 8}, 3), DType::kBFloat16);
  auto y_low = low->modules()[0]->Forward(kCpu, {As(q, DType::kBFloat16), As(k, DType::kBFloat16),
                                                 As(v, DType::kBFloat16)},
                                          ForwardOptions());
  auto y_full = full->modules()[0]->Forward(kCpu, {q, k, v}, ForwardOptions());
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs[0].dtype(), DType::kBFloat16);
  EXPECT_TRUE(BitwiseEqual(y_low->outputs[0], As(y_full->outputs[0], DType::kBFloat16)));
  const Tensor dy = Rounded(Random({6, 2, 16}, 4), DType::kBFloat16);
  auto dx_low = low->modules()[0]->Backward(kCpu, *y_low->saved, {As(dy, DType::kBFloat16)});
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_EQ(dx_low->size(), 3u);
  for (const Tensor& g : *dx_low) EXPECT_EQ(g.dtype(), DType::kBFloat16);
  std::vector<AttentionPathInfo> paths;
  low->modules()[0]->DescribeAttention(Device::Cpu(), &paths);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].path, "cpu_reference");
#if !TESERVE_WITH_CUDA
  paths.clear();
  low->modules()[0]->DescribeAttention(Device::Cuda(0), &paths);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].path, "cuda_unfused");
  EXPECT_THAT(paths[0].reason, testing::HasSubstr("not fused: built without the CUDA backend"));
#endif
}

// LayerNormLinear computes in the 16-bit dtype too (its norm writes BF16, its Linear reads
// it), also with return_layernorm_output, whose gradient is added in FP32.
TEST(ParamsDType, LayerNormLinearComputesInBf16) {
  v1::ModelSpec spec;
  spec.set_seed(4);
  auto* lnl = spec.add_layers()->mutable_layer_norm_linear();
  lnl->set_in_features(64);
  lnl->set_out_features(32);
  lnl->set_return_layernorm_output(true);
  v1::ModelSpec low_spec = spec;
  low_spec.mutable_layers(0)->set_params_dtype(v1::BFLOAT16);
  const recipes::Recipe recipe = RecipeOf("delayed");
  auto low = BuildStack(low_spec, recipe).value();
  auto full = BuildStack(spec, recipe).value();
  EXPECT_EQ(low->modules()[0]->kind(), "LayerNormLinear");
  const Tensor x = Random({32, 64}, 8);
  auto y_low = low->Forward(kCpu, {x}, ForwardOptions());
  auto y_full = full->Forward(kCpu, {x}, ForwardOptions());
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    ASSERT_EQ(y_low->outputs[i].dtype(), DType::kBFloat16) << i;
    EXPECT_LT(RelativeError(As(y_low->outputs[i], DType::kFloat32), y_full->outputs[i]), 5e-2) << i;
  }
  // The norm's output is the FP32 one rounded once.
  EXPECT_TRUE(BitwiseEqual(y_low->outputs[1], As(y_full->outputs[1], DType::kBFloat16)));
  const std::vector<Tensor> dy = {Random({32, 32}, 9, 0.1f), Random({32, 64}, 10, 0.1f)};
  auto dx_low = low->Backward(kCpu, *y_low->saved, dy);
  auto dx_full = full->Backward(kCpu, *y_full->saved, dy);
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  ASSERT_EQ((*dx_low)[0].dtype(), DType::kFloat32);
  EXPECT_LT(RelativeError((*dx_low)[0], (*dx_full)[0]), 0.1);
  const std::vector<Parameter*> pl = low->Parameters(), pf = full->Parameters();
  for (size_t i = 0; i < pl.size(); ++i) {
    ASSERT_EQ(pl[i]->grad.dtype(), DType::kFloat32) << pl[i]->name;
    EXPECT_LT(RelativeError(pl[i]->grad, pf[i]->grad), 0.1) << pl[i]->name;
  }
}

TEST(ParamsDType, RejectsOtherDTypes) {
  for (v1::DType bad : {v1::FLOAT8_E4M3, v1::INT32, v1::BOOL}) {
    v1::ModelSpec spec = OneLinear(16, 16, bad);
    testing_util::ExpectSpecError(spec, recipes::Recipe(),
                                  "model.layers[0].params_dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got " +
                                      v1::DType_Name(bad));
  }
  v1::ModelSpec spec = OneLinear(16, 16, v1::FLOAT32);
  spec.mutable_layers(0)->set_params_dtype(static_cast<v1::DType>(99));
  testing_util::ExpectSpecError(spec, recipes::Recipe(),
                                "model.layers[0].params_dtype: expected FLOAT32, BFLOAT16 or FLOAT16, got 99");
}

}  // namespace
}  // namespace layers
}  // namespace teserve
