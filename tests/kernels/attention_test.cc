// Tests of kernels/attention.h on the CPU. Forward (out, softmax_lse, max_logit) against
// the naive double reference of attention_reference.h for every mask type, GQA/MQA,
// windows, sbhd/bshd/thd with ragged and padded cu_seqlens, bias types, softmax types
// and dropout; backward (dq, dk, dv, dbias, dsoftmax_offset) against central finite
// differences of that double reference; dropout statistics; metadata errors.
#include "kernels/attention.h"
#include "kernels/cast.h"

#include <cmath>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/attention_reference.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::AttentionInputs;
using ::teserve::testing_kernels::AttentionProblem;
using ::teserve::testing_kernels::AttentionResult;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;
using ::teserve::testing_kernels::ReferenceAttention;
using ::teserve::testing_kernels::ReferenceLoss;
using ::teserve::testing_kernels::ToDoubles;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;
constexpr double kInf = std::numeric_limits<double>::infinity();

// Finite differences of the double reference are accurate to ~1e-9; the kernel's
// gradients are FP32 results of FP64 sums (with the FP32 softmax_lse and out it saved),
// so they agree to a few FP32 ulps of the terms summed.
constexpr double kGradAtol = 1e-5;
constexpr double kGradRtol = 1e-5;
constexpr double kFiniteDifferenceStep = 1e-5;
constexpr int kMaxChecksPerTensor = 40;

Tensor Int32Tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(values.size())}).value();
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// The kernel's tensors for a problem, and the same values as doubles for the reference.
struct ProblemData {
  Tensor q, k, v;
  AttentionSideTensors side;
  AttentionInputs ref;
};

ProblemData MakeData(const AttentionProblem& p, uint32_t seed) {
  ProblemData d;
  d.q = RandomTensor(p.q_shape(), -1.0f, 1.0f, seed);
  d.k = RandomTensor(p.k_shape(), -1.0f, 1.0f, seed + 1);
  d.v = RandomTensor(p.v_shape(), -1.0f, 1.0f, seed + 2);
  d.ref.q = ToDoubles(d.q.floats());
  d.ref.k = ToDoubles(d.k.floats());
  d.ref.v = ToDoubles(d.v.floats());
  if (p.padded()) {
    d.side.cu_seqlens_q = Int32Tensor(p.cu_q);
    d.side.cu_seqlens_kv = Int32Tensor(p.cu_kv);
  }
  if (!p.cu_q_padded.empty()) d.side.cu_seqlens_q_padded = Int32Tensor(p.cu_q_padded);
  if (!p.cu_kv_padded.empty()) d.side.cu_seqlens_kv_padded = Int32Tensor(p.cu_kv_padded);
  if (p.mask == AttnMaskType::kArbitrary) {
    d.side.mask = Tensor::Zeros(DType::kBool, p.mask_shape).value();
    std::mt19937 rng(seed + 3);
    uint8_t* bits = d.side.mask.data<uint8_t>();
    for (int64_t i = 0; i < d.side.mask.numel(); ++i) bits[i] = (rng() % 10) < 3 ? 1 : 0;
    // One fully masked row of scores (the first query of every broadcast slice).
    const int64_t row = p.mask_shape[3];
    for (int64_t j = 0; j < row; ++j) bits[j] = 1;
    d.ref.mask.assign(bits, bits + d.side.mask.numel());
  }
  if (p.bias == AttnBiasType::kPreScaleBias || p.bias == AttnBiasType::kPostScaleBias) {
    d.side.bias = RandomTensor(p.bias_shape, -1.0f, 1.0f, seed + 4);
    d.ref.bias = ToDoubles(d.side.bias.floats());
  }
  if (p.bias == AttnBiasType::kAlibi) {
    d.side.alibi_slopes = p.batch_slopes ? RandomTensor({p.sequences(), p.heads}, 0.1f, 1.0f, seed + 5)
                                         : RandomTensor({p.heads}, 0.1f, 1.0f, seed + 5);
    d.ref.slopes = ToDoubles(d.side.alibi_slopes.floats());
  }
  if (p.softmax == SoftmaxType::kLearnable) {
    d.side.softmax_offset = RandomTensor({p.heads}, -1.0f, 1.0f, seed + 6);
    d.ref.offset = ToDoubles(d.side.softmax_offset.floats());
  }
  return d;
}

struct AttentionCase {
  std::string name;
  AttentionProblem problem;
};

void PrintTo(const AttentionCase& c, std::ostream* os) { *os << c.name; }

AttentionProblem Base(QkvFormat format, AttnMaskType mask) {
  AttentionProblem p;
  p.format = format;
  p.mask = mask;
  if (IsCausal(mask)) p.window_right = 0;
  return p;
}

