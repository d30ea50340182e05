// Tests of kernels/nvfp4.h, kernels/hadamard.h and kernels/stochastic_rounding.h on the
// CPU: hand-computed NVFP4 codes and scales (zero blocks, outliers, rounding of the
// block scale, NaN/Inf, -0, tiny amax), packing order, copy consistency (1D and 2D),
// exact dequantization, the random Hadamard transform and its wgrad invariance,
// stochastic rounding (reproducibility, unbiasedness, neighbours) and metadata errors.
#include "kernels/nvfp4.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/hadamard.h"
#include "kernels/stochastic_rounding.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;
using ::testing::ElementsAreArray;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

uint8_t Nibble(const Tensor& packed, int64_t i) {
  const uint8_t byte = packed.data<uint8_t>()[i / 2];
  return (i % 2) ? (byte >> 4) : (byte & 0xF);
}

std::vector<uint8_t> Codes(const Tensor& packed) {
  std::vector<uint8_t> codes(packed.numel());
  for (int64_t i = 0; i < packed.numel(); ++i) codes[i] = Nibble(packed, i);
  return codes;
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.nbytes());
}

Tensor Matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  return Tensor::FromFloats(values, {rows, cols}).value();
}

Tensor Transposed(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  std::vector<float> t(x.numel());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x.floats()[r * cols + c];
  }
  return Matrix(t, cols, rows);
}

Nvfp4QuantizeOptions Options(bool rowwise, bool columnwise, bool two_d = false) {
  Nvfp4QuantizeOptions options;
  options.rowwise = rowwise;
  options.columnwise = columnwise;
  options.two_d = two_d;
  return options;
}

QuantizedTensor Quantize(const Tensor& x, const Nvfp4QuantizeOptions& options,
                         const Context& ctx = Context::Cpu()) {
  auto q = QuantizeNvfp4(ctx, x, options);
  EXPECT_TRUE(q.ok()) << q.status();
  return q.ok() ? *q : QuantizedTensor{};
}

Tensor Dequantized(const QuantizedTensor& q, Copy copy) {
  auto out = DequantizeNvfp4(Context::Cpu(), q, copy);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : Tensor{};
}

// Random values whose magnitude changes by 10x from one 16-wide column band to the
// next, so block scales differ and several E4M3 binades appear.
Tensor BandedTensor(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor x = RandomTensor({rows, cols}, -1.0f, 1.0f, seed);
  float* v = x.mutable_floats().data();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] *= std::pow(10.0f, static_cast<float>((i % cols) / 16 % 5) - 2.0f);
  return x;
}

// ---- Scale rules. ----

TEST(Nvfp4GlobalEncodeScale, FollowsTheRule) {
  EXPECT_EQ(Nvfp4GlobalEncodeScale(2688.0f), 1.0f);
  EXPECT_EQ(Nvfp4GlobalEncodeScale(1.0f), 2688.0f);
  EXPECT_EQ(Bits(Nvfp4GlobalEncodeScale(7.0f)), Bits(2688.0f / 7.0f));
  EXPECT_EQ(Nvfp4GlobalEncodeScale(0.0f), 1.0f);
  EXPECT_EQ(Nvfp4GlobalEncodeScale(kNaN), 1.0f);
  EXPECT_EQ(Nvfp4GlobalEncodeScale(kInf), 1.0f);
  EXPECT_EQ(Nvfp4GlobalEncodeScale(1e-36f), FLT_MAX);  // 2.7e39 overflows: clamped
  EXPECT_EQ(Nvfp4GlobalEncodeScale(std::numeric_limits<float>::denorm_min()), FLT_MAX);
  EXPECT_EQ(Bits(Nvfp4GlobalEncodeScale(FLT_MAX)), Bits(2688.0f / FLT_MAX));
}

