// CUDA LayerNorm / RMSNorm forward (kernels/cuda/normalization_*) against the CPU
// reference on the same inputs, and the FP8 encoder check.
//
// The contract tested (kernels/normalization.h):
// - y, mu, rsigma, dx, dgamma, dbeta agree with the CPU within tests/kernels/tolerances.h,
//   the relative part taken on the forward-error scale of each value (the sum of the
//   magnitudes that went into it).
// - FP8 codes: the kernel's codes are exactly encode(y * scale) of its own FP32 y (every
//   element, both copies, amax = max |y| bitwise), so wherever the GPU's FP32 y equals
//   the CPU's bit for bit the codes are equal. Where the two FP32 values differ (an ulp,
//   from different summation orders) the codes may differ, by one code step at most;
//   those elements are counted and reported, and must be a small fraction.
// - Every output element is written (outputs poisoned before a direct launch).
// - The hardware FP8 conversion the kernels use equals core/float_codec.h for every FP32
//   bit pattern, both formats.
// - Both forward kernels (register tile and shared-memory tile) are exercised: the
//   shapes say which one a case reaches (NormForwardPlan::register_tile).
// Backward, sm_margin and the FP32 entry points: normalization_backward_gpu_test.cc.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "kernels/normalization.h"
#include "tests/gpu/normalization/normalization_gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::NormForwardOptions;
using kernels::NormForwardResult;
using kernels::NormType;
using testing_kernels::AllClose;

const Device kGpu = Device::Cuda(0);

using testing::Bytes;
using testing::Floats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::Uniform;
using norm_gpu_test::AsDoubles;
using norm_gpu_test::BackwardScales;
using norm_gpu_test::Bits;
using norm_gpu_test::DeviceAlloc;
using norm_gpu_test::Encode;
using norm_gpu_test::ForwardScale;
using norm_gpu_test::Ordinal;
using norm_gpu_test::RandomInput;
using norm_gpu_test::RandomVector;
using norm_gpu_test::ShapeName;

// ---------------------------------------------------------------------------------------
// The hardware encoder equals the codec everywhere.

class Fp8EncoderTest : public ::testing::TestWithParam<kernels::cuda::Fp8Format> {};

