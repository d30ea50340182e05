// CUDA activations (kernels/cuda/activation_*) against the CPU reference on the same
// inputs, every activation kind.
//
// The contract tested (kernels/activation.h):
// - y, dx and dbias agree with the CPU within tests/kernels/tolerances.h, the relative
//   part taken on the forward-error scale of each value (the sum of the magnitudes of the
//   terms of its formula, evaluated in double; for dbias the sum of |dx| over the rows).
//   NaN must meet NaN and infinities must be equal.
// - FP8 codes: the kernel's codes are exactly encode(y * scale) of its own FP32 y (every
//   element; the columnwise copy is the transpose of the rowwise one; amax = max |y|
//   bitwise), so wherever the GPU's FP32 y equals the CPU's bit for bit the codes are the
//   CPU's. Where the two FP32 values differ (expf, FMA contraction) the codes may differ
//   by one code step at most; those elements are counted and reported.
// - y in BF16 / FP16 is the RNE narrowing of the same launch's FP32 y, bit for bit.
// - The FP32 entry points (ActivationForward / ActivationBackward) give the fused ones'
//   results on a CUDA device.
// - Direct launches write every output element (outputs poisoned first); the hardware and
//   codec FP8 encoders give the same codes, NaN and infinities included.
// The FusedActivationCpuTest cases check the CPU reference of the fused entry points and
// the argument checks; they run in every build, with or without a GPU. This file: CPU
// reference, forward, edges and errors; activation_launch_gpu_test.cc: backward and direct
// launches; shared helpers and cases: activation_gpu_test_util.h.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cpu/cast_cpu.h"
#include "tests/gpu/activation/activation_gpu_test_util.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/quantized_tensor.h"
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace activation_gpu_test {
namespace {

// ---------------------------------------------------------------------------------------
// The CPU reference of the fused entry points and their argument checks (every build).

kernels::ActivationParams DefaultParams() { return kernels::ActivationParams(); }

// BF16 x of uniforms in [-6, 6) (2 rows of 8 values per row group), widened exactly.
Tensor CpuInput(int64_t rows, int64_t cols, DType dtype) {
  Tensor x = Tensor::Zeros(DType::kFloat32, {rows, cols}).value();
  for (int64_t i = 0; i < rows * cols; ++i) {
    x.data<float>()[i] = static_cast<float>(((i * 2654435761u) % 1200) / 100.0 - 6.0);
  }
  if (dtype == DType::kFloat32) return x;
  return kernels::cpu::CastFromFloat32(Context::Cpu(), x, dtype).value();
}

TEST(FusedActivationCpuTest, ForwardQuantizesTheFp32OutputOfTheWidenedInput) {
  const Tensor x = CpuInput(5, 2 * 37, DType::kBFloat16);
  kernels::ActivationForwardOptions options;
  options.quantize = true;
  options.quantize_options.format = DType::kFloat8E4M3;
  options.quantize_options.scale = 64.0f;
  options.quantize_options.columnwise = true;
  auto fused = kernels::FusedActivationForward(Context::Cpu(), kernels::Activation::kSwiglu, DefaultParams(), x,
                                               options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  auto x32 = kernels::cpu::ToFloat32(Context::Cpu(), x);
  ASSERT_TRUE(x32.ok());
  auto y32 = kernels::ActivationForward(Context::Cpu(), kernels::Activation::kSwiglu, DefaultParams(), *x32);
  ASSERT_TRUE(y32.ok()) << y32.status();
  ASSERT_EQ(fused->y.dtype(), DType::kBFloat16);
  ASSERT_EQ(fused->y.shape(), (Shape{5, 37}));
  float amax = 0.0f;
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t j = 0; j < 37; ++j) {
      const float v = y32->data<float>()[r * 37 + j];
      amax = std::max(amax, std::fabs(v));
      EXPECT_EQ(fused->y.data<uint16_t>()[r * 37 + j], FloatToBf16(v)) << r << "," << j;
      const uint8_t code = FloatToE4M3(v * 64.0f);
      EXPECT_EQ(fused->fp8.rowwise_data.data<uint8_t>()[r * 37 + j], code) << r << "," << j;
      EXPECT_EQ(fused->fp8.columnwise_data.data<uint8_t>()[j * 5 + r], code) << r << "," << j;
    }
  }
  EXPECT_EQ(fused->fp8.amax, amax);
  EXPECT_EQ(fused->fp8.rowwise_scale_inv.data<float>()[0], 1.0f / 64.0f);
  EXPECT_EQ(fused->fp8.columnwise_data.shape(), (Shape{37, 5}));
}

TEST(FusedActivationCpuTest, BackwardDbiasIsTheColumnSumOfDx) {
  const Tensor x = CpuInput(9, 2 * 11, DType::kFloat32);
  const Tensor dy = CpuInput(9, 11, DType::kFloat32);
  kernels::ActivationBackwardOptions options;
  options.compute_dbias = true;
  const kernels::ActivationParams params = DefaultParams();
  auto fused = kernels::FusedActivationBackward(Context::Cpu(), kernels::Activation::kClampedSwiglu, params, dy, x,
                                                options);
  ASSERT_TRUE(fused.ok()) << fused.status();
  auto dx = kernels::ActivationBackward(Context::Cpu(), kernels::Activation::kClampedSwiglu, params, dy, x);
  ASSERT_TRUE(dx.ok()) << dx.status();
  ASSERT_EQ(fused->dbias.shape(), (Shape{22}));
  for (int64_t j = 0; j < 22; ++j) {
    double sum = 0.0;
    for (int64_t r = 0; r < 9; ++r) {
      EXPECT_EQ(fused->dx.data<float>()[r * 22 + j], dx->data<float>()[r * 22 + j]);
      sum += dx->data<float>()[r * 22 + j];
    }
    EXPECT_EQ(fused->dbias.data<float>()[j], static_cast<float>(sum)) << j;
  }
  auto no_dbias = kernels::FusedActivationBackward(Context::Cpu(), kernels::Activation::kClampedSwiglu, params, dy, x,
                                                   kernels::ActivationBackwardOptions());
  ASSERT_TRUE(no_dbias.ok());
  EXPECT_FALSE(no_dbias->dbias.defined());
}

// Each bad argument is INVALID_ARGUMENT naming its field.
TEST(FusedActivationCpuTest, RejectsBadArgumentsNamingTheField) {
  const Context cpu = Context::Cpu();
  const kernels::ActivationParams params = DefaultParams();
  const Tensor x = CpuInput(3, 8, DType::kBFloat16);
  auto expect_error = [](const absl::Status& status, const std::string& field) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(field), std::string::npos) << status;
  };
  kernels::ActivationForwardOptions nothing;
  nothing.write_y = false;
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGelu, params, x, nothing).status(),
               "options.write_y");
  kernels::ActivationForwardOptions int_y;
  int_y.y_dtype = DType::kInt32;
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGelu, params, x, int_y).status(),
               "options.y_dtype");
  kernels::ActivationForwardOptions bad_format;
  bad_format.quantize = true;
  bad_format.quantize_options.format = DType::kFloat32;
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGelu, params, x, bad_format).status(),
               "options.quantize_options.format");
  kernels::ActivationForwardOptions zero_scale;
  zero_scale.quantize = true;
  zero_scale.quantize_options.scale = 0.0f;
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGelu, params, x, zero_scale).status(),
               "options.quantize_options.scale");
  const Tensor ints = Tensor::Zeros(DType::kInt32, {3, 8}).value();
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGelu, params, ints,
                                               kernels::ActivationForwardOptions())
                   .status(),
               "x.dtype");
  const Tensor odd = CpuInput(3, 7, DType::kFloat32);
  expect_error(kernels::FusedActivationForward(cpu, kernels::Activation::kGeglu, params, odd,
                                               kernels::ActivationForwardOptions())
                   .status(),
               "x.shape");
  const Tensor dy_fp32 = CpuInput(3, 8, DType::kFloat32);
  expect_error(kernels::FusedActivationBackward(cpu, kernels::Activation::kGelu, params, dy_fp32, x,
                                                kernels::ActivationBackwardOptions())
                   .status(),
               "dy");
  const Tensor dy_wide = CpuInput(3, 8, DType::kBFloat16);
  expect_error(kernels::FusedActivationBackward(cpu, kernels::Activation::kSwiglu, params, dy_wide, x,
                                                kernels::ActivationBackwardOptions())
                   .status(),
               "dy");
}

