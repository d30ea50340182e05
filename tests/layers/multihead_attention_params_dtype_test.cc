// MultiheadAttention with a 16-bit params_dtype (BF16 / FP16) on the CPU reference,
// against the FP32 layer with the same master parameters, forward and backward, per
// option family (separate / fused QKV, input LayerNorm / RMSNorm with its returned
// output, GQA / MQA, RoPE halves and interleaved, qk_norm L2 / RMSNorm / LayerNorm
// before and after RoPE, cross-attention, thd, recomputed core attention, learnable
// softmax): outputs and the hidden_states gradient come out in the 16-bit dtype (the
// latter in the dtype hidden_states came in), the encoder_output gradient and every
// parameter gradient in FP32. The spec builds the layer natively and its attention
// core reports the 16-bit path (a TransformerLayer's attention blocks compute in its
// params_dtype the same way: transformer_layer_params_dtype_test).
//
// Tolerances, in units of the dtype's unit roundoff u (2^-8 for BF16, 2^-11 for FP16).
// The 16-bit layer rounds each GEMM operand (weights from their masters), the fused
// projection output, q and k after each norm / RoPE, the attention output and the final
// output, each by a relative error <= u of random sign; the norm-wise error of the
// output is dominated by its own final rounding (about u / sqrt(3) per element) plus the
// propagated earlier ones, and measures about u here. The forward is held to 3u (BF16
// 1.2e-2, FP16 1.5e-3). The backward adds as many roundings again (dy, dcontext,
// dq / dk / dv, their RoPE / norm backwards, the merged dmixed) on top of the forward's
// 16-bit saved activations, and a parameter gradient sums products of two rounded
// factors; measured up to about 2u (the qk norm weights, whose gradients are sums over
// every head's rounded channels), it is held to 6u (BF16 2.3e-2, FP16 2.9e-3). A
// gradient that vanishes analytically (a key bias, or the k_norm bias, under softmax's
// shift invariance) is, in 16 bits, the rounding residue of a cancelling sum: it is
// measured against the size of a typical gradient of its length (GradientErrors).
#include <algorithm>
#include <cmath>
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
#include "recipes/recipe.h"
#include "tests/layers/grad_check.h"
#include "tests/layers/layer_test_util.h"
#include "tests/layers/multihead_attention_test_util.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnMaskType;
using kernels::QkvFormat;
using testing_mha::BaseOptions;
using testing_mha::Rope;
using testing_mha::Set;
using testing_util::CuSeqlens;
using testing_util::PerturbSmallParameters;
using testing_util::RandomTensor;
using testing_util::GradientErrors;
using testing_util::RelativeError;
using testing_util::UnitRoundoff;

const Context kCpu = Context::Cpu();

Tensor As(const Tensor& t, DType dtype) { return kernels::Convert(kCpu, t, dtype).value(); }

// t rounded to `dtype` and back: values that dtype represents exactly.
Tensor Rounded(const Tensor& t, DType dtype) { return As(As(t, dtype), DType::kFloat32); }



struct DTypeCase {
  std::string name;
  std::function<void(MultiheadAttentionOptions*)> configure;
  Shape x_shape;
  Shape encoder_shape;               // cross only
  std::vector<int32_t> cu_q, cu_kv;  // thd only
};

void PrintTo(const DTypeCase& c, std::ostream* os) { *os << c.name; }

