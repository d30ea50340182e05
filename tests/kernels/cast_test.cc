// Tests of kernels/cast.h on the CPU: amax, per-tensor FP8 quantization against
// hand-computed codes, rowwise/columnwise consistency over awkward shapes, exact
// dequantization, dtype round trips and metadata errors.
#include "kernels/cast.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomFloats;
using ::teserve::testing_kernels::RandomTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

Tensor Floats(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor::FromFloats(values, {1, n}).value();
}

std::vector<uint8_t> Codes(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

PerTensorQuantizeOptions Options(DType format, float scale, bool rowwise = true,
                                 bool columnwise = false) {
  PerTensorQuantizeOptions options;
  options.format = format;
  options.scale = scale;
  options.rowwise = rowwise;
  options.columnwise = columnwise;
  return options;
}

TEST(Amax, IsLargestMagnitude) {
  EXPECT_EQ(Amax(Context::Cpu(), Floats({1.0f, -7.5f, 3.0f, -0.0f})).value(), 7.5f);
}

TEST(Amax, PropagatesNaN) {
  EXPECT_TRUE(std::isnan(Amax(Context::Cpu(), Floats({1.0f, kNaN, 3.0f})).value()));
  EXPECT_TRUE(std::isnan(Amax(Context::Cpu(), Floats({kNaN, kInf})).value()));
}

TEST(Amax, OfNegativeZeroIsPositiveZero) {
  const float amax = Amax(Context::Cpu(), Floats({-0.0f, -0.0f})).value();
  EXPECT_EQ(Bits(amax), 0u);
}

TEST(Amax, OfEmptyTensorIsZero) {
  const Tensor empty = Tensor::Zeros(DType::kFloat32, {0, 5}).value();
  EXPECT_EQ(Amax(Context::Cpu(), empty).value(), 0.0f);
}

TEST(Amax, AcceptsAnyRank) {
  const Tensor t = Tensor::FromFloats({1, -2, 3, -4, 5, -6, 7, -8}, {2, 2, 2}).value();
  EXPECT_EQ(Amax(Context::Cpu(), t).value(), 8.0f);
}

// E4M3 has 3 mantissa bits: in [1, 2) codes step by 0.125 (0x38 = 1.0, 0x39 = 1.125,
// 0x3A = 1.25). Scale 2 moves each input onto the value in the comment.
TEST(QuantizePerTensor, E4M3HandComputedCodes) {
  const std::vector<float> x = {
      0.53125f,                        // 1.0625, midpoint 1.0|1.125 -> even 1.0
      0.59375f,                        // 1.1875, midpoint 1.125|1.25 -> even 1.25
      0.5625f,                         // 1.125 exactly
      0.53125f + 0x1p-20f,             // just above the midpoint -> 1.125
      300.0f,                          // 600 saturates to 448
      -300.0f,                         // -448
      -0.0f,                           // -0 keeps its sign
      0x1p-11f,                        // 2^-10: half the smallest subnormal -> 0
      3 * 0x1p-11f,                    // 1.5 subnormal quanta -> even: 2 * 2^-9
      0x1p-10f,                        // 2^-9: the smallest subnormal
      kInf,                            // saturates
  };
  const std::vector<uint8_t> want = {0x38, 0x3A, 0x39, 0x39, 0x7E, 0xFE, 0x80,
                                     0x00, 0x02, 0x01, 0x7E};
  auto q = QuantizePerTensor(Context::Cpu(), Floats(x), Options(DType::kFloat8E4M3, 2.0f));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(Codes(q->rowwise_data), ::testing::ElementsAreArray(want));
  EXPECT_EQ(q->amax, kInf);
  EXPECT_EQ(q->rowwise_scale_inv.floats()[0], 0.5f);
  EXPECT_EQ(q->mode, ScalingMode::kPerTensor);
  EXPECT_EQ(q->format, DType::kFloat8E4M3);
  EXPECT_EQ(q->shape, (Shape{1, static_cast<int64_t>(x.size())}));
  EXPECT_FALSE(q->has_columnwise());
}

// E5M2 has 2 mantissa bits: in [1, 2) codes step by 0.25 (0x3C = 1.0).
TEST(QuantizePerTensor, E5M2HandComputedCodes) {
  const std::vector<float> x = {0.5625f, 0.6875f, 0.75f, 1e6f, -kInf, -0.0f};
  // 1.125 -> 1.0 (even), 1.375 -> 1.5 (even), 1.5, saturate, saturate, -0.
  const std::vector<uint8_t> want = {0x3C, 0x3E, 0x3E, 0x7B, 0xFB, 0x80};
  auto q = QuantizePerTensor(Context::Cpu(), Floats(x), Options(DType::kFloat8E5M2, 2.0f));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(Codes(q->rowwise_data), ::testing::ElementsAreArray(want));
  EXPECT_EQ(E5M2ToFloat(0x7B), kE5M2Max);
}

// x = fp32(1.0625 / 5) times 5 is 1.0625 + 2^-25 exactly, above the 1.0|1.125
// midpoint; the FP32 product rounds onto the midpoint, which ties to even (1.0). The
// contract takes the FP32 product, so the code is 0x38, not 0x39. Likewise 1.1875 / 5
// lands just below 1.1875 exactly but on it in FP32, tying up to 1.25.
TEST(QuantizePerTensor, ScalesWithAnFp32Product) {
  const float x1 = 1.0625f / 5.0f;
  const float x2 = 1.1875f / 5.0f;
  ASSERT_GT(static_cast<double>(x1) * 5.0, 1.0625);
  ASSERT_LT(static_cast<double>(x2) * 5.0, 1.1875);
  auto q = QuantizePerTensor(Context::Cpu(), Floats({x1, x2}), Options(DType::kFloat8E4M3, 5.0f));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_THAT(Codes(q->rowwise_data), ::testing::ElementsAre(0x38, 0x3A));
}

TEST(QuantizePerTensor, NaNInputGivesNaNAmaxAndNaNCode) {
  auto q = QuantizePerTensor(Context::Cpu(), Floats({1.0f, kNaN, -2.0f}),
                             Options(DType::kFloat8E4M3, 1.0f, true, true));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_TRUE(std::isnan(q->amax));
  EXPECT_EQ(Codes(q->rowwise_data)[1], 0x7F);
  EXPECT_EQ(Codes(q->columnwise_data)[1], 0x7F);
}

TEST(QuantizePerTensor, ScaleInvIsFp32Reciprocal) {
  auto q = QuantizePerTensor(Context::Cpu(), Floats({1.0f}),
                             Options(DType::kFloat8E4M3, 3.0f, true, true));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(Bits(q->rowwise_scale_inv.floats()[0]), Bits(1.0f / 3.0f));
  EXPECT_EQ(Bits(q->columnwise_scale_inv.floats()[0]), Bits(1.0f / 3.0f));
  EXPECT_EQ(q->columnwise_scale_inv.shape(), Shape{1});
}

TEST(QuantizePerTensor, ColumnwiseOnlyLeavesRowwiseAbsent) {
  auto q = QuantizePerTensor(Context::Cpu(), Floats({1.0f, 2.0f}),
                             Options(DType::kFloat8E5M2, 1.0f, false, true));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_FALSE(q->has_rowwise());
  EXPECT_FALSE(q->rowwise_scale_inv.defined());
  EXPECT_EQ(q->columnwise_data.shape(), (Shape{2, 1}));
}

// ---- Rowwise / columnwise consistency and exact dequantization over shapes. ----

struct QuantizeCase {
  DType format;
  int64_t rows;
  int64_t cols;
};

std::string QuantizeCaseName(const ::testing::TestParamInfo<QuantizeCase>& info) {
  const QuantizeCase& c = info.param;
  return absl::StrCat(c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2", "_", c.rows, "x", c.cols);
}

void PrintTo(const QuantizeCase& c, std::ostream* os) {
  *os << DTypeName(c.format) << " [" << c.rows << ", " << c.cols << "]";
}

class QuantizeShapes : public ::testing::TestWithParam<QuantizeCase> {
 protected:
  // Values spanning well past the format's range after scaling, so saturation,
  // subnormals and ordinary codes all appear.
  Tensor Input() const {
    const QuantizeCase& c = GetParam();
    return RandomTensor({c.rows, c.cols}, -600.0f, 600.0f, 17u + static_cast<uint32_t>(c.rows * c.cols));
  }
  float Scale() const { return GetParam().format == DType::kFloat8E4M3 ? 1.75f : 96.5f; }
};

TEST_P(QuantizeShapes, CopiesAreTransposesOfTheCodecApplied) {
  const QuantizeCase& c = GetParam();
  const Tensor x = Input();
  auto q = QuantizePerTensor(Context::Cpu(), x, Options(c.format, Scale(), true, true));
  ASSERT_TRUE(q.ok()) << q.status();
  ASSERT_EQ(q->rowwise_data.shape(), (Shape{c.rows, c.cols}));
  ASSERT_EQ(q->columnwise_data.shape(), (Shape{c.cols, c.rows}));
  EXPECT_EQ(q->rowwise_data.dtype(), c.format);
  EXPECT_EQ(q->columnwise_data.dtype(), c.format);
  const uint8_t* row = q->rowwise_data.data<uint8_t>();
  const uint8_t* col = q->columnwise_data.data<uint8_t>();
  const float* src = x.data<float>();
  float amax = 0.0f;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t k = 0; k < c.cols; ++k) {
      const float scaled = src[r * c.cols + k] * Scale();
      const uint8_t want = c.format == DType::kFloat8E4M3 ? FloatToE4M3(scaled) : FloatToE5M2(scaled);
      mismatches += row[r * c.cols + k] != want;
      mismatches += col[k * c.rows + r] != want;
      amax = std::max(amax, std::fabs(src[r * c.cols + k]));
    }
  }
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(q->amax, amax);
  EXPECT_EQ(q->amax, Amax(Context::Cpu(), x).value());
}

