// Tests of NVFP4's gradient-side features on the CPU: the 16-point random Hadamard
// transform (kernels/hadamard.h: signs, orthogonality, round trip) and its use on the
// columnwise copy, where a wgrad from RHT operands must equal the plain one up to
// quantization error; and stochastic rounding (kernels/stochastic_rounding.h:
// reproducibility from seed and stream, neighbours only, unbiasedness).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "core/float_codec.h"
#include "gtest/gtest.h"
#include "kernels/hadamard.h"
#include "kernels/nvfp4.h"
#include "kernels/stochastic_rounding.h"
#include "tests/kernels/nvfp4_test_util.h"
#include "tests/kernels/quantize_test_util.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::BandedTensor;
using ::teserve::testing_kernels::Dequantized;
using ::teserve::testing_kernels::ExpectMatchesFormula;
using ::teserve::testing_kernels::kInf;
using ::teserve::testing_kernels::kNaN;
using ::teserve::testing_kernels::Matrix;
using ::teserve::testing_kernels::Nibble;
using ::teserve::testing_kernels::Options;
using ::teserve::testing_kernels::Quantize;
using ::teserve::testing_kernels::RandomTensor;
using ::teserve::testing_kernels::Transposed;

// ---- Random Hadamard transform. ----

TEST(Hadamard16, SignsComeFromTheDocumentedSeed) {
  for (int j = 0; j < kHadamardSize; ++j) {
    EXPECT_EQ(kHadamardSigns[j], (Mix64(kHadamardSignSeed + j) >> 63) ? -1.0f : 1.0f) << j;
  }
}

// The rows of the identity come back as the columns of M (out = M v per tile).
TEST(Hadamard16, IsSylvesterTimesSignsOverFourAndOrthogonal) {
  std::vector<float> eye(256, 0.0f);
  for (int i = 0; i < 16; ++i) eye[i * 17] = 1.0f;
  auto r = ApplyHadamard16(Context::Cpu(), Matrix(eye, 16, 16));
  ASSERT_TRUE(r.ok()) << r.status();
  float m[16][16];
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      m[i][j] = r->floats()[j * 16 + i];
      const float h = (__builtin_popcount(i & j) % 2) ? -1.0f : 1.0f;
      EXPECT_EQ(m[i][j], h * kHadamardSigns[j] * 0.25f) << i << "," << j;
    }
  }
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 16; ++k) {
      float dot = 0.0f;
      for (int j = 0; j < 16; ++j) dot += m[i][j] * m[k][j];
      EXPECT_NEAR(dot, i == k ? 1.0f : 0.0f, FLT_EPSILON) << i << "," << k;
    }
  }
}

float MaxAbsDiff(const Tensor& a, const Tensor& b) {
  float diff = 0.0f;
  for (int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, std::fabs(a.floats()[i] - b.floats()[i]));
  return diff;
}

TEST(Hadamard16, InverseUndoesTheTransformWithin1e6) {
  const Tensor x = RandomTensor({8, 64}, -1.0f, 1.0f, 12u);
  auto y = ApplyHadamard16(Context::Cpu(), x);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_GT(MaxAbsDiff(*y, x), 0.1f);
  auto back = ApplyInverseHadamard16(Context::Cpu(), *y);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_LE(MaxAbsDiff(*back, x), 1e-6f);
  auto forward_of_inverse = ApplyHadamard16(Context::Cpu(), ApplyInverseHadamard16(Context::Cpu(), x).value());
  ASSERT_TRUE(forward_of_inverse.ok());
  EXPECT_LE(MaxAbsDiff(*forward_of_inverse, x), 1e-6f);
}

// Every 16-token tile of x^T equals the sign vector d, which the transform maps to
// (4, 0, ..., 0): the scaling amax is 4, not amax(x) = 1, so S = 2688 / 4 = 672 and the
// transformed copy does not clip.
TEST(QuantizeNvfp4, HadamardColumnwiseIsScaledFromTheTransformedAmax) {
  std::vector<float> values(32 * 16);
  for (int r = 0; r < 32; ++r) {
    for (int c = 0; c < 16; ++c) values[r * 16 + c] = kHadamardSigns[r % 16];
  }
  const Tensor x = Matrix(values, 32, 16);
  Nvfp4QuantizeOptions options = Options(true, true);
  options.random_hadamard = true;
  const QuantizedTensor q = Quantize(x, options);
  EXPECT_EQ(q.amax, 1.0f);
  EXPECT_EQ(q.global_encode_scale, 672.0f);
  const Tensor transformed = ApplyHadamard16(Context::Cpu(), Transposed(x)).value();
  EXPECT_EQ(transformed.floats()[0], 4.0f);
  ExpectMatchesFormula(transformed, q.columnwise_data, q.columnwise_scale_inv, 672.0f);
  ExpectMatchesFormula(x, q.rowwise_data, q.rowwise_scale_inv, 672.0f);  // never transformed
  const Tensor back = ApplyInverseHadamard16(Context::Cpu(), Dequantized(q, Copy::kColumnwise)).value();
  EXPECT_LE(MaxAbsDiff(back, Transposed(x)), 1e-5f);
}

