// MultiheadAttention: central finite-difference gradients of hidden_states,
// encoder_output and every parameter per option family (fused/separate QKV, input
// layernorm, cross-attention, GQA/MQA, RoPE interleaved or not, each qk_norm_type before
// and after RoPE, thd, return_bias, learnable softmax); the forward against an
// independent double implementation of the documented formula (TE's interleaved QKV
// layout, RoPE, L2 qk norm, GQA, causal softmax); fused/separate equivalence with equal
// weights; thd positions restarting per sequence; every recipe against high precision
// (normalized error within TE's per-GEMM rtol compounded over the GEMMs on the path);
// parameter and quantizer names. Recipes, option and side-input errors and the ModelSpec
// are in multihead_attention_options_test.cc.
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
// Finite differences over hidden_states, encoder_output and every parameter.

struct GradCase {
  std::string name;
  std::function<void(MultiheadAttentionOptions*)> configure;
  Shape x_shape;
  Shape encoder_shape;               // cross only
  std::vector<int32_t> cu_q, cu_kv;  // thd only
  std::vector<int32_t> cu_q_padded;  // thd with tokens between sequences (self-attention)
};

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class MultiheadAttentionGrad : public ::testing::TestWithParam<GradCase> {};

TEST_P(MultiheadAttentionGrad, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  MultiheadAttentionOptions o = BaseOptions();
  c.configure(&o);
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe());
  ASSERT_TRUE(m.ok()) << m.status();
  PerturbSmallParameters(**m);
  SideProblem p;
  p.x = RandomTensor(c.x_shape, 11);
  if (!c.encoder_shape.empty()) p.SetEncoderOutput(RandomTensor(c.encoder_shape, 12));
  if (!c.cu_q.empty()) {
    p.side.Set("cu_seqlens_q", CuSeqlens(c.cu_q));
    p.side.Set("cu_seqlens_kv", CuSeqlens(c.cu_kv.empty() ? c.cu_q : c.cu_kv));
  }
  if (!c.cu_q_padded.empty()) {
    p.side.Set("cu_seqlens_q_padded", CuSeqlens(c.cu_q_padded));
    p.side.Set("cu_seqlens_kv_padded", CuSeqlens(c.cu_q_padded));
  }
  GradCheckOptions options;
  options.max_checks = 24;
  CheckGradientsWithSide(**m, p, options);
}