TEST_P(Fp8EncoderTest, HardwareConversionMatchesCodecForEveryFp32Pattern) {
  TESERVE_SKIP_WITHOUT_GPU();
  unsigned long long* mismatches = nullptr;
  uint32_t* first = nullptr;
  ASSERT_EQ(DeviceAlloc(&mismatches, sizeof(*mismatches)), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&first, sizeof(*first)), cudaSuccess);
  ASSERT_EQ(cudaMemset(mismatches, 0, sizeof(*mismatches)), cudaSuccess);
  ASSERT_EQ(cudaMemset(first, 0xFF, sizeof(*first)), cudaSuccess);
  // Each launch covers 2^31 patterns and, through the sign flip, their negations.
  ASSERT_EQ(kernels::cuda::LaunchCompareFp8Encoders(GetParam(), 0, 1ull << 31, mismatches, first,
                                                    nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  unsigned long long count = 0;
  uint32_t first_bits = 0;
  ASSERT_EQ(cudaMemcpy(&count, mismatches, sizeof(count), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(&first_bits, first, sizeof(first_bits), cudaMemcpyDeviceToHost), cudaSuccess);
  cudaFree(mismatches);
  cudaFree(first);
  EXPECT_EQ(count, 0u) << "first mismatching FP32 pattern 0x" << std::hex << first_bits;
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8EncoderTest,
                         ::testing::Values(kernels::cuda::Fp8Format::kE4M3,
                                           kernels::cuda::Fp8Format::kE5M2),
                         [](const ::testing::TestParamInfo<kernels::cuda::Fp8Format>& info) {
                           return std::string(info.param == kernels::cuda::Fp8Format::kE4M3
                                                  ? "E4M3"
                                                  : "E5M2");
                         });

// ---------------------------------------------------------------------------------------
// Forward.

struct ForwardCase {
  NormType type;
  DType dtype;
  int64_t n, h;
  DType format;
  bool zero_centered;
};

std::string ForwardName(const ::testing::TestParamInfo<ForwardCase>& info) {
  const ForwardCase& c = info.param;
  return absl::StrCat(c.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(c.dtype), "_", ShapeName(c.n, c.h), "_",
                      c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2",
                      c.zero_centered ? "_ZeroCentered" : "");
}

class NormForwardGpuTest : public ::testing::TestWithParam<ForwardCase> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const ForwardCase& c = GetParam();
    const uint64_t seed = static_cast<uint64_t>(c.n * 131 + c.h);
    host_x_ = RandomInput(c.dtype, c.n, c.h, seed);
    gamma_ = c.zero_centered ? RandomVector(c.h, -0.5f, 0.5f, seed + 1)
                             : RandomVector(c.h, 0.5f, 1.5f, seed + 1);
    if (layer_norm()) beta_ = RandomVector(c.h, -1.0f, 1.0f, seed + 2);
    x_ = OnDevice(host_x_);
    gamma_gpu_ = OnDevice(gamma_);
    if (layer_norm()) beta_gpu_ = OnDevice(beta_);
    options_.eps = 1e-5f;
    options_.zero_centered_gamma = c.zero_centered;
    options_.y_dtype = DType::kFloat32;
    options_.quantize = true;
    options_.quantize_options.format = c.format;
    // |y| beyond 4 saturates; small values reach the subnormal codes.
    options_.quantize_options.scale = DTypeMaxFinite(c.format) / 4.0f;
    options_.quantize_options.rowwise = true;
    options_.quantize_options.columnwise = true;
  }

  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }

  absl::StatusOr<NormForwardResult> Gpu(const NormForwardOptions& options) const {
    return kernels::NormalizationForward(GpuContext(), GetParam().type, x_, gamma_gpu_, beta_gpu_,
                                         options);
  }
  absl::StatusOr<NormForwardResult> Cpu(const NormForwardOptions& options) const {
    return kernels::NormalizationForward(Context::Cpu(), GetParam().type, host_x_, gamma_, beta_,
                                         options);
  }

  Tensor host_x_, gamma_, beta_;
  Tensor x_, gamma_gpu_, beta_gpu_;
  NormForwardOptions options_;
};