double Frobenius(const std::vector<double>& a) {
  double sum = 0.0;
  for (double v : a) sum += v * v;
  return std::sqrt(sum);
}

std::vector<double> Difference(absl::Span<const float> a, absl::Span<const float> b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = static_cast<double>(a[i]) - b[i];
  return d;
}

std::vector<double> Difference(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> d(a.size());
  for (size_t i = 0; i < a.size(); ++i) d[i] = a[i] - b[i];
  return d;
}

// P [m, k] times Q [n, k] transposed, in double.
std::vector<double> TimesTransposed(const Tensor& p, const Tensor& q) {
  const int64_t m = p.dim(0), n = q.dim(0), k = p.dim(1);
  std::vector<double> out(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < k; ++t) out[i * n + j] += double{p.floats()[i * k + t]} * q.floats()[j * k + t];
    }
  }
  return out;
}

// wgrad dW = dy^T x from columnwise copies A = dy^T [out, N], X = x^T [in, N]. With the
// block-diagonal transform B (orthogonal), (A B^T)(X B^T)^T = A X^T: the RHT changes only
// the quantization error. For any operands, with eA = ||Aq - A||_F / ||A||_F,
//   ||Aq Xq^T - A X^T||_F <= (eA + eX + eA eX) ||A||_F ||X||_F   (submultiplicativity),
// so each product is held to that bound (plus 1e-5 for the FP32 transform), and RHT vs
// plain to the sum of both. E2M1 with 16-element blocks rounds a block scaled to
// [-6, 6] with an RMS error of about 0.38 against an RMS value of about 3.5 (uniform
// data), so e is about 0.11; each operand is held to e <= 0.15, which makes the
// relative Frobenius error of dW (to ||A||_F ||X||_F, the forward-error scale of
// tolerances.h) at most 0.3225. That bound assumes worst-case alignment; unbiased
// independent errors add in quadrature over the N terms of each entry, giving about
// sqrt((eA^2 + eX^2) / N) ||A||_F ||X||_F (0.009 here, measured 0.009), checked with a
// 3x margin: a systematic bias in the rounding would exceed it.
TEST(QuantizeNvfp4, HadamardWgradEqualsPlainAndExactUpToQuantizationError) {
  const int64_t tokens = 256, out = 24, in = 40;
  const Tensor dy = RandomTensor({tokens, out}, -1.0f, 1.0f, 21u);
  Tensor x = RandomTensor({tokens, in}, -1.0f, 1.0f, 22u);
  for (int64_t t = 0; t < tokens; t += 37) x.mutable_floats()[t * in + t % in] *= 20.0f;  // outliers
  Nvfp4QuantizeOptions plain = Options(false, true);
  Nvfp4QuantizeOptions rht = plain;
  rht.random_hadamard = true;
  const Tensor a = Transposed(dy), xt = Transposed(x);
  const Tensor a_rht = ApplyHadamard16(Context::Cpu(), a).value();
  const Tensor x_rht = ApplyHadamard16(Context::Cpu(), xt).value();
  const double norm_a = Frobenius(Difference(a.floats(), std::vector<float>(a.numel(), 0.0f)));
  const double norm_x = Frobenius(Difference(xt.floats(), std::vector<float>(xt.numel(), 0.0f)));
  const std::vector<double> exact = TimesTransposed(a, xt);
  std::vector<double> products[2];
  double bounds[2];
  for (int variant = 0; variant < 2; ++variant) {
    const Nvfp4QuantizeOptions& options = variant == 0 ? plain : rht;
    const Tensor& a_ref = variant == 0 ? a : a_rht;
    const Tensor& x_ref = variant == 0 ? xt : x_rht;
    const Tensor aq = Dequantized(Quantize(dy, options), Copy::kColumnwise);
    const Tensor xq = Dequantized(Quantize(x, options), Copy::kColumnwise);
    const double e_a = Frobenius(Difference(aq.floats(), a_ref.floats())) / norm_a;
    const double e_x = Frobenius(Difference(xq.floats(), x_ref.floats())) / norm_x;
    EXPECT_LE(e_a, 0.15) << "variant " << variant;
    EXPECT_LE(e_x, 0.15) << "variant " << variant;
    products[variant] = TimesTransposed(aq, xq);
    bounds[variant] = (e_a + e_x + e_a * e_x + 1e-5) * norm_a * norm_x;
    const double error = Frobenius(Difference(products[variant], exact));
    EXPECT_LE(error, bounds[variant]) << "variant " << variant;
    // Unbiased, independent rounding errors average out over the N-term dot products.
    const double random_estimate = std::sqrt((e_a * e_a + e_x * e_x) / tokens) * norm_a * norm_x;
    EXPECT_LE(error, 3.0 * random_estimate) << "variant " << variant;
    EXPECT_LE(error / (norm_a * norm_x), 0.3225) << "variant " << variant;
  }
  EXPECT_LE(Frobenius(Difference(products[1], products[0])), bounds[0] + bounds[1]);
}