std::vector<GradCase> GradCases() {
  std::vector<GradCase> cases = {
      {"SelfFusedInterleaved_Sbhd_Causal", Set([](auto* o) { o->fuse_qkv_params = true; }), {5, 2, 32}},
      {"SelfFusedConcatenated_Bshd_NoMask",
       Set([](auto* o) {
         o->fuse_qkv_params = true;
         o->qkv_weight_interleaved = false;
         o->attn_mask_type = AttnMaskType::kNoMask;
       }),
       {2, 4, 32}},
      {"SelfSeparate_Sbhd_Mqa", Set([](auto* o) { o->num_gqa_groups = 1; }), {4, 2, 32}},
      {"SelfSeparate_Bshd_Mha_CausalBottomRight",
       Set([](auto* o) {
         o->num_gqa_groups = 0;
         o->qkv_format = QkvFormat::kBshd;
         o->attn_mask_type = AttnMaskType::kCausalBottomRight;
       }),
       {2, 3, 32}},
      {"InputLayerNorm_Fused_ReturnLayerNormOutput",
       Set([](auto* o) {
         o->input_layernorm = true;
         o->fuse_qkv_params = true;
         o->return_layernorm_output = true;
       }),
       {4, 2, 32}},
      {"InputRmsNormZeroCentered_Separate_ReturnBias",
       Set([](auto* o) {
         o->input_layernorm = true;
         o->normalization = NormKind::kRmsNorm;
         o->zero_centered_gamma = true;
         o->return_bias = true;
       }),
       {3, 2, 32}},
      {"CrossFused_Sbhd_NoMask",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->fuse_qkv_params = true;
         o->attn_mask_type = AttnMaskType::kNoMask;
       }),
       {4, 2, 32},
       {6, 2, 32}},
      {"CrossSeparate_Bshd_InputLayerNorm_CausalBottomRight",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->qkv_format = QkvFormat::kBshd;
         o->input_layernorm = true;
         o->return_layernorm_output = true;
         o->attn_mask_type = AttnMaskType::kCausalBottomRight;
       }),
       {2, 3, 32},
       {2, 5, 32}},
      {"CrossFusedConcatenated_RopeInterleaved_QkL2",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->fuse_qkv_params = true;
         o->qkv_weight_interleaved = false;
         o->attn_mask_type = AttnMaskType::kNoMask;
         o->qk_norm_type = QkNormType::kL2Normalization;
         Rope(o, true);
       }),
       {3, 2, 32},
       {5, 2, 32}},
      {"RopeHalves_Sbhd", Set([](auto* o) { Rope(o, false); }), {6, 2, 32}},
      {"RopeInterleaved_Bshd_Percent50",
       Set([](auto* o) {
         o->qkv_format = QkvFormat::kBshd;
         Rope(o, true, 0.5);
       }),
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
      {"Thd_PaddedBetweenSequences_Rope_QkL2",
       Set([](auto* o) {
         o->qkv_format = QkvFormat::kThd;
         o->attn_mask_type = AttnMaskType::kPaddingCausalBottomRight;
         o->qk_norm_type = QkNormType::kL2Normalization;
         Rope(o, false);
       }),
       {7, 32},
       {},
       {0, 2, 5},
       {},
       {0, 3, 7}},
      {"CrossThd_Padding_RopeInterleaved",
       Set([](auto* o) {
         o->attention_type = AttentionType::kCross;
         o->qkv_format = QkvFormat::kThd;
         o->attn_mask_type = AttnMaskType::kPadding;
         Rope(o, true);
       }),
       {5, 32},
       {6, 32},
       {0, 2, 5},
       {0, 4, 6}},
      {"LearnableSoftmax_NoBias",
       Set([](auto* o) {
         o->softmax_type = kernels::SoftmaxType::kLearnable;
         o->bias = false;
       }),
       {4, 2, 32}},
      {"ExplicitKvChannels_NotDividingHidden",
       Set([](auto* o) {
         o->hidden_size = 30;
         o->kv_channels = 6;
         Rope(o, false);
       }),
       {3, 2, 30}},
  };
  for (QkNormType norm : {QkNormType::kL2Normalization, QkNormType::kRmsNorm, QkNormType::kLayerNorm}) {
    for (bool before : {false, true}) {
      for (bool interleaved : {false, true}) {
        const std::string name =
            absl::StrCat(norm == QkNormType::kL2Normalization ? "QkL2Normalization"
                         : norm == QkNormType::kRmsNorm       ? "QkRmsNorm"
                                                              : "QkLayerNorm",
                         before ? "_BeforeRope" : "_AfterRope", interleaved ? "Interleaved" : "Halves");
        cases.push_back({name,
                         [=](MultiheadAttentionOptions* o) {
                           o->qk_norm_type = norm;
                           o->qk_norm_before_rope = before;
                           o->fuse_qkv_params = interleaved;  // both projection layouts
                           Rope(o, interleaved);
                         },
                         {5, 2, 32}});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Families, MultiheadAttentionGrad, ::testing::ValuesIn(GradCases()),
                         [](const ::testing::TestParamInfo<GradCase>& info) { return info.param.name; });

// ---------------------------------------------------------------------------------
// Forward against a direct double implementation.

TEST(MultiheadAttention, ForwardMatchesDoubleReference) {
  // Self-attention, sbhd, fused interleaved QKV (TE's default layout), GQA 4:2, RoPE
  // halves, L2 qk norm after RoPE, causal.
  MultiheadAttentionOptions o = BaseOptions();
  o.fuse_qkv_params = true;
  o.qk_norm_type = QkNormType::kL2Normalization;
  Rope(&o, false);
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  PerturbSmallParameters(*m);
  const int64_t S = 5, B = 2, hidden = 32, H = 4, G = 2, D = 8;
  const Tensor x = RandomTensor({S, B, hidden}, 3);
  ForwardOptions options;
  auto out = m->Forward(Context(), {x}, options);
  ASSERT_TRUE(out.ok()) << out.status();

  const Parameter* wqkv = FindParameter(*m, "mha.qkv.weight");
  const Parameter* bqkv = FindParameter(*m, "mha.qkv.bias");
  const Parameter* wp = FindParameter(*m, "mha.proj.weight");
  const Parameter* bp = FindParameter(*m, "mha.proj.bias");
  ASSERT_TRUE(wqkv && bqkv && wp && bp);
  const int64_t width = (H + 2 * G) * D;
  ASSERT_EQ(wqkv->value.shape(), (Shape{width, hidden}));
  // Row of the fused weight for (part, head, channel): [G][H/G q, k, v][D].
  auto qkv_row = [&](int part, int64_t head, int64_t d) {
    const int64_t per = H / G;
    const int64_t group = part == 0 ? head / per : head;
    const int64_t slot = part == 0 ? head % per : per + part - 1;
    return (group * (per + 2) + slot) * D + d;
  };
  // q[s][b][h][d] etc. in double.
  std::vector<double> q(S * B * H * D), k(S * B * G * D), v(S * B * G * D);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t b = 0; b < B; ++b) {
      const float* xr = x.data<float>() + (s * B + b) * hidden;
      auto project = [&](int64_t row) {
        double acc = bqkv->value.floats()[row];
        for (int64_t i = 0; i < hidden; ++i) acc += static_cast<double>(wqkv->value.floats()[row * hidden + i]) * xr[i];
        return acc;
      };
      for (int part = 0; part < 3; ++part) {
        const int64_t heads = part == 0 ? H : G;
        std::vector<double>& dst = part == 0 ? q : part == 1 ? k : v;
        for (int64_t h = 0; h < heads; ++h) {
          std::vector<double> vec(D);
          for (int64_t d = 0; d < D; ++d) vec[d] = project(qkv_row(part, h, d));
          if (part < 2) {
            // RoPE, halves: pair (i, i + D/2) rotated by s / 10000^(2i/D).
            std::vector<double> rotated(vec);
            for (int64_t i = 0; i < D / 2; ++i) {
              const double angle = s / std::pow(10000.0, 2.0 * i / D);
              rotated[i] = vec[i] * std::cos(angle) - vec[i + D / 2] * std::sin(angle);
              rotated[i + D / 2] = vec[i + D / 2] * std::cos(angle) + vec[i] * std::sin(angle);
            }
            double norm = 0.0;
            for (double r : rotated) norm += r * r;
            for (int64_t d = 0; d < D; ++d) vec[d] = rotated[d] / std::sqrt(norm + 1e-6);
          }
          for (int64_t d = 0; d < D; ++d) dst[((s * B + b) * heads + h) * D + d] = vec[d];
        }
      }
    }
  }
  std::vector<double> context(S * B * H * D, 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / G);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> score(i + 1);  // causal: keys 0..i
        double max_score = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0.0;
          for (int64_t d = 0; d < D; ++d) dot += q[((i * B + b) * H + h) * D + d] * k[((j * B + b) * G + g) * D + d];
          score[j] = dot / std::sqrt(static_cast<double>(D));
          max_score = std::max(max_score, score[j]);
        }
        double total = 0.0;
        for (double& sc : score) total += (sc = std::exp(sc - max_score));
        for (int64_t j = 0; j <= i; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            context[((i * B + b) * H + h) * D + d] += score[j] / total * v[((j * B + b) * G + g) * D + d];
          }
        }
      }
    }
  }
  const Tensor& y = out->outputs[0];
  ASSERT_EQ(y.shape(), (Shape{S, B, hidden}));
  for (int64_t n = 0; n < S * B; ++n) {
    for (int64_t o2 = 0; o2 < hidden; ++o2) {
      double ref = bp->value.floats()[o2];
      for (int64_t c = 0; c < H * D; ++c) ref += wp->value.floats()[o2 * H * D + c] * context[n * H * D + c];
      EXPECT_NEAR(y.floats()[n * hidden + o2], ref, 1e-5 + 1e-5 * std::fabs(ref)) << "token " << n << " out " << o2;
    }
  }
}

