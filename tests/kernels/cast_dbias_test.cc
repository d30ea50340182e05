// Tests of the optional fused dbias (column sums of x) of QuantizePerTensor
// (kernels/cast.h), QuantizeMxfp8 and QuantizeBlockScaling (kernels/block_quantize.h) on
// the CPU: against an independent FP64 column sum within the FP32 reduction tolerance,
// exactly on sums that FP32 represents, NaN/Inf propagation, empty inputs, unchanged
// quantized outputs, and the metadata errors naming options.dbias.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"
#include "tests/kernels/test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::AllClose;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::RandomTensor;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

enum class Recipe { kPerTensor, kMxfp8, kBlock1D, kBlock2D };

const char* RecipeName(Recipe r) {
  switch (r) {
    case Recipe::kPerTensor: return "PerTensor";
    case Recipe::kMxfp8: return "Mxfp8";
    case Recipe::kBlock1D: return "Block1D";
    case Recipe::kBlock2D: return "Block2D";
  }
  return "?";
}

// Quantizes x with `recipe` (both copies, E4M3), writing the column sums to `dbias`
// when it is not null.
absl::StatusOr<QuantizedTensor> QuantizeWith(Recipe recipe, const Tensor& x, Tensor* dbias,
                                             const Context& ctx = Context::Cpu()) {
  switch (recipe) {
    case Recipe::kPerTensor: {
      PerTensorQuantizeOptions o;
      o.scale = 3.0f;
      o.columnwise = true;
      o.dbias = dbias;
      return QuantizePerTensor(ctx, x, o);
    }
    case Recipe::kMxfp8: {
      Mxfp8QuantizeOptions o;
      o.columnwise = true;
      o.dbias = dbias;
      return QuantizeMxfp8(ctx, x, o);
    }
    case Recipe::kBlock1D:
    case Recipe::kBlock2D: {
      BlockScalingQuantizeOptions o;
      o.columnwise = true;
      o.two_d = recipe == Recipe::kBlock2D;
      o.dbias = dbias;
      return QuantizeBlockScaling(ctx, x, o);
    }
  }
  return absl::InternalError("unknown recipe");
}

// Column sums of x in FP64, walking each column top to bottom, and sum |x| per column
// (the magnitude the reduction tolerance scales with).
struct Fp64ColumnSums {
  std::vector<double> sum;
  std::vector<double> abs_sum;
};

Fp64ColumnSums ReferenceSums(const Tensor& x) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  const float* v = x.data<float>();
  Fp64ColumnSums ref{std::vector<double>(cols, 0.0), std::vector<double>(cols, 0.0)};
  for (int64_t c = 0; c < cols; ++c) {
    for (int64_t r = 0; r < rows; ++r) {
      ref.sum[c] += v[r * cols + c];
      ref.abs_sum[c] += std::fabs(v[r * cols + c]);
    }
  }
  return ref;
}

// A dbias tensor pre-filled with a value no test expects, so unwritten entries show.
Tensor PoisonedDbias(int64_t cols) {
  Tensor t = Tensor::Zeros(DType::kFloat32, {cols}).value();
  for (int64_t c = 0; c < cols; ++c) t.data<float>()[c] = -12345.0f;
  return t;
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  if (!t.defined()) return {};
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.nbytes());
}

struct DbiasCase {
  Recipe recipe;
  int64_t rows;
  int64_t cols;
};

std::string CaseName(const ::testing::TestParamInfo<DbiasCase>& info) {
  return absl::StrCat(RecipeName(info.param.recipe), "_", info.param.rows, "x", info.param.cols);
}

class QuantizeDbias : public ::testing::TestWithParam<DbiasCase> {};

TEST_P(QuantizeDbias, MatchesAnFp64ColumnSum) {
  const DbiasCase& c = GetParam();
  const Tensor x = RandomTensor({c.rows, c.cols}, -3.0f, 5.0f, 7u + c.rows * 31 + c.cols);
  Tensor dbias = PoisonedDbias(c.cols);
  ASSERT_TRUE(QuantizeWith(c.recipe, x, &dbias).ok());
  EXPECT_EQ(dbias.shape(), (Shape{c.cols}));
  const Fp64ColumnSums ref = ReferenceSums(x);
  EXPECT_TRUE(AllClose(dbias.floats(), ref.sum, DType::kFloat32, ref.abs_sum));
}