// ---- Stochastic rounding. ----

TEST(StochasticRoundToE2M1, RoundsUpWhenTheDrawIsBelowTheFraction) {
  // 2.6 lies between 2 (code 4) and 3 (code 5); p = 2.6f - 2 exactly.
  const float p = 2.6f - 2.0f;
  const uint32_t threshold = static_cast<uint32_t>(std::ceil(p * 0x1p24f));  // first u with u >= p
  EXPECT_EQ(StochasticRoundToE2M1(2.6f, 0), 0x5);
  EXPECT_EQ(StochasticRoundToE2M1(2.6f, threshold - 1), 0x5);
  EXPECT_EQ(StochasticRoundToE2M1(2.6f, threshold), 0x4);
  EXPECT_EQ(StochasticRoundToE2M1(-2.6f, 0xFFFFFF), 0xC);
  EXPECT_EQ(StochasticRoundToE2M1(0.2f, 0), 0x1);
  EXPECT_EQ(StochasticRoundToE2M1(5.0f, 0), 0x7);
  EXPECT_EQ(StochasticRoundToE2M1(5.0f, 0x800000), 0x6);  // u = 0.5 is not below p = 0.5
  EXPECT_EQ(StochasticRoundToE2M1(-0.0f, 0), 0x8);
  for (float saturating : {6.0f, 7.0f, 1e30f, kInf}) {
    EXPECT_EQ(StochasticRoundToE2M1(saturating, 0), 0x7);
    EXPECT_EQ(StochasticRoundToE2M1(-saturating, 0), 0xF);
  }
  EXPECT_EQ(StochasticRoundToE2M1(kNaN, 0), 0x7);
  for (uint8_t code = 0; code < 16; ++code) {  // grid values never move
    for (uint32_t u : {0u, 0x7FFFFFu, 0xFFFFFFu}) EXPECT_EQ(StochasticRoundToE2M1(E2M1ToFloat(code), u), code);
  }
}

Nvfp4QuantizeOptions Stochastic(bool rowwise, bool columnwise, uint64_t stream = 0) {
  Nvfp4QuantizeOptions options = Options(rowwise, columnwise);
  options.stochastic_rounding = true;
  options.rng_stream = stream;
  return options;
}

Context Seeded(uint64_t seed) {
  Context ctx = Context::Cpu();
  ctx.seed = seed;
  return ctx;
}

TEST(StochasticRounding, IsReproducibleFromSeedAndStream) {
  const Tensor x = BandedTensor(32, 48, 13u);
  const QuantizedTensor a = Quantize(x, Stochastic(true, true), Seeded(42));
  const QuantizedTensor b = Quantize(x, Stochastic(true, true), Seeded(42));
  const QuantizedTensor other_seed = Quantize(x, Stochastic(true, true), Seeded(43));
  const QuantizedTensor other_stream = Quantize(x, Stochastic(true, true, 1), Seeded(42));
  EXPECT_TRUE(BitwiseEqual(a.rowwise_data, b.rowwise_data));
  EXPECT_TRUE(BitwiseEqual(a.columnwise_data, b.columnwise_data));
  EXPECT_FALSE(BitwiseEqual(a.rowwise_data, other_seed.rowwise_data));
  EXPECT_FALSE(BitwiseEqual(a.columnwise_data, other_seed.columnwise_data));
  EXPECT_FALSE(BitwiseEqual(a.rowwise_data, other_stream.rowwise_data));
  EXPECT_TRUE(BitwiseEqual(a.rowwise_scale_inv, other_seed.rowwise_scale_inv));  // scales are not random
  EXPECT_TRUE(BitwiseEqual(Quantize(x, Options(true, false), Seeded(1)).rowwise_data,
                           Quantize(x, Options(true, false), Seeded(2)).rowwise_data));
}