TEST_P(QuantizeShapes, DequantizeIsDecodeTimesScaleInvExactly) {
  const QuantizeCase& c = GetParam();
  auto q = QuantizePerTensor(Context::Cpu(), Input(), Options(c.format, Scale(), true, true));
  ASSERT_TRUE(q.ok()) << q.status();
  const float scale_inv = 1.0f / Scale();
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    const Tensor& data = copy == Copy::kRowwise ? q->rowwise_data : q->columnwise_data;
    auto dq = Dequantize(Context::Cpu(), *q, copy);
    ASSERT_TRUE(dq.ok()) << dq.status();
    ASSERT_EQ(dq->dtype(), DType::kFloat32);
    ASSERT_EQ(dq->shape(), data.shape());
    int64_t mismatches = 0;
    for (int64_t i = 0; i < data.numel(); ++i) {
      const uint8_t code = data.data<uint8_t>()[i];
      const float decoded = c.format == DType::kFloat8E4M3 ? E4M3ToFloat(code) : E5M2ToFloat(code);
      mismatches += Bits(dq->floats()[i]) != Bits(decoded * scale_inv);
    }
    EXPECT_EQ(mismatches, 0) << (copy == Copy::kRowwise ? "rowwise" : "columnwise");
  }
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, QuantizeShapes,
    ::testing::Values(QuantizeCase{DType::kFloat8E4M3, 1, 1}, QuantizeCase{DType::kFloat8E4M3, 3, 37},
                      QuantizeCase{DType::kFloat8E4M3, 257, 259}, QuantizeCase{DType::kFloat8E4M3, 128, 64},
                      QuantizeCase{DType::kFloat8E4M3, 0, 7}, QuantizeCase{DType::kFloat8E5M2, 1, 1},
                      QuantizeCase{DType::kFloat8E5M2, 3, 37}, QuantizeCase{DType::kFloat8E5M2, 257, 259},
                      QuantizeCase{DType::kFloat8E5M2, 1, 300}),
    QuantizeCaseName);