std::vector<DTypeCase> Cases() {
  return {
      {"SelfSeparate_Gqa_Sbhd_Causal", Set([](auto*) {}), {6, 2, 32}},
      {"SelfFusedInterleaved_Mha_Bshd_NoMask",
       Set([](auto* o) {
         o->fuse_qkv_params = true;
         o->num_gqa_groups = 0;
         o->qkv_format = QkvFormat::kBshd;
         o->attn_mask_type = AttnMaskType::kNoMask;
       }),
       {2, 5, 32}},
      {"SelfFusedConcatenated_Mqa",
       Set([](auto* o) {
         o->fuse_qkv_params = true;
         o->qkv_weight_interleaved = false;
         o->num_gqa_groups = 1;
       }),
       {5, 2, 32}},
      {"InputLayerNorm_Fused_ReturnLayerNormOutput_ReturnBias",
       Set([](auto* o) {
         o->input_layernorm = true;
         o->fuse_qkv_params = true;
         o->return_layernorm_output = true;
         o->return_bias = true;
       }),
       {5, 2, 32}},
      {"InputRmsNormZeroCentered_Separate",
       Set([](auto* o) {
         o->input_layernorm = true;
         o->normalization = NormKind::kRmsNorm;
         o->zero_centered_gamma = true;
       }),
       {5, 2, 32}},
      {"RopeHalves", Set([](auto* o) { Rope(o, false); }), {6, 2, 32}},
      {"RopeInterleaved_Fused_Bshd_Percent50",
       Set([](auto* o) {
         o->fuse_qkv_params = true;
         o->qkv_format = QkvFormat::kBshd;
         Rope(o, true, 0.5);
       }),
       {2, 6, 32}},
      {"QkL2_AfterRope",
       Set([](auto* o) {
         o->qk_norm_type = QkNormType::kL2Normalization;
         Rope(o, false);
       }),
       {6, 2, 32}},
      {"QkL2_BeforeRope_Fused",
       Set([](auto* o) {
         o->fuse_qkv_params = true;
         o->qk_norm_type = QkNormType::kL2Normalization;
         o->qk_norm_before_rope = true;
         Rope(o, true);
       }),
       {6, 2, 32}},
      {"QkRmsNorm_BeforeRope_InputLayerNorm",
       Set([](auto* o) {
         o->input_layernorm = true;
         o->qk_norm_type = QkNormType::kRmsNorm;
         o->qk_norm_before_rope = true;
         Rope(o, false);
       }),
       {6, 2, 32}},
      {"QkLayerNorm_AfterRope",
       Set([](auto* o) {
         o->qk_norm_type = QkNormType::kLayerNorm;
         Rope(o, true);
       }),
       {6, 2, 32}},
      {"CrossFused_RopeInterleaved_QkL2",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->fuse_qkv_params = true;
         o->attn_mask_type = AttnMaskType::kNoMask;
         o->qk_norm_type = QkNormType::kL2Normalization;
         Rope(o, true);
       }),
       {4, 2, 32},
       {6, 2, 32}},
      {"CrossSeparate_InputLayerNorm_Bshd",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->qkv_format = QkvFormat::kBshd;
         o->input_layernorm = true;
         o->return_layernorm_output = true;
         o->attn_mask_type = AttnMaskType::kCausalBottomRight;
       }),
       {2, 3, 32},
       {2, 5, 32}},
      {"Thd_PaddingCausal_Rope_QkRmsNorm",
       Set([](auto* o) {
         o->qkv_format = QkvFormat::kThd;
         o->attn_mask_type = AttnMaskType::kPaddingCausal;
         o->qk_norm_type = QkNormType::kRmsNorm;
         Rope(o, false);
       }),
       {7, 32},
       {},
       {0, 3, 7}},
      {"CheckpointCoreAttention_Rope",
       Set([](auto* o) {
         o->checkpoint_core_attention = true;
         Rope(o, false);
       }),
       {5, 2, 32}},
      {"LearnableSoftmax_NoBias",
       Set([](auto* o) {
         o->softmax_type = kernels::SoftmaxType::kLearnable;
         o->bias = false;
       }),
       {5, 2, 32}},
  };
}

struct Result {
  std::vector<Tensor> outputs;
  Tensor dx, denc;
};

// One forward and backward; dy[i] is converted to outputs[i]'s dtype, as the next layer
// of a stack would hand it over.
Result ForwardBackward(MultiheadAttention& m, const Tensor& x, const SideInputs& side, const std::vector<Tensor>& dy) {
  Result r;
  ForwardOptions options;
  options.side = &side;
  auto fwd = m.Forward(kCpu, {x}, options);
  EXPECT_TRUE(fwd.ok()) << fwd.status();
  if (!fwd.ok()) return r;
  r.outputs = fwd->outputs;
  std::vector<Tensor> grads;
  for (size_t i = 0; i < r.outputs.size() && i < dy.size(); ++i) grads.push_back(As(dy[i], r.outputs[i].dtype()));
  SideGrads side_grads;
  auto dx = m.Backward(kCpu, *fwd->saved, grads, &side_grads);
  EXPECT_TRUE(dx.ok()) << dx.status();
  if (dx.ok()) r.dx = (*dx)[0];
  r.denc = side_grads.encoder_output;
  return r;
}

