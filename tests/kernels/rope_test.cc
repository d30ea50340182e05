// Tests of kernels/rope.h on the CPU. The frequency table against the double formula
// 1 / base^(2i / r) * position (and hand values); the rotation against a direct complex
// multiplication per channel pair in double, with positions derived independently from
// each layout (sbhd, bshd, thd restarting at every cu_seqlens boundary); the backward
// as the exact transpose (adjoint identity with arbitrary angles, inverse rotation,
// central finite differences); metadata errors.
#include "kernels/rope.h"

#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;
using ::testing::HasSubstr;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// ---------------------------------------------------------------------------------
// Double references, written from the definition rather than from the kernel's loops.

// Angle of pair i (0 <= i < r/2) at `position`.
double Angle(double base, int64_t r, int64_t i, double position) {
  return position / std::pow(base, 2.0 * static_cast<double>(i) / static_cast<double>(r));
}

// The channels (a, b) of pair i: (i, i + r/2) for halves, (2i, 2i + 1) interleaved.
std::pair<int64_t, int64_t> PairChannels(int64_t i, int64_t r, bool interleaved) {
  return interleaved ? std::make_pair(2 * i, 2 * i + 1) : std::make_pair(i, i + r / 2);
}

// Position of every token (row of h*d values) of a tensor of `shape` in `format`;
// -1 for thd padding tokens past the last sequence.
std::vector<int64_t> TokenPositions(const Shape& shape, RopeFormat format, const std::vector<int32_t>& cu) {
  std::vector<int64_t> positions;
  if (format == RopeFormat::kSbhd) {
    for (int64_t s = 0; s < shape[0]; ++s)
      for (int64_t b = 0; b < shape[1]; ++b) positions.push_back(s);
  } else if (format == RopeFormat::kBshd) {
    for (int64_t b = 0; b < shape[0]; ++b)
      for (int64_t s = 0; s < shape[1]; ++s) positions.push_back(s);
  } else {
    positions.assign(shape[0], -1);
    for (size_t k = 0; k + 1 < cu.size(); ++k)
      for (int32_t i = cu[k]; i < cu[k + 1]; ++i) positions[i] = i - cu[k];
  }
  return positions;
}

// Rotates pair (x_a, x_b) by `angle` (sign +1) or by -angle (sign -1): the complex
// product (x_a + i x_b) * exp(i * sign * angle).
void RotatePair(double x_a, double x_b, double angle, double* y_a, double* y_b) {
  *y_a = x_a * std::cos(angle) - x_b * std::sin(angle);
  *y_b = x_b * std::cos(angle) + x_a * std::sin(angle);
}

// `angle_of(position, i)` gives the angle of pair i; rotary dim r; positions per token.
template <typename AngleFn>
std::vector<double> ReferenceRope(const Tensor& t, int64_t r, bool interleaved, const std::vector<int64_t>& positions,
                                  AngleFn angle_of, double sign) {
  const int64_t d = t.dim(-1);
  const int64_t rows = t.numel() / d;  // one row per (token, head)
  const int64_t heads = t.dim(-2);
  std::vector<double> out(t.floats().begin(), t.floats().end());
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t position = positions[row / heads];
    if (position < 0) continue;
    const float* x = t.data<float>() + row * d;
    for (int64_t i = 0; i < r / 2; ++i) {
      const auto [a, b] = PairChannels(i, r, interleaved);
      RotatePair(x[a], x[b], sign * angle_of(position, i), &out[row * d + a], &out[row * d + b]);
    }
  }
  return out;
}

// |x_a cos| + |x_b sin| per channel: the magnitude of the two-term sum.
std::vector<double> RopeMagnitude(const Tensor& t, int64_t r, bool interleaved) {
  const int64_t d = t.dim(-1);
  std::vector<double> m(t.numel());
  for (int64_t row = 0; row < t.numel() / d; ++row) {
    const float* x = t.data<float>() + row * d;
    for (int64_t j = 0; j < d; ++j) m[row * d + j] = std::fabs(x[j]);
    for (int64_t i = 0; i < r / 2; ++i) {
      const auto [a, b] = PairChannels(i, r, interleaved);
      m[row * d + a] = m[row * d + b] = std::fabs(x[a]) + std::fabs(x[b]);
    }
  }
  return m;
}