// ---- Plain conversions. ----

// Every code of a format, decoded to FP32 and encoded back, is the same code; NaN
// codes come back as a NaN code; E5M2 infinities saturate (satfinite).
struct RoundTripCase {
  DType dtype;
  int bits;
};

void PrintTo(const RoundTripCase& c, std::ostream* os) { *os << DTypeName(c.dtype); }

std::string RoundTripName(const ::testing::TestParamInfo<RoundTripCase>& info) {
  std::string name(DTypeName(info.param.dtype));
  name.erase(std::remove(name.begin(), name.end(), '_'), name.end());
  return name;
}

class CastRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(CastRoundTrip, EveryCodeSurvivesToFloat32AndBack) {
  const RoundTripCase& c = GetParam();
  const int64_t count = int64_t{1} << c.bits;
  Tensor codes = Tensor::Zeros(c.dtype, {count}).value();
  for (int64_t i = 0; i < count; ++i) {
    if (c.bits == 8) codes.data<uint8_t>()[i] = static_cast<uint8_t>(i);
    else codes.data<uint16_t>()[i] = static_cast<uint16_t>(i);
  }
  auto wide = ToFloat32(Context::Cpu(), codes);
  ASSERT_TRUE(wide.ok()) << wide.status();
  auto back = CastFromFloat32(Context::Cpu(), *wide, c.dtype);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->dtype(), c.dtype);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float v = wide->floats()[i];
    const uint32_t got = c.bits == 8 ? back->data<uint8_t>()[i] : back->data<uint16_t>()[i];
    if (std::isnan(v)) {
      const float again = c.bits == 8 ? (c.dtype == DType::kFloat8E4M3 ? E4M3ToFloat(got) : E5M2ToFloat(got))
                                      : (c.dtype == DType::kFloat16 ? Fp16ToFloat(got) : Bf16ToFloat(got));
      mismatches += !std::isnan(again);
    } else if (std::isinf(v) && c.dtype == DType::kFloat8E5M2) {
      mismatches += got != (v > 0 ? 0x7Bu : 0xFBu);
    } else {
      mismatches += got != static_cast<uint32_t>(i);
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(Kernels, CastRoundTrip,
                         ::testing::Values(RoundTripCase{DType::kFloat8E4M3, 8},
                                           RoundTripCase{DType::kFloat8E5M2, 8},
                                           RoundTripCase{DType::kFloat16, 16},
                                           RoundTripCase{DType::kBFloat16, 16}),
                         RoundTripName);

TEST(CastFromFloat32, Float32IsACopy) {
  const Tensor x = RandomTensor({3, 37}, -1e30f, 1e30f, 5u);
  auto y = CastFromFloat32(Context::Cpu(), x, DType::kFloat32);
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_TRUE(BitwiseEqual(x, *y));
  EXPECT_NE(x.raw_data(), y->raw_data());
}

TEST(CastFromFloat32, RoundsToNearestEven) {
  // 1 + 2^-8 is the BF16 midpoint between 1 and 1 + 2^-7: even is 1.
  // 1 + 3 * 2^-8 is the midpoint above 1 + 2^-7: even is 1 + 2^-6.
  const Tensor x = Floats({1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 70000.0f});
  auto bf16 = CastFromFloat32(Context::Cpu(), x, DType::kBFloat16);
  auto fp16 = CastFromFloat32(Context::Cpu(), x, DType::kFloat16);
  ASSERT_TRUE(bf16.ok() && fp16.ok());
  const uint16_t* b = bf16->data<uint16_t>();
  EXPECT_EQ(b[0], 0x3F80);
  EXPECT_EQ(b[1], 0x3F82);
  const uint16_t* h = fp16->data<uint16_t>();
  EXPECT_EQ(h[2], 0x3C00);  // 1 + 2^-11: FP16 midpoint 1|1+2^-10, even is 1
  EXPECT_EQ(h[3], 0x7C00);  // beyond 65504: IEEE overflow to Inf (not satfinite)
}

TEST(ToFloat32, KeepsShapeOfAnyRank) {
  Tensor codes = Tensor::Zeros(DType::kFloat8E4M3, {2, 3, 4}).value();
  codes.data<uint8_t>()[5] = 0x38;
  auto wide = ToFloat32(Context::Cpu(), codes);
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(wide->floats()[5], 1.0f);
}

// ---- Metadata errors name the argument and say expected vs got. ----

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

TEST(CastErrors, QuantizeRejectsInputsOtherThanFloat32OrBf16) {
  const Tensor x = Tensor::Zeros(DType::kFloat16, {2, 2}).value();
  EXPECT_THAT(QuantizePerTensor(Context::Cpu(), x, Options(DType::kFloat8E4M3, 1.0f)),
              HasError(kInvalid, "x.dtype: expected FLOAT32 or BFLOAT16, got FLOAT16"));
}

// A BF16 x quantizes exactly as the FP32 tensor of its values: same amax, same codes,
// same fused dbias.
TEST(Cast, Bf16InputQuantizesAsItsFloat32Value) {
  Tensor x32 = Tensor::Zeros(DType::kFloat32, {3, 16}).value();
  for (int64_t i = 0; i < x32.numel(); ++i) x32.mutable_floats()[i] = 0.37f * (i - 20) + 0.001f * i * i;
  const Tensor x16 = CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value();
  const Tensor exact = ToFloat32(Context::Cpu(), x16).value();
  Tensor dbias16 = Tensor::Zeros(DType::kFloat32, {16}).value();
  Tensor dbias32 = Tensor::Zeros(DType::kFloat32, {16}).value();
  PerTensorQuantizeOptions o = Options(DType::kFloat8E4M3, 4.0f);
  o.columnwise = true;
  o.dbias = &dbias16;
  auto q16 = QuantizePerTensor(Context::Cpu(), x16, o);
  o.dbias = &dbias32;
  auto q32 = QuantizePerTensor(Context::Cpu(), exact, o);
  ASSERT_TRUE(q16.ok()) << q16.status();
  ASSERT_TRUE(q32.ok()) << q32.status();
  EXPECT_EQ(q16->amax, q32->amax);
  EXPECT_TRUE(BitwiseEqual(q16->rowwise_data, q32->rowwise_data));
  EXPECT_TRUE(BitwiseEqual(q16->columnwise_data, q32->columnwise_data));
  EXPECT_TRUE(BitwiseEqual(dbias16, dbias32));
  EXPECT_EQ(Amax(Context::Cpu(), x16).value(), Amax(Context::Cpu(), exact).value());
}

TEST(CastErrors, QuantizeRejectsRank3Input) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {2, 2, 2}).value();
  EXPECT_THAT(QuantizePerTensor(Context::Cpu(), x, Options(DType::kFloat8E4M3, 1.0f)),
              HasError(kInvalid, "x.shape: expected rank 2, got [2, 2, 2]"));
}

