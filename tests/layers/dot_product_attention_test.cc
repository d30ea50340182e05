// DotProductAttention: finite-difference gradients of q, k, v and softmax_offset per
// option family (formats, masks, GQA/MQA, windows, thd offsets, softmax and bias
// types, checkpointing); forward vs the naive double reference; checkpoint and
// microbatch exactness; dropout determinism and its training-only use; max_logit;
// defaults. Option, side-input and spec errors are in dot_product_attention_errors_test.cc.
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

}  // namespace
}  // namespace layers
}  // namespace teserve