#if TESERVE_WITH_CUDA

// ---------------------------------------------------------------------------------------
// Forward.

// Checks a fused GPU forward (FP32 y, both FP8 copies) against the CPU on the same input.
void CheckForward(const Case& c, bool specials) {
  const int64_t in_cols = InputWidth(c);
  const Tensor host_x = MakeInput(c.dtype, c.rows, in_cols, SeedOf(c), specials);
  const Tensor x = OnDevice(host_x);
  ActivationForwardOptions options;
  options.y_dtype = DType::kFloat32;
  options.quantize = true;
  options.quantize_options.format = c.format;
  options.quantize_options.scale = kScale;
  options.quantize_options.rowwise = true;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult gpu,
                       kernels::FusedActivationForward(GpuContext(), c.kind, kParams, x, options));
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult cpu,
                       kernels::FusedActivationForward(Context::Cpu(), c.kind, kParams, host_x, options));
  const std::vector<float> gpu_y = Floats(gpu.y);
  const std::vector<float> cpu_y = Floats(cpu.y);
  std::vector<double> y_scale;
  Scales(c.kind, Floats(host_x), nullptr, c.rows, c.k, &y_scale, nullptr);
  ExpectClose(gpu_y, cpu_y, y_scale, DType::kFloat32, "y");

  const std::vector<uint8_t> gpu_row = Bytes(gpu.fp8.rowwise_data);
  const std::vector<uint8_t> gpu_col = Bytes(gpu.fp8.columnwise_data);
  const std::vector<uint8_t> cpu_row = Bytes(cpu.fp8.rowwise_data);
  const std::vector<uint8_t> cpu_col = Bytes(cpu.fp8.columnwise_data);
  ASSERT_EQ(gpu_row.size(), static_cast<size_t>(c.rows * c.k));
  ASSERT_EQ(gpu_col.size(), gpu_row.size());
  int64_t not_own = 0, not_transposed = 0, same_value_differs = 0, more_than_one_step = 0, value_differs = 0;
  int64_t first_bad = -1;
  uint32_t own_max = 0;
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < c.k; ++j) {
      const int64_t i = r * c.k + j;
      const float gy = gpu_y[i];
      own_max = std::max(own_max, Bits(gy) & 0x7FFFFFFFu);
      if (gpu_row[i] != Encode(c.format, gy * kScale)) {
        ++not_own;
        if (first_bad < 0) first_bad = i;
      }
      const bool same = Bits(gy) == Bits(cpu_y[i]) || (std::isnan(gy) && std::isnan(cpu_y[i]));
      if (same) {
        if (gpu_row[i] != cpu_row[i]) ++same_value_differs;
      } else {
        ++value_differs;
        if (std::abs(Ordinal(gpu_row[i]) - Ordinal(cpu_row[i])) > 1) ++more_than_one_step;
      }
    }
  }
  // Transposes, checked in 64x64 tiles (cache-friendly on the 134M-element shapes).
  int64_t cpu_not_transposed = 0;
  for (int64_t r0 = 0; r0 < c.rows; r0 += 64) {
    for (int64_t j0 = 0; j0 < c.k; j0 += 64) {
      for (int64_t j = j0; j < std::min(c.k, j0 + 64); ++j) {
        for (int64_t r = r0; r < std::min(c.rows, r0 + 64); ++r) {
          not_transposed += gpu_col[j * c.rows + r] != gpu_row[r * c.k + j] ? 1 : 0;
          cpu_not_transposed += cpu_col[j * c.rows + r] != cpu_row[r * c.k + j] ? 1 : 0;
        }
      }
    }
  }
  ASSERT_EQ(cpu_not_transposed, 0) << "CPU reference columnwise copy";
  EXPECT_EQ(not_own, 0) << "codes that are not encode(gpu y * scale); first at " << first_bad;
  EXPECT_EQ(not_transposed, 0) << "columnwise codes that are not the rowwise transposed";
  EXPECT_EQ(same_value_differs, 0) << "codes differing from the CPU's where the FP32 y agrees";
  EXPECT_EQ(more_than_one_step, 0) << "codes more than one step from the CPU's";
  if (c.rows * c.k >= (int64_t{1} << 20)) {
    std::printf("  %s: FP32 y differs from the CPU's in %lld of %lld elements\n",
                CaseName(::testing::TestParamInfo<Case>(c, 0)).c_str(), static_cast<long long>(value_differs),
                static_cast<long long>(c.rows * c.k));
  }

  // amax: max |y| of the GPU's own FP32 y, bitwise (NaN as NaN), and close to the CPU's.
  if (own_max > 0x7F800000u) {
    EXPECT_TRUE(std::isnan(gpu.fp8.amax)) << gpu.fp8.amax;
  } else {
    EXPECT_EQ(Bits(gpu.fp8.amax), own_max) << gpu.fp8.amax;
  }
  ExpectClose({gpu.fp8.amax}, {cpu.fp8.amax}, {}, DType::kFloat32, "amax");
  EXPECT_EQ(Bits(Floats(gpu.fp8.rowwise_scale_inv)[0]), Bits(1.0f / kScale));
  EXPECT_EQ(Bits(Floats(gpu.fp8.columnwise_scale_inv)[0]), Bits(1.0f / kScale));
  EXPECT_EQ(gpu.fp8.format, c.format);
  EXPECT_EQ(gpu.fp8.shape, (Shape{c.rows, c.k}));
}

class ActivationForwardGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationForwardGpuTest, MatchesCpuAndQuantizesItsOwnFp32Output) { CheckForward(GetParam(), false); }

TEST_P(ActivationForwardGpuTest, NanAndInfinityInputsMatchCpu) { CheckForward(GetParam(), true); }

// y in x's dtype (the default) and an FP8-only run give the FP32 run's values narrowed,
// and the same codes.
TEST_P(ActivationForwardGpuTest, YDtypeAndFp8OnlyVariantsAgreeWithTheFp32Run) {
  const Case& c = GetParam();
  const Tensor host_x = MakeInput(c.dtype, c.rows, InputWidth(c), SeedOf(c), false);
  const Tensor x = OnDevice(host_x);
  ActivationForwardOptions fp32;
  fp32.y_dtype = DType::kFloat32;
  fp32.quantize = true;
  fp32.quantize_options.format = c.format;
  fp32.quantize_options.scale = kScale;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult wide,
                       kernels::FusedActivationForward(GpuContext(), c.kind, kParams, x, fp32));
  ActivationForwardOptions native = fp32;
  native.y_dtype.reset();
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult narrow,
                       kernels::FusedActivationForward(GpuContext(), c.kind, kParams, x, native));
  ActivationForwardOptions fp8_only = fp32;
  fp8_only.write_y = false;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult codes_only,
                       kernels::FusedActivationForward(GpuContext(), c.kind, kParams, x, fp8_only));
  ASSERT_EQ(narrow.y.dtype(), c.dtype);
  EXPECT_FALSE(codes_only.y.defined());
  EXPECT_FALSE(codes_only.fp8.columnwise_data.defined());

  ASSERT_OK_AND_ASSIGN(const Tensor expected,
                       kernels::cpu::CastFromFloat32(Context::Cpu(), OnHost(wide.y), c.dtype));
  const std::vector<uint8_t> want = Bytes(expected);
  const std::vector<uint8_t> got = Bytes(narrow.y);
  int64_t differing = 0;
  for (size_t i = 0; i < want.size(); ++i) differing += want[i] != got[i] ? 1 : 0;
  EXPECT_EQ(differing, 0) << "bytes of y in " << DTypeName(c.dtype) << " differ from the FP32 run narrowed";
  EXPECT_EQ(Bytes(narrow.fp8.rowwise_data), Bytes(wide.fp8.rowwise_data));
  EXPECT_EQ(Bytes(codes_only.fp8.rowwise_data), Bytes(wide.fp8.rowwise_data));
  EXPECT_EQ(Bits(codes_only.fp8.amax), Bits(wide.fp8.amax));
}