// Current scaling's rule: the cast takes fp8_max / max(amax, epsilon) from x itself, the
// same bits as quantizing with that scale given.
TEST(QuantizePerTensor, CurrentRuleQuantizesWithTheTensorsOwnScale) {
  struct Case {
    std::vector<float> values;
    float epsilon;
    bool power_2;
    float expected_scale;
  };
  const std::vector<Case> cases = {
      {{1.0f, -3.5f, 2.0f}, 0.0f, false, 448.0f / 3.5f},
      {{1.0f, -3.0f, 2.0f}, 0.0f, true, 128.0f},          // 149.33 rounded down to a power of 2
      {{1e-6f, 0.0f}, 1e-3f, false, 448.0f / 1e-3f},      // floored to epsilon
      {{0.0f, 0.0f}, 0.0f, false, 1.0f},                  // amax 0: scale 1
      {{1.0f, kNaN}, 0.0f, false, 1.0f},                  // NaN: scale 1
      {{1.0f, -kInf}, 0.0f, false, 1.0f},                 // Inf: scale 1
      {{1e-44f}, 0.0f, false, std::numeric_limits<float>::max()},  // 448 / denormal overflows
  };
  for (const Case& c : cases) {
    PerTensorQuantizeOptions options = Options(DType::kFloat8E4M3, 1.0f, true, true);
    options.current = CurrentScaleRule{c.epsilon, c.power_2};
    absl::StatusOr<QuantizedTensor> q = QuantizePerTensor(Context::Cpu(), Floats(c.values), options);
    ASSERT_TRUE(q.ok()) << q.status();
    const float scale_inv = q->rowwise_scale_inv.floats()[0];
    EXPECT_EQ(Bits(scale_inv), Bits(1.0f / c.expected_scale)) << c.values[0] << " eps " << c.epsilon;
    EXPECT_EQ(Bits(q->columnwise_scale_inv.floats()[0]), Bits(scale_inv));
    absl::StatusOr<QuantizedTensor> given =
        QuantizePerTensor(Context::Cpu(), Floats(c.values), Options(DType::kFloat8E4M3, c.expected_scale, true, true));
    ASSERT_TRUE(given.ok()) << given.status();
    EXPECT_EQ(Codes(q->rowwise_data), Codes(given->rowwise_data));
    EXPECT_EQ(Codes(q->columnwise_data), Codes(given->columnwise_data));
    EXPECT_EQ(Bits(q->amax), Bits(given->amax));
  }
}

