// Tests of kernels/block_quantize.h on the CPU: MXFP8 and FP8 block scaling against
// hand-computed codes and scales in both directions, an independent per-block oracle
// over tail shapes, rowwise/columnwise consistency, exact dequantization, the
// half-ulp error bound, the cuBLASLt scale layouts and metadata errors.
//
// Hand vectors are laid along one row of a [1, n] tensor (rowwise copy) or down one
// column of an [n, 1] tensor (columnwise copy): either way the copy under test is the
// vector itself, so one expectation checks both directions.
#include "kernels/block_quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <ostream>
#include <string>
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
using ::testing::ElementsAreArray;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

std::vector<float> Floats(const Tensor& t) {
  return std::vector<float>(t.floats().begin(), t.floats().end());
}

// `v` padded with zeros to `n`, as [1, n] (rowwise) or [n, 1] (columnwise).
Tensor Along(Copy copy, std::vector<float> v, int64_t n) {
  v.resize(n, 0.0f);
  return Tensor::FromFloats(v, copy == Copy::kRowwise ? Shape{1, n} : Shape{n, 1}).value();
}

std::vector<uint8_t> Padded(std::vector<uint8_t> v, size_t n) {
  v.resize(n, 0);
  return v;
}

const Tensor& DataOf(const QuantizedTensor& q, Copy copy) {
  return copy == Copy::kRowwise ? q.rowwise_data : q.columnwise_data;
}
const Tensor& ScalesOf(const QuantizedTensor& q, Copy copy) {
  return copy == Copy::kRowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
}

Tensor Transposed(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor t = Tensor::Zeros(x.dtype(), {cols, rows}).value();
  const int64_t bytes = DTypeBits(x.dtype()) / 8;
  const uint8_t* src = static_cast<const uint8_t*>(x.raw_data());
  uint8_t* dst = static_cast<uint8_t*>(t.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * bytes, src + (r * cols + c) * bytes, bytes);
  }
  return t;
}

std::string CopyName(Copy copy) { return copy == Copy::kRowwise ? "Rowwise" : "Columnwise"; }

Mxfp8QuantizeOptions MxOptions(Copy copy, DType format = DType::kFloat8E4M3) {
  Mxfp8QuantizeOptions o;
  o.format = format;
  o.rowwise = copy == Copy::kRowwise;
  o.columnwise = copy == Copy::kColumnwise;
  return o;
}

BlockScalingQuantizeOptions BlockOptions(bool rowwise, bool columnwise, bool two_d) {
  BlockScalingQuantizeOptions o;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  o.two_d = two_d;
  return o;
}

// ---- MXFP8 hand-computed vectors (E4M3: code = e << 3 | m, value 2^(e-7) (1 + m/8)). ----

class Mxfp8Vectors : public ::testing::TestWithParam<Copy> {
 protected:
  QuantizedTensor Quantize(std::vector<float> v, int64_t n, DType format = DType::kFloat8E4M3) {
    auto q = QuantizeMxfp8(Context::Cpu(), Along(GetParam(), std::move(v), n),
                           MxOptions(GetParam(), format));
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? *q : QuantizedTensor{};
  }
  std::vector<uint8_t> Data(const QuantizedTensor& q) { return Bytes(DataOf(q, GetParam())); }
  std::vector<uint8_t> Codes(const QuantizedTensor& q) { return Bytes(ScalesOf(q, GetParam())); }
};

// amax 448 * 2^10: code 127 + 10, factor 2^-10. 1024 -> 1.0, -3584 -> -3.5; 0.125
// becomes 2^-13, under half the smallest subnormal (2^-10): flushed, sign kept.
TEST_P(Mxfp8Vectors, SingleHugeValueFlushesSmallOnes) {
  const QuantizedTensor q = Quantize({458752.0f, 0.125f, -0.125f, 1024.0f, -3584.0f}, 32);
  EXPECT_THAT(Codes(q), ElementsAreArray({137}));
  EXPECT_THAT(Data(q), ElementsAreArray(Padded({0x7E, 0x00, 0x80, 0x38, 0xC6}, 32)));
  EXPECT_EQ(q.amax, 458752.0f);
  EXPECT_EQ(ScalesOf(q, GetParam()).dtype(), DType::kFloat8E8M0);
  EXPECT_EQ(q.mode, ScalingMode::kMxfp8_1D);
}

TEST_P(Mxfp8Vectors, ZeroBlockHasCodeZeroAndKeepsNegativeZero) {
  const QuantizedTensor q = Quantize({0.0f, -0.0f, 0.0f, -0.0f}, 32);
  EXPECT_THAT(Codes(q), ElementsAreArray({0x00}));
  EXPECT_THAT(Data(q), ElementsAreArray(Padded({0x00, 0x80, 0x00, 0x80}, 32)));
  EXPECT_EQ(Bits(q.amax), 0u);
}

