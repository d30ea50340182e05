// LayerSpec.params_dtype on the CPU reference: Linear, GroupedLinear, the norms,
// LayerNormLinear and LayerNormMLP compute in the 16-bit dtype (x and the weights
// rounded to it, outputs and input gradients in it, FP32 master weights and
// gradients); DotProductAttention hands 16-bit q, k, v to the attention kernels, and
// MultiheadAttention computes in 16 bits around it (multihead_attention_params_dtype_test),
// and so does TransformerLayer around its blocks (transformer_layer_params_dtype_test).
// A quantized 16-bit Linear reads the same FP8 codes as an FP32 Linear given the same
// (16-bit representable) values.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/init.h"
#include "layers/spec.h"
#include "layers/transformer_layer.h"
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

// A stack of LayerNorm, MultiheadAttention and TransformerLayer, each computing in BF16
// itself (no layer is wrapped), against the FP32 stack: the first layer's output is the
// FP32 one rounded once, the stack's output and gradients stay within 16-bit rounding,
// and the gradient of an FP32 input comes back FP32.
TEST(ParamsDType, StackOfLayersComputesInBf16) {
  v1::ModelSpec spec;
  spec.set_seed(3);
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(64);
  auto* mha = spec.add_layers()->mutable_multihead_attention();
  mha->set_hidden_size(64);
  mha->set_num_attention_heads(4);
  mha->set_attention_dropout(0.0f);
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
  EXPECT_EQ(low->modules()[1]->kind(), "MultiheadAttention");
  EXPECT_EQ(low->modules()[2]->name(), "layers.2");
  auto* native = dynamic_cast<TransformerLayer*>(low->modules()[2].get());
  ASSERT_NE(native, nullptr);
  EXPECT_EQ(native->options().params_dtype, DType::kBFloat16);

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

// ---- LayerNormMLP and GroupedLinear ------------------------------------------------------

// Unit roundoff of a 16-bit dtype (half the distance between neighbouring values,
// relative): BF16 has 8 significant bits (2^-8), FP16 11 (2^-11).
using testing_util::UnitRoundoff;

DType ToDType(v1::DType wire) { return wire == v1::BFLOAT16 ? DType::kBFloat16 : DType::kFloat16; }

// The fused layers under test, each the only layer of its model:
//   mlp_gelu               LayerNormMLP, LayerNorm, gelu, returning ln_out too
//   mlp_swiglu_checkpoint  LayerNormMLP, RMSNorm, swiglu (gated), recomputing fc1
//   grouped                GroupedLinear over 3 groups, the middle one empty
v1::ModelSpec FusedLayerModel(const std::string& layer, v1::DType params_dtype) {
  v1::ModelSpec spec;
  spec.set_seed(9);
  v1::LayerSpec* l = spec.add_layers();
  l->set_name("l");
  l->set_params_dtype(params_dtype);
  if (layer == "grouped") {
    auto* g = l->mutable_grouped_linear();
    g->set_num_gemms(3);
    g->set_in_features(128);
    g->set_out_features(128);
    g->set_init_std(0.1f);
    return spec;
  }
  auto* mlp = l->mutable_layer_norm_mlp();
  mlp->set_hidden_size(128);
  mlp->set_ffn_hidden_size(256);
  mlp->set_init_std(0.1f);
  if (layer == "mlp_gelu") {
    mlp->set_return_layernorm_output(true);
  } else {
    mlp->set_normalization("RMSNorm");
    mlp->set_activation("swiglu");
    mlp->set_checkpoint(true);
  }
  return spec;
}

constexpr int64_t kFusedTokens = 128;

SideInputs GroupSplits() {
  SideInputs side;
  Tensor splits = Tensor::Zeros(DType::kInt64, {3}).value();
  splits.data<int64_t>()[0] = 48;
  splits.data<int64_t>()[1] = 0;
  splits.data<int64_t>()[2] = kFusedTokens - 48;
  side.Set("m_splits", std::move(splits));
  return side;
}

// Biases and norm parameters non-zero (the same draws in both stacks).
void RandomizeSmallParameters(LayerStack& stack) {
  uint64_t stream = 50;
  for (Parameter* p : stack.Parameters()) {
    if (p->value.rank() == 1) FillNormal(stream++, 0.3f, p->value.mutable_floats());
  }
}

// The quantizer of `role` of sub-layer `layer` ("l.fc1", "l.gemm0", ...).
recipes::Quantizer* QuantizerOf(Module& m, const std::string& layer, recipes::TensorRole role) {
  for (const NamedQuantizer& q : m.Quantizers()) {
    if (q.layer == layer && q.quantizer->role() == role) return q.quantizer;
  }
  ADD_FAILURE() << "no quantizer " << layer;
  return nullptr;
}

struct FusedBounds {
  double forward;   // relative L2 error of the outputs
  double backward;  // of the input and parameter gradients
};

// How far the 16-bit layer may be from the FP32 one (relative L2 errors), in units of
// the dtype's unit roundoff u.
//   - No recipe: the two compute the same values but for the 16-bit roundings, each a
//     relative error of at most u (RMS ~u / sqrt(3)) and independent between elements,
//     so the GEMMs' sums average them instead of adding them up. The MLP forward rounds
//     six tensors (ln_out, W1, fc1_out, the activation, W2, y): RMS ~1.4u; the backward
//     adds dy's consumers' roundings (d_act, d fc1_out, d ln_out, dx), and the norm's
//     backward subtracts row means, which cancels part of the signal and not of the
//     error. GroupedLinear rounds W and y (dx): below u. Bounds 4u forward and 6u
//     backward (this data: MLP up to 1.1u / 1.3u, GroupedLinear 0.6u / 0.6u).
//   - Delayed / current scaling: both sides quantize, but the FP32 side quantizes the
//     FP32 values and the 16-bit side their roundings. A value within its rounding error
//     (mean u / 2) of an FP8 rounding boundary takes the neighbouring code, one step
//     away (E4M3 2^-3 relative, E5M2 2^-2): a fraction ~u / (2 step) of the values, so
//     each quantized operand adds ~sqrt(u / (2 step)) * step relative error, for BF16
//     ~1.1e-2 per E4M3 operand (forward) and ~2.2e-2 per E5M2 one (gradients), for FP16
//     sqrt(8) times less. The MLP quantizes four forward operands, the backward also
//     two gradients and reads the forward's codes, and the activation and the norm's
//     backward amplify some of it. Bounds: BF16 0.1 forward and 0.15 backward, FP16
//     5e-2 and 8e-2 (this data: BF16 up to 3.5e-2 / 5.8e-2, FP16 1.7e-2 / 3.1e-2). A
//     wrong dtype, scale or operand gives errors of order 1.
FusedBounds BoundsFor(const std::string& recipe, DType dtype) {
  const double u = UnitRoundoff(dtype);
  if (recipe == "none") return {4 * u, 6 * u};
  return dtype == DType::kBFloat16 ? FusedBounds{0.1, 0.15} : FusedBounds{5e-2, 8e-2};
}

class FusedLayerParamsDType
    : public testing::TestWithParam<std::tuple<std::string, std::string, v1::DType>> {};

// A 16-bit LayerNormMLP / GroupedLinear against the FP32 layer with the same FP32
// masters, forward and backward, on 16-bit inputs and output gradients: outputs and
// input gradients come out in the 16-bit dtype and within BoundsFor of the FP32
// layer's; parameters and their gradients stay FP32, the gradients within the backward
// bound. What must be exact is checked bit for bit:
//   - ln_out is the FP32 norm's output rounded once;
//   - the quantizers read the 16-bit tensors: rounding is monotonic, so the amax of a
//     16-bit tensor is the FP32 tensor's amax rounded, for ln_out (fc1's input), the
//     group inputs and every weight; except where the norm kernel makes fc1's input cast
//     (Linear::PlanInputCast: delayed scaling, MXFP8), which quantizes the FP32 norm
//     output, so that amax is the FP32 layer's exactly.
TEST_P(FusedLayerParamsDType, MatchesTheFloat32Layer) {
  const auto& [layer, recipe_name, wire_dtype] = GetParam();
  const DType dtype = ToDType(wire_dtype);
  const recipes::Recipe recipe = RecipeOf(recipe_name);
  const FusedBounds bound = BoundsFor(recipe_name, dtype);
  const bool grouped = layer == "grouped";
  auto low = BuildStack(FusedLayerModel(layer, wire_dtype), recipe).value();
  auto full = BuildStack(FusedLayerModel(layer, v1::FLOAT32), recipe).value();
  EXPECT_EQ(low->modules()[0]->kind(), grouped ? "GroupedLinear" : "LayerNormMLP");
  RandomizeSmallParameters(*low);
  RandomizeSmallParameters(*full);
  const SideInputs side = grouped ? GroupSplits() : SideInputs();
  ForwardOptions options;
  options.side = &side;

  // 16-bit inputs and gradients, as the previous and next 16-bit layers hand them over;
  // the FP32 layer reads the same values.
  const Tensor x = Rounded(Random({kFusedTokens, 128}, 11), dtype);
  auto y_low = low->Forward(kCpu, {As(x, dtype)}, options);
  auto y_full = full->Forward(kCpu, {x}, options);
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs.size(), y_full->outputs.size());
  for (size_t i = 0; i < y_low->outputs.size(); ++i) {
    ASSERT_EQ(y_low->outputs[i].dtype(), dtype) << i;
    const double error = RelativeError(As(y_low->outputs[i], DType::kFloat32), y_full->outputs[i]);
    EXPECT_LT(error, bound.forward) << "output " << i;
    std::printf("%s %s %s output %zu: relative error %.3g (%.2f u)\n", layer.c_str(), recipe_name.c_str(),
                std::string(DTypeName(dtype)).c_str(), i, error, error / UnitRoundoff(dtype));
  }
  if (layer == "mlp_gelu") {
    EXPECT_TRUE(BitwiseEqual(y_low->outputs[1], As(y_full->outputs[1], dtype)));
  }
  if (recipe.quantizes()) {
    std::vector<std::pair<std::string, recipes::TensorRole>> read16;
    if (grouped) {
      for (const char* g : {"l.gemm0", "l.gemm2"}) {
        read16.push_back({g, recipes::TensorRole::kInput});
        read16.push_back({g, recipes::TensorRole::kWeight});
      }
    } else {
      read16 = {{"l.fc1", recipes::TensorRole::kInput},
                {"l.fc1", recipes::TensorRole::kWeight},
                {"l.fc2", recipes::TensorRole::kWeight}};
    }
    const bool fused_ln_out = !grouped && (recipe_name == "delayed" || recipe_name == "mxfp8");
    for (const auto& [sub, role] : read16) {
      const float a_low = QuantizerOf(*low, sub, role)->Snapshot().amax;
      const float a_full = QuantizerOf(*full, sub, role)->Snapshot().amax;
      if (fused_ln_out && sub == "l.fc1" && role == recipes::TensorRole::kInput) {
        EXPECT_EQ(a_low, a_full) << sub << " (fused input cast)";
        continue;
      }
      const Tensor a = Tensor::FromFloats({a_full}, {1}).value();
      EXPECT_EQ(a_low, As(As(a, dtype), DType::kFloat32).floats()[0]) << sub;
    }
  }

  std::vector<Tensor> dy_full = {Rounded(Random({kFusedTokens, 128}, 12, 0.1f), dtype)};
  if (layer == "mlp_gelu") dy_full.push_back(Rounded(Random({kFusedTokens, 128}, 13, 0.1f), dtype));
  std::vector<Tensor> dy_low;
  for (const Tensor& g : dy_full) dy_low.push_back(As(g, dtype));
  auto dx_low = low->Backward(kCpu, *y_low->saved, dy_low);
  auto dx_full = full->Backward(kCpu, *y_full->saved, dy_full);
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  // dx comes back in the dtype x came in.
  ASSERT_EQ((*dx_low)[0].dtype(), dtype);
  const double dx_error = RelativeError(As((*dx_low)[0], DType::kFloat32), (*dx_full)[0]);
  EXPECT_LT(dx_error, bound.backward);
  std::printf("%s %s %s dx: relative error %.3g (%.2f u)\n", layer.c_str(), recipe_name.c_str(),
              std::string(DTypeName(dtype)).c_str(), dx_error, dx_error / UnitRoundoff(dtype));
  const std::vector<Parameter*> pl = low->Parameters(), pf = full->Parameters();
  ASSERT_EQ(pl.size(), pf.size());
  for (size_t i = 0; i < pl.size(); ++i) {
    ASSERT_EQ(pl[i]->value.dtype(), DType::kFloat32) << pl[i]->name;
    ASSERT_EQ(pl[i]->grad.dtype(), DType::kFloat32) << pl[i]->name;
    if (grouped && (pl[i]->name == "l.weight1" || pl[i]->name == "l.bias1")) {
      // The empty group's parameters get no gradient.
      for (float v : pl[i]->grad.floats()) EXPECT_EQ(v, 0.0f) << pl[i]->name;
      continue;
    }
    const double error = RelativeError(pl[i]->grad, pf[i]->grad);
    EXPECT_LT(error, bound.backward) << pl[i]->name;
    std::printf("%s %s %s %s: relative error %.3g (%.2f u)\n", layer.c_str(), recipe_name.c_str(),
                std::string(DTypeName(dtype)).c_str(), pl[i]->name.c_str(), error, error / UnitRoundoff(dtype));
  }
}