// ---------------------------------------------------------------------------------
// Fused and separate QKV with equal weights.

void ExpectNear(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  int failures = 0;
  for (int64_t i = 0; i < got.numel() && failures < 5; ++i) {
    if (std::fabs(got.floats()[i] - want.floats()[i]) > tol * (1.0 + std::fabs(want.floats()[i]))) {
      ADD_FAILURE() << what << "[" << i << "]: " << got.floats()[i] << " vs " << want.floats()[i];
      ++failures;
    }
  }
}

// Copies rows [begin, begin + rows) of `block` into `fused` at row offsets given by
// `row_of(r)` for r in the block (weights [rows, cols] or biases [rows]).
void ScatterRows(const Tensor& block, Tensor& fused, const std::function<int64_t(int64_t)>& row_of) {
  const int64_t cols = block.rank() == 2 ? block.dim(1) : 1;
  for (int64_t r = 0; r < block.dim(0); ++r) {
    for (int64_t c = 0; c < cols; ++c) fused.mutable_floats()[row_of(r) * cols + c] = block.floats()[r * cols + c];
  }
}

class FusedVersusSeparate : public ::testing::TestWithParam<std::tuple<bool, bool>> {};

TEST_P(FusedVersusSeparate, AgreeWithEqualWeights) {
  const auto [cross, interleaved] = GetParam();
  MultiheadAttentionOptions o = BaseOptions();
  o.attention_type = cross ? AttentionType::kCross : AttentionType::kSelf;
  if (cross) o.attn_mask_type = AttnMaskType::kNoMask;
  Rope(&o, false);
  MultiheadAttentionOptions fused_options = o;
  fused_options.fuse_qkv_params = true;
  fused_options.qkv_weight_interleaved = interleaved;
  fused_options.seed = 99;  // different initial weights: the copy below must make them equal
  auto separate = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  auto fused = MultiheadAttention::Create("mha", fused_options, recipes::Recipe()).value();
  PerturbSmallParameters(*separate);
  const int64_t H = 4, G = 2, D = 8, per = H / G;
  // Fused row of row r of a separate block (part 0 query, 1 key, 2 value).
  auto fused_row = [&](int part, int64_t r) -> int64_t {
    const int64_t head = r / D, d = r % D;
    if (cross) return interleaved ? (2 * head + (part - 1)) * D + d : (part - 1) * G * D + r;
    if (!interleaved) return (part == 0 ? 0 : part == 1 ? H * D : (H + G) * D) + r;
    const int64_t group = part == 0 ? head / per : head;
    const int64_t slot = part == 0 ? head % per : per + part - 1;
    return (group * (per + 2) + slot) * D + d;
  };
  // Each separate parameter, the fused parameter holding it, and its part (-1: same name).
  struct Pair {
    Parameter* separate;
    Parameter* fused;
    int part;
  };
  std::vector<Pair> pairs;
  for (Parameter* p : separate->Parameters()) {
    const std::string& name = p->name;
    const bool is_bias = absl::EndsWith(name, "_bias");
    const std::string stem = cross ? "mha.key_value." : "mha.qkv.";
    if (!absl::StartsWith(name, stem) || name == stem + "weight" || name == stem + "bias") {
      pairs.push_back({p, FindParameter(*fused, name), -1});
      continue;
    }
    const absl::string_view block = absl::string_view(name).substr(stem.size());  // "key_weight", ...
    const int part = absl::StartsWith(block, "query") ? 0 : absl::StartsWith(block, "key") ? 1 : 2;
    pairs.push_back({p, FindParameter(*fused, stem + (is_bias ? "bias" : "weight")), part});
  }
  for (const Pair& pair : pairs) {
    ASSERT_NE(pair.fused, nullptr) << pair.separate->name;
    if (pair.part < 0) {
      std::copy_n(pair.separate->value.floats().begin(), pair.separate->value.numel(),
                  pair.fused->value.mutable_floats().begin());
    } else {
      ScatterRows(pair.separate->value, pair.fused->value, [&](int64_t r) { return fused_row(pair.part, r); });
    }
  }
  const Tensor x = RandomTensor({4, 2, 32}, 21);
  const Tensor enc = RandomTensor({5, 2, 32}, 22);
  const RunResult a = RunForwardBackward(*separate, x, cross ? &enc : nullptr);
  const RunResult b = RunForwardBackward(*fused, x, cross ? &enc : nullptr);
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  // The same GEMM; only the column order of the projection output differs.
  ExpectNear(b.outputs[0], a.outputs[0], 1e-6, "output");
  ExpectNear(b.dx, a.dx, 1e-6, "d hidden_states");
  if (cross) ExpectNear(b.denc, a.denc, 1e-6, "d encoder_output");
  // Parameter gradients map back through the same layout.
  for (const Pair& pair : pairs) {
    if (pair.part < 0) {
      ExpectNear(pair.fused->grad, pair.separate->grad, 1e-6, pair.separate->name + " grad");
      continue;
    }
    Tensor gathered = Tensor::Zeros(DType::kFloat32, pair.separate->grad.shape()).value();
    const int64_t cols = gathered.rank() == 2 ? gathered.dim(1) : 1;
    for (int64_t r = 0; r < gathered.dim(0); ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        gathered.mutable_floats()[r * cols + c] = pair.fused->grad.floats()[fused_row(pair.part, r) * cols + c];
      }
    }
    ExpectNear(gathered, pair.separate->grad, 1e-6, pair.separate->name + " grad");
  }
  if (!cross && !interleaved) {
    // Concatenated layout: the separate views are exactly the fused weight's rows.
    EXPECT_TRUE(BitwiseEqual(a.outputs[0], b.outputs[0]));
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, FusedVersusSeparate, ::testing::Combine(::testing::Bool(), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
                           return absl::StrCat(std::get<0>(info.param) ? "Cross" : "Self",
                                               std::get<1>(info.param) ? "_Interleaved" : "_Concatenated");
                         });