TEST_P(NormForwardGpuTest, MatchesCpuAndQuantizesItsOwnFp32Output) {
  const ForwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const NormForwardResult gpu, Gpu(options_));
  ASSERT_OK_AND_ASSIGN(const NormForwardResult cpu, Cpu(options_));
  const std::vector<float> x = Floats(host_x_);
  const std::vector<float> y_gpu = Floats(gpu.y);
  const std::vector<float> y_cpu = Floats(cpu.y);
  const std::vector<float> rsigma_gpu = Floats(gpu.rsigma);
  const std::vector<float> rsigma_cpu = Floats(cpu.rsigma);
  ASSERT_EQ(gpu.mu.defined(), layer_norm());
  const std::vector<float> mu_cpu = layer_norm() ? Floats(cpu.mu) : std::vector<float>(c.n, 0.0f);
  const float* g = gamma_.data<float>();
  const float* b = layer_norm() ? beta_.data<float>() : nullptr;

  // Statistics and y against the CPU, on the forward-error scale.
  std::vector<double> mean_abs;
  const std::vector<double> y_scale =
      ForwardScale(x, c.n, c.h, rsigma_cpu, g, b, c.zero_centered, &mean_abs);
  EXPECT_TRUE(AllClose(rsigma_gpu, AsDoubles(rsigma_cpu), DType::kFloat32));
  if (layer_norm()) {
    EXPECT_TRUE(AllClose(Floats(gpu.mu), AsDoubles(mu_cpu), DType::kFloat32, mean_abs));
  }
  EXPECT_TRUE(AllClose(y_gpu, AsDoubles(y_cpu), DType::kFloat32, y_scale));

  // The FP8 copies are exactly the quantization of the GPU's own FP32 y.
  const float scale = options_.quantize_options.scale;
  const std::vector<uint8_t> rowwise = Bytes(gpu.fp8.rowwise_data);
  const std::vector<uint8_t> columnwise = Bytes(gpu.fp8.columnwise_data);
  const std::vector<uint8_t> cpu_rowwise = Bytes(cpu.fp8.rowwise_data);
  ASSERT_EQ(rowwise.size(), static_cast<size_t>(c.n * c.h));
  ASSERT_EQ(columnwise.size(), static_cast<size_t>(c.n * c.h));
  int64_t not_own_encoding = 0, not_transposed = 0, equal_y_code_differs = 0;
  int64_t y_differs = 0, code_differs = 0, non_adjacent = 0;
  float amax = 0.0f;
  for (int64_t r = 0; r < c.n; ++r) {
    for (int64_t j = 0; j < c.h; ++j) {
      const int64_t i = r * c.h + j;
      amax = std::max(amax, std::fabs(y_gpu[i]));
      if (rowwise[i] != Encode(c.format, y_gpu[i] * scale)) ++not_own_encoding;
      if (columnwise[j * c.n + r] != rowwise[i]) ++not_transposed;
      const bool same_y = Bits(y_gpu[i]) == Bits(y_cpu[i]);
      if (!same_y) ++y_differs;
      if (rowwise[i] != cpu_rowwise[i]) {
        ++code_differs;
        if (same_y) ++equal_y_code_differs;
        if (std::abs(Ordinal(rowwise[i]) - Ordinal(cpu_rowwise[i])) > 1) ++non_adjacent;
      }
    }
  }
  EXPECT_EQ(not_own_encoding, 0) << "codes that are not encode(y_gpu * scale)";
  EXPECT_EQ(not_transposed, 0) << "columnwise codes that are not the transposed rowwise codes";
  EXPECT_EQ(equal_y_code_differs, 0) << "codes differing although the FP32 y values agree";
  EXPECT_EQ(non_adjacent, 0) << "codes more than one step from the CPU's";
  EXPECT_LE(code_differs, std::max<int64_t>(1, c.n * c.h / 100)) << "too many code differences";
  EXPECT_EQ(Bits(gpu.fp8.amax), Bits(amax)) << gpu.fp8.amax << " vs max |y_gpu| " << amax;
  // amax is one of the y values: within the tolerance of the largest forward-error scale.
  EXPECT_TRUE(AllClose({gpu.fp8.amax}, {cpu.fp8.amax}, DType::kFloat32,
                       {*std::max_element(y_scale.begin(), y_scale.end())}));
  EXPECT_EQ(Floats(gpu.fp8.rowwise_scale_inv), std::vector<float>{1.0f / scale});
  EXPECT_EQ(Floats(gpu.fp8.columnwise_scale_inv), std::vector<float>{1.0f / scale});
  RecordProperty("y_values_differing_from_cpu", static_cast<int>(y_differs));
  RecordProperty("fp8_codes_differing_from_cpu", static_cast<int>(code_differs));
  std::printf("[ %s ] FP32 y differs from the CPU in %lld of %lld elements; FP8 codes in %lld\n",
              ShapeName(c.n, c.h).c_str(), static_cast<long long>(y_differs),
              static_cast<long long>(c.n * c.h), static_cast<long long>(code_differs));
}