// The FP32 entry point on a CUDA device returns the fused entry point's y.
TEST_P(ActivationForwardGpuTest, Fp32EntryPointDispatchesToCuda) {
  const Case& c = GetParam();
  if (c.dtype != DType::kFloat32) GTEST_SKIP() << "FP32 entry point takes FP32 x";
  const Tensor x = OnDevice(MakeInput(c.dtype, c.rows, InputWidth(c), SeedOf(c), false));
  ASSERT_OK_AND_ASSIGN(const Tensor y, kernels::ActivationForward(GpuContext(), c.kind, kParams, x));
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult fused,
                       kernels::FusedActivationForward(GpuContext(), c.kind, kParams, x, ActivationForwardOptions()));
  EXPECT_EQ(y.device(), kGpu);
  EXPECT_EQ(Bytes(y), Bytes(fused.y));
}

INSTANTIATE_TEST_SUITE_P(Small, ActivationForwardGpuTest, ::testing::ValuesIn(SmallCases()), CaseName);
INSTANTIATE_TEST_SUITE_P(Tiled, ActivationForwardGpuTest, ::testing::ValuesIn(TiledCases()), CaseName);

class ActivationForwardLargeGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationForwardLargeGpuTest, MatchesCpuAndQuantizesItsOwnFp32Output) { CheckForward(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Large, ActivationForwardLargeGpuTest, ::testing::ValuesIn(LargeForwardCases()), CaseName);

// No rows: empty outputs, amax 0, scale_inv written, dbias all zeros.
TEST(ActivationGpuEdgeTest, ZeroRows) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor x = OnDevice(Tensor::Zeros(DType::kBFloat16, {0, 2 * 24}).value());
  const Tensor dy = OnDevice(Tensor::Zeros(DType::kBFloat16, {0, 24}).value());
  ActivationForwardOptions options;
  options.quantize = true;
  options.quantize_options.scale = 4.0f;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult fwd,
                       kernels::FusedActivationForward(GpuContext(), Activation::kSwiglu, kParams, x, options));
  EXPECT_EQ(fwd.y.shape(), (Shape{0, 24}));
  EXPECT_EQ(fwd.fp8.columnwise_data.shape(), (Shape{24, 0}));
  EXPECT_EQ(fwd.fp8.amax, 0.0f);
  EXPECT_EQ(Floats(fwd.fp8.rowwise_scale_inv)[0], 0.25f);
  ActivationBackwardOptions bwd;
  bwd.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult grad,
                       kernels::FusedActivationBackward(GpuContext(), Activation::kSwiglu, kParams, dy, x, bwd));
  EXPECT_EQ(grad.dx.shape(), (Shape{0, 48}));
  const std::vector<float> dbias = Floats(grad.dbias);
  ASSERT_EQ(dbias.size(), 48u);
  for (float v : dbias) EXPECT_EQ(Bits(v), 0u);
}