// A NaN makes the block's scale NaN (0xFF) and every code of that block NaN (0x7F);
// the next block is untouched.
TEST_P(Mxfp8Vectors, NaNPoisonsOnlyItsBlock) {
  std::vector<float> v(64, 0.0f);
  v[0] = 1.0f;
  v[1] = kNaN;
  v[2] = -2.0f;
  v[32] = 448.0f;
  v[33] = 1.0f;
  const QuantizedTensor q = Quantize(v, 64);
  EXPECT_THAT(Codes(q), ElementsAreArray({0xFF, 127}));
  std::vector<uint8_t> want(32, 0x7F);
  want.push_back(0x7E);
  want.push_back(0x38);
  EXPECT_THAT(Data(q), ElementsAreArray(Padded(want, 64)));
  EXPECT_TRUE(std::isnan(q.amax));
}

// Inf: Inf / 448 saturates the E8M0 code (0xFE, factor 2^-127); Inf saturates to 448.
TEST_P(Mxfp8Vectors, InfSaturates) {
  const QuantizedTensor q = Quantize({kInf, 1.0f, -kInf}, 32);
  EXPECT_THAT(Codes(q), ElementsAreArray({0xFE}));
  EXPECT_THAT(Data(q), ElementsAreArray(Padded({0x7E, 0x00, 0xFE}, 32)));
}

// amax 56 = 448 * 2^-3 exactly: code 124, 56 -> 448, 7 -> 56. One FP32 ulp above:
// the scale rounds up to 2^-2 (code 125), 56+ -> 224, 7 -> 28.
TEST_P(Mxfp8Vectors, E8M0RoundsUpAboveAnExactPowerOfTwo) {
  std::vector<float> v(64, 0.0f);
  v[0] = 56.0f;
  v[1] = 7.0f;
  v[32] = std::nextafter(56.0f, kInf);
  v[33] = 7.0f;
  const QuantizedTensor q = Quantize(v, 64);
  EXPECT_THAT(Codes(q), ElementsAreArray({124, 125}));
  std::vector<uint8_t> want = Padded({0x7E, 0x66}, 32);
  want.push_back(0x76);
  want.push_back(0x5E);
  EXPECT_THAT(Data(q), ElementsAreArray(Padded(want, 64)));
}

// amax 3584: factor 2^-3. 8.5 -> 1.0625, the 1.0|1.125 midpoint: even 1.0 (0x38);
// 9.5 -> 1.1875: even 1.25 (0x3A); just above 8.5 -> 1.125 (0x39).
TEST_P(Mxfp8Vectors, MidpointsAfterScalingRoundToEven) {
  const QuantizedTensor q = Quantize({3584.0f, 8.5f, 9.5f, 8.5f + 0x1p-18f}, 32);
  EXPECT_THAT(Codes(q), ElementsAreArray({130}));
  EXPECT_THAT(Data(q), ElementsAreArray(Padded({0x7E, 0x38, 0x3A, 0x39}, 32)));
}

// E5M2 (max 57344 = 0x7B, 1.0 = 0x3C): amax 2 * 57344 gives code 128; 2.25 -> 1.125,
// the 1.0|1.25 midpoint: even 1.0.
TEST_P(Mxfp8Vectors, E5M2UsesItsOwnMaximum) {
  const QuantizedTensor q = Quantize({114688.0f, 2.25f, -2.0f}, 32, DType::kFloat8E5M2);
  EXPECT_THAT(Codes(q), ElementsAreArray({128}));
  EXPECT_THAT(Data(q), ElementsAreArray(Padded({0x7B, 0x3C, 0xBC}, 32)));
  EXPECT_EQ(q.format, DType::kFloat8E5M2);
}

INSTANTIATE_TEST_SUITE_P(Kernels, Mxfp8Vectors,
                         ::testing::Values(Copy::kRowwise, Copy::kColumnwise),
                         [](const ::testing::TestParamInfo<Copy>& info) {
                           return CopyName(info.param);
                         });

// ---- FP8 block scaling hand-computed vectors, 1D and 2D (one tile), both copies. ----

struct BlockVectorCase {
  Copy copy;
  bool two_d;
};

void PrintTo(const BlockVectorCase& c, std::ostream* os) {
  *os << CopyName(c.copy) << (c.two_d ? " 2D" : " 1D");
}

class BlockVectors : public ::testing::TestWithParam<BlockVectorCase> {
 protected:
  QuantizedTensor Quantize(std::vector<float> v, BlockScalingQuantizeOptions o = {}) {
    const BlockVectorCase& c = GetParam();
    o.rowwise = c.copy == Copy::kRowwise;
    o.columnwise = c.copy == Copy::kColumnwise;
    o.two_d = c.two_d;
    const int64_t n = static_cast<int64_t>(v.size());
    auto q = QuantizeBlockScaling(Context::Cpu(), Along(c.copy, std::move(v), n), o);
    EXPECT_TRUE(q.ok()) << q.status();
    return q.ok() ? *q : QuantizedTensor{};
  }
  std::vector<uint8_t> Data(const QuantizedTensor& q) { return Bytes(DataOf(q, GetParam().copy)); }
  // The single block's scale_inv, as bits.
  uint32_t ScaleInvBits(const QuantizedTensor& q) {
    const Tensor& s = ScalesOf(q, GetParam().copy);
    EXPECT_EQ(s.numel(), 1);
    return s.numel() == 1 ? Bits(s.floats()[0]) : 0u;
  }
};