// Row 0: one huge value (amax 2688 makes S = 1) drowns the rest of its block.
// Row 1: block amax 6 gives scale 1.0 (0x38), e = 1, so codes are plain RNE E2M1.
// Row 2: block amax 5: 5/6 rounds down to E4M3 0.8125 (0x35), e = 1/0.8125, and the
//        block maximum saturates to 6.
// Row 3: all -0: scale 0, e = 0, codes keep the sign (0x8), dequantize to -0.
TEST(QuantizeNvfp4, HandComputedCodesAndScales) {
  std::vector<float> x(64, 0.0f);
  x[0] = 2688.0f;
  for (int i = 1; i < 16; ++i) x[i] = 1.0f;
  const std::vector<float> row1 = {6, -6, 0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f,
                                   5, 5.0001f, -0.0f, 0.3f, 2.9f, -1.5f, 4.5f, 0.1f};
  std::copy(row1.begin(), row1.end(), x.begin() + 16);
  x[32] = 5.0f;
  x[33] = -2.5f;
  for (int i = 48; i < 64; ++i) x[i] = -0.0f;
  const QuantizedTensor q = Quantize(Matrix(x, 4, 16), Options(true, false));
  EXPECT_EQ(q.amax, 2688.0f);
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_EQ(q.mode, ScalingMode::kNvfp4_1D);
  EXPECT_EQ(q.format, DType::kFloat4E2M1);
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{4, 1}));
  EXPECT_EQ(q.rowwise_scale_inv.dtype(), DType::kFloat8E4M3);
  EXPECT_THAT(Bytes(q.rowwise_scale_inv), ElementsAreArray({0x7E, 0x38, 0x35, 0x00}));
  std::vector<uint8_t> want(64, 0x0);
  want[0] = 0x7;
  const std::vector<uint8_t> want1 = {0x7, 0xF, 0x0, 0x2, 0x2, 0x4, 0x4, 0x6,
                                      0x6, 0x7, 0x8, 0x1, 0x5, 0xB, 0x6, 0x0};
  std::copy(want1.begin(), want1.end(), want.begin() + 16);
  want[32] = 0x7;
  want[33] = 0xD;
  for (int i = 48; i < 64; ++i) want[i] = 0x8;
  EXPECT_THAT(Codes(q.rowwise_data), ElementsAreArray(want));
  const Tensor dq = Dequantized(q, Copy::kRowwise);
  EXPECT_EQ(dq.floats()[0], 2688.0f);
  EXPECT_EQ(dq.floats()[1], 0.0f);
  EXPECT_EQ(dq.floats()[32], 6.0f * 0.8125f);
  EXPECT_EQ(dq.floats()[33], -3.0f * 0.8125f);
  for (int i = 48; i < 64; ++i) EXPECT_TRUE(std::signbit(dq.floats()[i]) && dq.floats()[i] == 0.0f);
}

TEST(QuantizeNvfp4, NaNPoisonsItsBlockAndLeavesSAtOne) {
  std::vector<float> x(32, 2.0f);
  for (int i = 0; i < 16; ++i) x[i] = 0.5f * (i + 1);  // block amax 8
  x[19] = kNaN;
  const QuantizedTensor q = Quantize(Matrix(x, 2, 16), Options(true, false));
  EXPECT_TRUE(std::isnan(q.amax));
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_THAT(Bytes(q.rowwise_scale_inv), ::testing::ElementsAre(FloatToE4M3(8.0f / 6.0f), 0x7F));
  const std::vector<uint8_t> codes = Codes(q.rowwise_data);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(codes[i], i == 19 ? 0x7 : 0x0) << i;  // E2M1(x * 0)
  const Tensor dq = Dequantized(q, Copy::kRowwise);
  for (int i = 0; i < 16; ++i) EXPECT_TRUE(std::isfinite(dq.floats()[i])) << i;
  for (int i = 16; i < 32; ++i) EXPECT_TRUE(std::isnan(dq.floats()[i])) << i;
}

TEST(QuantizeNvfp4, InfSaturatesLikeTheFp8Casts) {
  std::vector<float> x(16, 0.0f);
  x[0] = kInf;
  x[1] = -kInf;
  x[2] = 1.0f;
  const QuantizedTensor q = Quantize(Matrix(x, 1, 16), Options(true, false));
  EXPECT_EQ(q.amax, kInf);
  EXPECT_EQ(q.global_encode_scale, 1.0f);
  EXPECT_THAT(Bytes(q.rowwise_scale_inv), ElementsAreArray({0x7E}));
  EXPECT_EQ(Nibble(q.rowwise_data, 0), 0x7);
  EXPECT_EQ(Nibble(q.rowwise_data, 1), 0xF);
  EXPECT_EQ(Nibble(q.rowwise_data, 2), 0x0);  // 1/448 rounds to 0
  const Tensor dq = Dequantized(q, Copy::kRowwise);
  EXPECT_EQ(dq.floats()[0], 2688.0f);
  EXPECT_EQ(dq.floats()[1], -2688.0f);
}

