// DotProductAttention: option, input-shape, side-input and ModelSpec validation errors
// (each names the field), and a spec-built stack that runs. The numerical tests are in
// dot_product_attention_test.cc.
#include "layers/dot_product_attention.h"

#include <cmath>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layers/init.h"
#include "layers/spec.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"
#include "tests/layers/dot_product_attention_test_util.h"
#include "tests/layers/grad_check.h"

namespace teserve {
namespace layers {
namespace {

using kernels::AttnBiasType;
using kernels::AttnMaskType;
using kernels::QkvFormat;
using kernels::SoftmaxType;
using testing::HasSubstr;
using testing_util::CheckGradients;
using testing_util::RandomTensor;
using testing_dpa::BoolTensor;
using testing_dpa::Int32Tensor;
using testing_dpa::Options;
using testing_dpa::PaddingMask;

// Errors: options, input shapes, side inputs, spec.
absl::Status CreateStatus(const DotProductAttentionOptions& o) { return DotProductAttention::Create("attn", o).status(); }

TEST(DotProductAttentionErrors, Options) {
  DotProductAttentionOptions o = Options(QkvFormat::kSbhd, AttnMaskType::kCausal, 8, 3);
  EXPECT_THAT(CreateStatus(o).message(),
              HasSubstr("options.num_gqa_groups: expected a divisor of num_attention_heads 8 (or 0: "
                        "num_attention_heads), got 3"));
  o = Options(QkvFormat::kSbhd, AttnMaskType::kCausal);
  o.window_size = AttentionWindow{-1, -1};
  EXPECT_THAT(CreateStatus(o).message(),
              HasSubstr("options.window_size.right: expected 0 for attn_mask_type causal"));
  o = Options(QkvFormat::kSbhd, AttnMaskType::kNoMask);
  o.window_size = AttentionWindow{3, -1};
  EXPECT_THAT(CreateStatus(o).message(),
              HasSubstr("options.window_size: expected (-1, -1) or both sides >= 0 for attn_mask_type no_mask"));
  o.window_size = AttentionWindow{-2, 1};
  EXPECT_THAT(CreateStatus(o).message(), HasSubstr("options.window_size.left: expected -1 (unbounded) or >= 0, got -2"));
  o = Options(QkvFormat::kThd, AttnMaskType::kCausal);
  EXPECT_THAT(CreateStatus(o).message(),
              HasSubstr("options.attn_mask_type: expected padding, padding_causal or padding_causal_bottom_right "
                        "with qkv_format thd, got causal"));
  o = Options(QkvFormat::kThd, AttnMaskType::kPadding);
  o.core_attention_bias_type = AttnBiasType::kPostScaleBias;
  EXPECT_THAT(CreateStatus(o).message(),
              HasSubstr("options.core_attention_bias_type: expected no_bias or alibi with qkv_format thd"));
  o = Options(QkvFormat::kSbhd, AttnMaskType::kCausal);
  o.attention_dropout = 1.0f;
  EXPECT_THAT(CreateStatus(o).message(), HasSubstr("options.attention_dropout: expected a probability in [0, 1)"));
  o.attention_dropout = 0.0f;
  o.softmax_scale = 0.0f;
  EXPECT_THAT(CreateStatus(o).message(), HasSubstr("options.softmax_scale: expected a finite value > 0, got 0"));
  EXPECT_EQ(CreateStatus(o).code(), absl::StatusCode::kInvalidArgument);
}

TEST(DotProductAttentionErrors, InputShapes) {
  auto layer = DotProductAttention::Create("attn", Options(QkvFormat::kBshd, AttnMaskType::kCausal, 4, 2)).value();
  EXPECT_THAT(layer->OutputShapes({{2, 5, 4, 4}, {2, 5, 2, 4}}, "inputs").status().message(),
              HasSubstr("inputs: expected 3 tensors, got 2"));
  EXPECT_THAT(layer->OutputShapes({{2, 5, 3, 4}, {2, 5, 2, 4}, {2, 5, 2, 4}}, "inputs").status().message(),
              HasSubstr("inputs[0].shape: expected [B, S_q, 4, 4] (qkv_format bshd of layer 'attn'), got [2, 5, 3, 4]"));
  EXPECT_THAT(layer->OutputShapes({{2, 5, 4, 4}, {3, 5, 2, 4}, {3, 5, 2, 4}}, "inputs").status().message(),
              HasSubstr("inputs[1].shape: expected [B, S_kv, 2, 4] with the batch size of query"));
  EXPECT_THAT(layer->OutputShapes({{2, 5, 4, 4}, {2, 5, 2, 4}, {2, 6, 2, 4}}, "inputs").status().message(),
              HasSubstr("inputs[2].shape: expected [B, S_kv, 2, 4] with the leading dimensions of key"));
  const std::vector<Tensor> bad{RandomTensor({2, 5, 4, 4}, 1), RandomTensor({2, 5, 2, 4}, 2), RandomTensor({2, 5, 4, 4}, 3)};
  EXPECT_THAT(layer->Forward(Context(), bad, ForwardOptions()).status().message(), HasSubstr("inputs[2].shape"));
}

TEST(DotProductAttentionErrors, SideInputsNameTheSideInput) {
  const std::vector<Shape> bshd{{2, 5, 2, 4}, {2, 5, 2, 4}, {2, 5, 2, 4}};
  auto padding = DotProductAttention::Create("attn", Options(QkvFormat::kBshd, AttnMaskType::kPadding)).value();
  SideInputs side;
  EXPECT_THAT(padding->ValidateSide(side, bshd).message(),
              HasSubstr("side_inputs.attention_mask: expected a BOOL padding mask [B, 1, 1, S] or "
                        "side_inputs.cu_seqlens_q and side_inputs.cu_seqlens_kv (attn_mask_type padding), got neither"));
  side.Set("attention_mask", BoolTensor({2, 1, 1, 5}, {0, 1, 0, 1, 1, 0, 0, 0, 0, 0}));
  EXPECT_THAT(padding->ValidateSide(side, bshd).message(),
              HasSubstr("side_inputs.attention_mask: expected right padding"));
  side.Set("attention_mask", Tensor::Zeros(DType::kFloat32, {2, 1, 1, 5}).value());
  EXPECT_THAT(padding->ValidateSide(side, bshd).message(),
              HasSubstr("side_inputs.attention_mask.dtype: expected BOOL, got FLOAT32"));
  side.Set("attention_mask", PaddingMask(5, {5, 5}));
  EXPECT_THAT(padding->ValidateSide(side, {{2, 5, 2, 4}, {2, 6, 2, 4}, {2, 6, 2, 4}}).message(),
              HasSubstr("side_inputs.attention_mask: expected no padding mask when S_q 5 != S_kv 6"));
  SideInputs lengths;
  lengths.Set("cu_seqlens_q", Int32Tensor({0, 5, 11}));
  lengths.Set("cu_seqlens_kv", Int32Tensor({0, 5, 10}));
  EXPECT_THAT(padding->ValidateSide(lengths, bshd).message(),
              HasSubstr("side_inputs.cu_seqlens_q: expected sequence lengths <= 5 (the sequence dimension), got 6"));

  auto thd = DotProductAttention::Create("attn", Options(QkvFormat::kThd, AttnMaskType::kPaddingCausal)).value();
  const std::vector<Shape> thd_shapes{{9, 2, 4}, {9, 2, 4}, {9, 2, 4}};
  EXPECT_THAT(thd->ValidateSide(SideInputs(), thd_shapes).message(),
              HasSubstr("side_inputs.cu_seqlens_q: expected an INT32 [batch + 1] tensor"));
  SideInputs packed;
  packed.Set("cu_seqlens_q", Int32Tensor({0, 3, 7}));
  packed.Set("cu_seqlens_kv", Int32Tensor({0, 3, 7}));
  packed.Set("cu_seqlens_kv_padded", Int32Tensor({0, 2, 9}));
  EXPECT_THAT(thd->ValidateSide(packed, thd_shapes).message(),
              HasSubstr("side_inputs.cu_seqlens_kv_padded: expected room for sequence 0 of length 3, got 2 rows"));
  packed.Set("cu_seqlens_kv", Int32Tensor({0, 3}));
  EXPECT_THAT(thd->ValidateSide(packed, thd_shapes).message(),
              HasSubstr("side_inputs.cu_seqlens_kv.shape: expected [3] (batch size + 1), got [2]"));

  auto arbitrary = DotProductAttention::Create("attn", Options(QkvFormat::kBshd, AttnMaskType::kArbitrary)).value();
  SideInputs mask;
  mask.Set("attention_mask", Tensor::Zeros(DType::kBool, {2, 1, 5}).value());
  EXPECT_THAT(arbitrary->ValidateSide(mask, bshd).message(),
              HasSubstr("side_inputs.attention_mask.shape: expected rank 4, got [2, 1, 5] (rank 3)"));

  DotProductAttentionOptions o = Options(QkvFormat::kBshd, AttnMaskType::kNoMask);
  o.core_attention_bias_type = AttnBiasType::kPostScaleBias;
  auto biased = DotProductAttention::Create("attn", o).value();
  EXPECT_THAT(biased->ValidateSide(SideInputs(), bshd).message(),
              HasSubstr("side_inputs.core_attention_bias: expected an FP32 [1|B, 1|H, S_q, S_kv] tensor"));
  o.core_attention_bias_type = AttnBiasType::kAlibi;
  auto alibi = DotProductAttention::Create("attn", o).value();
  EXPECT_TRUE(alibi->ValidateSide(SideInputs(), bshd).ok());  // default slopes
  SideInputs slopes;
  slopes.Set("alibi_slopes", Tensor::Zeros(DType::kFloat32, {3, 2}).value());
  EXPECT_THAT(alibi->ValidateSide(slopes, bshd).message(),
              HasSubstr("side_inputs.alibi_slopes.shape: expected FP32 [2] or [2, 2], got [3, 2]"));
  // Forward without ValidateSide reports the same error instead of crashing.
  const std::vector<Tensor> inputs{RandomTensor(bshd[0], 1), RandomTensor(bshd[1], 2), RandomTensor(bshd[2], 3)};
  ForwardOptions with_slopes;
  with_slopes.side = &slopes;
  EXPECT_THAT(alibi->Forward(Context(), inputs, with_slopes).status().message(), HasSubstr("alibi_slopes.shape"));
}

v1::ModelSpec AttentionModel() {
  v1::ModelSpec spec;
  auto* layer = spec.add_layers();
  layer->set_name("attn");
  v1::DotProductAttentionSpec* s = layer->mutable_dot_product_attention();
  s->set_num_attention_heads(4);
  s->set_kv_channels(8);
  s->set_num_gqa_groups(2);
  s->set_qkv_format("bshd");
  s->set_softmax_type("learnable");
  auto* fc = spec.add_layers();
  fc->set_name("proj");
  fc->mutable_linear()->set_in_features(32);
  fc->mutable_linear()->set_out_features(8);
  return spec;
}

TEST(DotProductAttentionSpec, BuildsAStackThatRuns) {
  auto stack = BuildStack(AttentionModel(), recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  std::vector<std::string> names;
  for (Parameter* p : (*stack)->Parameters()) names.push_back(p->name);
  EXPECT_THAT(names, testing::ElementsAre("attn.softmax_offset", "proj.weight", "proj.bias"));
  auto* attention = dynamic_cast<DotProductAttention*>((*stack)->modules()[0].get());
  ASSERT_NE(attention, nullptr);
  EXPECT_EQ(attention->config().mask_type, AttnMaskType::kCausal);
  const std::vector<Tensor> inputs{RandomTensor({2, 3, 4, 8}, 1), RandomTensor({2, 3, 2, 8}, 2),
                                   RandomTensor({2, 3, 2, 8}, 3)};
  auto out = (*stack)->Forward(Context(), inputs, ForwardOptions());
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->outputs[0].shape(), (Shape{2, 3, 8}));
  auto grads = (*stack)->Backward(Context(), *out->saved, {RandomTensor({2, 3, 8}, 4)});
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_EQ(grads->size(), 3u);
}

TEST(DotProductAttentionSpec, ErrorsNameTheField) {
  struct Bad {
    std::function<void(v1::ModelSpec*)> edit;
    std::string message;
  };
  const std::vector<Bad> cases = {
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_attn_mask_type("causal_top"); },
       "model.layers[0].dot_product_attention.attn_mask_type: expected one of \"no_mask\""},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_num_gqa_groups(3); },
       "model.layers[0].dot_product_attention.num_gqa_groups: expected a divisor of num_attention_heads 4"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_num_attention_heads(0); },
       "model.layers[0].dot_product_attention.num_attention_heads: expected a size in 1..16777216, got 0"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(0)->mutable_dot_product_attention()->mutable_window_size()->set_left(4);
         m->mutable_layers(0)->mutable_dot_product_attention()->mutable_window_size()->set_right(2);
       },
       "model.layers[0].dot_product_attention.window_size.right: expected 0 for attn_mask_type causal"},
      {[](v1::ModelSpec* m) {
         m->mutable_layers(0)->mutable_dot_product_attention()->mutable_window_size()->set_left(-3);
       },
       "model.layers[0].dot_product_attention.window_size.left: expected -1 (unbounded) or >= 0, got -3"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_qkv_format("thd"); },
       "model.layers[0].dot_product_attention.attn_mask_type: expected padding, padding_causal or "
       "padding_causal_bottom_right with qkv_format thd, got causal"},
      {[](v1::ModelSpec* m) {
         auto* s = m->mutable_layers(0)->mutable_dot_product_attention();
         s->set_qkv_format("thd");
         s->set_attn_mask_type("padding,causal");
         s->set_core_attention_bias_type("pre_scale_bias");
       },
       "model.layers[0].dot_product_attention.core_attention_bias_type: expected no_bias or alibi with qkv_format "
       "thd, got pre_scale_bias"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_softmax_scale(-1.0f); },
       "model.layers[0].dot_product_attention.softmax_scale: expected a finite value > 0, got -1"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_softmax_type("sink"); },
       "model.layers[0].dot_product_attention.softmax_type: expected one of \"vanilla\", \"off-by-one\", "
       "\"learnable\", got \"sink\""},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_attention_dropout(1.5f); },
       "model.layers[0].dot_product_attention.attention_dropout: expected a probability in [0, 1), got 1.5"},
      {[](v1::ModelSpec* m) { m->mutable_layers(0)->mutable_dot_product_attention()->set_return_max_logit(true); },
       "model.layers[0].dot_product_attention.return_max_logit: expected false (only the last layer of a stack "
       "may return max_logit as a second output), got true"},
      {[](v1::ModelSpec* m) { m->mutable_layers(1)->mutable_linear()->set_in_features(16); },
       "model.layers[1].linear.in_features: expected 32 (the output width of layer 'attn'), got 16"},
      {[](v1::ModelSpec* m) {
         *m->add_layers() = m->layers(0);
         m->mutable_layers(2)->set_name("attn2");
       },
       "model.layers[2].dot_product_attention: expected the first layer of the stack (it reads the query, key and "
       "value inputs), got layer 2"},
  };
  for (const Bad& bad : cases) {
    v1::ModelSpec spec = AttentionModel();
    bad.edit(&spec);
    auto stack = BuildStack(spec, recipes::Recipe());
    ASSERT_FALSE(stack.ok()) << bad.message;
    EXPECT_EQ(stack.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(stack.status().message(), HasSubstr(bad.message));
  }
}

}  // namespace
}  // namespace layers
}  // namespace teserve