// amax 3.5: scale 448 / 3.5 = 128 exactly. 3.5 -> 448, 1 -> 128, 8.5/128 -> 8.5 (tie,
// even 8), 9.5/128 -> 9.5 (tie, even 10), 2^-20 -> 2^-13 (flushed).
TEST_P(BlockVectors, PowerOfTwoScaleHandComputed) {
  const QuantizedTensor q = Quantize({3.5f, 1.0f, -0.0f, 8.5f / 128, 9.5f / 128, 0x1p-20f, -3.5f});
  EXPECT_EQ(ScaleInvBits(q), Bits(0x1p-7f));
  EXPECT_THAT(Data(q), ElementsAreArray({0x7E, 0x70, 0x80, 0x50, 0x52, 0x00, 0xFE}));
  EXPECT_EQ(q.amax, 3.5f);
  EXPECT_EQ(q.mode, GetParam().two_d ? ScalingMode::kBlock2D : ScalingMode::kBlock1D);
}

// amax 3: 448 / 3 = 149.33 rounds down to 128 by default; without the power-of-two
// rule the FP32 quotient itself is the scale (3 -> 448, 1 -> 149.3 -> 144).
TEST_P(BlockVectors, PowerOfTwoRoundingOnAndOff) {
  const QuantizedTensor on = Quantize({3.0f, 1.0f});
  EXPECT_EQ(ScaleInvBits(on), Bits(0x1p-7f));
  EXPECT_THAT(Data(on), ElementsAreArray({0x7C, 0x70}));
  BlockScalingQuantizeOptions o;
  o.power_2_scale = false;
  const QuantizedTensor off = Quantize({3.0f, 1.0f}, o);
  EXPECT_EQ(ScaleInvBits(off), Bits(1.0f / (448.0f / 3.0f)));
  EXPECT_THAT(Data(off), ElementsAreArray({0x7E, 0x71}));
}

// The epsilon floor applies before the zero check: a zero block gets 448 / eps.
TEST_P(BlockVectors, EpsilonFloorsTheAmax) {
  BlockScalingQuantizeOptions o;
  o.amax_epsilon = 1.0f;
  EXPECT_EQ(ScaleInvBits(Quantize({0.0f, 0.0f}, o)), Bits(1.0f / 256));
  const QuantizedTensor floored = Quantize({0.5f, 0.25f}, o);  // scale 448 -> 256
  EXPECT_EQ(ScaleInvBits(floored), Bits(1.0f / 256));
  EXPECT_THAT(Data(floored), ElementsAreArray({0x70, 0x68}));
  const QuantizedTensor plain = Quantize({0.5f, 0.25f});  // 896 -> 512
  EXPECT_EQ(ScaleInvBits(plain), Bits(1.0f / 512));
  EXPECT_THAT(Data(plain), ElementsAreArray({0x78, 0x70}));
}

TEST_P(BlockVectors, ZeroBlockHasScaleOne) {
  const QuantizedTensor q = Quantize({0.0f, -0.0f});
  EXPECT_EQ(ScaleInvBits(q), Bits(1.0f));
  EXPECT_THAT(Data(q), ElementsAreArray({0x00, 0x80}));
}

// Non-finite amax: scale 1, values encoded unscaled (NaN -> 0x7F, Inf and -1000 saturate).
TEST_P(BlockVectors, NonFiniteBlocksHaveScaleOne) {
  const QuantizedTensor nan = Quantize({kNaN, 2.0f, -1000.0f});
  EXPECT_EQ(ScaleInvBits(nan), Bits(1.0f));
  EXPECT_THAT(Data(nan), ElementsAreArray({0x7F, 0x40, 0xFE}));
  EXPECT_TRUE(std::isnan(nan.amax));
  const QuantizedTensor inf = Quantize({kInf, 2.0f, -kInf});
  EXPECT_EQ(ScaleInvBits(inf), Bits(1.0f));
  EXPECT_THAT(Data(inf), ElementsAreArray({0x7E, 0x40, 0xFE}));
}

// 448 / 1e-39 overflows: FLT_MAX, which the power-of-two rule takes down to 2^127.
TEST_P(BlockVectors, InfiniteScaleBecomesFltMax) {
  BlockScalingQuantizeOptions o;
  o.power_2_scale = false;
  const QuantizedTensor exact = Quantize({1e-39f}, o);
  EXPECT_EQ(ScaleInvBits(exact), Bits(1.0f / FLT_MAX));
  EXPECT_THAT(Data(exact), ElementsAreArray({0x2B}));  // 0.3403 -> 0.34375
  const QuantizedTensor pow2 = Quantize({1e-39f});
  EXPECT_EQ(ScaleInvBits(pow2), Bits(0x1p-127f));
  EXPECT_THAT(Data(pow2), ElementsAreArray({0x23}));  // 0.1701 -> 0.171875
}