// amax 1e-36: S overflows and is clamped to FLT_MAX (inv_S = 2^-128). The second
// block's scale is an E4M3 subnormal whose encode factor overflows and is clamped, so
// its zeros stay zero codes (an unclamped Inf would make 0 * Inf = NaN -> code 6).
TEST(QuantizeNvfp4, TinyAmaxClampsScalesWithoutNaN) {
  std::vector<float> x(32, 0.0f);
  x[0] = 1e-36f;
  x[1] = -0.5e-36f;
  x[16] = 1e-40f;
  const QuantizedTensor q = Quantize(Matrix(x, 1, 32), Options(true, false));
  EXPECT_EQ(q.global_encode_scale, FLT_MAX);
  EXPECT_EQ(Bytes(q.rowwise_scale_inv)[1], FloatToE4M3((1e-40f / 6.0f) * FLT_MAX));
  const std::vector<uint8_t> codes = Codes(q.rowwise_data);
  for (int i = 2; i < 32; ++i) EXPECT_EQ(codes[i], 0x0) << i;
  const Tensor dq = Dequantized(q, Copy::kRowwise);
  EXPECT_NEAR(dq.floats()[0], 1e-36, 0.05e-36);
  EXPECT_NEAR(dq.floats()[1], -0.5e-36, 0.05e-36);
  for (int i = 2; i < 32; ++i) EXPECT_EQ(dq.floats()[i], 0.0f) << i;
}

// ---- Packing. ----

TEST(CastToFloat4E2M1, PacksLowNibbleFirstWithAnOddCount) {
  const Tensor x = Tensor::FromFloats({0.5f, 1.0f, -6.0f, 3.0f, 1.5f}, {5}).value();
  auto packed = CastToFloat4E2M1(Context::Cpu(), x);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->dtype(), DType::kFloat4E2M1);
  EXPECT_EQ(packed->shape(), Shape{5});
  EXPECT_THAT(Bytes(*packed), ElementsAreArray({0x21, 0x5F, 0x03}));
  auto back = Float4E2M1ToFloat32(Context::Cpu(), *packed);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_THAT(back->floats(), ElementsAreArray(x.floats()));
}

TEST(QuantizeNvfp4, DataBytesHoldElementPairsLowNibbleFirst) {
  const QuantizedTensor q = Quantize(BandedTensor(3, 32, 4u), Options(true, false));
  const std::vector<uint8_t> bytes = Bytes(q.rowwise_data);
  ASSERT_EQ(bytes.size(), 48u);
  const std::vector<uint8_t> codes = Codes(q.rowwise_data);
  for (size_t k = 0; k < bytes.size(); ++k) {
    EXPECT_EQ(bytes[k], codes[2 * k] | (codes[2 * k + 1] << 4)) << k;
  }
}

// ---- The formula, independently per element, and copy consistency. ----

// Recomputes codes and scale bytes of a 1D copy from the header's formula.
void ExpectMatchesFormula(const Tensor& src, const Tensor& data, const Tensor& scales, float s) {
  const int64_t rows = src.dim(0), cols = src.dim(1);
  const float inv_s = 1.0f / s;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 16; ++b) {
      float block_amax = 0.0f;
      for (int k = 0; k < 16; ++k) block_amax = std::max(block_amax, std::fabs(src.floats()[r * cols + b * 16 + k]));
      const uint8_t byte = FloatToE4M3(block_amax / 6.0f * s);
      mismatches += scales.data<uint8_t>()[r * (cols / 16) + b] != byte;
      const float sd = E4M3ToFloat(byte);
      const float e = sd > 0 ? std::min(1.0f / (sd * inv_s), FLT_MAX) : 0.0f;
      for (int k = 0; k < 16; ++k) {
        const int64_t i = r * cols + b * 16 + k;
        mismatches += Nibble(data, i) != FloatToE2M1(src.floats()[i] * e);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(QuantizeNvfp4, BothCopiesFollowTheFormula) {
  const Tensor x = BandedTensor(48, 80, 7u);
  const QuantizedTensor q = Quantize(x, Options(true, true));
  float amax = 0.0f;
  for (float v : x.floats()) amax = std::max(amax, std::fabs(v));
  EXPECT_EQ(q.amax, amax);
  EXPECT_EQ(Bits(q.global_encode_scale), Bits(2688.0f / q.amax));
  ASSERT_EQ(q.rowwise_data.shape(), (Shape{48, 80}));
  ASSERT_EQ(q.columnwise_data.shape(), (Shape{80, 48}));
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{48, 5}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{80, 3}));
  ExpectMatchesFormula(x, q.rowwise_data, q.rowwise_scale_inv, q.global_encode_scale);
  ExpectMatchesFormula(Transposed(x), q.columnwise_data, q.columnwise_scale_inv, q.global_encode_scale);
}