TEST_P(NormForwardGpuTest, Fp8OnlyAndYDtypeVariantsAgreeWithTheFusedRun) {
  ASSERT_OK_AND_ASSIGN(const NormForwardResult full, Gpu(options_));
  // Codes alone (no y): the same codes, amax and statistics.
  NormForwardOptions fp8_only = options_;
  fp8_only.write_y = false;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult codes, Gpu(fp8_only));
  EXPECT_FALSE(codes.y.defined());
  EXPECT_EQ(Bytes(codes.fp8.rowwise_data), Bytes(full.fp8.rowwise_data));
  EXPECT_EQ(Bytes(codes.fp8.columnwise_data), Bytes(full.fp8.columnwise_data));
  EXPECT_EQ(Bits(codes.fp8.amax), Bits(full.fp8.amax));
  EXPECT_EQ(Bytes(codes.rsigma), Bytes(full.rsigma));
  // Only one copy requested.
  NormForwardOptions columnwise_only = fp8_only;
  columnwise_only.quantize_options.rowwise = false;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult transposed, Gpu(columnwise_only));
  EXPECT_FALSE(transposed.fp8.has_rowwise());
  EXPECT_EQ(Bytes(transposed.fp8.columnwise_data), Bytes(full.fp8.columnwise_data));
  // y in x's dtype (no quantization): the FP32 y of the same launch shape rounded once.
  // (Without a columnwise copy the tile can be wider, so the row sums, and with them the
  // last bit of y, may differ from the quantized run's; compare like with like.)
  NormForwardOptions plain;
  plain.eps = options_.eps;
  plain.zero_centered_gamma = options_.zero_centered_gamma;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult narrow, Gpu(plain));
  EXPECT_FALSE(narrow.fp8.has_rowwise());
  ASSERT_EQ(narrow.y.dtype(), GetParam().dtype);
  plain.y_dtype = DType::kFloat32;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult wide, Gpu(plain));
  ASSERT_OK_AND_ASSIGN(const Tensor rounded,
                       kernels::cpu::CastFromFloat32(Context::Cpu(), OnHost(wide.y), GetParam().dtype));
  EXPECT_EQ(Bytes(narrow.y), Bytes(rounded));
}

// A direct launch into poisoned buffers reproduces the op's outputs: every element written.
TEST_P(NormForwardGpuTest, DirectLaunchWritesEveryOutputElement) {
  const ForwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const NormForwardResult want, Gpu(options_));
  const int64_t numel = c.n * c.h;
  void* y = nullptr;
  uint8_t *rowwise = nullptr, *columnwise = nullptr;
  float *mu = nullptr, *rsigma = nullptr, *scale_inv = nullptr;
  uint32_t* amax_bits = nullptr;
  ASSERT_EQ(DeviceAlloc(&y, std::max<int64_t>(1, numel) * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&rowwise, std::max<int64_t>(1, numel)), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&columnwise, std::max<int64_t>(1, numel)), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&mu, std::max<int64_t>(1, c.n) * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&rsigma, std::max<int64_t>(1, c.n) * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&scale_inv, 8), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&amax_bits, 4), cudaSuccess);
  for (void* p : {y, static_cast<void*>(mu), static_cast<void*>(rsigma)}) {
    ASSERT_EQ(cudaMemset(p, 0xFF, p == y ? numel * 4 : c.n * 4), cudaSuccess);  // NaN
  }
  ASSERT_EQ(cudaMemset(rowwise, 0xA5, numel), cudaSuccess);
  ASSERT_EQ(cudaMemset(columnwise, 0xA5, numel), cudaSuccess);
  ASSERT_EQ(cudaMemset(scale_inv, 0xFF, 8), cudaSuccess);
  ASSERT_EQ(cudaMemset(amax_bits, 0xFF, 4), cudaSuccess);

  kernels::cuda::NormForwardParams p;
  p.rms = !layer_norm();
  p.x = x_.raw_data();
  p.x_type = c.dtype == DType::kFloat32   ? kernels::cuda::NormDType::kFloat32
             : c.dtype == DType::kFloat16 ? kernels::cuda::NormDType::kFloat16
                                          : kernels::cuda::NormDType::kBFloat16;
  p.rows = c.n;
  p.cols = c.h;
  p.gamma = gamma_gpu_.data<float>();
  p.beta = layer_norm() ? beta_gpu_.data<float>() : nullptr;
  p.eps = options_.eps;
  p.zero_centered_gamma = c.zero_centered;
  p.y = y;
  p.y_type = kernels::cuda::NormDType::kFloat32;
  p.mu = layer_norm() ? mu : nullptr;
  p.rsigma = rsigma;
  p.format = c.format == DType::kFloat8E4M3 ? kernels::cuda::Fp8Format::kE4M3
                                            : kernels::cuda::Fp8Format::kE5M2;
  p.scale = options_.quantize_options.scale;
  p.scale_inv = 1.0f / p.scale;
  p.rowwise = rowwise;
  p.columnwise = columnwise;
  p.rowwise_scale_inv = scale_inv;
  p.columnwise_scale_inv = scale_inv + 1;
  p.amax_bits = amax_bits;
  ASSERT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  auto bytes_of = [](const void* device, int64_t n) {
    std::vector<uint8_t> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  EXPECT_EQ(bytes_of(y, numel * 4), Bytes(want.y));
  EXPECT_EQ(bytes_of(rowwise, numel), Bytes(want.fp8.rowwise_data));
  EXPECT_EQ(bytes_of(columnwise, numel), Bytes(want.fp8.columnwise_data));
  EXPECT_EQ(bytes_of(rsigma, c.n * 4), Bytes(want.rsigma));
  if (layer_norm()) {
    EXPECT_EQ(bytes_of(mu, c.n * 4), Bytes(want.mu));
  }
  std::vector<uint8_t> scale_inv_bytes = bytes_of(scale_inv, 8);
  std::vector<uint8_t> expected_scale_inv = Bytes(want.fp8.rowwise_scale_inv);
  const std::vector<uint8_t> columnwise_scale_inv = Bytes(want.fp8.columnwise_scale_inv);
  expected_scale_inv.insert(expected_scale_inv.end(), columnwise_scale_inv.begin(),
                            columnwise_scale_inv.end());
  EXPECT_EQ(scale_inv_bytes, expected_scale_inv);
  std::vector<uint8_t> amax_bytes = bytes_of(amax_bits, 4);
  uint32_t amax_value = 0;
  std::memcpy(&amax_value, amax_bytes.data(), 4);
  EXPECT_EQ(amax_value, Bits(want.fp8.amax));
  for (void* ptr : {y, static_cast<void*>(rowwise), static_cast<void*>(columnwise),
                    static_cast<void*>(mu), static_cast<void*>(rsigma),
                    static_cast<void*>(scale_inv), static_cast<void*>(amax_bits)}) {
    cudaFree(ptr);
  }
}