AttentionProblem Thd(AttnMaskType mask, std::vector<int32_t> cu_q, std::vector<int32_t> cu_kv, int64_t t_q,
                     int64_t t_kv) {
  AttentionProblem p = Base(QkvFormat::kThd, mask);
  p.cu_q = std::move(cu_q);
  p.cu_kv = std::move(cu_kv);
  p.t_q = t_q;
  p.t_kv = t_kv;
  return p;
}

std::vector<AttentionCase> Cases() {
  using F = QkvFormat;
  using M = AttnMaskType;
  std::vector<AttentionCase> cases;
  auto add = [&](std::string name, AttentionProblem p) { cases.push_back({std::move(name), std::move(p)}); };
  {
    AttentionProblem p = Base(F::kSbhd, M::kNoMask);
    p.s_kv = 7;
    add("Sbhd_NoMask_Sq5_Skv7", p);
    p = Base(F::kBshd, M::kNoMask);
    p.heads = 4, p.groups = 2, p.d_v = 3;
    add("Bshd_NoMask_GQA4x2_DvDiffers", p);
    p = Base(F::kBshd, M::kNoMask);
    p.heads = 3, p.groups = 1;
    add("Bshd_NoMask_MQA", p);
  }
  for (M mask : {M::kCausal, M::kCausalBottomRight}) {
    for (auto [s_q, s_kv] : {std::pair<int64_t, int64_t>{4, 6}, {6, 4}}) {
      for (F format : {F::kSbhd, F::kBshd}) {
        AttentionProblem p = Base(format, mask);
        p.s_q = s_q, p.s_kv = s_kv;
        add(absl::StrCat(format == F::kSbhd ? "Sbhd_" : "Bshd_", AttnMaskTypeName(mask), "_Sq", s_q, "_Skv", s_kv), p);
      }
    }
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kPadding);
    p.s_kv = 7, p.cu_q = {0, 3, 8}, p.cu_kv = {0, 6, 7};
    add("Bshd_Padding_Cross", p);
    p = Base(F::kSbhd, M::kPaddingCausal);
    p.cu_q = {0, 4, 6}, p.cu_kv = {0, 3, 8};
    add("Sbhd_PaddingCausal", p);
    p = Base(F::kBshd, M::kPaddingCausalBottomRight);
    p.s_kv = 6, p.cu_q = {0, 2, 7}, p.cu_kv = {0, 6, 9};
    add("Bshd_PaddingCausalBottomRight", p);
    p = Base(F::kBshd, M::kPadding);
    p.batch = 3, p.cu_q = {0, 0, 4, 7}, p.cu_kv = {0, 3, 5, 5};  // no queries; 2 keys; no keys
    add("Bshd_Padding_EmptySequences", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kArbitrary);
    p.s_kv = 6, p.mask_shape = {2, 1, 5, 6};
    add("Bshd_Arbitrary_PerBatch", p);
    p = Base(F::kSbhd, M::kArbitrary);
    p.heads = 3, p.groups = 3, p.mask_shape = {1, 3, 1, 5};
    add("Sbhd_Arbitrary_BroadcastHeadsAndQueries", p);
    p = Base(F::kBshd, M::kArbitrary);
    p.mask_shape = {2, 2, 5, 5}, p.window_left = 1, p.window_right = 1;
    add("Bshd_Arbitrary_Window1x1", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kNoMask);
    p.s_kv = 7, p.window_left = 2, p.window_right = 1;
    add("Bshd_NoMask_Window2x1_BottomRight", p);
    p = Base(F::kSbhd, M::kCausal);
    p.s_q = 6, p.s_kv = 6, p.window_left = 2;
    add("Sbhd_Causal_Window2", p);
    p = Base(F::kBshd, M::kPaddingCausalBottomRight);
    p.s_kv = 6, p.cu_q = {0, 3, 8}, p.cu_kv = {0, 6, 10}, p.window_left = 1;
    add("Bshd_PaddingCausalBottomRight_Window1", p);
    p = Base(F::kBshd, M::kPadding);
    p.cu_q = {0, 5, 8}, p.cu_kv = {0, 5, 10}, p.window_left = 0, p.window_right = 0;
    add("Bshd_Padding_Window0x0", p);
  }
  {
    AttentionProblem p = Thd(M::kPadding, {0, 3, 3, 8}, {0, 2, 6, 9}, 8, 9);
    p.groups = 1;
    add("Thd_Padding_Ragged_MQA", p);
    p = Thd(M::kPaddingCausal, {0, 3, 5, 9}, {0, 3, 5, 9}, 13, 13);
    p.cu_q_padded = {0, 4, 8, 13}, p.cu_kv_padded = {0, 4, 8, 13}, p.heads = 3, p.groups = 3;
    add("Thd_PaddingCausal_PaddedOffsets", p);
    p = Thd(M::kPaddingCausalBottomRight, {0, 2, 5}, {0, 4, 10}, 8, 12);
    p.cu_q_padded = {0, 3, 7}, p.cu_kv_padded = {0, 5, 11};
    add("Thd_PaddingCausalBottomRight_Cross_PaddedOffsets", p);
    p = Thd(M::kPadding, {0, 4, 7}, {0, 5, 9}, 7, 9);
    p.window_left = 1, p.window_right = 2;
    add("Thd_Padding_Window1x2", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kNoMask);
    p.softmax = SoftmaxType::kOffByOne;
    add("Bshd_NoMask_OffByOne", p);
    p = Base(F::kSbhd, M::kCausal);
    p.softmax = SoftmaxType::kLearnable, p.s_q = 6;
    add("Sbhd_Causal_Learnable_FullyMaskedRows", p);
    p = Thd(M::kPadding, {0, 3, 7}, {0, 0, 4}, 7, 4);
    p.softmax = SoftmaxType::kLearnable, p.heads = 4, p.groups = 2;
    add("Thd_Padding_Learnable_GQA_EmptyKeys", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kNoMask);
    p.bias = AttnBiasType::kPreScaleBias, p.bias_shape = {1, 2, 5, 5}, p.scale = 0.3f;
    add("Bshd_NoMask_PreScaleBias_1hss", p);
    p = Base(F::kSbhd, M::kCausal);
    p.bias = AttnBiasType::kPostScaleBias, p.bias_shape = {2, 1, 5, 5};
    add("Sbhd_Causal_PostScaleBias_b1ss", p);
    p = Base(F::kBshd, M::kPadding);
    p.s_kv = 6, p.cu_q = {0, 4, 9}, p.cu_kv = {0, 6, 8};
    p.bias = AttnBiasType::kPostScaleBias, p.bias_shape = {2, 2, 5, 6};
    add("Bshd_Padding_PostScaleBias_bhss", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kCausalBottomRight);
    p.s_q = 4, p.s_kv = 7, p.bias = AttnBiasType::kAlibi;
    add("Bshd_CausalBottomRight_Alibi", p);
    p = Base(F::kSbhd, M::kCausal);
    p.s_q = 4, p.s_kv = 7, p.bias = AttnBiasType::kAlibi;
    add("Sbhd_Causal_Alibi_TopLeft", p);
    p = Base(F::kBshd, M::kPadding);
    p.s_kv = 6, p.cu_q = {0, 2, 7}, p.cu_kv = {0, 6, 9}, p.bias = AttnBiasType::kAlibi, p.batch_slopes = true;
    add("Bshd_Padding_AlibiPerBatchSlopes", p);
    p = Thd(M::kPaddingCausal, {0, 3, 8}, {0, 5, 9}, 8, 9);
    p.bias = AttnBiasType::kAlibi;
    add("Thd_PaddingCausal_Alibi", p);
  }
  {
    AttentionProblem p = Base(F::kBshd, M::kCausal);
    p.dropout = 0.3f, p.dropout_seed = 17, p.dropout_stream = 5;
    add("Bshd_Causal_Dropout0.3", p);
    p = Thd(M::kPadding, {0, 3, 7}, {0, 4, 9}, 7, 9);
    p.dropout = 0.2f, p.dropout_seed = 3, p.softmax = SoftmaxType::kLearnable;
    add("Thd_Padding_Dropout0.2_Learnable", p);
  }
  {
    // TE's "weird" test shape (docs/te_facts.md): 3 x 37 x 3 heads x 23.
    AttentionProblem p = Base(F::kSbhd, M::kCausal);
    p.batch = 3, p.s_q = 37, p.s_kv = 37, p.heads = 3, p.groups = 3, p.d_qk = 23, p.d_v = 23;
    add("Weird_Sbhd_Causal_3x37x3x23", p);
    // TE's "small" test shape (docs/te_facts.md): batch 2, seq 128, 8 heads, head dim 16.
    p = Base(F::kBshd, M::kPaddingCausal);
    p.s_q = 128, p.s_kv = 128, p.heads = 8, p.groups = 8, p.d_qk = 16, p.d_v = 16;
    p.cu_q = {0, 128, 228}, p.cu_kv = {0, 128, 228};
    add("Small_Bshd_PaddingCausal_2x128x8x16", p);
  }
  for (AttentionCase& c : cases) {  // test names allow [A-Za-z0-9_] only
    for (char& ch : c.name) {
      if (ch == '.') ch = 'p';
    }
  }
  return cases;
}

