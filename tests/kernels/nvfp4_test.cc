// Tests of kernels/nvfp4.h on the CPU: hand-computed NVFP4 codes and scales (zero
// blocks, outliers, rounding of the block scale, NaN/Inf, -0, tiny amax), packing order,
// copy consistency (1D and 2D), exact dequantization and metadata errors. The random
// Hadamard transform and stochastic rounding are in nvfp4_gradient_test.cc.
#include "kernels/nvfp4.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "core/float_codec.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/hadamard.h"
#include "tests/kernels/nvfp4_test_util.h"
#include "tests/kernels/quantize_test_util.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::BandedTensor;
using ::teserve::testing_kernels::Bits;
using ::teserve::testing_kernels::Bytes;
using ::teserve::testing_kernels::Dequantized;
using ::teserve::testing_kernels::ExpectMatchesFormula;
using ::teserve::testing_kernels::HasError;
using ::teserve::testing_kernels::kInf;
using ::teserve::testing_kernels::kNaN;
using ::teserve::testing_kernels::Matrix;
using ::teserve::testing_kernels::Nibble;
using ::teserve::testing_kernels::Options;
using ::teserve::testing_kernels::Quantize;
using ::teserve::testing_kernels::Transposed;
using ::testing::ElementsAreArray;

constexpr absl::StatusCode kInvalid = absl::StatusCode::kInvalidArgument;

std::vector<uint8_t> Codes(const Tensor& packed) {
  std::vector<uint8_t> codes(packed.numel());
  for (int64_t i = 0; i < packed.numel(); ++i) codes[i] = Nibble(packed, i);
  return codes;
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

// The BF16 output is Convert of the FP32 one, bit for bit; other dtypes are refused.
TEST(DequantizeNvfp4, Bf16OutputIsTheRoundedFp32Output) {
  const Tensor x = BandedTensor(48, 64, 11u);
  for (bool two_d : {false, true}) {
    const QuantizedTensor q = Quantize(x, Options(true, true, two_d));
    for (Copy copy : {Copy::kRowwise, Copy::kColumnwise}) {
      const Tensor fp32 = Dequantized(q, copy);
      const Tensor bf16 = DequantizeNvfp4(Context::Cpu(), q, copy, DType::kBFloat16).value();
      ASSERT_EQ(bf16.dtype(), DType::kBFloat16);
      for (int64_t i = 0; i < fp32.numel(); ++i) {
        ASSERT_EQ(bf16.data<uint16_t>()[i], FloatToBf16(fp32.floats()[i])) << "element " << i;
      }
    }
    EXPECT_THAT(DequantizeNvfp4(Context::Cpu(), q, Copy::kRowwise, DType::kFloat8E4M3),
                HasError(absl::StatusCode::kInvalidArgument, "out_dtype: expected FLOAT32 or BFLOAT16"));
  }
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

// The CUDA kernels themselves are tested against this reference in tests/gpu.
TEST(Nvfp4Errors, CudaTensorsNeedACudaContext) {
  float storage[256] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {16, 16}, Device::Cuda(0));
  EXPECT_THAT(QuantizeNvfp4(Context::Cpu(), x, Options(true, false)),
              HasError(kInvalid, "x.device: expected cpu, got cuda:0"));
}

#if !TESERVE_WITH_CUDA
TEST(Nvfp4Errors, CudaTensorsWithoutCudaBackendAreUnimplemented) {
  float storage[256] = {};
  Context ctx;
  ctx.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {16, 16}, Device::Cuda(0));
  EXPECT_THAT(QuantizeNvfp4(ctx, x, Options(true, false)),
              HasError(absl::StatusCode::kUnimplemented,
                       "QuantizeNvfp4 has no kernel for cuda:0 (teserve was built without CUDA)"));
  EXPECT_THAT(ApplyHadamard16(ctx, x),
              HasError(absl::StatusCode::kUnimplemented,
                       "ApplyHadamard16 has no kernel for cuda:0 (teserve was built without CUDA)"));
}
#endif

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
