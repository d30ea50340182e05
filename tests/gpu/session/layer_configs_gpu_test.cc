// Every layer, alone in a session, on Transformer Engine's "small" and "weird" test
// configurations (docs/te_facts.md), under no recipe and every recipe, with FP32 and
// BF16 params: a GPU session against the CPU reference from the same spec and seed.
//   small: batch 2, seq 128, 8 heads of 16 (hidden 128, 256 tokens)
//   weird: batch 3, seq 37, 3 heads of 23 (hidden 69, 111 tokens)
// A configuration the CPU session refuses (a recipe whose blocks do not divide the
// shapes, a layer that cannot take the dims) must be refused on the GPU too, with the
// same code and message. Otherwise one ForwardBackward (MSE) from the same state is
// judged as session_gpu_test judges its first step: loss, output, input gradients and
// every parameter gradient by their relative L2 error (bounds per recipe, below).
//
// TESERVE_LAYER_CONFIGS_DEVICE=cpu runs the same comparison CPU against CPU (on a
// machine without a GPU: the harness, the specs and the refusal matching are checked,
// and every comparison is exact).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cast.h"
#include "layers/init.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/recipe_specs.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

struct Config {
  std::string name;
  int64_t batch, seq, heads, head_dim;
  int64_t hidden() const { return heads * head_dim; }
  int64_t tokens() const { return batch * seq; }
};

std::vector<Config> Configs() { return {{"small", 2, 128, 8, 16}, {"weird", 3, 37, 3, 23}}; }

std::vector<std::string> Layers() {
  return {"Linear",        "LayerNorm",           "RMSNorm",           "LayerNormLinear", "LayerNormMLP",
          "GroupedLinear", "DotProductAttention", "MultiheadAttention", "TransformerLayer"};
}
std::vector<std::string> Recipes() { return {"none", "delayed", "current", "mxfp8", "block", "nvfp4"}; }

// One layer of kind `layer` on config `c`, params_dtype `dtype`; its inputs' shapes and
// side inputs.
struct Model {
  v1::ModelSpec spec;
  std::vector<Shape> inputs;
  layers::SideInputs side;
};

Model ModelOf(const std::string& layer, const Config& c, v1::DType dtype) {
  Model m;
  m.spec.set_seed(21);
  v1::LayerSpec* l = m.spec.add_layers();
  l->set_name("l");
  l->set_params_dtype(dtype);
  const int64_t h = c.hidden();
  const Shape sbh{c.seq, c.batch, h};
  m.inputs = {sbh};
  if (layer == "Linear") {
    l->mutable_linear()->set_in_features(h);
    l->mutable_linear()->set_out_features(h);
    l->mutable_linear()->set_init_std(0.1f);
  } else if (layer == "LayerNorm") {
    l->mutable_layer_norm()->set_hidden_size(h);
  } else if (layer == "RMSNorm") {
    l->mutable_rms_norm()->set_hidden_size(h);
  } else if (layer == "LayerNormLinear") {
    l->mutable_layer_norm_linear()->set_in_features(h);
    l->mutable_layer_norm_linear()->set_out_features(h);
    l->mutable_layer_norm_linear()->set_init_std(0.1f);
  } else if (layer == "LayerNormMLP") {
    l->mutable_layer_norm_mlp()->set_hidden_size(h);
    l->mutable_layer_norm_mlp()->set_ffn_hidden_size(4 * h);
    l->mutable_layer_norm_mlp()->set_init_std(0.05f);
  } else if (layer == "GroupedLinear") {
    l->mutable_grouped_linear()->set_num_gemms(2);
    l->mutable_grouped_linear()->set_in_features(h);
    l->mutable_grouped_linear()->set_out_features(h);
    l->mutable_grouped_linear()->set_init_std(0.1f);
    m.inputs = {{c.tokens(), h}};
    Tensor splits = Tensor::Zeros(DType::kInt64, {2}).value();
    splits.data<int64_t>()[0] = c.tokens() / 2;
    splits.data<int64_t>()[1] = c.tokens() - c.tokens() / 2;
    m.side.Set("m_splits", std::move(splits));
  } else if (layer == "DotProductAttention") {
    l->mutable_dot_product_attention()->set_num_attention_heads(c.heads);
    l->mutable_dot_product_attention()->set_kv_channels(c.head_dim);
    l->mutable_dot_product_attention()->set_attn_mask_type("causal");
    const Shape sbhd{c.seq, c.batch, c.heads, c.head_dim};
    m.inputs = {sbhd, sbhd, sbhd};
  } else if (layer == "MultiheadAttention") {
    l->mutable_multihead_attention()->set_hidden_size(h);
    l->mutable_multihead_attention()->set_num_attention_heads(c.heads);
    l->mutable_multihead_attention()->set_init_std(0.05f);
  } else {
    l->mutable_transformer_layer()->set_hidden_size(h);
    l->mutable_transformer_layer()->set_ffn_hidden_size(4 * h);
    l->mutable_transformer_layer()->set_num_attention_heads(c.heads);
    l->mutable_transformer_layer()->set_init_std(0.05f);
  }
  return m;
}