INSTANTIATE_TEST_SUITE_P(Kernels, BlockVectors,
                         ::testing::Values(BlockVectorCase{Copy::kRowwise, false},
                                           BlockVectorCase{Copy::kColumnwise, false},
                                           BlockVectorCase{Copy::kRowwise, true},
                                           BlockVectorCase{Copy::kColumnwise, true}),
                         [](const ::testing::TestParamInfo<BlockVectorCase>& info) {
                           return absl::StrCat(CopyName(info.param.copy),
                                               info.param.two_d ? "_2D" : "_1D");
                         });

// ---- Shapes: an independent per-block oracle, consistency and exact dequantization. ----

enum class Recipe { kMxfp8, kBlock1D, kBlock2D };

struct ShapeCase {
  Recipe recipe;
  DType format;
  int64_t rows;
  int64_t cols;
};

const char* RecipeName(Recipe recipe) {
  return recipe == Recipe::kMxfp8 ? "Mxfp8" : recipe == Recipe::kBlock1D ? "Block1D" : "Block2D";
}

void PrintTo(const ShapeCase& c, std::ostream* os) {
  *os << RecipeName(c.recipe) << " " << DTypeName(c.format) << " [" << c.rows << ", " << c.cols
      << "]";
}

std::string ShapeCaseName(const ::testing::TestParamInfo<ShapeCase>& info) {
  const ShapeCase& c = info.param;
  return absl::StrCat(RecipeName(c.recipe), "_", c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2",
                      "_", c.rows, "x", c.cols);
}

class BlockShapes : public ::testing::TestWithParam<ShapeCase> {
 protected:
  // Rows spread over 2^-10 .. 2^9 so blocks of very different magnitude meet.
  Tensor Input() const {
    const ShapeCase& c = GetParam();
    std::vector<float> v =
        RandomFloats(c.rows * c.cols, -1.0f, 1.0f, 7u + static_cast<uint32_t>(c.rows));
    for (int64_t r = 0; r < c.rows; ++r) {
      for (int64_t k = 0; k < c.cols; ++k)
        v[r * c.cols + k] = std::ldexp(v[r * c.cols + k], static_cast<int>(r % 20) - 10);
    }
    return Tensor::FromFloats(v, {c.rows, c.cols}).value();
  }
  absl::StatusOr<QuantizedTensor> Quantize(const Tensor& x, bool rowwise = true,
                                           bool columnwise = true) const {
    const ShapeCase& c = GetParam();
    if (c.recipe == Recipe::kMxfp8) {
      Mxfp8QuantizeOptions o;
      o.format = c.format;
      o.rowwise = rowwise;
      o.columnwise = columnwise;
      return QuantizeMxfp8(Context::Cpu(), x, o);
    }
    BlockScalingQuantizeOptions o = BlockOptions(rowwise, columnwise, c.recipe == Recipe::kBlock2D);
    o.format = c.format;
    return QuantizeBlockScaling(Context::Cpu(), x, o);
  }
  // Block extent along (rows, cols) of a copy.
  int64_t BlockRows() const { return GetParam().recipe == Recipe::kBlock2D ? 128 : 1; }
  int64_t BlockCols() const { return GetParam().recipe == Recipe::kMxfp8 ? 32 : 128; }
  float ScaleInvAt(const Tensor& s, int64_t r, int64_t c) const {
    const int64_t i = (r / BlockRows()) * s.dim(1) + c / BlockCols();
    return GetParam().recipe == Recipe::kMxfp8 ? E8M0ToFloat(s.data<uint8_t>()[i]) : s.floats()[i];
  }
  float Decode(uint8_t code) const {
    return GetParam().format == DType::kFloat8E4M3 ? E4M3ToFloat(code) : E5M2ToFloat(code);
  }
};

// The oracle: per block of the copy (tails partial), the scale from the recipe's
// formula written out independently, then every code is encode(x * scale).
float OracleScale(Recipe recipe, float fp8_max, float amax) {
  if (recipe == Recipe::kMxfp8) return std::ldexp(1.0f, 127 - FloatToE8M0RoundUp(amax / fp8_max));
  int exponent;  // fp8_max / amax = m * 2^exponent with m in [0.5, 1)
  std::frexp(fp8_max / amax, &exponent);
  return std::ldexp(1.0f, exponent - 1);  // the power of two at or below
}