TEST_P(QuantizeDbias, IsExactWhenEverySumIsRepresentable) {
  // Small integers: every partial sum is an exact FP32 integer, so the column sum is
  // known in closed form: sum_r (r % 7 - 3) + c * rows.
  const DbiasCase& c = GetParam();
  std::vector<float> values(c.rows * c.cols);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t col = 0; col < c.cols; ++col) {
      values[r * c.cols + col] = static_cast<float>(r % 7 - 3 + col);
    }
  }
  const Tensor x = Tensor::FromFloats(values, {c.rows, c.cols}).value();
  Tensor dbias = PoisonedDbias(c.cols);
  ASSERT_TRUE(QuantizeWith(c.recipe, x, &dbias).ok());
  double row_part = 0.0;
  for (int64_t r = 0; r < c.rows; ++r) row_part += r % 7 - 3;
  for (int64_t col = 0; col < c.cols; ++col) {
    EXPECT_EQ(dbias.data<float>()[col], static_cast<float>(row_part + col * c.rows)) << col;
  }
}

TEST_P(QuantizeDbias, LeavesTheQuantizedCopiesUnchanged) {
  const DbiasCase& c = GetParam();
  const Tensor x = RandomTensor({c.rows, c.cols}, -40.0f, 40.0f, 99u + c.cols);
  Tensor dbias = PoisonedDbias(c.cols);
  const auto with_or = QuantizeWith(c.recipe, x, &dbias);
  const auto without_or = QuantizeWith(c.recipe, x, nullptr);
  ASSERT_TRUE(with_or.ok()) << with_or.status();
  ASSERT_TRUE(without_or.ok()) << without_or.status();
  const QuantizedTensor& with = *with_or;
  const QuantizedTensor& without = *without_or;
  EXPECT_EQ(Bytes(with.rowwise_data), Bytes(without.rowwise_data));
  EXPECT_EQ(Bytes(with.columnwise_data), Bytes(without.columnwise_data));
  EXPECT_EQ(Bytes(with.rowwise_scale_inv), Bytes(without.rowwise_scale_inv));
  EXPECT_EQ(Bytes(with.columnwise_scale_inv), Bytes(without.columnwise_scale_inv));
  EXPECT_EQ(with.amax, without.amax);
  EXPECT_NE(Bytes(with.rowwise_data), std::vector<uint8_t>(with.rowwise_data.nbytes(), 0));
}

TEST_P(QuantizeDbias, NanAndInfPropagateToTheirColumnsOnly) {
  const DbiasCase& c = GetParam();
  if (c.cols < 3) GTEST_SKIP() << "needs three columns";
  Tensor x = RandomTensor({c.rows, c.cols}, -1.0f, 1.0f, 5u);
  float* v = x.data<float>();
  const int64_t last = c.rows - 1;
  v[last * c.cols + 0] = kNaN;  // column 0: NaN
  v[0 * c.cols + 1] = kInf;     // column 1: +Inf (and -Inf too when there are two rows)
  if (c.rows > 1) v[last * c.cols + 1] = -kInf;
  v[last * c.cols + 2] = -kInf;  // column 2: -Inf
  Tensor dbias = PoisonedDbias(c.cols);
  ASSERT_TRUE(QuantizeWith(c.recipe, x, &dbias).ok());
  const float* d = dbias.data<float>();
  EXPECT_TRUE(std::isnan(d[0])) << d[0];
  if (c.rows > 1) {
    EXPECT_TRUE(std::isnan(d[1])) << "Inf + -Inf gives NaN, got " << d[1];
  } else {
    EXPECT_EQ(d[1], kInf);
  }
  EXPECT_EQ(d[2], -kInf);
  const Fp64ColumnSums ref = ReferenceSums(x);
  for (int64_t col = 3; col < c.cols; ++col) {
    EXPECT_TRUE(std::isfinite(d[col])) << col;
    EXPECT_NEAR(d[col], ref.sum[col], 1e-6 + 5e-6 * ref.abs_sum[col]) << col;
  }
}