TEST(MultiheadAttention, SeparateParametersAreViewsOfOneGemm) {
  MultiheadAttentionOptions o = BaseOptions();
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  EXPECT_THAT(ParameterNames(*m),
              ElementsAre("mha.qkv.query_weight", "mha.qkv.key_weight", "mha.qkv.value_weight", "mha.qkv.query_bias",
                          "mha.qkv.key_bias", "mha.qkv.value_bias", "mha.proj.weight", "mha.proj.bias"));
  EXPECT_EQ(FindParameter(*m, "mha.qkv.query_weight")->value.shape(), (Shape{32, 32}));
  EXPECT_EQ(FindParameter(*m, "mha.qkv.key_weight")->value.shape(), (Shape{16, 32}));
  EXPECT_EQ(FindParameter(*m, "mha.qkv.value_bias")->value.shape(), (Shape{16}));
  std::vector<std::string> quantized;
  for (const NamedQuantizer& q : m->Quantizers()) quantized.push_back(q.layer);
  EXPECT_TRUE(quantized.empty());  // high precision: no quantizers
}

TEST(MultiheadAttention, ParameterNamesFollowTe) {
  MultiheadAttentionOptions o = BaseOptions();
  o.input_layernorm = true;
  o.fuse_qkv_params = true;
  o.qk_norm_type = QkNormType::kLayerNorm;
  o.softmax_type = kernels::SoftmaxType::kLearnable;
  EXPECT_THAT(ParameterNames(*MultiheadAttention::Create("mha", o, recipes::Recipe()).value()),
              ElementsAre("mha.layernorm_qkv.layer_norm_weight", "mha.layernorm_qkv.layer_norm_bias",
                          "mha.layernorm_qkv.weight", "mha.layernorm_qkv.bias", "mha.q_norm.weight", "mha.q_norm.bias",
                          "mha.k_norm.weight", "mha.k_norm.bias", "mha.core_attention.softmax_offset",
                          "mha.proj.weight", "mha.proj.bias"));
  MultiheadAttentionOptions cross = BaseOptions();
  cross.attention_type = AttentionType::kCross;
  cross.bias = false;
  cross.qk_norm_type = QkNormType::kRmsNorm;
  EXPECT_THAT(ParameterNames(*MultiheadAttention::Create("x", cross, recipes::Recipe()).value()),
              ElementsAre("x.query_layer.weight", "x.key_value.key_weight", "x.key_value.value_weight",
                          "x.q_norm.weight", "x.k_norm.weight", "x.proj.weight"));
  cross.input_layernorm = true;
  cross.normalization = NormKind::kRmsNorm;
  cross.qk_norm_type = QkNormType::kL2Normalization;  // no parameters
  EXPECT_THAT(ParameterNames(*MultiheadAttention::Create("x", cross, recipes::Recipe()).value()),
              ElementsAre("x.layernorm_query.layer_norm_weight", "x.layernorm_query.query_weight",
                          "x.key_value.key_weight", "x.key_value.value_weight", "x.proj.weight"));
}