v1::OptimizerSpec Sgd() {
  v1::OptimizerSpec o;
  o.mutable_sgd()->set_lr(1e-2f);
  return o;
}

// The device under test: cuda:0, or the CPU when TESERVE_LAYER_CONFIGS_DEVICE=cpu.
std::optional<Context> DeviceUnderTest() {
  const char* device = std::getenv("TESERVE_LAYER_CONFIGS_DEVICE");
  if (device != nullptr && std::string(device) == "cpu") return Context::Cpu();
  std::string why;
  if (!testing::GpuAvailable(&why)) return std::nullopt;
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

// Bounds of the relative L2 error of one forward and backward of one layer from the
// same state, session_gpu_test's first-step bounds (its "Quantized recipes" comment says
// why they are what they are): unquantized FP32 1e-4 (summation order); BF16 params 2e-2
// forward / 5e-2 backward (a BF16 rounding step is 2^-8); per-tensor FP8 5e-2 / 0.5 (the
// gradients go to E5M2 with the first step's default scale, and a TransformerLayer's dx
// passes four quantized GEMMs); MXFP8 and block scaling 5e-2 / 0.1; NVFP4 0.2 / 0.2
// (E2M1's coarser grid, see there).
struct Bounds {
  double forward, backward;
};

Bounds BoundsFor(const std::string& recipe, v1::DType dtype) {
  if (recipe == "none") return dtype == v1::FLOAT32 ? Bounds{1e-4, 1e-4} : Bounds{2e-2, 5e-2};
  if (recipe == "delayed" || recipe == "current") return {5e-2, 0.5};
  if (recipe == "nvfp4") return {0.2, 0.2};
  return {5e-2, 0.1};
}

double RelativeL2(const Tensor& got_any, const Tensor& want_any) {
  const Tensor got = kernels::Convert(Context::Cpu(), got_any, DType::kFloat32).value();
  const Tensor want = kernels::Convert(Context::Cpu(), want_any, DType::kFloat32).value();
  double diff = 0.0, norm = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double w = want.floats()[i];
    diff += (got.floats()[i] - w) * (got.floats()[i] - w);
    norm += w * w;
  }
  const double floor = 1e-4 * std::sqrt(static_cast<double>(std::max<int64_t>(want.numel(), 1)));
  return std::sqrt(diff) / std::max(std::sqrt(norm), floor);
}

void ExpectClose(const Tensor& got, const Tensor& want, double bound, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const double e = RelativeL2(got, want);
  EXPECT_LE(e, bound) << what << ": relative L2 error " << e;
}

using Param = std::tuple<Config, std::string, std::string, v1::DType>;

class LayerConfigsGpu : public ::testing::TestWithParam<Param> {};