double Dot(absl::Span<const float> a, absl::Span<const float> b) {
  double sum = 0.0;
  for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
  return sum;
}

Tensor CuSeqlens(const std::vector<int32_t>& cu) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(cu.size())}).value();
  for (size_t i = 0; i < cu.size(); ++i) t.data<int32_t>()[i] = cu[i];
  return t;
}

// ---------------------------------------------------------------------------------
// Frequencies.

TEST(RotaryFrequencies, HandValuesForHeadDimFour) {
  // r = 4, base 10000: inv_freq = [1, 10000^-0.5 = 0.01].
  RotaryOptions options;
  options.dim = 4;
  auto halves = RotaryFrequencies(options, 3);
  ASSERT_TRUE(halves.ok()) << halves.status();
  EXPECT_EQ(halves->shape(), (Shape{3, 4}));
  EXPECT_THAT(halves->floats(), ::testing::Pointwise(::testing::FloatEq(), std::vector<float>{0, 0, 0, 0,          //
                                                                                              1, 0.01f, 1, 0.01f,  //
                                                                                              2, 0.02f, 2, 0.02f}));
  options.interleaved = true;
  auto interleaved = RotaryFrequencies(options, 2, /*offset=*/5);
  ASSERT_TRUE(interleaved.ok()) << interleaved.status();
  EXPECT_THAT(interleaved->floats(),
              ::testing::Pointwise(::testing::FloatEq(), std::vector<float>{5, 5, 0.05f, 0.05f, 6, 6, 0.06f, 0.06f}));
}

struct FreqCase {
  int64_t dim;
  double percent;
  float base;
  bool interleaved;
  int64_t seq, offset;
};

void PrintTo(const FreqCase& c, std::ostream* os) {
  *os << "dim " << c.dim << " percent " << c.percent << " base " << c.base
      << (c.interleaved ? " interleaved" : " halves") << " s " << c.seq << " offset " << c.offset;
}

class RotaryFrequencyTable : public ::testing::TestWithParam<FreqCase> {};

TEST_P(RotaryFrequencyTable, MatchesDoubleFormula) {
  const FreqCase& c = GetParam();
  RotaryOptions options;
  options.dim = c.dim;
  options.rotary_percent = c.percent;
  options.rotary_base = c.base;
  options.interleaved = c.interleaved;
  const int64_t r = c.percent < 1.0 ? static_cast<int64_t>(c.dim * c.percent) : c.dim;
  auto freqs = RotaryFrequencies(options, c.seq, c.offset);
  ASSERT_TRUE(freqs.ok()) << freqs.status();
  ASSERT_EQ(freqs->shape(), (Shape{c.seq, r}));
  std::vector<double> want(c.seq * r);
  for (int64_t s = 0; s < c.seq; ++s) {
    for (int64_t i = 0; i < r / 2; ++i) {
      const auto [a, b] = PairChannels(i, r, c.interleaved);
      want[s * r + a] = want[s * r + b] = Angle(c.base, r, i, static_cast<double>(s + c.offset));
    }
  }
  // FP32 evaluation (pow, division, product): a few ulps of the value.
  EXPECT_TRUE(AllClose(freqs->floats(), want, DType::kFloat32));
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, RotaryFrequencyTable,
    ::testing::Values(FreqCase{16, 1.0, 10000.0f, false, 128, 0}, FreqCase{16, 1.0, 10000.0f, true, 128, 0},
                      FreqCase{64, 0.5, 10000.0f, false, 37, 3}, FreqCase{23, 0.7, 500000.0f, true, 9, 0},
                      FreqCase{2, 1.0, 10.0f, false, 5, 100}),
    [](const ::testing::TestParamInfo<FreqCase>& info) {
      const FreqCase& c = info.param;
      return absl::StrCat("dim", c.dim, "_r", c.percent < 1.0 ? static_cast<int64_t>(c.dim * c.percent) : c.dim,
                          "_base", static_cast<int64_t>(c.base), c.interleaved ? "_Interleaved" : "_Halves", "_s",
                          c.seq, "_offset", c.offset);
    });