TEST(MultiheadAttention, ThdPositionsRestartPerSequence) {
  // Two sequences packed as thd (padding_causal) give what a bshd batch of the same two
  // sequences gives (causal): RoPE positions and the causal diagonal restart at each.
  MultiheadAttentionOptions o = BaseOptions();
  o.qk_norm_type = QkNormType::kRmsNorm;
  Rope(&o, true);
  MultiheadAttentionOptions bshd = o, thd = o;
  bshd.qkv_format = QkvFormat::kBshd;
  thd.qkv_format = QkvFormat::kThd;
  thd.attn_mask_type = AttnMaskType::kPaddingCausal;
  auto a = MultiheadAttention::Create("mha", bshd, recipes::Recipe()).value();
  auto b = MultiheadAttention::Create("mha", thd, recipes::Recipe()).value();  // same seed: same weights
  const Tensor x = RandomTensor({2, 6, 32}, 8);
  SideInputs side;
  side.Set("cu_seqlens_q", CuSeqlens({0, 6, 12}));
  side.Set("cu_seqlens_kv", CuSeqlens({0, 6, 12}));
  ForwardOptions with_side;
  with_side.side = &side;
  auto ya = a->Forward(Context(), {x}, ForwardOptions());
  auto yb = b->Forward(Context(), {x.Reshape({12, 32}).value()}, with_side);
  ASSERT_TRUE(ya.ok()) << ya.status();
  ASSERT_TRUE(yb.ok()) << yb.status();
  ExpectNear(yb->outputs[0], ya->outputs[0].Reshape({12, 32}).value(), 1e-6, "thd vs bshd");
}