TEST_P(LayerConfigsGpu, OneStepMatchesTheCpuReferenceOrIsRefusedAlike) {
  const std::optional<Context> device = DeviceUnderTest();
  if (!device.has_value()) GTEST_SKIP() << "no GPU (TESERVE_LAYER_CONFIGS_DEVICE=cpu runs it CPU against CPU)";
  const auto& [c, layer, recipe, dtype] = GetParam();
  const Model m = ModelOf(layer, c, dtype);
  const v1::RecipeSpec r = testing_util::RecipeSpecNamed(recipe);
  auto cpu = Session::Create(m.spec, r, Sgd(), Context::Cpu());
  auto dev = Session::Create(m.spec, r, Sgd(), *device);
  ASSERT_EQ(dev.status().code(), cpu.status().code()) << "cpu: " << cpu.status() << "; device: " << dev.status();
  if (!cpu.ok()) {
    EXPECT_EQ(dev.status().message(), cpu.status().message());
    std::printf("refused at creation alike: %s\n", std::string(cpu.status().message()).c_str());
    return;
  }
  if (!device->device.is_cpu()) {
    EXPECT_EQ((*dev)->Summary().device, "cuda:0") << (*dev)->Summary().device_note;
  }
  std::vector<Tensor> inputs;
  for (size_t i = 0; i < m.inputs.size(); ++i) {
    Tensor t = Tensor::Zeros(DType::kFloat32, m.inputs[i]).value();
    layers::FillNormal(100 + i, 1.0f, t.mutable_floats());
    inputs.push_back(std::move(t));
  }
  // The single output has the last input's leading shape and the layer's width.
  Shape out_shape = m.inputs[0];
  if (layer == "DotProductAttention") out_shape = {c.seq, c.batch, c.hidden()};
  Tensor target = Tensor::Zeros(DType::kFloat32, out_shape).value();
  layers::FillNormal(200, 0.5f, target.mutable_floats());
  LossOptions mse;
  mse.kind = LossOptions::Kind::kMse;
  auto want = (*cpu)->ForwardBackward(inputs, m.side, mse, target, true, true);
  auto got = (*dev)->ForwardBackward(inputs, m.side, mse, target, true, true);
  ASSERT_EQ(got.status().code(), want.status().code()) << "cpu: " << want.status() << "; device: " << got.status();
  if (!want.ok()) {
    EXPECT_EQ(got.status().message(), want.status().message());
    std::printf("refused at the call alike: %s\n", std::string(want.status().message()).c_str());
    return;
  }
  const Bounds bound = BoundsFor(recipe, dtype);
  EXPECT_NEAR(got->loss, want->loss, bound.forward * std::fabs(want->loss) + 1e-6);
  ASSERT_EQ(got->outputs.size(), want->outputs.size());
  ExpectClose(got->outputs[0], want->outputs[0], bound.forward, "output");
  ASSERT_EQ(got->grad_inputs.size(), want->grad_inputs.size());
  for (size_t i = 0; i < want->grad_inputs.size(); ++i) {
    ExpectClose(got->grad_inputs[i], want->grad_inputs[i], bound.backward, absl::StrCat("grad_inputs[", i, "]"));
  }
  auto want_grads = (*cpu)->GetGradients({});
  auto got_grads = (*dev)->GetGradients({});
  ASSERT_TRUE(want_grads.ok() && got_grads.ok());
  ASSERT_EQ(got_grads->size(), want_grads->size());
  for (size_t i = 0; i < want_grads->size(); ++i) {
    EXPECT_EQ((*got_grads)[i].name, (*want_grads)[i].name);
    ExpectClose((*got_grads)[i].tensor, (*want_grads)[i].tensor, bound.backward, (*want_grads)[i].name);
  }
}

std::string NameOf(const ::testing::TestParamInfo<Param>& info) {
  const auto& [c, layer, recipe, dtype] = info.param;
  return absl::StrCat(c.name, "_", layer, "_", recipe, "_", dtype == v1::FLOAT32 ? "fp32" : "bf16");
}

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(TeConfigs, LayerConfigsGpu,
                         ::testing::Combine(::testing::ValuesIn(Configs()), ::testing::ValuesIn(Layers()),
                                            ::testing::ValuesIn(Recipes()),
                                            ::testing::Values(v1::FLOAT32, v1::BFLOAT16)),
                         NameOf);

}  // namespace
}  // namespace train
}  // namespace teserve