TEST(CastErrors, QuantizeRejectsBadCurrentEpsilon) {
  for (float epsilon : {-1.0f, kInf, kNaN}) {
    PerTensorQuantizeOptions options = Options(DType::kFloat8E4M3, 1.0f);
    options.current = CurrentScaleRule{epsilon, false};
    EXPECT_THAT(QuantizePerTensor(Context::Cpu(), Floats({1.0f}), options),
                HasError(kInvalid, "options.current.amax_epsilon: expected a finite value >= 0"))
        << epsilon;
  }
}

TEST(CastErrors, QuantizeRejectsNonFp8Format) {
  EXPECT_THAT(QuantizePerTensor(Context::Cpu(), Floats({1.0f}), Options(DType::kBFloat16, 1.0f)),
              HasError(kInvalid, "options.format: expected FLOAT8_E4M3 or FLOAT8_E5M2, got BFLOAT16"));
}

TEST(CastErrors, QuantizeRejectsBadScales) {
  for (float scale : {0.0f, -1.0f, kInf, kNaN}) {
    EXPECT_THAT(QuantizePerTensor(Context::Cpu(), Floats({1.0f}), Options(DType::kFloat8E4M3, scale)),
                HasError(kInvalid, "options.scale: expected a finite positive value"))
        << scale;
  }
}