std::vector<ForwardCase> ForwardCases() {
  const NormType ln = NormType::kLayerNorm, rms = NormType::kRmsNorm;
  const DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  const DType e4m3 = DType::kFloat8E4M3, e5m2 = DType::kFloat8E5M2;
  return {
      {ln, f32, 1, 259, e4m3, false},       // one row, odd width
      {ln, bf16, 257, 259, e4m3, true},     // tails in both dimensions
      {rms, f16, 128, 129, e5m2, false},    // 16-row multiple, odd width
      {rms, bf16, 1, 8192, e4m3, true},     // one row across a cluster of 8
      {ln, bf16, 96, 8192, e5m2, false},    // cluster of 8, vector stores everywhere
      {ln, f32, 64, 12000, e4m3, false},    // too long for a cluster: separate statistics
      {rms, bf16, 33, 4100, e4m3, false},   // no 16-byte loads (4100 * 2 % 16 != 0)
      {ln, f16, 300, 1000, e5m2, true},
      {ln, f32, 2, 1, e4m3, false},         // h = 1: zero variance
      {ln, bf16, 16384, 8192, e4m3, false}, // the benchmark shape
      {rms, bf16, 16384, 8192, e4m3, true},
      // Register-tile kernel shapes (cols % 64 == 0, rows % 8 == 0): partial row tile and
      // a cluster of 2 x 12 warps; 7 CTAs of 15 warps, the last with 10 (6400 = 100 x 64);
      // one warp, one 8-row group.
      {ln, bf16, 40, 1536, e4m3, false},
      {rms, f16, 64, 6400, e5m2, true},
      {ln, f16, 8, 64, e4m3, true},
      {ln, bf16, 4104, 2048, e5m2, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormForwardGpuTest, ::testing::ValuesIn(ForwardCases()),
                         ForwardName);

// Which forward kernel a shape reaches, and the register tile's geometry.
TEST(NormForwardPlanGpu, RegisterTileCoversAlignedSixteenBitShapes) {
  TESERVE_SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  struct PlanCase {
    kernels::cuda::NormDType type;
    int64_t n, h;
    bool register_tile;
    int cluster, cols_per_cta;
  };
  const auto bf16 = kernels::cuda::NormDType::kBFloat16, f16 = kernels::cuda::NormDType::kFloat16,
             f32 = kernels::cuda::NormDType::kFloat32;
  const std::vector<PlanCase> cases = {
      {bf16, 16384, 8192, true, 8, 1024}, {f16, 64, 6400, true, 7, 960},
      {bf16, 40, 1536, true, 2, 768},     {bf16, 8, 64, true, 1, 64},
      {bf16, 1, 8192, false, 0, 0},       // rows not a multiple of 8
      {bf16, 64, 8256, false, 0, 0},      // wider than 8 x 1024 columns
      {bf16, 64, 1000, false, 0, 0},      // cols not a multiple of 64
      {f32, 64, 8192, false, 0, 0},       // FP32 x
  };
  void* buffer = nullptr;
  ASSERT_EQ(cudaMalloc(&buffer, 256), cudaSuccess);
  for (const PlanCase& c : cases) {
    SCOPED_TRACE(ShapeName(c.n, c.h));
    kernels::cuda::NormForwardParams p;
    p.x = buffer;  // planning reads only alignment
    p.x_type = c.type;
    p.rows = c.n;
    p.cols = c.h;
    p.gamma = static_cast<const float*>(buffer);
    p.beta = static_cast<const float*>(buffer);
    p.rowwise = p.columnwise = static_cast<uint8_t*>(buffer);
    kernels::cuda::NormForwardPlan plan;
    ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
    EXPECT_EQ(plan.register_tile, c.register_tile);
    EXPECT_LE(plan.ctas, sms * plan.ctas_per_sm);
    if (c.register_tile) {
      EXPECT_EQ(plan.cluster_size, c.cluster);
      EXPECT_EQ(plan.cols_per_cta, c.cols_per_cta);
      EXPECT_EQ(plan.rows_per_cta, 32);
      EXPECT_EQ(plan.ctas % plan.cluster_size, 0);
    }
    p.encoder = kernels::cuda::Fp8Encoder::kCodec;  // the codec variant: the tile kernel
    ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
    EXPECT_FALSE(plan.register_tile);
  }
  cudaFree(buffer);
}

// MXFP8 output on CUDA: exactly QuantizeMxfp8 (CPU) of the GPU's own FP32 y, codes and
// E8M0 scales; against the CPU op, differences only where the FP32 y values differ.
TEST(NormForwardPlanGpu, Mxfp8OutputIsTheBlockQuantizationOfItsOwnFp32Output) {
  TESERVE_SKIP_WITHOUT_GPU();
  struct Case {
    NormType type;
    DType dtype;
    int64_t n, h;
    DType format;
  };
  for (const Case& c : {Case{NormType::kLayerNorm, DType::kBFloat16, 256, 1024, DType::kFloat8E4M3},
                        Case{NormType::kRmsNorm, DType::kFloat16, 64, 96, DType::kFloat8E5M2},
                        Case{NormType::kLayerNorm, DType::kFloat32, 32, 8192, DType::kFloat8E4M3}}) {
    SCOPED_TRACE(ShapeName(c.n, c.h));
    const Tensor x = RandomInput(c.dtype, c.n, c.h, 31);
    const Tensor gamma = RandomVector(c.h, 0.5f, 1.5f, 32);
    const Tensor beta = c.type == NormType::kLayerNorm ? RandomVector(c.h, -1.0f, 1.0f, 33) : Tensor();
    NormForwardOptions options;
    options.y_dtype = DType::kFloat32;
    options.mxfp8 = true;
    options.mxfp8_options.format = c.format;
    options.mxfp8_options.rowwise = true;
    options.mxfp8_options.columnwise = true;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult gpu,
                         kernels::NormalizationForward(GpuContext(), c.type, OnDevice(x), OnDevice(gamma),
                                                       beta.defined() ? OnDevice(beta) : Tensor(), options));
    ASSERT_OK_AND_ASSIGN(const NormForwardResult cpu,
                         kernels::NormalizationForward(Context::Cpu(), c.type, x, gamma, beta, options));
    ASSERT_OK_AND_ASSIGN(const QuantizedTensor own,
                         kernels::QuantizeMxfp8(Context::Cpu(), OnHost(gpu.y), options.mxfp8_options));
    EXPECT_EQ(gpu.fp8.mode, ScalingMode::kMxfp8_1D);
    EXPECT_EQ(Bytes(gpu.fp8.rowwise_data), Bytes(own.rowwise_data));
    EXPECT_EQ(Bytes(gpu.fp8.columnwise_data), Bytes(own.columnwise_data));
    EXPECT_EQ(Bytes(gpu.fp8.rowwise_scale_inv), Bytes(own.rowwise_scale_inv));
    EXPECT_EQ(Bytes(gpu.fp8.columnwise_scale_inv), Bytes(own.columnwise_scale_inv));
    const std::vector<uint8_t> codes = Bytes(gpu.fp8.rowwise_data), cpu_codes = Bytes(cpu.fp8.rowwise_data);
    const std::vector<float> y_gpu = Floats(gpu.y), y_cpu = Floats(cpu.y);
    int64_t differ = 0, differ_with_equal_y_block = 0;
    for (int64_t i = 0; i < c.n * c.h; ++i) {
      if (codes[i] == cpu_codes[i]) continue;
      ++differ;
      bool block_equal = true;  // a code can only move when some y of its block moved
      const int64_t start = i / 32 * 32;
      for (int64_t j = start; j < start + 32; ++j) block_equal &= Bits(y_gpu[j]) == Bits(y_cpu[j]);
      if (block_equal) ++differ_with_equal_y_block;
    }
    EXPECT_EQ(differ_with_equal_y_block, 0);
    EXPECT_LE(differ, std::max<int64_t>(1, c.n * c.h / 100));
  }
}

// NaN and Inf inputs on the register-tile kernel: rows holding them normalize to NaN, take
// the patched encoder (code 0x7F, as core/float_codec.h), and amax is NaN; other rows are
// untouched and still match their own encoding.
TEST(NormForwardPlanGpu, NonFiniteRowsEncodeAsNanOnTheRegisterTile) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int64_t n = 64, h = 1024;
  Tensor x32 = RandomInput(DType::kFloat32, n, h, 21);
  x32.data<float>()[5 * h + 7] = std::nanf("");
  x32.data<float>()[9 * h + 1000] = INFINITY;
  const Tensor x = kernels::cpu::CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value();
  const Tensor gamma = RandomVector(h, 0.5f, 1.5f, 22), beta = RandomVector(h, -1.0f, 1.0f, 23);
  NormForwardOptions options;
  options.y_dtype = DType::kFloat32;
  options.quantize = true;
  options.quantize_options.scale = 32.0f;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult out,
                       kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm,
                                                     OnDevice(x), OnDevice(gamma), OnDevice(beta),
                                                     options));
  const std::vector<float> y = Floats(out.y);
  const std::vector<uint8_t> rowwise = Bytes(out.fp8.rowwise_data);
  const std::vector<uint8_t> columnwise = Bytes(out.fp8.columnwise_data);
  int64_t wrong = 0, nan_rows_wrong = 0;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const int64_t i = r * h + j;
      if (rowwise[i] != Encode(DType::kFloat8E4M3, y[i] * 32.0f)) ++wrong;
      if (columnwise[j * n + r] != rowwise[i]) ++wrong;
      if ((r == 5 || r == 9) && (!std::isnan(y[i]) || rowwise[i] != 0x7F)) ++nan_rows_wrong;
      if (r != 5 && r != 9 && !std::isfinite(y[i])) ++nan_rows_wrong;
    }
  }
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(nan_rows_wrong, 0);
  EXPECT_TRUE(std::isnan(out.fp8.amax));
}

#else

TEST(NormGpu, SkippedWithoutCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