// Rows that attend to nothing (and heads with nothing unmasked) are -inf in both;
// the rest agree within the FP32 tolerance of the shared table.
void ExpectCloseOrSameInfinity(absl::Span<const float> got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  std::vector<float> finite_got;
  std::vector<double> finite_want;
  for (size_t i = 0; i < got.size(); ++i) {
    if (want[i] == -kInf) {
      EXPECT_EQ(got[i], -std::numeric_limits<float>::infinity()) << what << "[" << i << "]";
    } else {
      finite_got.push_back(got[i]);
      finite_want.push_back(want[i]);
    }
  }
  EXPECT_TRUE(AllClose(finite_got, finite_want, DType::kFloat32)) << what;
}

class AttentionVsReference : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(AttentionVsReference, ForwardMatchesNaiveReference) {
  const AttentionProblem& p = GetParam().problem;
  const ProblemData d = MakeData(p, 11);
  auto result = AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side);
  ASSERT_TRUE(result.ok()) << result.status();
  const AttentionResult ref = ReferenceAttention(p, d.ref);

  EXPECT_EQ(result->out.shape(), p.out_shape());
  EXPECT_TRUE(AllClose(result->out.floats(), ref.out, DType::kFloat32, ref.magnitude));

  ExpectCloseOrSameInfinity(result->softmax_lse.floats(), ref.lse, "softmax_lse");
  ASSERT_TRUE(result->max_logit.defined());
  ExpectCloseOrSameInfinity(result->max_logit.floats(), ref.max_logit, "max_logit");
  int64_t empty_rows = 0;
  for (double lse : ref.lse) empty_rows += lse == -kInf;
  // Sanity of the reference itself: the problem has rows that attend to something.
  EXPECT_LT(empty_rows, static_cast<int64_t>(ref.lse.size()));
}