TEST(QuantizeNvfp4, ColumnwiseOfXIsRowwiseOfXTransposed) {
  const Tensor x = BandedTensor(32, 48, 8u);
  const QuantizedTensor q = Quantize(x, Options(false, true));
  const QuantizedTensor qt = Quantize(Transposed(x), Options(true, false));
  EXPECT_FALSE(q.has_rowwise());
  EXPECT_EQ(Bits(q.global_encode_scale), Bits(qt.global_encode_scale));
  EXPECT_TRUE(BitwiseEqual(q.columnwise_data, qt.rowwise_data));
  EXPECT_TRUE(BitwiseEqual(q.columnwise_scale_inv, qt.rowwise_scale_inv));
}

// Dequantize must be (E2M1 * sd) * (1 / S) exactly, with the documented scale layout.
void ExpectExactDequantize(const QuantizedTensor& q, Copy copy) {
  const bool rowwise = copy == Copy::kRowwise;
  const Tensor& data = rowwise ? q.rowwise_data : q.columnwise_data;
  const Tensor& scales = rowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
  const int64_t rows = data.dim(0), cols = data.dim(1);
  const int64_t block_rows = q.mode == ScalingMode::kNvfp4_2D ? 16 : 1;
  const Tensor dq = Dequantized(q, copy);
  ASSERT_EQ(dq.shape(), data.shape());
  const float inv_s = 1.0f / q.global_encode_scale;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float sd = E4M3ToFloat(scales.data<uint8_t>()[(r / block_rows) * (cols / 16) + c / 16]);
      mismatches += Bits(dq.floats()[r * cols + c]) != Bits(E2M1ToFloat(Nibble(data, r * cols + c)) * sd * inv_s);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(DequantizeNvfp4, IsDecodeTimesScaleTimesInverseSExactly) {
  const Tensor x = BandedTensor(48, 64, 9u);
  for (bool two_d : {false, true}) {
    const QuantizedTensor q = Quantize(x, Options(true, true, two_d));
    ExpectExactDequantize(q, Copy::kRowwise);
    ExpectExactDequantize(q, Copy::kColumnwise);
  }
}

// ---- 2D blocks. ----

void Expect2DCopiesAgree(const QuantizedTensor& q) {
  const int64_t rows = q.rows(), cols = q.cols();
  ASSERT_EQ(q.rowwise_scale_inv.shape(), (Shape{rows / 16, cols / 16}));
  ASSERT_EQ(q.columnwise_scale_inv.shape(), (Shape{cols / 16, rows / 16}));
  int64_t mismatches = 0;
  for (int64_t br = 0; br < rows / 16; ++br) {
    for (int64_t bc = 0; bc < cols / 16; ++bc) {
      mismatches += q.rowwise_scale_inv.data<uint8_t>()[br * (cols / 16) + bc] !=
                    q.columnwise_scale_inv.data<uint8_t>()[bc * (rows / 16) + br];
    }
  }
  const Tensor row = Dequantized(q, Copy::kRowwise);
  const Tensor col = Dequantized(q, Copy::kColumnwise);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      mismatches += Nibble(q.rowwise_data, r * cols + c) != Nibble(q.columnwise_data, c * rows + r);
      mismatches += Bits(row.floats()[r * cols + c]) != Bits(col.floats()[c * rows + r]);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(QuantizeNvfp4, TwoDCopiesDequantizeIdentically) {
  const Tensor x = BandedTensor(48, 64, 10u);
  const QuantizedTensor q = Quantize(x, Options(true, true, true));
  EXPECT_EQ(q.mode, ScalingMode::kNvfp4_2D);
  Expect2DCopiesAgree(q);
  // Block (1, 2): rows 16..31, cols 32..47.
  float tile_amax = 0.0f;
  for (int r = 16; r < 32; ++r) {
    for (int c = 32; c < 48; ++c) tile_amax = std::max(tile_amax, std::fabs(x.floats()[r * 64 + c]));
  }
  EXPECT_EQ(q.rowwise_scale_inv.data<uint8_t>()[1 * 4 + 2],
            FloatToE4M3(tile_amax / 6.0f * q.global_encode_scale));
  Nvfp4QuantizeOptions sr = Options(true, true, true);
  sr.stochastic_rounding = true;
  Expect2DCopiesAgree(Quantize(x, sr));
}

TEST(QuantizeNvfp4, TwoDColumnwiseOnlyMatchesTheColumnwiseOfBoth) {
  const Tensor x = BandedTensor(32, 32, 11u);
  const QuantizedTensor both = Quantize(x, Options(true, true, true));
  const QuantizedTensor col = Quantize(x, Options(false, true, true));
  EXPECT_TRUE(BitwiseEqual(both.columnwise_data, col.columnwise_data));
  EXPECT_TRUE(BitwiseEqual(both.columnwise_scale_inv, col.columnwise_scale_inv));
}

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

// ---- Metadata errors name the argument and say expected vs got. ----

TEST(Nvfp4Errors, BlockedDimensionsMustBeMultiplesOf16) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {20, 40}).value();
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, Options(true, false)),
              HasError(kInvalid, "x.shape[1]: expected a multiple of 16 (NVFP4 blocks run along it), got 40"));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, Options(false, true)),
              HasError(kInvalid, "x.shape[0]: expected a multiple of 16 (NVFP4 blocks run along it), got 20"));
  const Tensor wide = Tensor::Zeros(DType::kFloat32, {20, 32}).value();
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), wide, Options(true, false, true)), HasError(kInvalid, "x.shape[0]"));
  const Tensor tall = Tensor::Zeros(DType::kFloat32, {32, 40}).value();
  EXPECT_TRUE(QuantizeNvfp4(Context::Cpu(), tall, Options(false, true)).ok());  // cols not blocked
  const QuantizedTensor empty = Quantize(Tensor::Zeros(DType::kFloat32, {0, 16}).value(), Options(true, true));
  EXPECT_EQ(empty.global_encode_scale, 1.0f);
  EXPECT_EQ(empty.columnwise_scale_inv.shape(), (Shape{16, 0}));
  EXPECT_EQ(Dequantized(empty, Copy::kColumnwise).shape(), (Shape{16, 0}));
}