TEST(RotaryFrequencies, RotaryPercentTruncatesAsTe) {
  // floor(10 * 0.7) in double is 7 (0.7 * 10 = 7.000000000000001): odd, rejected.
  RotaryOptions options;
  options.dim = 10;
  options.rotary_percent = 0.7;
  EXPECT_THAT(RotaryDim(options, "rotary"), HasError(kInvalid, "rotary.rotary_percent"));
  options.rotary_percent = 0.8;  // 8
  EXPECT_EQ(RotaryDim(options, "rotary").value(), 8);
  options.rotary_percent = 0.05;  // 0
  EXPECT_THAT(RotaryDim(options, "rotary"), HasError(kInvalid, "even and > 0"));
}

TEST(RotaryFrequencies, FixedAndDynamicPositionInterpolation) {
  RotaryOptions options;
  options.dim = 8;
  options.seq_len_interpolation_factor = 2.0;
  options.pretrained_max_position_embeddings = 16;
  RotaryOptions plain;
  plain.dim = 8;
  // Fixed scaling (32 <= 16 * 2): position s behaves as s / 2.
  const Tensor scaled = RotaryFrequencies(options, 32).value();
  const Tensor base = RotaryFrequencies(plain, 32).value();
  for (int64_t s = 0; s < 32; ++s) {
    for (int64_t j = 0; j < 8; ++j) {
      EXPECT_NEAR(scaled.floats()[s * 8 + j], base.floats()[s * 8 + j] / 2.0, 1e-6 * (1 + s)) << s << "," << j;
    }
  }
  // Dynamic scaling (40 > 32): positions scaled by 16 / 40.
  const Tensor dynamic = RotaryFrequencies(options, 40).value();
  const Tensor base40 = RotaryFrequencies(plain, 40).value();
  for (int64_t s = 0; s < 40; ++s) {
    EXPECT_NEAR(dynamic.floats()[s * 8], base40.floats()[s * 8] * 16.0 / 40.0, 1e-6 * (1 + s)) << s;
  }
}

TEST(RotaryFrequencies, RejectsBadArguments) {
  RotaryOptions options;
  EXPECT_THAT(RotaryFrequencies(options, 4), HasError(kInvalid, "options.dim: expected a value > 0, got 0"));
  options.dim = 7;
  EXPECT_THAT(RotaryFrequencies(options, 4), HasError(kInvalid, "options.rotary_percent"));
  options.dim = 8;
  options.rotary_percent = 1.5;
  EXPECT_THAT(RotaryFrequencies(options, 4), HasError(kInvalid, "expected a value in (0, 1], got 1.5"));
  options.rotary_percent = 1.0;
  options.rotary_base = 0.0f;
  EXPECT_THAT(RotaryFrequencies(options, 4), HasError(kInvalid, "options.rotary_base"));
  options.rotary_base = 10000.0f;
  options.seq_len_interpolation_factor = -1.0;
  EXPECT_THAT(RotaryFrequencies(options, 4), HasError(kInvalid, "options.seq_len_interpolation_factor"));
  options.seq_len_interpolation_factor = 0.0;
  EXPECT_THAT(RotaryFrequencies(options, -1), HasError(kInvalid, "max_seq_len"));
  EXPECT_THAT(RotaryFrequencies(options, 4, -2), HasError(kInvalid, "offset"));
}

// ---------------------------------------------------------------------------------
// Rotation over the layouts.