TEST_P(AttentionVsReference, BackwardMatchesFiniteDifferences) {
  const AttentionProblem& p = GetParam().problem;
  const ProblemData d = MakeData(p, 23);
  auto forward = AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side);
  ASSERT_TRUE(forward.ok()) << forward.status();
  const Tensor dout = RandomTensor(p.out_shape(), -1.0f, 1.0f, 99);
  const std::vector<double> w = ToDoubles(dout.floats());
  auto grads =
      AttentionBackward(Context(), p.config(), d.q, d.k, d.v, d.side, forward->out, forward->softmax_lse, dout);
  ASSERT_TRUE(grads.ok()) << grads.status();

  AttentionInputs in = d.ref;
  auto check = [&](std::vector<double>* values, const Tensor& analytic, const std::string& what) {
    ASSERT_TRUE(analytic.defined()) << what;
    ASSERT_EQ(analytic.numel(), static_cast<int64_t>(values->size())) << what;
    const int64_t n = analytic.numel();
    const int64_t stride = std::max<int64_t>(1, n / kMaxChecksPerTensor);
    for (int64_t i = 0; i < n; i += stride) {
      const double saved = (*values)[i];
      (*values)[i] = saved + kFiniteDifferenceStep;
      const double plus = ReferenceLoss(p, in, w);
      (*values)[i] = saved - kFiniteDifferenceStep;
      const double minus = ReferenceLoss(p, in, w);
      (*values)[i] = saved;
      const double numeric = (plus - minus) / (2 * kFiniteDifferenceStep);
      EXPECT_NEAR(analytic.floats()[i], numeric, kGradAtol + kGradRtol * std::fabs(numeric)) << what << "[" << i << "]";
    }
  };
  check(&in.q, grads->dq, "dq");
  check(&in.k, grads->dk, "dk");
  check(&in.v, grads->dv, "dv");
  if (!in.bias.empty()) check(&in.bias, grads->dbias, "dbias");
  if (!in.offset.empty()) check(&in.offset, grads->dsoftmax_offset, "dsoftmax_offset");
}

INSTANTIATE_TEST_SUITE_P(Attention, AttentionVsReference, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return info.param.name; });

// A problem whose outputs expose the dropout mask: q = 0 gives uniform probabilities
// 1 / S_kv, and v = identity makes out[i, h, j] = P'(i, j).
struct ExposedDropout {
  AttentionProblem p;
  Tensor q, k, v;
};