TEST(Nvfp4Errors, RejectsBadOptionsAndInputs) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {16, 16}).value();
  Nvfp4QuantizeOptions rht_2d = Options(true, true, true);
  rht_2d.random_hadamard = true;
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, rht_2d), HasError(kInvalid, "options.random_hadamard: expected false"));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, Options(false, false)),
              HasError(kInvalid, "options: expected rowwise and/or columnwise, got neither"));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), Tensor::Zeros(DType::kBFloat16, {16, 16}).value(), Options(true, false)),
              HasError(kInvalid, "x.dtype: expected FLOAT32, got BFLOAT16"));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), Tensor::Zeros(DType::kFloat32, {16}).value(), Options(true, false)),
              HasError(kInvalid, "x.shape: expected rank 2"));
  EXPECT_THAT(ApplyHadamard16(Context::Cpu(), Tensor::Zeros(DType::kFloat32, {2, 20}).value()),
              HasError(kInvalid, "x.shape[1]: expected a multiple of 16 (the Hadamard tiles run along it), got 20"));
}

TEST(Nvfp4Errors, CudaTensorsAreUnimplemented) {
  float storage[256] = {};
  Context ctx;
  ctx.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {16, 16}, Device::Cuda(0));
  EXPECT_THAT(QuantizeNvfp4(ctx, x, Options(true, false)),
              HasError(absl::StatusCode::kUnimplemented, "no CUDA kernel yet for QuantizeNvfp4"));
  EXPECT_THAT(ApplyHadamard16(ctx, x), HasError(absl::StatusCode::kUnimplemented, "no CUDA kernel yet for ApplyHadamard16"));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, Options(true, false)), HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

TEST(Nvfp4Errors, DequantizeChecksMetadata) {
  const QuantizedTensor q = Quantize(BandedTensor(16, 32, 15u), Options(true, false));
  EXPECT_THAT(DequantizeNvfp4(Context::Cpu(), q, Copy::kColumnwise), HasError(kInvalid, "q.columnwise_data: expected a tensor"));
  QuantizedTensor per_tensor = q;
  per_tensor.mode = ScalingMode::kPerTensor;
  EXPECT_THAT(DequantizeNvfp4(Context::Cpu(), per_tensor, Copy::kRowwise),
              HasError(kInvalid, "q.mode: expected nvfp4_1d or nvfp4_2d, got per_tensor"));
  QuantizedTensor as_2d = q;
  as_2d.mode = ScalingMode::kNvfp4_2D;
  EXPECT_THAT(DequantizeNvfp4(Context::Cpu(), as_2d, Copy::kRowwise),
              HasError(kInvalid, "q.rowwise_scale_inv.shape: expected [1, 2], got [16, 2]"));
  QuantizedTensor bad_scale = q;
  bad_scale.global_encode_scale = 0.0f;
  EXPECT_THAT(DequantizeNvfp4(Context::Cpu(), bad_scale, Copy::kRowwise),
              HasError(kInvalid, "q.global_encode_scale: expected a finite positive value, got 0"));
}
}  // namespace
}  // namespace kernels
}  // namespace teserve