struct RopeCase {
  std::string name;
  RopeFormat format;
  Shape shape;
  int64_t rotary_dim;  // <= head dim; the rest passes through
  bool interleaved;
  std::vector<int32_t> cu_seqlens;  // thd only
};

void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.name; }

class RopeLayouts : public ::testing::TestWithParam<RopeCase> {
 protected:
  void SetUp() override {
    const RopeCase& c = GetParam();
    t_ = RandomTensor(c.shape, -2.0f, 2.0f, 17u);
    dy_ = RandomTensor(c.shape, -1.0f, 1.0f, 18u);
    RotaryOptions options;
    options.dim = c.rotary_dim;
    options.interleaved = c.interleaved;
    freqs_ = RotaryFrequencies(options, MaxPosition() + 2).value();  // spare rows are allowed
    if (c.format == RopeFormat::kThd) cu_ = CuSeqlens(c.cu_seqlens);
    positions_ = TokenPositions(c.shape, c.format, c.cu_seqlens);
  }

  int64_t MaxPosition() const {
    const RopeCase& c = GetParam();
    if (c.format == RopeFormat::kSbhd) return c.shape[0];
    if (c.format == RopeFormat::kBshd) return c.shape[1];
    int64_t longest = 0;
    for (size_t k = 0; k + 1 < c.cu_seqlens.size(); ++k)
      longest = std::max<int64_t>(longest, c.cu_seqlens[k + 1] - c.cu_seqlens[k]);
    return longest;
  }
  const Tensor* cu() const { return GetParam().format == RopeFormat::kThd ? &cu_ : nullptr; }
  // Angle of pair i at a position, read from the FP32 table the kernel also reads (the
  // table itself is checked against the double formula above).
  double TableAngle(int64_t position, int64_t i) const {
    const RopeCase& c = GetParam();
    return freqs_.floats()[position * c.rotary_dim + PairChannels(i, c.rotary_dim, c.interleaved).first];
  }

  Tensor t_, dy_, freqs_, cu_;
  std::vector<int64_t> positions_;
};

TEST_P(RopeLayouts, ForwardMatchesComplexRotation) {
  const RopeCase& c = GetParam();
  auto out = RopeForward(Context::Cpu(), t_, freqs_, c.format, c.interleaved, cu());
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), t_.shape());
  const auto angle = [&](int64_t p, int64_t i) { return TableAngle(p, i); };
  EXPECT_TRUE(AllClose(out->floats(), ReferenceRope(t_, c.rotary_dim, c.interleaved, positions_, angle, 1.0),
                       DType::kFloat32, RopeMagnitude(t_, c.rotary_dim, c.interleaved)));
}

TEST_P(RopeLayouts, ForwardWithExactAnglesIsCloseToDoubleFormula) {
  // End to end from (base, position) to the output: the FP32 angle carries a relative
  // error of a few ulps, which the rotation turns into |x| * angle * ulps.
  const RopeCase& c = GetParam();
  auto out = RopeForward(Context::Cpu(), t_, freqs_, c.format, c.interleaved, cu());
  ASSERT_TRUE(out.ok()) << out.status();
  const auto angle = [&](int64_t p, int64_t i) { return Angle(10000.0, c.rotary_dim, i, static_cast<double>(p)); };
  const std::vector<double> want = ReferenceRope(t_, c.rotary_dim, c.interleaved, positions_, angle, 1.0);
  const double max_angle = static_cast<double>(MaxPosition());
  std::vector<double> magnitude = RopeMagnitude(t_, c.rotary_dim, c.interleaved);
  for (double& m : magnitude) m *= 1.0 + max_angle;
  EXPECT_TRUE(AllClose(out->floats(), want, DType::kFloat32, magnitude));
}