ExposedDropout MakeExposedDropout(float prob, uint64_t seed, uint64_t stream) {
  ExposedDropout e;
  e.p = Base(QkvFormat::kBshd, AttnMaskType::kNoMask);
  e.p.batch = 2, e.p.s_q = 64, e.p.s_kv = 64, e.p.heads = 2, e.p.groups = 1, e.p.d_qk = 2, e.p.d_v = 64;
  e.p.dropout = prob, e.p.dropout_seed = seed, e.p.dropout_stream = stream;
  e.q = Tensor::Zeros(DType::kFloat32, e.p.q_shape()).value();
  e.k = RandomTensor(e.p.k_shape(), -1.0f, 1.0f, 5);
  e.v = Tensor::Zeros(DType::kFloat32, e.p.v_shape()).value();
  float* v = e.v.data<float>();
  for (int64_t b = 0; b < e.p.batch; ++b) {
    for (int64_t j = 0; j < e.p.s_kv; ++j) v[(b * e.p.s_kv + j) * e.p.d_v + j] = 1.0f;
  }
  return e;
}

TEST(AttentionDropout, KeepsTheExpectedFractionScaledByInverseKeepProbability) {
  constexpr float kProb = 0.25f;
  ExposedDropout e = MakeExposedDropout(kProb, 7, 1);
  auto result = AttentionForward(Context(), e.p.config(), e.q, e.k, e.v, AttentionSideTensors());
  ASSERT_TRUE(result.ok()) << result.status();
  const float kept_value = static_cast<float>(1.0 / 64.0 / (1.0 - kProb));
  int64_t kept = 0;
  int64_t total = 0;
  for (float x : result->out.floats()) {
    ++total;
    if (x == 0.0f) continue;
    ++kept;
    EXPECT_NEAR(x, kept_value, 1e-7);
  }
  // 16384 Bernoulli(0.75) draws: the count is within 5 standard deviations of 0.75 n.
  const double mean = 0.75 * total;
  const double sd = std::sqrt(total * 0.75 * 0.25);
  EXPECT_NEAR(static_cast<double>(kept), mean, 5.0 * sd);
}

TEST(AttentionDropout, SameSeedAndStreamGiveTheSameMaskOthersDiffer) {
  ExposedDropout a = MakeExposedDropout(0.5f, 7, 1);
  auto first = AttentionForward(Context(), a.p.config(), a.q, a.k, a.v, AttentionSideTensors());
  auto again = AttentionForward(Context(), a.p.config(), a.q, a.k, a.v, AttentionSideTensors());
  ASSERT_TRUE(first.ok() && again.ok());
  EXPECT_TRUE(BitwiseEqual(first->out, again->out));
  for (auto [seed, stream] : {std::pair<uint64_t, uint64_t>{7, 2}, {8, 1}}) {
    AttentionConfig config = a.p.config();
    config.dropout_seed = seed;
    config.dropout_stream = stream;
    auto other = AttentionForward(Context(), config, a.q, a.k, a.v, AttentionSideTensors());
    ASSERT_TRUE(other.ok());
    int64_t differing = 0;
    for (size_t i = 0; i < other->out.floats().size(); ++i) {
      differing += (other->out.floats()[i] == 0.0f) != (first->out.floats()[i] == 0.0f);
    }
    // Independent masks at p = 0.5 disagree on about half of the 16384 positions.
    EXPECT_GT(differing, 6000) << "seed " << seed << " stream " << stream;
  }
}

TEST(AttentionMaxLogit, HeadWithEveryScoreMaskedReportsNegativeInfinityAndZeroOutput) {
  AttentionProblem p = Base(QkvFormat::kBshd, AttnMaskType::kArbitrary);
  p.mask_shape = {1, 2, 1, 1};
  ProblemData d = MakeData(p, 3);
  d.side.mask.data<uint8_t>()[0] = 0;  // head 0 sees everything
  d.side.mask.data<uint8_t>()[1] = 1;  // head 1 sees nothing
  auto result = AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(std::isfinite(result->max_logit.floats()[0]));
  EXPECT_EQ(result->max_logit.floats()[1], -std::numeric_limits<float>::infinity());
  const float* out = result->out.data<float>();
  for (int64_t row = 0; row < p.rows_q(); ++row) {
    for (int64_t c = 0; c < p.d_v; ++c) EXPECT_EQ(out[(row * 2 + 1) * p.d_v + c], 0.0f);
  }
}

TEST(AttentionAlibi, DefaultSlopesFollowTheGeometricSequence) {
  std::vector<float> eight = DefaultAlibiSlopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int k = 1; k <= 8; ++k) EXPECT_EQ(eight[k - 1], std::ldexp(1.0f, -k)) << k;
  // 12 heads: 8 slopes 2^(-k), then 2^(-(2m - 1) / 2) for m = 1..4.
  std::vector<float> twelve = DefaultAlibiSlopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int k = 1; k <= 8; ++k) EXPECT_EQ(twelve[k - 1], std::ldexp(1.0f, -k));
  for (int m = 1; m <= 4; ++m) {
    EXPECT_FLOAT_EQ(twelve[7 + m], static_cast<float>(std::pow(2.0, -(2.0 * m - 1.0) / 2.0))) << m;
  }
  EXPECT_EQ(DefaultAlibiSlopes(1), std::vector<float>{std::ldexp(1.0f, -8)});
}