TEST_P(BlockShapes, MatchesAPerBlockOracle) {
  const ShapeCase& c = GetParam();
  const Tensor x = Input();
  auto q = Quantize(x);
  ASSERT_TRUE(q.ok()) << q.status();
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    const Tensor xc = copy == Copy::kRowwise ? x : Transposed(x);
    const int64_t rows = xc.dim(0), cols = xc.dim(1);
    const uint8_t* codes = DataOf(*q, copy).data<uint8_t>();
    int64_t mismatches = 0;
    for (int64_t br = 0; br < rows; br += BlockRows()) {
      for (int64_t bc = 0; bc < cols; bc += BlockCols()) {
        const int64_t r_end = std::min(br + BlockRows(), rows),
                      c_end = std::min(bc + BlockCols(), cols);
        float amax = 0.0f;
        for (int64_t r = br; r < r_end; ++r) {
          for (int64_t k = bc; k < c_end; ++k)
            amax = std::max(amax, std::fabs(xc.floats()[r * cols + k]));
        }
        const float scale = OracleScale(c.recipe, DTypeMaxFinite(c.format), amax);
        mismatches += Bits(ScaleInvAt(ScalesOf(*q, copy), br, bc)) != Bits(1.0f / scale);
        for (int64_t r = br; r < r_end; ++r) {
          for (int64_t k = bc; k < c_end; ++k) {
            const float y = xc.floats()[r * cols + k] * scale;
            mismatches += codes[r * cols + k] !=
                          (c.format == DType::kFloat8E4M3 ? FloatToE4M3(y) : FloatToE5M2(y));
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << CopyName(copy);
  }
}

TEST_P(BlockShapes, ScaleShapesFollowTheContract) {
  const ShapeCase& c = GetParam();
  auto q = Quantize(Input());
  ASSERT_TRUE(q.ok()) << q.status();
  auto ceil128 = [](int64_t n) { return (n + 127) / 128; };
  Shape row_scales, col_scales;
  switch (c.recipe) {
    case Recipe::kMxfp8:
      row_scales = {c.rows, c.cols / 32};
      col_scales = {c.cols, c.rows / 32};
      break;
    case Recipe::kBlock1D:
      row_scales = {c.rows, ceil128(c.cols)};
      col_scales = {c.cols, ceil128(c.rows)};
      break;
    case Recipe::kBlock2D:
      row_scales = {ceil128(c.rows), ceil128(c.cols)};
      col_scales = {ceil128(c.cols), ceil128(c.rows)};
      break;
  }
  EXPECT_EQ(q->rowwise_scale_inv.shape(), row_scales);
  EXPECT_EQ(q->columnwise_scale_inv.shape(), col_scales);
  EXPECT_EQ(q->rowwise_data.shape(), (Shape{c.rows, c.cols}));
  EXPECT_EQ(q->columnwise_data.shape(), (Shape{c.cols, c.rows}));
  EXPECT_EQ(q->shape, (Shape{c.rows, c.cols}));
}

// Columnwise of x is rowwise of x^T, byte for byte (data and scales).
TEST_P(BlockShapes, ColumnwiseOfXIsRowwiseOfXTransposed) {
  const Tensor x = Input();
  auto col = Quantize(x, false, true);
  auto row_t = Quantize(Transposed(x), true, false);
  ASSERT_TRUE(col.ok() && row_t.ok()) << col.status() << row_t.status();
  EXPECT_FALSE(col->has_rowwise());
  EXPECT_TRUE(BitwiseEqual(col->columnwise_data, row_t->rowwise_data));
  EXPECT_TRUE(BitwiseEqual(col->columnwise_scale_inv, row_t->rowwise_scale_inv));
}

TEST_P(BlockShapes, DequantizeIsDecodeTimesScaleInvExactly) {
  auto q = Quantize(Input());
  ASSERT_TRUE(q.ok()) << q.status();
  for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
    auto dq = DequantizeBlock(Context::Cpu(), *q, copy);
    ASSERT_TRUE(dq.ok()) << dq.status();
    const Tensor& data = DataOf(*q, copy);
    ASSERT_EQ(dq->shape(), data.shape());
    int64_t mismatches = 0;
    for (int64_t r = 0; r < data.dim(0); ++r) {
      for (int64_t k = 0; k < data.dim(1); ++k) {
        const int64_t i = r * data.dim(1) + k;
        const float want = Decode(data.data<uint8_t>()[i]) * ScaleInvAt(ScalesOf(*q, copy), r, k);
        mismatches += Bits(dq->floats()[i]) != Bits(want);
      }
    }
    EXPECT_EQ(mismatches, 0) << CopyName(copy);
  }
}

// With power-of-two scales the scaled value y is exact, so |x - deq| is the format's
// rounding error of y, at most half an ulp of y's binade, times the block scale_inv.
TEST_P(BlockShapes, ErrorIsAtMostHalfAnUlpAtTheBlockScale) {
  const ShapeCase& c = GetParam();
  const int man_bits = c.format == DType::kFloat8E4M3 ? 3 : 2;
  const int min_exp = c.format == DType::kFloat8E4M3 ? -6 : -14;
  const Tensor x = Input();
  auto q = Quantize(x);
  ASSERT_TRUE(q.ok()) << q.status();
  auto dq = DequantizeBlock(Context::Cpu(), *q, Copy::kRowwise);
  ASSERT_TRUE(dq.ok()) << dq.status();
  int64_t violations = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t k = 0; k < c.cols; ++k) {
      const double inv = ScaleInvAt(q->rowwise_scale_inv, r, k);
      const double v = x.floats()[r * c.cols + k];
      const double y = std::fabs(v / inv);
      const int binade = y == 0.0 ? min_exp : std::max(std::ilogb(y), min_exp);
      const double half_ulp = std::ldexp(1.0, binade - man_bits - 1) * inv;
      violations += std::fabs(v - dq->floats()[r * c.cols + k]) > half_ulp;
    }
  }
  EXPECT_EQ(violations, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, BlockShapes,
    ::testing::Values(ShapeCase{Recipe::kMxfp8, DType::kFloat8E4M3, 64, 96},
                      ShapeCase{Recipe::kMxfp8, DType::kFloat8E5M2, 64, 96},
                      ShapeCase{Recipe::kMxfp8, DType::kFloat8E4M3, 32, 32},
                      ShapeCase{Recipe::kMxfp8, DType::kFloat8E4M3, 160, 256},
                      ShapeCase{Recipe::kBlock1D, DType::kFloat8E4M3, 257, 259},
                      ShapeCase{Recipe::kBlock1D, DType::kFloat8E5M2, 257, 259},
                      ShapeCase{Recipe::kBlock1D, DType::kFloat8E4M3, 3, 37},
                      ShapeCase{Recipe::kBlock2D, DType::kFloat8E4M3, 257, 259},
                      ShapeCase{Recipe::kBlock2D, DType::kFloat8E5M2, 257, 259},
                      ShapeCase{Recipe::kBlock2D, DType::kFloat8E4M3, 128, 384}),
    ShapeCaseName);

// Tiles of different magnitude (2^(3i - 2j) for tile (i, j)), so a copy that took its
// scales from the wrong tile would round differently.
TEST(BlockScaling2D, BothCopiesDequantizeIdentically) {
  Tensor x = testing_kernels::RandomTensor({257, 259}, -300.0f, 300.0f, 11u);
  float* v = x.data<float>();
  for (int64_t r = 0; r < 257; ++r) {
    for (int64_t c = 0; c < 259; ++c)
      v[r * 259 + c] = std::ldexp(v[r * 259 + c], static_cast<int>(3 * (r / 128) - 2 * (c / 128)));
  }
  auto q = QuantizeBlockScaling(Context::Cpu(), x, BlockOptions(true, true, true));
  ASSERT_TRUE(q.ok()) << q.status();
  auto row = DequantizeBlock(Context::Cpu(), *q, Copy::kRowwise);
  auto col = DequantizeBlock(Context::Cpu(), *q, Copy::kColumnwise);
  ASSERT_TRUE(row.ok() && col.ok());
  EXPECT_TRUE(BitwiseEqual(*row, Transposed(*col)));
  EXPECT_TRUE(BitwiseEqual(q->columnwise_scale_inv, Transposed(q->rowwise_scale_inv)));
}

TEST(BlockScaling1D, CopiesUseTheirOwnBlocks) {
  // One huge value: rowwise it shares a block with row 0 only, columnwise with column 0.
  std::vector<float> v(128 * 128, 1.0f);
  v[0] = 448.0f * 64;
  auto q = QuantizeBlockScaling(Context::Cpu(), Tensor::FromFloats(v, {128, 128}).value(),
                                BlockOptions(true, true, false));
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->rowwise_scale_inv.floats()[0], 64.0f);
  EXPECT_EQ(q->rowwise_scale_inv.floats()[1], 1.0f / 256);  // 448 -> 256
  EXPECT_EQ(q->columnwise_scale_inv.floats()[0], 64.0f);
  EXPECT_EQ(q->columnwise_scale_inv.floats()[1], 1.0f / 256);
}