TEST_P(RopeLayouts, BackwardIsTheTransposeOfTheForward) {
  const RopeCase& c = GetParam();
  const Tensor y = RopeForward(Context::Cpu(), t_, freqs_, c.format, c.interleaved, cu()).value();
  auto dt = RopeBackward(Context::Cpu(), dy_, freqs_, c.format, c.interleaved, cu());
  ASSERT_TRUE(dt.ok()) << dt.status();
  // <R t, dy> = <t, R^T dy>.
  const double lhs = Dot(y.floats(), dy_.floats());
  const double rhs = Dot(t_.floats(), dt->floats());
  EXPECT_NEAR(lhs, rhs, 1e-5 * (1.0 + std::sqrt(static_cast<double>(t_.numel()))));
  // For a consistent table R^T is the rotation by -angle.
  const auto angle = [&](int64_t p, int64_t i) { return TableAngle(p, i); };
  EXPECT_TRUE(AllClose(dt->floats(), ReferenceRope(dy_, c.rotary_dim, c.interleaved, positions_, angle, -1.0),
                       DType::kFloat32, RopeMagnitude(dy_, c.rotary_dim, c.interleaved)));
}

TEST_P(RopeLayouts, BackwardMatchesFiniteDifferences) {
  // L(t) = <RopeForward(t), dy>; dL/dt_k by central differences on a spread of elements.
  const RopeCase& c = GetParam();
  const Tensor dt = RopeBackward(Context::Cpu(), dy_, freqs_, c.format, c.interleaved, cu()).value();
  Tensor t = t_.Clone().value();
  const double h = 1e-2;
  const int64_t stride = std::max<int64_t>(1, t.numel() / 64);
  for (int64_t k = 0; k < t.numel(); k += stride) {
    const float saved = t.floats()[k];
    t.mutable_floats()[k] = static_cast<float>(saved + h);
    const double plus =
        Dot(RopeForward(Context::Cpu(), t, freqs_, c.format, c.interleaved, cu())->floats(), dy_.floats());
    t.mutable_floats()[k] = static_cast<float>(saved - h);
    const double minus =
        Dot(RopeForward(Context::Cpu(), t, freqs_, c.format, c.interleaved, cu())->floats(), dy_.floats());
    t.mutable_floats()[k] = saved;
    EXPECT_NEAR(dt.floats()[k], (plus - minus) / (2 * h), 2e-4) << "element " << k;
  }
}

TEST_P(RopeLayouts, RotationPreservesPairNormsAndPassesTheRestThrough) {
  const RopeCase& c = GetParam();
  const Tensor y = RopeForward(Context::Cpu(), t_, freqs_, c.format, c.interleaved, cu()).value();
  const int64_t d = t_.dim(-1);
  for (int64_t row = 0; row < t_.numel() / d; ++row) {
    const float* x = t_.data<float>() + row * d;
    const float* out = y.data<float>() + row * d;
    for (int64_t i = 0; i < c.rotary_dim / 2; ++i) {
      const auto [a, b] = PairChannels(i, c.rotary_dim, c.interleaved);
      EXPECT_NEAR(std::hypot(out[a], out[b]), std::hypot(x[a], x[b]), 1e-5) << "row " << row << " pair " << i;
    }
    for (int64_t j = c.rotary_dim; j < d; ++j) EXPECT_EQ(out[j], x[j]) << "row " << row << " channel " << j;
  }
}

