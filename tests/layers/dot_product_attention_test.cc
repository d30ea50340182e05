// DotProductAttention: finite-difference gradients of q, k, v and softmax_offset per
// option family (formats, masks, GQA/MQA, windows, thd offsets, softmax and bias
// types, checkpointing); forward vs the naive double reference; checkpoint and
// microbatch exactness; dropout determinism and its training-only use; max_logit;
// option, side-input and spec validation errors.
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

Tensor Int32Tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(values.size())}).value();
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// BOOL tensor of `shape` from 0/1 values.
Tensor BoolTensor(const Shape& shape, const std::vector<int>& values) {
  Tensor t = Tensor::Zeros(DType::kBool, shape).value();
  for (size_t i = 0; i < values.size(); ++i) t.data<uint8_t>()[i] = values[i] != 0;
  return t;
}

// [B, 1, 1, S] padding mask with the given real lengths (right padding).
Tensor PaddingMask(int64_t seq, const std::vector<int>& lengths) {
  std::vector<int> values;
  for (int len : lengths) {
    for (int64_t j = 0; j < seq; ++j) values.push_back(j >= len ? 1 : 0);
  }
  return BoolTensor({static_cast<int64_t>(lengths.size()), 1, 1, seq}, values);
}

// Runs a module with fixed side inputs (CheckGradients passes none).
class WithSide : public Module {
 public:
  WithSide(Module* inner, SideInputs side) : Module(inner->name()), inner_(inner), side_(std::move(side)) {}
  std::string kind() const override { return inner_->kind(); }
  absl::StatusOr<std::vector<Shape>> OutputShapes(const std::vector<Shape>& shapes,
                                                  absl::string_view field) const override {
    return inner_->OutputShapes(shapes, field);
  }
  absl::StatusOr<ForwardOutput> Forward(const Context& ctx, const std::vector<Tensor>& inputs,
                                        const ForwardOptions& options) override {
    ForwardOptions with_side = options;
    with_side.side = &side_;
    return inner_->Forward(ctx, inputs, with_side);
  }
  absl::StatusOr<std::vector<Tensor>> Backward(const Context& ctx, SavedActivations& saved,
                                               const std::vector<Tensor>& grad_outputs,
                                               SideGrads* side_grads) override {
    return inner_->Backward(ctx, saved, grad_outputs, side_grads);
  }
  std::vector<Parameter*> Parameters() override { return inner_->Parameters(); }

 private:
  Module* inner_;
  SideInputs side_;
};

DotProductAttentionOptions Options(QkvFormat format, AttnMaskType mask, int64_t heads = 2, int64_t groups = 0,
                                   int64_t channels = 4) {
  DotProductAttentionOptions o;
  o.num_attention_heads = heads;
  o.num_gqa_groups = groups;
  o.kv_channels = channels;
  o.qkv_format = format;
  o.attn_mask_type = mask;
  return o;
}

struct GradCase {
  std::string name;
  DotProductAttentionOptions options;
  Shape q, k, v;
  std::function<SideInputs()> side = [] { return SideInputs(); };
};