TEST(MultiheadAttention, TokensBetweenThdSequencesDoNotChangeTheRealTokens) {
  // With cu_seqlens_q_padded the rotary positions restart at each padded start (TE's
  // pad_between_seqs); the real tokens then get what the unpadded packing gives them.
  MultiheadAttentionOptions o = BaseOptions();
  o.qkv_format = QkvFormat::kThd;
  o.attn_mask_type = AttnMaskType::kPaddingCausal;
  Rope(&o, true);
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  const Tensor packed = RandomTensor({5, 32}, 6);
  Tensor padded = RandomTensor({7, 32}, 7);  // rows 2 and 6 are padding
  const int64_t real_rows[5] = {0, 1, 3, 4, 5};
  for (int64_t i = 0; i < 5; ++i) {
    std::copy_n(packed.floats().begin() + i * 32, 32, padded.mutable_floats().begin() + real_rows[i] * 32);
  }
  SideInputs plain, with_padding;
  for (SideInputs* side : {&plain, &with_padding}) {
    side->Set("cu_seqlens_q", CuSeqlens({0, 2, 5}));
    side->Set("cu_seqlens_kv", CuSeqlens({0, 2, 5}));
  }
  with_padding.Set("cu_seqlens_q_padded", CuSeqlens({0, 3, 7}));
  with_padding.Set("cu_seqlens_kv_padded", CuSeqlens({0, 3, 7}));
  ForwardOptions a_options, b_options;
  a_options.side = &plain;
  b_options.side = &with_padding;
  auto a = m->Forward(Context(), {packed}, a_options);
  auto b = m->Forward(Context(), {padded}, b_options);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 32; ++j) {
      EXPECT_NEAR(b->outputs[0].floats()[real_rows[i] * 32 + j], a->outputs[0].floats()[i * 32 + j], 1e-6)
          << "token " << i << " channel " << j;
    }
  }
}

