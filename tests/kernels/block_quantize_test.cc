// Tests of kernels/block_quantize.h on the CPU, part 1: MXFP8 and FP8 block scaling
// against hand-computed codes and scales in both directions, and metadata errors.
// block_quantize_shapes_test.cc holds the per-block oracle over tail shapes, copy
// consistency, exact dequantization, the half-ulp bound and the cuBLASLt scale layouts.
//
// Hand vectors are laid along one row of a [1, n] tensor (rowwise copy) or down one
// column of an [n, 1] tensor (columnwise copy): either way the copy under test is the
// vector itself, so one expectation checks both directions.
#include "kernels/block_quantize.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
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
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::kInf;
using ::teserve::testing_kernels::kNaN;
using ::teserve::testing_kernels::ScaleCodes;
using ::teserve::testing_kernels::ScalesOf;
using ::testing::ElementsAreArray;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

// `v` padded with zeros to `n`, as [1, n] (rowwise) or [n, 1] (columnwise).
Tensor Along(Copy copy, std::vector<float> v, int64_t n) {
  v.resize(n, 0.0f);
  return Tensor::FromFloats(v, copy == Copy::kRowwise ? Shape{1, n} : Shape{n, 1}).value();
}

std::vector<uint8_t> Padded(std::vector<uint8_t> v, size_t n) {
  v.resize(n, 0);
  return v;
}

Mxfp8QuantizeOptions MxOptions(Copy copy, DType format = DType::kFloat8E4M3) {
  Mxfp8QuantizeOptions o;
  o.format = format;
  o.rowwise = copy == Copy::kRowwise;
  o.columnwise = copy == Copy::kColumnwise;
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

// The CUDA kernels themselves are tested against this reference in tests/gpu.
TEST(BlockQuantizeErrors, CudaTensorsNeedACudaContext) {
  float storage[32 * 32] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {32, 32}, Device::Cuda(0));
  EXPECT_THAT(QuantizeMxfp8(Context::Cpu(), x, MxOptions(Copy::kRowwise)),
              HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

#if !TESERVE_WITH_CUDA
TEST(BlockQuantizeErrors, CudaTensorsWithoutCudaBackendAreUnimplemented) {
  float storage[32 * 32] = {};
  Context cuda;
  cuda.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {32, 32}, Device::Cuda(0));
  EXPECT_THAT(QuantizeMxfp8(cuda, x, MxOptions(Copy::kRowwise)),
              HasError(absl::StatusCode::kUnimplemented,
                       "QuantizeMxfp8 has no kernel for cuda:0 (teserve was built without CUDA)"));
  EXPECT_THAT(QuantizeBlockScaling(cuda, x, {}),
              HasError(absl::StatusCode::kUnimplemented,
                       "QuantizeBlockScaling has no kernel for cuda:0 (teserve was built without CUDA)"));
}
#endif

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
  EXPECT_THAT(DequantizeBlock(Context::Cpu(), *q, Copy::kRowwise, DType::kFloat16),
              HasError(kInvalid, "out_dtype: expected FLOAT32 or BFLOAT16, got FLOAT16"));
}

// The BF16 output is Convert of the FP32 one, bit for bit (NaN and Inf blocks included).
TEST(DequantizeBlock, Bf16OutputIsTheRoundedFp32Output) {
  std::vector<float> values;
  for (int i = 0; i < 64 * 96; ++i) values.push_back(std::ldexp(static_cast<float>((i * 37) % 251) - 125.0f, (i % 40) - 20));
  values[5] = std::numeric_limits<float>::quiet_NaN();
  values[200] = std::numeric_limits<float>::infinity();
  const Tensor x = Tensor::FromFloats(values, {64, 96}).value();
  for (DType format : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    Mxfp8QuantizeOptions options;
    options.format = format;
    options.columnwise = true;
    const QuantizedTensor q = QuantizeMxfp8(Context::Cpu(), x, options).value();
    for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
      const Tensor fp32 = DequantizeBlock(Context::Cpu(), q, copy).value();
      const Tensor bf16 = DequantizeBlock(Context::Cpu(), q, copy, DType::kBFloat16).value();
      ASSERT_EQ(bf16.dtype(), DType::kBFloat16);
      ASSERT_EQ(bf16.shape(), fp32.shape());
      for (int64_t i = 0; i < fp32.numel(); ++i) {
        ASSERT_EQ(bf16.data<uint16_t>()[i], FloatToBf16(fp32.floats()[i])) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