TEST(CastErrors, QuantizeRejectsNoCopyRequested) {
  EXPECT_THAT(QuantizePerTensor(Context::Cpu(), Floats({1.0f}),
                                Options(DType::kFloat8E4M3, 1.0f, false, false)),
              HasError(kInvalid, "options: expected rowwise and/or columnwise"));
}

TEST(CastErrors, QuantizeRejectsTensorOnAnotherDevice) {
  float storage[4] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {2, 2}, Device::Cuda(0));
  EXPECT_THAT(QuantizePerTensor(Context::Cpu(), x, Options(DType::kFloat8E4M3, 1.0f)),
              HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

TEST(CastErrors, DequantizeRejectsMissingCopy) {
  auto q = QuantizePerTensor(Context::Cpu(), Floats({1.0f, 2.0f}), Options(DType::kFloat8E4M3, 1.0f));
  ASSERT_TRUE(q.ok());
  EXPECT_THAT(Dequantize(Context::Cpu(), *q, Copy::kColumnwise),
              HasError(kInvalid, "q.columnwise_data: expected a tensor"));
}

TEST(CastErrors, DequantizeRejectsInconsistentMetadata) {
  auto q = QuantizePerTensor(Context::Cpu(), Floats({1.0f, 2.0f}),
                             Options(DType::kFloat8E4M3, 1.0f, true, true));
  ASSERT_TRUE(q.ok());
  QuantizedTensor wrong_shape = *q;
  wrong_shape.shape = {2, 1};
  EXPECT_THAT(Dequantize(Context::Cpu(), wrong_shape, Copy::kRowwise),
              HasError(kInvalid, "q.rowwise_data.shape: expected [2, 1], got [1, 2]"));
  QuantizedTensor wrong_format = *q;
  wrong_format.format = DType::kFloat8E5M2;
  EXPECT_THAT(Dequantize(Context::Cpu(), wrong_format, Copy::kColumnwise),
              HasError(kInvalid, "q.columnwise_data.dtype: expected FLOAT8_E5M2, got FLOAT8_E4M3"));
  QuantizedTensor wrong_scale = *q;
  wrong_scale.rowwise_scale_inv = Tensor::Zeros(DType::kFloat32, {2}).value();
  EXPECT_THAT(Dequantize(Context::Cpu(), wrong_scale, Copy::kRowwise),
              HasError(kInvalid, "q.rowwise_scale_inv.shape: expected [1], got [2]"));
  QuantizedTensor wrong_mode = *q;
  wrong_mode.mode = ScalingMode::kMxfp8_1D;
  EXPECT_THAT(Dequantize(Context::Cpu(), wrong_mode, Copy::kRowwise),
              HasError(kInvalid, "q.mode: expected per_tensor, got mxfp8_1d"));
}

TEST(CastErrors, ConversionsRejectUnsupportedDtypes) {
  const Tensor ints = Tensor::Zeros(DType::kInt32, {3}).value();
  EXPECT_THAT(ToFloat32(Context::Cpu(), ints), HasError(kInvalid, "x.dtype: expected one of FLOAT32"));
  EXPECT_THAT(CastFromFloat32(Context::Cpu(), Floats({1.0f}), DType::kFloat4E2M1),
              HasError(kInvalid, "dtype: expected one of FLOAT32, FLOAT16, BFLOAT16, FLOAT8_E4M3, "
                                 "FLOAT8_E5M2, got FLOAT4_E2M1"));
  EXPECT_THAT(CastFromFloat32(Context::Cpu(), ints, DType::kFloat16),
              HasError(kInvalid, "x.dtype: expected FLOAT32, got INT32"));
  EXPECT_THAT(Amax(Context::Cpu(), ints), HasError(kInvalid, "x.dtype: expected FLOAT32 or BFLOAT16, got INT32"));
}

TEST(CastErrors, UndefinedTensorIsNamed) {
  EXPECT_THAT(Amax(Context::Cpu(), Tensor()), HasError(kInvalid, "x: expected a tensor, got an undefined"));
}

#if !TESERVE_WITH_CUDA
TEST(CastErrors, CudaContextWithoutCudaBackendIsUnimplemented) {
  float storage[4] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {2, 2}, Device::Cuda(0));
  Context ctx;
  ctx.device = Device::Cuda(0);
  EXPECT_THAT(Amax(ctx, x),
              HasError(absl::StatusCode::kUnimplemented, "Amax has no kernel for cuda:0 (teserve was built without CUDA)"));
  EXPECT_THAT(QuantizePerTensor(ctx, x, Options(DType::kFloat8E4M3, 1.0f)),
              HasError(absl::StatusCode::kUnimplemented,
                       "QuantizePerTensor has no kernel for cuda:0 (teserve was built without CUDA)"));
}
#endif

}  // namespace
}  // namespace kernels
}  // namespace teserve