// ---------------------------------------------------------------------------------------
// Errors on a CUDA device.

TEST(ActivationGpuErrorsTest, RejectsMixedDevicesAndBadOptions) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor x = OnDevice(MakeInput(DType::kFloat32, 4, 8, 1, false));
  const Tensor host_dy = MakeInput(DType::kFloat32, 4, 8, 2, false);
  auto mixed = kernels::FusedActivationBackward(GpuContext(), Activation::kGelu, kParams, host_dy, x,
                                                ActivationBackwardOptions());
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument) << mixed.status();
  ActivationForwardOptions options;
  options.write_y = false;
  auto nothing = kernels::FusedActivationForward(GpuContext(), Activation::kGelu, kParams, x, options);
  EXPECT_EQ(nothing.status().code(), absl::StatusCode::kInvalidArgument) << nothing.status();
  EXPECT_NE(nothing.status().message().find("options.write_y"), std::string::npos) << nothing.status();
}

#else

TEST(ActivationGpuTest, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

// Without the CUDA backend a CUDA context is refused, not crashed on.
TEST(FusedActivationCpuTest, CudaContextWithoutCudaBackendIsUnimplemented) {
  Context ctx;
  ctx.device = Device::Cuda(0);
  float storage[8] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {2, 4}, Device::Cuda(0));
  auto fused = kernels::FusedActivationForward(ctx, kernels::Activation::kGelu, kernels::ActivationParams(), x,
                                               kernels::ActivationForwardOptions());
  EXPECT_EQ(fused.status().code(), absl::StatusCode::kUnimplemented) << fused.status();
  EXPECT_NE(fused.status().message().find("FusedActivationForward has no kernel for cuda:0 (teserve was built without CUDA)"),
            std::string::npos);
  auto plain = kernels::ActivationBackward(ctx, kernels::Activation::kGelu, kernels::ActivationParams(), x, x);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kUnimplemented) << plain.status();
  EXPECT_NE(plain.status().message().find("ActivationBackward has no kernel for cuda:0"), std::string::npos);
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace activation_gpu_test
}  // namespace teserve