std::vector<GradCase> GradCases() {
  using F = QkvFormat;
  using M = AttnMaskType;
  std::vector<GradCase> cases;
  cases.push_back({"Sbhd_Causal", Options(F::kSbhd, M::kCausal), {5, 2, 2, 4}, {5, 2, 2, 4}, {5, 2, 2, 4}});
  {
    GradCase c{"Bshd_NoMask_GQA_PairChannels", Options(F::kBshd, M::kNoMask, 4, 2), {2, 5, 4, 4}, {2, 6, 2, 4},
               {2, 6, 2, 3}};
    c.options.kv_channels_v = 3;
    cases.push_back(c);
  }
  cases.push_back({"Bshd_CausalBottomRight_MQA", Options(F::kBshd, M::kCausalBottomRight, 3, 1), {2, 4, 3, 4},
                   {2, 6, 1, 4}, {2, 6, 1, 4}});
  {
    GradCase c{"Sbhd_Padding_FromAttentionMask", Options(F::kSbhd, M::kPadding), {5, 2, 2, 4}, {5, 2, 2, 4},
               {5, 2, 2, 4}};
    c.side = [] {
      SideInputs s;
      s.Set("attention_mask", PaddingMask(5, {3, 5}));
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_PaddingCausal_CrossFromCuSeqlens", Options(F::kBshd, M::kPaddingCausal), {2, 4, 2, 4},
               {2, 6, 2, 4}, {2, 6, 2, 4}};
    c.side = [] {
      SideInputs s;
      s.Set("cu_seqlens_q", Int32Tensor({0, 4, 6}));
      s.Set("cu_seqlens_kv", Int32Tensor({0, 5, 11}));
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_Arbitrary", Options(F::kBshd, M::kArbitrary), {2, 3, 2, 4}, {2, 4, 2, 4}, {2, 4, 2, 4}};
    c.side = [] {
      SideInputs s;
      s.Set("attention_mask", BoolTensor({2, 1, 3, 4}, {0, 1, 0, 0, 1, 1, 1, 1, 0, 0, 1, 0,  //
                                                        1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 1, 0}));
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_NoMask_Window1x1", Options(F::kBshd, M::kNoMask), {2, 5, 2, 4}, {2, 6, 2, 4}, {2, 6, 2, 4}};
    c.options.window_size = AttentionWindow{1, 1};
    cases.push_back(c);
  }
  {
    GradCase c{"Thd_PaddingCausalBottomRight_PaddedOffsets", Options(F::kThd, M::kPaddingCausalBottomRight, 2, 1),
               {8, 2, 4}, {12, 1, 4}, {12, 1, 4}};
    c.side = [] {
      SideInputs s;
      s.Set("cu_seqlens_q", Int32Tensor({0, 2, 5}));
      s.Set("cu_seqlens_kv", Int32Tensor({0, 4, 10}));
      s.Set("cu_seqlens_q_padded", Int32Tensor({0, 3, 7}));
      s.Set("cu_seqlens_kv_padded", Int32Tensor({0, 5, 11}));
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_NoMask_OffByOne", Options(F::kBshd, M::kNoMask), {2, 4, 2, 4}, {2, 4, 2, 4}, {2, 4, 2, 4}};
    c.options.softmax_type = SoftmaxType::kOffByOne;
    cases.push_back(c);
    c = {"Sbhd_Causal_Learnable", Options(F::kSbhd, M::kCausal), {4, 2, 2, 4}, {4, 2, 2, 4}, {4, 2, 2, 4}};
    c.options.softmax_type = SoftmaxType::kLearnable;
    cases.push_back(c);
    c = {"Thd_Padding_Learnable_GQA", Options(F::kThd, M::kPadding, 4, 2), {7, 4, 4}, {9, 2, 4}, {9, 2, 4}};
    c.options.softmax_type = SoftmaxType::kLearnable;
    c.side = [] {
      SideInputs s;
      s.Set("cu_seqlens_q", Int32Tensor({0, 3, 7}));
      s.Set("cu_seqlens_kv", Int32Tensor({0, 4, 9}));
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_NoMask_PreScaleBias", Options(F::kBshd, M::kNoMask), {2, 3, 2, 4}, {2, 4, 2, 4}, {2, 4, 2, 4}};
    c.options.core_attention_bias_type = AttnBiasType::kPreScaleBias;
    c.side = [] {
      SideInputs s;
      s.Set("core_attention_bias", RandomTensor({1, 2, 3, 4}, 41));
      return s;
    };
    cases.push_back(c);
    c = {"Sbhd_Causal_PostScaleBias", Options(F::kSbhd, M::kCausal), {4, 2, 2, 4}, {4, 2, 2, 4}, {4, 2, 2, 4}};
    c.options.core_attention_bias_type = AttnBiasType::kPostScaleBias;
    c.side = [] {
      SideInputs s;
      s.Set("core_attention_bias", RandomTensor({2, 2, 4, 4}, 42));
      return s;
    };
    cases.push_back(c);
    c = {"Bshd_CausalBottomRight_AlibiDefaultSlopes", Options(F::kBshd, M::kCausalBottomRight), {2, 3, 2, 4},
         {2, 5, 2, 4}, {2, 5, 2, 4}};
    c.options.core_attention_bias_type = AttnBiasType::kAlibi;
    cases.push_back(c);
    c = {"Thd_PaddingCausal_AlibiGivenSlopes", Options(F::kThd, M::kPaddingCausal), {6, 2, 4}, {6, 2, 4},
         {6, 2, 4}};
    c.options.core_attention_bias_type = AttnBiasType::kAlibi;
    c.side = [] {
      SideInputs s;
      s.Set("cu_seqlens_q", Int32Tensor({0, 2, 6}));
      s.Set("cu_seqlens_kv", Int32Tensor({0, 2, 6}));
      s.Set("alibi_slopes", Tensor::FromFloats({0.5f, 0.25f, 0.75f, 1.0f}, {2, 2}).value());
      return s;
    };
    cases.push_back(c);
  }
  {
    GradCase c{"Bshd_Causal_Checkpointed", Options(F::kBshd, M::kCausal), {2, 5, 2, 4}, {2, 5, 2, 4}, {2, 5, 2, 4}};
    c.options.checkpoint_core_attention = true;
    c.options.softmax_type = SoftmaxType::kLearnable;
    cases.push_back(c);
  }
  return cases;
}

class DotProductAttentionGrad : public testing::TestWithParam<GradCase> {};

TEST_P(DotProductAttentionGrad, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  auto attention = DotProductAttention::Create("attn", c.options);
  ASSERT_TRUE(attention.ok()) << attention.status();
  for (Parameter* p : (*attention)->Parameters()) FillNormal(77, 0.5f, p->value.mutable_floats());
  WithSide module(attention->get(), c.side());
  ASSERT_TRUE((*attention)->ValidateSide(c.side(), {c.q, c.k, c.v}).ok());
  CheckGradients(module, {RandomTensor(c.q, 1), RandomTensor(c.k, 2), RandomTensor(c.v, 3)});
}

INSTANTIATE_TEST_SUITE_P(Options, DotProductAttentionGrad, testing::ValuesIn(GradCases()),
                         [](const testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// The layer's output is the reference attention of its inputs, heads flattened.
TEST(DotProductAttention, ForwardMatchesNaiveReferenceInEveryFormat) {
  for (QkvFormat format : {QkvFormat::kSbhd, QkvFormat::kBshd, QkvFormat::kThd}) {
    testing_kernels::AttentionProblem p;
    p.format = format;
    p.mask = format == QkvFormat::kThd ? AttnMaskType::kPaddingCausal : AttnMaskType::kCausal;
    p.window_right = 0;
    p.heads = 4, p.groups = 2, p.d_qk = 8, p.d_v = 6, p.s_q = 6, p.s_kv = 6;
    if (format == QkvFormat::kThd) p.cu_q = p.cu_kv = {0, 5, 11}, p.t_q = p.t_kv = 11;
    DotProductAttentionOptions o = Options(format, p.mask, 4, 2, 8);
    o.kv_channels_v = 6;
    auto attention = DotProductAttention::Create("attn", o).value();
    const Tensor q = RandomTensor(p.q_shape(), 4), k = RandomTensor(p.k_shape(), 5), v = RandomTensor(p.v_shape(), 6);
    SideInputs side;
    if (format == QkvFormat::kThd) {
      side.Set("cu_seqlens_q", Int32Tensor(p.cu_q));
      side.Set("cu_seqlens_kv", Int32Tensor(p.cu_kv));
    }
    ForwardOptions options;
    options.side = &side;
    auto out = attention->Forward(Context(), {q, k, v}, options);
    ASSERT_TRUE(out.ok()) << out.status();
    Shape expected = p.out_shape();
    expected.pop_back();
    expected.back() = 4 * 6;
    EXPECT_EQ(out->outputs[0].shape(), expected);
    testing_kernels::AttentionInputs in;
    in.q = testing_kernels::ToDoubles(q.floats());
    in.k = testing_kernels::ToDoubles(k.floats());
    in.v = testing_kernels::ToDoubles(v.floats());
    const testing_kernels::AttentionResult ref = testing_kernels::ReferenceAttention(p, in);
    EXPECT_TRUE(testing_kernels::AllClose(out->outputs[0].floats(), ref.out, DType::kFloat32, ref.magnitude))
        << kernels::QkvFormatName(format);
  }
}

// Runs forward + backward; returns outputs followed by input gradients and parameter gradients.
std::vector<Tensor> ForwardBackward(DotProductAttention& layer, const std::vector<Tensor>& inputs,
                                    const SideInputs& side, const Context& ctx = Context()) {
  for (Parameter* p : layer.Parameters()) {
    for (float& g : p->grad.mutable_floats()) g = 0.0f;
  }
  ForwardOptions options;
  options.side = &side;
  auto forward = layer.Forward(ctx, inputs, options);
  EXPECT_TRUE(forward.ok()) << forward.status();
  std::vector<Tensor> grad_outputs;
  for (size_t i = 0; i < forward->outputs.size(); ++i) grad_outputs.push_back(RandomTensor(forward->outputs[i].shape(), 50 + i));
  auto grads = layer.Backward(ctx, *forward->saved, grad_outputs);
  EXPECT_TRUE(grads.ok()) << grads.status();
  std::vector<Tensor> all = forward->outputs;
  for (Tensor& g : *grads) all.push_back(g);
  for (Parameter* p : layer.Parameters()) all.push_back(p->grad.Clone().value());
  return all;
}

TEST(DotProductAttention, CheckpointedBackwardIsBitExactWithDropoutAndSink) {
  DotProductAttentionOptions o = Options(QkvFormat::kThd, AttnMaskType::kPaddingCausalBottomRight, 4, 2);
  o.attention_dropout = 0.2f;
  o.softmax_type = SoftmaxType::kLearnable;
  o.return_max_logit = true;
  o.seed = 9;
  SideInputs side;
  side.Set("cu_seqlens_q", Int32Tensor({0, 3, 7}));
  side.Set("cu_seqlens_kv", Int32Tensor({0, 5, 9}));
  const std::vector<Tensor> inputs{RandomTensor({7, 4, 4}, 1), RandomTensor({9, 2, 4}, 2), RandomTensor({9, 2, 4}, 3)};
  Context ctx;
  ctx.seed = 1234;
  auto plain = DotProductAttention::Create("attn", o).value();
  o.checkpoint_core_attention = true;
  auto checkpointed = DotProductAttention::Create("attn", o).value();
  for (auto* layer : {plain.get(), checkpointed.get()}) FillNormal(3, 0.5f, layer->Parameters()[0]->value.mutable_floats());
  for (int step = 0; step < 2; ++step) {  // the second step uses the next dropout stream
    const std::vector<Tensor> a = ForwardBackward(*plain, inputs, side, ctx);
    const std::vector<Tensor> b = ForwardBackward(*checkpointed, inputs, side, ctx);
    ASSERT_EQ(a.size(), 6u);  // out, max_logit, dq, dk, dv, dsoftmax_offset
    ASSERT_EQ(b.size(), a.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BitwiseEqual(a[i], b[i])) << "step " << step << " tensor " << i;
  }
}

TEST(DotProductAttention, DropoutIsDeterministicPerForwardAndOffWithoutSaving) {
  DotProductAttentionOptions o = Options(QkvFormat::kBshd, AttnMaskType::kNoMask);
  o.attention_dropout = 0.5f;
  o.seed = 4;
  const std::vector<Tensor> inputs{RandomTensor({2, 6, 2, 4}, 1), RandomTensor({2, 6, 2, 4}, 2),
                                   RandomTensor({2, 6, 2, 4}, 3)};
  auto a = DotProductAttention::Create("attn", o).value();
  auto b = DotProductAttention::Create("attn", o).value();
  const ForwardOptions train;
  std::vector<Tensor> first, second;
  for (int i = 0; i < 2; ++i) {
    first.push_back(a->Forward(Context(), inputs, train).value().outputs[0]);
    second.push_back(b->Forward(Context(), inputs, train).value().outputs[0]);
  }
  EXPECT_TRUE(BitwiseEqual(first[0], second[0]));  // same seed, same call sequence
  EXPECT_TRUE(BitwiseEqual(first[1], second[1]));
  EXPECT_FALSE(BitwiseEqual(first[0], first[1]));  // each forward draws a new mask
  Context other_seed;
  other_seed.seed = 1;
  auto c = DotProductAttention::Create("attn", o).value();
  EXPECT_FALSE(BitwiseEqual(c->Forward(other_seed, inputs, train).value().outputs[0], first[0]));

  // Inference (no saved activations) runs without dropout: the same as p = 0.
  ForwardOptions infer;
  infer.save_for_backward = false;
  o.attention_dropout = 0.0f;
  auto no_dropout = DotProductAttention::Create("attn", o).value();
  EXPECT_TRUE(BitwiseEqual(a->Forward(Context(), inputs, infer).value().outputs[0],
                           no_dropout->Forward(Context(), inputs, infer).value().outputs[0]));
}

TEST(DotProductAttention, EachBackwardUsesItsOwnForwardsDropoutMask) {
  DotProductAttentionOptions o = Options(QkvFormat::kSbhd, AttnMaskType::kCausal);
  o.attention_dropout = 0.3f;
  const std::vector<Tensor> x{RandomTensor({5, 2, 2, 4}, 1), RandomTensor({5, 2, 2, 4}, 2),
                              RandomTensor({5, 2, 2, 4}, 3)};
  const std::vector<Tensor> y{RandomTensor({5, 2, 2, 4}, 4), RandomTensor({5, 2, 2, 4}, 5),
                              RandomTensor({5, 2, 2, 4}, 6)};
  const Tensor dout = RandomTensor({5, 2, 8}, 7);
  // Alone: forward x, backward.
  auto alone = DotProductAttention::Create("attn", o).value();
  auto fx = alone->Forward(Context(), x, ForwardOptions()).value();
  const std::vector<Tensor> expected = alone->Backward(Context(), *fx.saved, {dout}).value();
  // Interleaved microbatches: forward x, forward y, backward y, backward x.
  auto layer = DotProductAttention::Create("attn", o).value();
  auto fx2 = layer->Forward(Context(), x, ForwardOptions()).value();
  auto fy = layer->Forward(Context(), y, ForwardOptions()).value();
  ASSERT_TRUE(layer->Backward(Context(), *fy.saved, {dout}).ok());
  const std::vector<Tensor> got = layer->Backward(Context(), *fx2.saved, {dout}).value();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(BitwiseEqual(got[i], expected[i])) << i;
}

// Gradients through dropout: finite differences of the first (training) forward of a
// fresh layer, which always draws the same mask.
TEST(DotProductAttention, DropoutGradientsMatchFiniteDifferencesOfTheSameMask) {
  DotProductAttentionOptions o = Options(QkvFormat::kBshd, AttnMaskType::kPadding);
  o.attention_dropout = 0.25f;
  o.softmax_type = SoftmaxType::kOffByOne;
  SideInputs side;
  side.Set("attention_mask", PaddingMask(5, {4, 5}));
  std::vector<Tensor> inputs{RandomTensor({2, 5, 2, 4}, 1), RandomTensor({2, 5, 2, 4}, 2),
                             RandomTensor({2, 5, 2, 4}, 3)};
  const Tensor w = RandomTensor({2, 5, 8}, 4);
  auto loss = [&]() {
    auto fresh = DotProductAttention::Create("attn", o).value();
    ForwardOptions options;
    options.side = &side;
    return testing_util::WeightedSum(fresh->Forward(Context(), inputs, options).value().outputs, {w});
  };
  auto layer = DotProductAttention::Create("attn", o).value();
  ForwardOptions options;
  options.side = &side;
  auto forward = layer->Forward(Context(), inputs, options).value();
  const std::vector<Tensor> grads = layer->Backward(Context(), *forward.saved, {w}).value();
  constexpr float kStep = 1e-2f;
  for (int t = 0; t < 3; ++t) {
    absl::Span<float> values = inputs[t].mutable_floats();
    for (size_t i = 0; i < values.size(); i += 7) {
      const float saved = values[i];
      values[i] = saved + kStep;
      const double plus = loss();
      values[i] = saved - kStep;
      const double minus = loss();
      values[i] = saved;
      const double numeric = (plus - minus) / (2.0 * kStep);
      EXPECT_NEAR(grads[t].floats()[i], numeric, 2e-3 + 2e-3 * std::fabs(numeric)) << "input " << t << "[" << i << "]";
    }
  }
}

TEST(DotProductAttention, PaddingMaskAndCuSeqlensGiveTheSameResult) {
  DotProductAttentionOptions o = Options(QkvFormat::kSbhd, AttnMaskType::kPaddingCausalBottomRight);
  const std::vector<Tensor> inputs{RandomTensor({6, 3, 2, 4}, 1), RandomTensor({6, 3, 2, 4}, 2),
                                   RandomTensor({6, 3, 2, 4}, 3)};
  SideInputs by_mask;
  by_mask.Set("attention_mask", PaddingMask(6, {2, 6, 0}));
  SideInputs by_lengths;
  by_lengths.Set("cu_seqlens_q", Int32Tensor({0, 2, 8, 8}));
  by_lengths.Set("cu_seqlens_kv", Int32Tensor({0, 2, 8, 8}));
  auto layer = DotProductAttention::Create("attn", o).value();
  const std::vector<Tensor> a = ForwardBackward(*layer, inputs, by_mask);
  const std::vector<Tensor> b = ForwardBackward(*layer, inputs, by_lengths);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(BitwiseEqual(a[i], b[i])) << i;
  // Padding query rows (sequence 0 beyond 2 tokens, all of sequence 2) are zero.
  const float* out = a[0].data<float>();
  for (int64_t s = 0; s < 6; ++s) {
    for (int64_t c = 0; c < 8; ++c) {
      if (s >= 2) {
        EXPECT_EQ(out[(s * 3 + 0) * 8 + c], 0.0f);
      }
      EXPECT_EQ(out[(s * 3 + 2) * 8 + c], 0.0f);
    }
  }
}

TEST(DotProductAttention, ReturnsMaxLogitWithoutChangingGradients) {
  DotProductAttentionOptions o = Options(QkvFormat::kBshd, AttnMaskType::kCausal);
  o.softmax_scale = 0.7f;
  const std::vector<Tensor> inputs{RandomTensor({2, 4, 2, 4}, 1), RandomTensor({2, 4, 2, 4}, 2),
                                   RandomTensor({2, 4, 2, 4}, 3)};
  auto plain = DotProductAttention::Create("attn", o).value();
  o.return_max_logit = true;
  auto with_logit = DotProductAttention::Create("attn", o).value();
  ASSERT_EQ(with_logit->OutputShapes({{2, 4, 2, 4}, {2, 4, 2, 4}, {2, 4, 2, 4}}, "inputs").value().size(), 2u);
  auto out = with_logit->Forward(Context(), inputs, ForwardOptions()).value();
  ASSERT_EQ(out.outputs.size(), 2u);
  ASSERT_EQ(out.outputs[1].shape(), (Shape{2}));
  // max over b and causal (i, j <= i) of 0.7 * q.k, per head.
  for (int64_t h = 0; h < 2; ++h) {
    double best = -INFINITY;
    for (int64_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < 4; ++i) {
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < 4; ++d) {
            dot += double(inputs[0].floats()[((b * 4 + i) * 2 + h) * 4 + d]) * inputs[1].floats()[((b * 4 + j) * 2 + h) * 4 + d];
          }
          best = std::max(best, 0.7 * dot);
        }
      }
    }
    EXPECT_NEAR(out.outputs[1].floats()[h], best, 1e-6 + 5e-6 * std::fabs(best)) << h;
  }
  const Tensor dout = RandomTensor({2, 4, 8}, 9);
  auto grads = with_logit->Backward(Context(), *out.saved, {dout, RandomTensor({2}, 10)}).value();
  auto plain_out = plain->Forward(Context(), inputs, ForwardOptions()).value();
  auto plain_grads = plain->Backward(Context(), *plain_out.saved, {dout}).value();
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(BitwiseEqual(grads[i], plain_grads[i])) << i;
}

TEST(DotProductAttention, LearnableSoftmaxOffsetIsANamedParameterStartingAtZero) {
  DotProductAttentionOptions o = Options(QkvFormat::kSbhd, AttnMaskType::kCausal, 3, 3);
  EXPECT_TRUE(DotProductAttention::Create("attn", o).value()->Parameters().empty());
  o.softmax_type = SoftmaxType::kLearnable;
  auto layer = DotProductAttention::Create("attn", o).value();
  ASSERT_EQ(layer->Parameters().size(), 1u);
  EXPECT_EQ(layer->Parameters()[0]->name, "attn.softmax_offset");
  EXPECT_THAT(layer->Parameters()[0]->value.floats(), testing::ElementsAre(0.0f, 0.0f, 0.0f));
  // Zero sink logits make learnable the same as off-by-one.
  o.softmax_type = SoftmaxType::kOffByOne;
  auto off_by_one = DotProductAttention::Create("attn", o).value();
  const std::vector<Tensor> inputs{RandomTensor({4, 1, 3, 4}, 1), RandomTensor({4, 1, 3, 4}, 2),
                                   RandomTensor({4, 1, 3, 4}, 3)};
  EXPECT_TRUE(BitwiseEqual(layer->Forward(Context(), inputs, ForwardOptions()).value().outputs[0],
                           off_by_one->Forward(Context(), inputs, ForwardOptions()).value().outputs[0]));
}

TEST(DotProductAttention, DefaultsFollowTe) {
  DotProductAttentionOptions o;
  o.num_attention_heads = 2;
  o.kv_channels = 16;
  auto layer = DotProductAttention::Create("attn", o).value();
  EXPECT_EQ(layer->config().mask_type, AttnMaskType::kCausal);
  EXPECT_EQ(layer->config().qkv_format, QkvFormat::kSbhd);
  EXPECT_EQ(layer->config().window_left, -1);
  EXPECT_EQ(layer->config().window_right, 0);
  EXPECT_EQ(layer->config().softmax_scale, 0.25f);
  o.attn_mask_type = AttnMaskType::kNoMask;
  EXPECT_EQ(DotProductAttention::Create("attn", o).value()->config().window_right, -1);
}

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