// ---- MXFP8 scale swizzle (cuBLASLt VEC32_UE8M0). ----

Tensor ScaleCodes(int64_t rows, int64_t cols, uint8_t fill) {
  Tensor t = Tensor::Zeros(DType::kFloat8E8M0, {rows, cols}).value();
  std::memset(t.raw_data(), fill, t.nbytes());
  return t;
}

TEST(SwizzleMxfp8Scales, RoundTripsOverShapes) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{1, 1},   {64, 3},  {128, 4},
                                                           {300, 9}, {256, 8}, {0, 5}};
  for (const auto& [rows, cols] : shapes) {
    Tensor s = Tensor::Zeros(DType::kFloat8E8M0, {rows, cols}).value();
    for (int64_t i = 0; i < s.numel(); ++i)
      s.data<uint8_t>()[i] = static_cast<uint8_t>(1 + i % 251);
    auto sw = SwizzleMxfp8Scales(Context::Cpu(), s);
    ASSERT_TRUE(sw.ok()) << sw.status();
    EXPECT_EQ(sw->shape(), (Shape{(rows + 127) / 128 * 128, (cols + 3) / 4 * 4}));
    auto back = UnswizzleMxfp8Scales(Context::Cpu(), *sw, rows, cols);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(BitwiseEqual(s, *back)) << rows << "x" << cols;
  }
}