TEST(AttentionNames, ParseAcceptsTeSpellingsAndNamesTheFieldOtherwise) {
  for (AttnMaskType t : {AttnMaskType::kNoMask, AttnMaskType::kPadding, AttnMaskType::kCausal,
                         AttnMaskType::kPaddingCausal, AttnMaskType::kCausalBottomRight,
                         AttnMaskType::kPaddingCausalBottomRight, AttnMaskType::kArbitrary}) {
    auto parsed = ParseAttnMaskType(AttnMaskTypeName(t), "m");
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, t);
  }
  EXPECT_EQ(ParseAttnMaskType("padding,causal", "m").value(), AttnMaskType::kPaddingCausal);
  EXPECT_EQ(ParseAttnMaskType("causal,padding", "m").value(), AttnMaskType::kPaddingCausal);
  EXPECT_EQ(ParseSoftmaxType("off-by-one", "s").value(), SoftmaxType::kOffByOne);
  EXPECT_EQ(ParseAttnBiasType("post_scale_bias", "b").value(), AttnBiasType::kPostScaleBias);
  EXPECT_EQ(ParseQkvFormat("thd", "f").value(), QkvFormat::kThd);
  EXPECT_THAT(ParseQkvFormat("hbsd", "spec.qkv_format"),
              HasError(kInvalid, "spec.qkv_format: expected one of \"sbhd\", \"bshd\", \"thd\", got \"hbsd\""));
  EXPECT_THAT(ParseSoftmaxType("off_by_one", "x"), HasError(kInvalid, "got \"off_by_one\""));
}

// Metadata errors: each names the argument and says expected vs got.
class AttentionErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    p_ = Base(QkvFormat::kBshd, AttnMaskType::kPadding);
    p_.cu_q = {0, 3, 8};
    p_.cu_kv = {0, 5, 7};
    d_ = MakeData(p_, 1);
  }
  absl::Status Run(const AttentionConfig& config) {
    return AttentionForward(Context(), config, d_.q, d_.k, d_.v, d_.side).status();
  }
  AttentionProblem p_;
  ProblemData d_;
};

TEST_F(AttentionErrors, ConfigValues) {
  AttentionConfig c = p_.config();
  c.softmax_scale = 0.0f;
  EXPECT_THAT(Run(c), HasError(kInvalid, "config.softmax_scale: expected a finite positive value, got 0"));
  c = p_.config();
  c.dropout = 1.0f;
  EXPECT_THAT(Run(c), HasError(kInvalid, "config.dropout: expected a probability in [0, 1), got 1"));
  c = p_.config();
  c.window_left = -2;
  EXPECT_THAT(Run(c), HasError(kInvalid, "config.window_left: expected -1 (unbounded) or >= 0, got -2"));
  c = p_.config();
  c.mask_type = AttnMaskType::kPaddingCausal;
  c.window_right = -1;
  EXPECT_THAT(Run(c), HasError(kInvalid, "config.window_right: expected 0 for mask type padding_causal"));
}

TEST_F(AttentionErrors, ThdNeedsPaddingAndRejectsBias) {
  AttentionProblem p = Thd(AttnMaskType::kPadding, {0, 3, 5}, {0, 3, 5}, 5, 5);
  ProblemData d = MakeData(p, 2);
  AttentionConfig c = p.config();
  c.mask_type = AttnMaskType::kCausal;
  c.window_right = 0;
  EXPECT_THAT(AttentionForward(Context(), c, d.q, d.k, d.v, d.side),
              HasError(kInvalid, "config.mask_type: expected padding, padding_causal or padding_causal_bottom_right "
                                 "with qkv_format thd, got causal"));
  c = p.config();
  c.bias_type = AttnBiasType::kPostScaleBias;
  EXPECT_THAT(AttentionForward(Context(), c, d.q, d.k, d.v, d.side),
              HasError(kInvalid, "config.bias_type: expected no_bias or alibi with qkv_format thd"));
}