TEST(MultiheadAttention, EmptyBatchRunsForwardAndBackward) {
  MultiheadAttentionOptions o = BaseOptions();
  o.input_layernorm = true;
  o.qk_norm_type = QkNormType::kL2Normalization;
  Rope(&o, false);
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  const RunResult r = RunForwardBackward(*m, Tensor::Zeros(DType::kFloat32, {0, 2, 32}).value(), nullptr);
  ASSERT_EQ(r.outputs.size(), 1u);
  EXPECT_EQ(r.outputs[0].shape(), (Shape{0, 2, 32}));
  EXPECT_EQ(r.dx.shape(), (Shape{0, 2, 32}));
}

TEST(MultiheadAttention, ReturnBiasAndLayerNormOutput) {
  MultiheadAttentionOptions o = BaseOptions();
  o.input_layernorm = true;
  o.return_layernorm_output = true;
  o.return_bias = true;
  auto m = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  PerturbSmallParameters(*m);
  const Tensor x = RandomTensor({3, 2, 32}, 4);
  auto out = m->Forward(Context(), {x}, ForwardOptions()).value();
  ASSERT_EQ(out.outputs.size(), 3u);
  EXPECT_TRUE(BitwiseEqual(out.outputs[1], FindParameter(*m, "mha.proj.bias")->value));
  // The layernorm output: LayerNorm of x with the layernorm_qkv gamma and beta.
  const Parameter* gamma = FindParameter(*m, "mha.layernorm_qkv.layer_norm_weight");
  const Parameter* beta = FindParameter(*m, "mha.layernorm_qkv.layer_norm_bias");
  for (int64_t n = 0; n < 6; ++n) {
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < 32; ++j) mean += x.floats()[n * 32 + j] / 32.0;
    for (int64_t j = 0; j < 32; ++j) var += std::pow(x.floats()[n * 32 + j] - mean, 2) / 32.0;
    for (int64_t j = 0; j < 32; ++j) {
      const double want =
          (x.floats()[n * 32 + j] - mean) / std::sqrt(var + 1e-5) * gamma->value.floats()[j] + beta->value.floats()[j];
      EXPECT_NEAR(out.outputs[2].floats()[n * 32 + j], want, 1e-5) << n << "," << j;
    }
  }
  // return_layernorm_output without input_layernorm is ignored, as in TE.
  o.input_layernorm = false;
  auto plain = MultiheadAttention::Create("mha", o, recipes::Recipe()).value();
  EXPECT_EQ(plain->OutputShapes({{3, 2, 32}}, "inputs")->size(), 2u);
}

}  // namespace
}  // namespace layers
}  // namespace teserve