// Offsets by the formula: tile (r/128, c/4) of a 2x2 tile grid, 512 bytes each, then
// (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4 inside.
TEST(SwizzleMxfp8Scales, PlacesBytesAtHandComputedOffsets) {
  struct Case {
    int64_t r, c, offset;
  };
  for (const Case& k :
       {Case{0, 0, 0}, Case{1, 0, 16}, Case{32, 0, 4}, Case{33, 3, 23}, Case{127, 3, 511},
        Case{0, 4, 512}, Case{128, 0, 1024}, Case{130, 5, 1569}, Case{255, 7, 2047}}) {
    Tensor s = ScaleCodes(256, 8, 0);
    s.data<uint8_t>()[k.r * 8 + k.c] = 0x5A;
    auto sw = SwizzleMxfp8Scales(Context::Cpu(), s);
    ASSERT_TRUE(sw.ok()) << sw.status();
    const std::vector<uint8_t> bytes = Bytes(*sw);
    EXPECT_EQ(bytes[k.offset], 0x5A) << "(" << k.r << ", " << k.c << ")";
    EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x5A), 1);
  }
}

TEST(SwizzleMxfp8Scales, PaddingBytesAreZero) {
  auto sw = SwizzleMxfp8Scales(Context::Cpu(), ScaleCodes(100, 3, 0x7F));
  ASSERT_TRUE(sw.ok()) << sw.status();
  ASSERT_EQ(sw->shape(), (Shape{128, 4}));
  const std::vector<uint8_t> bytes = Bytes(*sw);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x7F), 300);
  EXPECT_EQ(std::count(bytes.begin(), bytes.end(), 0x00), 128 * 4 - 300);
  EXPECT_EQ(bytes[(100 % 32) * 16 + (100 / 32) * 4], 0x00);  // row 100, col 0: padding row
  EXPECT_EQ(bytes[3], 0x00);                                 // row 0, col 3: padding column
}

TEST(SwizzleMxfp8Scales, RoundTripsQuantizedScales) {
  const Tensor x = testing_kernels::RandomTensor({64, 96}, -100.0f, 100.0f, 3u);
  Mxfp8QuantizeOptions o;
  o.columnwise = true;
  auto q = QuantizeMxfp8(Context::Cpu(), x, o);
  ASSERT_TRUE(q.ok()) << q.status();
  for (const Tensor* s : {&q->rowwise_scale_inv, &q->columnwise_scale_inv}) {
    auto sw = SwizzleMxfp8Scales(Context::Cpu(), *s);
    ASSERT_TRUE(sw.ok()) << sw.status();
    auto back = UnswizzleMxfp8Scales(Context::Cpu(), *sw, s->dim(0), s->dim(1));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(BitwiseEqual(*s, *back));
  }
}

// ---- FP8 block-scaling GEMM layouts (cuBLASLt VEC128_32F / BLK128x128_32F). ----

Tensor Iota(int64_t rows, int64_t cols) {
  std::vector<float> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i + 1);
  return Tensor::FromFloats(v, {rows, cols}).value();
}

TEST(BlockScalesGemmLayout, OneDIsTransposedAndPaddedToFour) {
  auto out = BlockScalesGemmLayout(Context::Cpu(), Iota(5, 3), false);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), (Shape{3, 8}));
  const std::vector<float> got = Floats(*out);
  for (int64_t k = 0; k < 3; ++k) {
    for (int64_t m = 0; m < 8; ++m) {
      EXPECT_EQ(got[k * 8 + m], m < 5 ? static_cast<float>(m * 3 + k + 1) : 0.0f) << k << "," << m;
    }
  }
}

TEST(BlockScalesGemmLayout, TwoDKeepsOrderAndPadsTheLastDim) {
  auto out = BlockScalesGemmLayout(Context::Cpu(), Iota(3, 5), true);
  ASSERT_TRUE(out.ok()) << out.status();
  ASSERT_EQ(out->shape(), (Shape{3, 8}));
  const std::vector<float> got = Floats(*out);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 8; ++j)
      EXPECT_EQ(got[i * 8 + j], j < 5 ? static_cast<float>(i * 5 + j + 1) : 0.0f);
  }
}

TEST(BlockScalesGemmLayout, ShapesOfQuantizedTails) {
  const Tensor x = testing_kernels::RandomTensor({257, 259}, -1.0f, 1.0f, 5u);
  auto q1 = QuantizeBlockScaling(Context::Cpu(), x, BlockOptions(true, true, false));
  auto q2 = QuantizeBlockScaling(Context::Cpu(), x, BlockOptions(true, true, true));
  ASSERT_TRUE(q1.ok() && q2.ok());
  EXPECT_EQ(BlockScalesGemmLayout(Context::Cpu(), q1->rowwise_scale_inv, false)->shape(),
            (Shape{3, 260}));
  EXPECT_EQ(BlockScalesGemmLayout(Context::Cpu(), q1->columnwise_scale_inv, false)->shape(),
            (Shape{3, 260}));
  EXPECT_EQ(BlockScalesGemmLayout(Context::Cpu(), q2->rowwise_scale_inv, true)->shape(),
            (Shape{3, 4}));
}

// ---- Metadata errors name the argument and say expected vs got. ----