std::vector<RopeCase> AllRopeCases() {
  std::vector<RopeCase> cases;
  for (bool interleaved : {false, true}) {
    const std::string mode = interleaved ? "_Interleaved" : "_Halves";
    cases.push_back({"Sbhd_128x2x8x16_r16" + mode, RopeFormat::kSbhd, {128, 2, 8, 16}, 16, interleaved, {}});
    cases.push_back({"Sbhd_37x3x3x24_r12" + mode, RopeFormat::kSbhd, {37, 3, 3, 24}, 12, interleaved, {}});
    cases.push_back({"Bshd_3x37x3x24_r24" + mode, RopeFormat::kBshd, {3, 37, 3, 24}, 24, interleaved, {}});
    cases.push_back({"Bshd_1x1x1x2_r2" + mode, RopeFormat::kBshd, {1, 1, 1, 2}, 2, interleaved, {}});
    cases.push_back({"Thd_9x2x8_r8_ThreeSeqs" + mode, RopeFormat::kThd, {9, 2, 8}, 8, interleaved, {0, 3, 5, 9}});
    cases.push_back(
        {"Thd_12x3x10_r6_EmptySeqAndTailPadding" + mode, RopeFormat::kThd, {12, 3, 10}, 6, interleaved, {0, 4, 4, 10}});
    cases.push_back({"Sbhd_0x2x2x4_r4_Empty" + mode, RopeFormat::kSbhd, {0, 2, 2, 4}, 4, interleaved, {}});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Kernels, RopeLayouts, ::testing::ValuesIn(AllRopeCases()),
                         [](const ::testing::TestParamInfo<RopeCase>& info) { return info.param.name; });

TEST(Rope, ThdPositionsRestartAtEverySequence) {
  // Each sequence of a packed batch rotates exactly like the same tokens alone at the
  // start of a bshd batch of one.
  const std::vector<int32_t> cu = {0, 3, 7};
  const Tensor t = RandomTensor({7, 2, 4}, -1.0f, 1.0f, 5u);
  RotaryOptions options;
  options.dim = 4;
  const Tensor freqs = RotaryFrequencies(options, 8).value();
  const Tensor cu_t = CuSeqlens(cu);
  const Tensor packed = RopeForward(Context::Cpu(), t, freqs, RopeFormat::kThd, false, &cu_t).value();
  for (size_t k = 0; k + 1 < cu.size(); ++k) {
    const int64_t len = cu[k + 1] - cu[k];
    Tensor alone = Tensor::Zeros(DType::kFloat32, {1, len, 2, 4}).value();
    std::copy_n(t.data<float>() + cu[k] * 8, len * 8, alone.data<float>());
    const Tensor rotated = RopeForward(Context::Cpu(), alone, freqs, RopeFormat::kBshd, false, nullptr).value();
    for (int64_t j = 0; j < len * 8; ++j) EXPECT_EQ(packed.floats()[cu[k] * 8 + j], rotated.floats()[j]);
  }
}

TEST(Rope, BackwardIsTheTransposeForArbitraryAngles) {
  // A table whose paired channels disagree is still transposed exactly.
  const Tensor t = RandomTensor({5, 2, 3, 6}, -1.0f, 1.0f, 21u);
  const Tensor dy = RandomTensor({5, 2, 3, 6}, -1.0f, 1.0f, 22u);
  const Tensor freqs = RandomTensor({5, 6}, -3.0f, 3.0f, 23u);
  for (bool interleaved : {false, true}) {
    const Tensor y = RopeForward(Context::Cpu(), t, freqs, RopeFormat::kSbhd, interleaved, nullptr).value();
    const Tensor dt = RopeBackward(Context::Cpu(), dy, freqs, RopeFormat::kSbhd, interleaved, nullptr).value();
    EXPECT_NEAR(Dot(y.floats(), dy.floats()), Dot(t.floats(), dt.floats()), 1e-4) << interleaved;
  }
}

TEST(Rope, RejectsBadMetadata) {
  const Context ctx = Context::Cpu();
  RotaryOptions options;
  options.dim = 8;
  const Tensor freqs = RotaryFrequencies(options, 4).value();
  const Tensor t = RandomTensor({4, 1, 2, 8}, -1.0f, 1.0f, 1u);
  EXPECT_THAT(RopeForward(ctx, RandomTensor({4, 2, 8}, -1, 1, 1u), freqs, RopeFormat::kSbhd, false, nullptr),
              HasError(kInvalid, "t.shape: expected rank 4"));
  EXPECT_THAT(RopeBackward(ctx, t, freqs, RopeFormat::kThd, false, nullptr), HasError(kInvalid, "dy.shape"));
  EXPECT_THAT(RopeForward(ctx, t, RandomTensor({4, 10}, -1, 1, 2u), RopeFormat::kSbhd, false, nullptr),
              HasError(kInvalid, "freqs.shape: expected [s, r] with r even, 0 < r <= 8"));
  EXPECT_THAT(RopeForward(ctx, t, RandomTensor({4, 3}, -1, 1, 2u), RopeFormat::kSbhd, false, nullptr),
              HasError(kInvalid, "got [4, 3]"));
  EXPECT_THAT(RopeForward(ctx, t, RandomTensor({3, 8}, -1, 1, 2u), RopeFormat::kSbhd, false, nullptr),
              HasError(kInvalid, "freqs.shape: expected at least 4 rows"));
  EXPECT_THAT(RopeForward(ctx, RandomTensor({1, 5, 2, 8}, -1, 1, 1u), freqs, RopeFormat::kBshd, false, nullptr),
              HasError(kInvalid, "at least 5 rows"));
  const Tensor thd = RandomTensor({6, 2, 8}, -1.0f, 1.0f, 3u);
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, nullptr),
              HasError(kInvalid, "cu_seqlens: expected an INT32 [batch + 1] tensor for thd, got none"));
  const Tensor not_zero = CuSeqlens({1, 6});
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, &not_zero),
              HasError(kInvalid, "cu_seqlens[0]: expected 0, got 1"));
  const Tensor decreasing = CuSeqlens({0, 4, 3});
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, &decreasing),
              HasError(kInvalid, "cu_seqlens[2]: expected a value >= cu_seqlens[1] = 4, got 3"));
  const Tensor too_long = CuSeqlens({0, 3, 7});
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, &too_long),
              HasError(kInvalid, "cu_seqlens[2]: expected at most the token count of t (6), got 7"));
  const Tensor long_seq = CuSeqlens({0, 5});
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, &long_seq), HasError(kInvalid, "at least 5 rows"));
  const Tensor float_cu = RandomTensor({3}, 0, 1, 4u);
  EXPECT_THAT(RopeForward(ctx, thd, freqs, RopeFormat::kThd, false, &float_cu),
              HasError(kInvalid, "cu_seqlens.dtype: expected INT32"));
  Context cuda;
  cuda.device = Device::Cuda(0);
  // Host t with a CUDA context: the device check names the argument (in every build).
  EXPECT_THAT(RopeForward(cuda, t, freqs, RopeFormat::kSbhd, false, nullptr), HasError(kInvalid, "t.device"));