TEST_F(AttentionErrors, QkvShapes) {
  Tensor k_bad = RandomTensor({2, 5, 3, 4}, -1.0f, 1.0f, 1);  // 3 groups do not divide 2 heads
  Tensor v_bad = RandomTensor({2, 5, 3, 4}, -1.0f, 1.0f, 1);
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, k_bad, v_bad, d_.side),
              HasError(kInvalid, "k.shape: expected a head count (dimension 2) >= 1 dividing the 2 heads of q"));
  Tensor v_short = RandomTensor({2, 4, 2, 4}, -1.0f, 1.0f, 1);
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, v_short, d_.side),
              HasError(kInvalid, "v.shape: expected dimension 1 = 5 (as in k), got [2, 4, 2, 4]"));
  Tensor k_batch = RandomTensor({3, 5, 2, 4}, -1.0f, 1.0f, 1);
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, k_batch, k_batch, d_.side),
              HasError(kInvalid, "k.shape: expected dimension 0 = 2 (the batch size of q)"));
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q.Reshape({10, 2, 4}).value(), d_.k, d_.v, d_.side),
              HasError(kInvalid, "q.shape: expected rank 4 (qkv_format bshd), got [10, 2, 4] (rank 3)"));
}

TEST_F(AttentionErrors, CuSeqlensValues) {
  AttentionSideTensors side = d_.side;
  side.cu_seqlens_q = Int32Tensor({0, 3, 2});
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "cu_seqlens_q[2]: expected >= cu_seqlens_q[1] = 3, got 2"));
  side.cu_seqlens_q = Int32Tensor({1, 3, 5});
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "cu_seqlens_q[0]: expected 0, got 1"));
  side.cu_seqlens_q = Int32Tensor({0, 6, 8});
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "cu_seqlens_q: expected sequence lengths <= 5 (the sequence dimension), got 6 for "
                                 "sequence 0"));
  side.cu_seqlens_q = Int32Tensor({0, 3});
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "cu_seqlens_q.shape: expected [3] (batch size + 1), got [2]"));
  side = d_.side;
  side.cu_seqlens_kv = Tensor();
  EXPECT_THAT(AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "cu_seqlens_kv: expected an INT32 [batch + 1] tensor (mask type padding, "
                                 "qkv_format bshd), got none"));
}

TEST_F(AttentionErrors, ThdPaddedOffsets) {
  AttentionProblem p = Thd(AttnMaskType::kPadding, {0, 3, 5}, {0, 3, 5}, 7, 7);
  ProblemData d = MakeData(p, 2);
  d.side.cu_seqlens_q_padded = Int32Tensor({0, 2, 6});
  EXPECT_THAT(AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side),
              HasError(kInvalid, "cu_seqlens_q_padded: expected room for sequence 0 of length 3, got 2 rows"));
  d.side.cu_seqlens_q_padded = Int32Tensor({0, 4, 8});
  EXPECT_THAT(AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side),
              HasError(kInvalid, "cu_seqlens_q_padded[2]: expected <= 7 (the token count of the tensor), got 8"));
  d.side.cu_seqlens_q_padded = Tensor();
  d.side.cu_seqlens_kv = Int32Tensor({0, 3, 9});
  EXPECT_THAT(AttentionForward(Context(), p.config(), d.q, d.k, d.v, d.side),
              HasError(kInvalid, "cu_seqlens_kv[2]: expected <= 7 (the token count of the tensor), got 9"));
}

TEST_F(AttentionErrors, SideTensorsOfTheOtherOptions) {
  AttentionConfig c = p_.config();
  c.mask_type = AttnMaskType::kArbitrary;
  EXPECT_THAT(Run(c), HasError(kInvalid, "mask: expected a BOOL tensor broadcastable to [B, H, S_q, S_kv]"));
  AttentionSideTensors side = d_.side;
  side.mask = Tensor::Zeros(DType::kBool, {2, 1, 4, 5}).value();
  EXPECT_THAT(AttentionForward(Context(), c, d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "mask.shape: expected [1|2, 1|2, 1|5, 1|5] (broadcast to [B, H, S_q, S_kv]), got "
                                 "[2, 1, 4, 5]"));
  c = p_.config();
  c.bias_type = AttnBiasType::kPreScaleBias;
  side = d_.side;
  side.bias = Tensor::Zeros(DType::kFloat32, {1, 2, 1, 5}).value();
  EXPECT_THAT(AttentionForward(Context(), c, d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "bias.shape: expected [1|2, 1|2, 5, 5]"));
  c = p_.config();
  c.bias_type = AttnBiasType::kAlibi;
  side = d_.side;
  side.alibi_slopes = Tensor::Zeros(DType::kFloat32, {3}).value();
  EXPECT_THAT(AttentionForward(Context(), c, d_.q, d_.k, d_.v, side),
              HasError(kInvalid, "alibi_slopes.shape: expected FP32 [2] or [2, 2], got [3]"));
  c = p_.config();
  c.softmax_type = SoftmaxType::kLearnable;
  EXPECT_THAT(Run(c), HasError(kInvalid, "softmax_offset: expected a tensor, got an undefined tensor"));
}