// Returns the E2M1 values at or just below / above a (a >= 0).
void Neighbours(float a, float* lo, float* hi) {
  static constexpr float kGrid[] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  *lo = 0.0f;
  *hi = 6.0f;
  for (float g : kGrid) {
    if (g <= a) *lo = g;
    if (g >= a && g < *hi) *hi = g;
  }
  if (a >= 6.0f) *lo = 6.0f;
}

TEST(StochasticRounding, NeverLeavesTheTwoNeighbours) {
  const Tensor x = BandedTensor(64, 64, 14u);
  const QuantizedTensor q = Quantize(x, Stochastic(true, false), Seeded(7));
  const QuantizedTensor nearest = Quantize(x, Options(true, false));
  const float inv_s = 1.0f / q.global_encode_scale;
  int64_t outside = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float sd = E4M3ToFloat(q.rowwise_scale_inv.data<uint8_t>()[i / 16]);
    const float e = sd > 0 ? std::min(1.0f / (sd * inv_s), FLT_MAX) : 0.0f;
    const float y = x.floats()[i] * e;
    float lo, hi;
    Neighbours(std::fabs(y), &lo, &hi);
    const float v = E2M1ToFloat(Nibble(q.rowwise_data, i));
    outside += (std::fabs(v) != lo && std::fabs(v) != hi) || (v != 0.0f && std::signbit(v) != std::signbit(y));
  }
  EXPECT_EQ(outside, 0);
  EXPECT_FALSE(BitwiseEqual(q.rowwise_data, nearest.rowwise_data));
}

// Each row: {6, 2.6 x 15, -6, -2.6 x 15}. amax 6 gives S = 448 and block scale 448, so
// e is 1 to within an ulp and each 2.6 rounds to 2 or 3 with P(3) = 0.6: per draw the
// standard deviation is sqrt(0.6 * 0.4) = 0.49, so the mean of 19200 draws is within
// 5 sigma = 0.0177 of 2.6 unless the rounding is biased.
TEST(StochasticRounding, IsUnbiasedOverManyElements) {
  const int64_t rows = 1280;
  std::vector<float> values;
  for (int64_t r = 0; r < rows; ++r) {
    values.push_back(6.0f);
    values.insert(values.end(), 15, 2.6f);
    values.push_back(-6.0f);
    values.insert(values.end(), 15, -2.6f);
  }
  const Tensor dq = Dequantized(Quantize(Matrix(values, rows, 32), Stochastic(true, false), Seeded(99)),
                                Copy::kRowwise);
  double sum_pos = 0.0, sum_neg = 0.0;
  int64_t not_neighbour = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int k = 1; k < 16; ++k) {
      const float pos = dq.floats()[r * 32 + k], neg = dq.floats()[r * 32 + 16 + k];
      not_neighbour += std::fabs(pos - 2.0f) > 1e-5f && std::fabs(pos - 3.0f) > 1e-5f;
      sum_pos += pos;
      sum_neg += neg;
    }
  }
  const double n = rows * 15.0;
  const double five_sigma = 5.0 * std::sqrt(0.6 * 0.4 / n);
  EXPECT_EQ(not_neighbour, 0);
  EXPECT_NEAR(sum_pos / n, 2.6, five_sigma);
  EXPECT_NEAR(sum_neg / n, -2.6, five_sigma);
}

// One element, 0.7 between 0.5 and 1 (P(1) = 0.4), over 2000 seeds: the standard
// deviation of one draw is 0.5 * sqrt(0.24), 5 sigma of the mean is 0.0274.
TEST(StochasticRounding, IsUnbiasedOverSeeds) {
  std::vector<float> values(16, 0.7f);
  values[0] = 6.0f;
  const Tensor x = Matrix(values, 1, 16);
  double sum = 0.0;
  const int seeds = 2000;
  for (int seed = 0; seed < seeds; ++seed) {
    sum += Dequantized(Quantize(x, Stochastic(true, false), Seeded(seed)), Copy::kRowwise).floats()[1];
  }
  EXPECT_NEAR(sum / seeds, 0.7, 5.0 * 0.5 * std::sqrt(0.24 / seeds));
}


}  // namespace
}  // namespace kernels
}  // namespace teserve