TEST(BlockQuantizeErrors, Mxfp8RejectsIndivisibleDims) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {33, 64}).value();
  const Tensor y = Tensor::Zeros(DType::kFloat32, {64, 33}).value();
  EXPECT_THAT(QuantizeMxfp8(Context::Cpu(), y, MxOptions(Copy::kRowwise)),
              HasError(kInvalid,
                       "x.shape[1]: expected a multiple of 32 for the rowwise MXFP8 copy, got 33"));
  EXPECT_THAT(
      QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kColumnwise)),
      HasError(kInvalid,
               "x.shape[0]: expected a multiple of 32 for the columnwise MXFP8 copy, got 33"));
  EXPECT_TRUE(QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kRowwise)).ok());
}

TEST(BlockQuantizeErrors, RejectBadInputsAndOptions) {
  const Tensor bf16 = Tensor::Zeros(DType::kBFloat16, {32, 32}).value();
  const Tensor x = Tensor::Zeros(DType::kFloat32, {32, 32}).value();
  EXPECT_THAT(QuantizeMxfp8(Context::Cpu(), bf16, MxOptions(Copy::kRowwise)),
              HasError(kInvalid, "x.dtype: expected FLOAT32, got BFLOAT16"));
  EXPECT_THAT(
      QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kRowwise, DType::kBFloat16)),
      HasError(kInvalid, "options.format: expected FLOAT8_E4M3 or FLOAT8_E5M2, got BFLOAT16"));
  EXPECT_THAT(QuantizeBlockScaling(Context::Cpu(), x, BlockOptions(false, false, false)),
              HasError(kInvalid, "options: expected rowwise and/or columnwise, got neither"));
  for (float eps : {-1.0f, kNaN, kInf}) {
    BlockScalingQuantizeOptions o;
    o.amax_epsilon = eps;
    EXPECT_THAT(QuantizeBlockScaling(Context::Cpu(), x, o),
                HasError(kInvalid, "options.amax_epsilon: expected a finite value >= 0"));
  }
  EXPECT_THAT(
      QuantizeBlockScaling(Context::Cpu(), Tensor::Zeros(DType::kFloat32, {2, 2, 2}).value(), {}),
      HasError(kInvalid, "x.shape: expected rank 2, got [2, 2, 2]"));
}

TEST(BlockQuantizeErrors, CudaTensorsAreUnimplemented) {
  float storage[32 * 32] = {};
  Context cuda;
  cuda.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {32, 32}, Device::Cuda(0));
  EXPECT_THAT(QuantizeMxfp8(cuda, x, MxOptions(Copy::kRowwise)),
              HasError(absl::StatusCode::kUnimplemented, "no CUDA kernel yet for QuantizeMxfp8"));
  EXPECT_THAT(
      QuantizeBlockScaling(cuda, x, {}),
      HasError(absl::StatusCode::kUnimplemented, "no CUDA kernel yet for QuantizeBlockScaling"));
  EXPECT_THAT(QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kRowwise)),
              HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

TEST(BlockQuantizeErrors, DequantizeChecksModeCopyAndScales) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {32, 64}).value();
  auto q = QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kRowwise));
  ASSERT_TRUE(q.ok());
  EXPECT_THAT(DequantizeBlock(Context::Cpu(), *q, Copy::kColumnwise),
              HasError(kInvalid, "q.columnwise_data: expected a tensor"));
  QuantizedTensor per_tensor = *q;
  per_tensor.mode = ScalingMode::kPerTensor;
  EXPECT_THAT(
      DequantizeBlock(Context::Cpu(), per_tensor, Copy::kRowwise),
      HasError(kInvalid, "q.mode: expected one of mxfp8_1d, block_1d, block_2d, got per_tensor"));
  QuantizedTensor wrong_scales = *q;
  wrong_scales.rowwise_scale_inv = ScaleCodes(32, 3, 127);
  EXPECT_THAT(DequantizeBlock(Context::Cpu(), wrong_scales, Copy::kRowwise),
              HasError(kInvalid, "q.rowwise_scale_inv.shape: expected [32, 2], got [32, 3]"));
  QuantizedTensor as_block = *q;
  as_block.mode = ScalingMode::kBlock1D;
  EXPECT_THAT(DequantizeBlock(Context::Cpu(), as_block, Copy::kRowwise),
              HasError(kInvalid, "q.rowwise_scale_inv.dtype: expected FLOAT32, got FLOAT8_E8M0"));
}

TEST(BlockQuantizeErrors, LayoutsCheckTheirInputs) {
  EXPECT_THAT(SwizzleMxfp8Scales(Context::Cpu(), Iota(2, 2)),
              HasError(kInvalid, "scales.dtype: expected FLOAT8_E8M0, got FLOAT32"));
  EXPECT_THAT(UnswizzleMxfp8Scales(Context::Cpu(), ScaleCodes(128, 4, 0), 129, 4),
              HasError(kInvalid, "swizzled.shape: expected [256, 4], got [128, 4]"));
  EXPECT_THAT(BlockScalesGemmLayout(Context::Cpu(), ScaleCodes(2, 2, 0), false),
              HasError(kInvalid, "scale_inv.dtype: expected FLOAT32, got FLOAT8_E8M0"));
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