// Per-tensor and 1x128/128x128 block scaling allow every shape (one row, tails);
// MXFP8 needs both dims divisible by 32 for the two copies.
INSTANTIATE_TEST_SUITE_P(
    Kernels, QuantizeDbias,
    ::testing::Values(DbiasCase{Recipe::kPerTensor, 1, 259}, DbiasCase{Recipe::kPerTensor, 257, 259},
                      DbiasCase{Recipe::kPerTensor, 128, 129}, DbiasCase{Recipe::kPerTensor, 1000, 3},
                      DbiasCase{Recipe::kBlock1D, 1, 259}, DbiasCase{Recipe::kBlock1D, 257, 259},
                      DbiasCase{Recipe::kBlock1D, 128, 129}, DbiasCase{Recipe::kBlock2D, 1, 259},
                      DbiasCase{Recipe::kBlock2D, 257, 259}, DbiasCase{Recipe::kBlock2D, 128, 129},
                      DbiasCase{Recipe::kMxfp8, 32, 32}, DbiasCase{Recipe::kMxfp8, 96, 160},
                      DbiasCase{Recipe::kMxfp8, 320, 64}),
    CaseName);

class QuantizeDbiasRecipes : public ::testing::TestWithParam<Recipe> {};

std::string RecipeCaseName(const ::testing::TestParamInfo<Recipe>& info) {
  return RecipeName(info.param);
}

TEST_P(QuantizeDbiasRecipes, NoRowsGivesZeros) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {0, 64}).value();
  Tensor dbias = PoisonedDbias(64);
  const auto q = QuantizeWith(GetParam(), x, &dbias);
  ASSERT_TRUE(q.ok()) << q.status();
  for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(dbias.data<float>()[c], 0.0f) << c;
}

TEST_P(QuantizeDbiasRecipes, RejectsWrongDbiasNamingTheField) {
  const Tensor x = Tensor::Zeros(DType::kFloat32, {32, 64}).value();
  Tensor wrong_shape = Tensor::Zeros(DType::kFloat32, {32}).value();
  EXPECT_THAT(QuantizeWith(GetParam(), x, &wrong_shape),
              HasError(kInvalid, "options.dbias.shape: expected [64], got [32]"));
  Tensor rank2 = Tensor::Zeros(DType::kFloat32, {1, 64}).value();
  EXPECT_THAT(QuantizeWith(GetParam(), x, &rank2), HasError(kInvalid, "options.dbias.shape"));
  Tensor wrong_dtype = Tensor::Zeros(DType::kBFloat16, {64}).value();
  EXPECT_THAT(QuantizeWith(GetParam(), x, &wrong_dtype),
              HasError(kInvalid, "options.dbias.dtype: expected FLOAT32, got BFLOAT16"));
  Tensor undefined;
  EXPECT_THAT(QuantizeWith(GetParam(), x, &undefined),
              HasError(kInvalid, "options.dbias: expected a tensor, got an undefined"));
  float storage[64] = {};
  Tensor on_gpu = Tensor::Borrow(storage, DType::kFloat32, {64}, Device::Cuda(0));
  EXPECT_THAT(QuantizeWith(GetParam(), x, &on_gpu),
              HasError(kInvalid, "options.dbias.device: expected cpu, got cuda:0"));
}

INSTANTIATE_TEST_SUITE_P(Kernels, QuantizeDbiasRecipes,
                         ::testing::Values(Recipe::kPerTensor, Recipe::kMxfp8, Recipe::kBlock1D,
                                           Recipe::kBlock2D),
                         RecipeCaseName);

// The CUDA block kernels fuse dbias: tests/gpu/block_quantize_dbias_gpu_test.

}  // namespace
}  // namespace kernels
}  // namespace teserve