#if !TESERVE_WITH_CUDA
  // CUDA tensors pass the checks; a build without the CUDA backend has no kernel for them.
  const Tensor t_cuda = Tensor::Borrow(nullptr, DType::kFloat32, t.shape(), Device::Cuda(0));
  const Tensor freqs_cuda = Tensor::Borrow(nullptr, DType::kFloat32, freqs.shape(), Device::Cuda(0));
  EXPECT_THAT(RopeForward(cuda, t_cuda, freqs_cuda, RopeFormat::kSbhd, false, nullptr),
              HasError(absl::StatusCode::kUnimplemented,
                       "RopeForward has no kernel for cuda:0 (teserve was built without CUDA)"));
  EXPECT_THAT(RopeBackward(cuda, t_cuda, freqs_cuda, RopeFormat::kSbhd, false, nullptr),
              HasError(absl::StatusCode::kUnimplemented, "RopeBackward has no kernel for cuda:0"));
#endif
}

TEST(RopeFormat, ParsesTeNames) {
  EXPECT_EQ(ParseRopeFormat("sbhd", "f").value(), RopeFormat::kSbhd);
  EXPECT_EQ(ParseRopeFormat("bshd", "f").value(), RopeFormat::kBshd);
  EXPECT_EQ(ParseRopeFormat("thd", "f").value(), RopeFormat::kThd);
  EXPECT_THAT(ParseRopeFormat("bhsd", "qkv_format"),
              HasError(kInvalid, "qkv_format: expected one of sbhd, bshd, thd, got 'bhsd'"));
  EXPECT_EQ(RopeFormatName(RopeFormat::kThd), "thd");
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
