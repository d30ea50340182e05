// Tests of kernels/block_quantize.h on the CPU, part 2: MXFP8 and FP8 block scaling
// over shapes (tails included) against an independent per-block oracle, the contract's
// scale shapes, rowwise/columnwise consistency, exact dequantization and the half-ulp
// error bound; then the cuBLASLt scale layouts (MXFP8 swizzle, block-scaling GEMM
// layouts) and their metadata errors. Hand vectors are in block_quantize_test.cc.
#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "tests/kernels/block_quantize_test_util.h"
#include "tests/kernels/quantize_test_util.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::Bits;
using ::teserve::testing_kernels::BlockOptions;
using ::teserve::testing_kernels::Bytes;
using ::teserve::testing_kernels::CopyName;
using ::teserve::testing_kernels::DataOf;
using ::teserve::testing_kernels::Floats;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomFloats;
using ::teserve::testing_kernels::ScaleCodes;
using ::teserve::testing_kernels::ScalesOf;
using ::teserve::testing_kernels::Transposed;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

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