class MultiheadAttentionParamsDType : public testing::TestWithParam<std::tuple<DTypeCase, DType>> {};

TEST_P(MultiheadAttentionParamsDType, MatchesTheFloat32Layer) {
  const auto& [c, dtype] = GetParam();
  MultiheadAttentionOptions o = BaseOptions();
  c.configure(&o);
  MultiheadAttentionOptions o16 = o;
  o16.params_dtype = dtype;
  auto full = MultiheadAttention::Create("mha", o, recipes::Recipe());
  auto low = MultiheadAttention::Create("mha", o16, recipes::Recipe());
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

  const Tensor x = Rounded(RandomTensor(c.x_shape, 11), dtype);
  SideInputs side;
  if (!c.encoder_shape.empty()) side.Set("encoder_output", RandomTensor(c.encoder_shape, 12));
  if (!c.cu_q.empty()) {
    side.Set("cu_seqlens_q", CuSeqlens(c.cu_q));
    side.Set("cu_seqlens_kv", CuSeqlens(c.cu_kv.empty() ? c.cu_q : c.cu_kv));
  }
  auto shapes = (*full)->OutputShapes({x.shape()}, "inputs");
  ASSERT_TRUE(shapes.ok()) << shapes.status();
  std::vector<Tensor> dy;
  for (size_t i = 0; i < shapes->size(); ++i) dy.push_back(Rounded(RandomTensor((*shapes)[i], 77 + i), dtype));

  const Result want = ForwardBackward(**full, x, side, dy);
  const Result got = ForwardBackward(**low, As(x, dtype), side, dy);
  const double u = UnitRoundoff(dtype);
  const double forward_tol = 3 * u, backward_tol = 6 * u;
  ASSERT_EQ(got.outputs.size(), want.outputs.size());
  for (size_t i = 0; i < got.outputs.size(); ++i) {
    ASSERT_EQ(got.outputs[i].dtype(), dtype) << "output " << i;
    EXPECT_LT(RelativeError(As(got.outputs[i], DType::kFloat32), want.outputs[i]), forward_tol) << "output " << i;
  }
  ASSERT_TRUE(got.dx.defined());
  ASSERT_EQ(got.dx.dtype(), dtype);
  EXPECT_LT(RelativeError(As(got.dx, DType::kFloat32), want.dx), backward_tol) << "hidden_states gradient";
  if (!c.encoder_shape.empty()) {
    ASSERT_TRUE(got.denc.defined());
    ASSERT_EQ(got.denc.dtype(), DType::kFloat32);
    EXPECT_LT(RelativeError(got.denc, want.denc), backward_tol) << "encoder_output gradient";
  }
  for (const Parameter* p : pl) ASSERT_EQ(p->grad.dtype(), DType::kFloat32) << p->name;
  const std::vector<double> errors = GradientErrors(pl, pf);
  for (size_t i = 0; i < pl.size(); ++i) EXPECT_LT(errors[i], backward_tol) << pl[i]->name;
}

INSTANTIATE_TEST_SUITE_P(Families, MultiheadAttentionParamsDType,
                         testing::Combine(testing::ValuesIn(Cases()),
                                          testing::Values(DType::kBFloat16, DType::kFloat16)),
                         [](const testing::TestParamInfo<std::tuple<DTypeCase, DType>>& info) {
                           return absl::StrCat(std::get<0>(info.param).name, "_",
                                               std::get<1>(info.param) == DType::kBFloat16 ? "BF16" : "FP16");
                         });

// hidden_states' gradient goes back in the dtype it came in: FP32 for an FP32 input to a
// BF16 layer (the first layer of a stack reading the session's FP32 input).
TEST(MultiheadAttentionParamsDType, InputGradientInTheInputsDType) {
  MultiheadAttentionOptions o = BaseOptions();
  o.input_layernorm = true;
  o.params_dtype = DType::kBFloat16;
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe());
  ASSERT_TRUE(m.ok()) << m.status();
  const Tensor x = RandomTensor({4, 2, 32}, 3);
  const Result r = ForwardBackward(**m, x, SideInputs(), {RandomTensor({4, 2, 32}, 4)});
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].dtype(), DType::kBFloat16);
  EXPECT_EQ(r.dx.dtype(), DType::kFloat32);
}