TEST_F(AttentionErrors, BackwardChecksTheSavedTensors) {
  auto forward = AttentionForward(Context(), p_.config(), d_.q, d_.k, d_.v, d_.side);
  ASSERT_TRUE(forward.ok());
  Tensor short_lse = Tensor::Zeros(DType::kFloat32, {2, 5}).value();
  EXPECT_THAT(AttentionBackward(Context(), p_.config(), d_.q, d_.k, d_.v, d_.side, forward->out, short_lse,
                                forward->out),
              HasError(kInvalid, "softmax_lse.shape: expected [2, 5, 2], got [2, 5]"));
  Tensor dout = Tensor::Zeros(DType::kFloat32, {2, 5, 2, 3}).value();
  EXPECT_THAT(AttentionBackward(Context(), p_.config(), d_.q, d_.k, d_.v, d_.side, forward->out,
                                forward->softmax_lse, dout),
              HasError(kInvalid, "dout.shape: expected [2, 5, 2, 4], got [2, 5, 2, 3]"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve

namespace teserve {
namespace {

// 16-bit q, k, v on the CPU run the FP32 reference on the widened values; out and the
// gradients come back in the input dtype (the rounding of the FP32 results), softmax_lse
// stays FP32, and the path says the reference ran.
TEST(Attention16Bit, CpuWidensRunsTheReferenceAndRoundsTheOutputs) {
  Context cpu;
  kernels::AttentionConfig config;
  config.qkv_format = kernels::QkvFormat::kBshd;
  config.mask_type = kernels::AttnMaskType::kCausal;
  config.window_right = 0;
  config.softmax_scale = 0.5f;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    auto narrow = [&](const Tensor& x) { return kernels::Convert(cpu, x, dtype).value(); };
    auto widen = [&](const Tensor& x) { return kernels::Convert(cpu, x, DType::kFloat32).value(); };
    const Tensor q = narrow(testing_kernels::RandomTensor({2, 6, 2, 4}, -1.0f, 1.0f, 1));
    const Tensor k = narrow(testing_kernels::RandomTensor({2, 6, 2, 4}, -1.0f, 1.0f, 2));
    const Tensor v = narrow(testing_kernels::RandomTensor({2, 6, 2, 4}, -1.0f, 1.0f, 3));
    const Tensor dout = narrow(testing_kernels::RandomTensor({2, 6, 2, 4}, -1.0f, 1.0f, 4));
    const auto got = kernels::AttentionForward(cpu, config, q, k, v, kernels::AttentionSideTensors());
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->path, kernels::AttentionPath::kCpuReference);
    const auto want =
        kernels::AttentionForward(cpu, config, widen(q), widen(k), widen(v), kernels::AttentionSideTensors());
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_EQ(got->out.dtype(), dtype);
    EXPECT_EQ(widen(got->out).floats(), widen(narrow(want->out)).floats());
    EXPECT_EQ(got->softmax_lse.floats(), want->softmax_lse.floats());

    const auto grads = kernels::AttentionBackward(cpu, config, q, k, v, kernels::AttentionSideTensors(), got->out,
                                                  got->softmax_lse, dout);
    ASSERT_TRUE(grads.ok()) << grads.status();
    const auto want_grads = kernels::AttentionBackward(cpu, config, widen(q), widen(k), widen(v),
                                                       kernels::AttentionSideTensors(), widen(got->out),
                                                       got->softmax_lse, widen(dout));
    ASSERT_TRUE(want_grads.ok()) << want_grads.status();
    ASSERT_EQ(grads->dq.dtype(), dtype);
    EXPECT_EQ(widen(grads->dq).floats(), widen(narrow(want_grads->dq)).floats());
    EXPECT_EQ(widen(grads->dk).floats(), widen(narrow(want_grads->dk)).floats());
    EXPECT_EQ(widen(grads->dv).floats(), widen(narrow(want_grads->dv)).floats());
  }
}

TEST(Attention16Bit, MixedDtypesAreRejectedNamingTheTensor) {
  Context cpu;
  kernels::AttentionConfig config;
  config.qkv_format = kernels::QkvFormat::kBshd;
  const Tensor q = kernels::Convert(cpu, testing_kernels::RandomTensor({1, 2, 1, 4}, -1, 1, 1), DType::kBFloat16).value();
  const Tensor k = testing_kernels::RandomTensor({1, 2, 1, 4}, -1, 1, 2);
  const auto got = kernels::AttentionForward(cpu, config, q, k, k, kernels::AttentionSideTensors());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(got.status().message().find("k"), std::string::npos) << got.status();
}

}  // namespace
}  // namespace teserve