INSTANTIATE_TEST_SUITE_P(
    LayersAndRecipes, FusedLayerParamsDType,
    testing::Combine(testing::Values("mlp_gelu", "mlp_swiglu_checkpoint", "grouped"),
                     testing::Values("none", "delayed", "current"), testing::Values(v1::BFLOAT16, v1::FLOAT16)),
    [](const testing::TestParamInfo<std::tuple<std::string, std::string, v1::DType>>& info) {
      return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" + v1::DType_Name(std::get<2>(info.param));
    });

// GroupedLinear is Linears on the row groups, so with x, the weights, the biases and dy
// representable in the 16-bit dtype both sides multiply the same values (quantized:
// the same FP8 codes) with FP32 accumulation: y and dx are the FP32 layer's rounded
// once, and the FP32 weight and bias gradients are equal, bit for bit.
TEST_P(LinearParamsDType, GroupedLinearOnRepresentableValuesIsTheFloat32OneRounded) {
  const auto& [recipe_name, wire_dtype] = GetParam();
  if (recipe_name == "nvfp4") GTEST_SKIP() << "random streams per quantization (stochastic rounding)";
  const DType dtype = ToDType(wire_dtype);
  const recipes::Recipe recipe = RecipeOf(recipe_name);
  auto low = BuildStack(FusedLayerModel("grouped", wire_dtype), recipe).value();
  auto full = BuildStack(FusedLayerModel("grouped", v1::FLOAT32), recipe).value();
  const std::vector<Parameter*> pl = low->Parameters(), pf = full->Parameters();
  for (size_t i = 0; i < pl.size(); ++i) {
    const Tensor init = Rounded(Random(pl[i]->value.shape(), 60 + i, 0.1f), dtype);
    std::copy(init.floats().begin(), init.floats().end(), pl[i]->value.mutable_floats().begin());
    std::copy(init.floats().begin(), init.floats().end(), pf[i]->value.mutable_floats().begin());
  }
  // Block-scaled recipes need groups of whole 128-row blocks.
  SideInputs side;
  Tensor splits = Tensor::Zeros(DType::kInt64, {3}).value();
  const bool blocks = recipe.block_multiple() > 1;
  splits.data<int64_t>()[0] = blocks ? 128 : 48;
  splits.data<int64_t>()[2] = blocks ? 128 : 208;
  side.Set("m_splits", std::move(splits));
  ForwardOptions options;
  options.side = &side;
  const Tensor x = Rounded(Random({256, 128}, 14), dtype);
  const Tensor dy = Rounded(Random({256, 128}, 15, 0.1f), dtype);
  auto y_low = low->Forward(kCpu, {As(x, dtype)}, options);
  auto y_full = full->Forward(kCpu, {x}, options);
  ASSERT_TRUE(y_low.ok()) << y_low.status();
  ASSERT_TRUE(y_full.ok()) << y_full.status();
  ASSERT_EQ(y_low->outputs[0].dtype(), dtype);
  EXPECT_TRUE(BitwiseEqual(y_low->outputs[0], As(y_full->outputs[0], dtype)));
  auto dx_low = low->Backward(kCpu, *y_low->saved, {As(dy, dtype)});
  auto dx_full = full->Backward(kCpu, *y_full->saved, {dy});
  ASSERT_TRUE(dx_low.ok()) << dx_low.status();
  ASSERT_TRUE(dx_full.ok()) << dx_full.status();
  ASSERT_EQ((*dx_low)[0].dtype(), dtype);
  EXPECT_TRUE(BitwiseEqual((*dx_low)[0], As((*dx_full)[0], dtype)));
  for (size_t i = 0; i < pl.size(); ++i) EXPECT_TRUE(BitwiseEqual(pl[i]->grad, pf[i]->grad)) << pl[i]->name;
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