TEST(MultiheadAttentionParamsDType, RejectsOtherDTypes) {
  MultiheadAttentionOptions o = BaseOptions();
  o.params_dtype = DType::kFloat8E4M3;
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe());
  ASSERT_FALSE(m.ok());
  EXPECT_THAT(m.status().message(), testing::HasSubstr("options.params_dtype: expected FLOAT32, BFLOAT16 or FLOAT16"));
}

v1::ModelSpec AttentionModel(v1::DType params_dtype) {
  v1::ModelSpec spec;
  spec.set_seed(9);
  v1::LayerSpec* fc = spec.add_layers();
  fc->mutable_linear()->set_in_features(32);
  fc->mutable_linear()->set_out_features(32);
  fc->set_params_dtype(params_dtype);
  v1::LayerSpec* layer = spec.add_layers();
  layer->set_name("attn");
  auto* mha = layer->mutable_multihead_attention();
  mha->set_hidden_size(32);
  mha->set_num_attention_heads(4);
  mha->set_num_gqa_groups(2);
  mha->set_attention_dropout(0.0f);
  mha->set_input_layernorm(true);
  layer->set_params_dtype(params_dtype);
  return spec;
}

// The spec builds a 16-bit MultiheadAttention natively: no boundary, params_dtype in its
// options, its attention core described for 16-bit q, k, v; a stack of a BF16 Linear and
// the BF16 layer runs forward and backward in BF16 with FP32 masters.
TEST(MultiheadAttentionParamsDType, SpecBuildsItNatively) {
  auto low = BuildStack(AttentionModel(v1::BFLOAT16), recipes::Recipe());
  auto full = BuildStack(AttentionModel(v1::FLOAT32), recipes::Recipe());
  ASSERT_TRUE(low.ok()) << low.status();
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_EQ(testing_util::ParameterNames(**low), testing_util::ParameterNames(**full));
  auto* mha = dynamic_cast<MultiheadAttention*>((*low)->modules()[1].get());
  ASSERT_NE(mha, nullptr) << "a 16-bit MultiheadAttention is built as itself";
  EXPECT_EQ(mha->options().params_dtype, DType::kBFloat16);

  std::vector<AttentionPathInfo> paths;
  mha->DescribeAttention(Device::Cpu(), &paths);
  ASSERT_EQ(paths.size(), 1u);
  EXPECT_EQ(paths[0].layer, "attn.core_attention");
  EXPECT_EQ(paths[0].path, "cpu_reference");
  paths.clear();
  mha->DescribeAttention(Device::Cuda(0), &paths);
  ASSERT_EQ(paths.size(), 1u);
#if TESERVE_WITH_CUDA
  // Eligible for the fused path (what remains is whether cuDNN loads on this host).
  EXPECT_THAT(paths[0].reason, testing::Not(testing::HasSubstr("not BF16 / FP16")));
  if (paths[0].path == "cudnn_fused") {
    EXPECT_THAT(paths[0].reason, testing::HasSubstr("BFLOAT16"));
  }
#else
  EXPECT_EQ(paths[0].path, "cuda_unfused");
  EXPECT_THAT(paths[0].reason, testing::HasSubstr("not fused: built without the CUDA backend"));
#endif

  // One more layer's roundings than the single layer above; the stack's FP32 input.
  testing_util::ExpectNearFloat32Module(**low, **full, {6, 2, 32}, 21, DType::kBFloat16, 4, 8);
  const double u = UnitRoundoff(DType::kBFloat16);
  const std::vector<Parameter*> pl = (*low)->Parameters(), pf = (*full)->Parameters();
  for (const Parameter* p : pl) {
    ASSERT_EQ(p->value.dtype(), DType::kFloat32) << p->name;
    ASSERT_EQ(p->grad.dtype(), DType::kFloat32) << p->name;
  }
  const std::vector<double> errors = GradientErrors(pl, pf);
  for (size_t i = 0; i < pl.size(); ++i) EXPECT_LT(errors[i], 8 * u) << pl[i]->name;
}

}  // namespace
}  // namespace layers
}  // namespace teserve
