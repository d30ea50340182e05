// CUDA LayerNorm / RMSNorm (kernels/cuda/normalization_*) against the CPU reference on
// the same inputs.
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
// - sm_margin shrinks the grid to (SMs - margin) x resident CTAs and changes no result
//   (the backward's dgamma / dbeta summation order aside).
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
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/cast_cuda.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "kernels/cuda/normalization_kernels.h"
#include "kernels/normalization.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::NormBackwardOptions;
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

template <typename T>
cudaError_t DeviceAlloc(T** ptr, int64_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), static_cast<size_t>(bytes));
}

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Host tensor of `dtype` [n, h]: mean 0.5, spread ~1.5, every 7th row 64x larger.
Tensor RandomInput(DType dtype, int64_t n, int64_t h, uint64_t seed) {
  Tensor x = Tensor::Zeros(DType::kFloat32, {n, h}).value();
  float* v = x.data<float>();
  for (int64_t r = 0; r < n; ++r) {
    const float row_scale = r % 7 == 3 ? 64.0f : 1.0f;
    for (int64_t c = 0; c < h; ++c) {
      const uint64_t i = static_cast<uint64_t>(r * h + c);
      v[r * h + c] = row_scale * (0.5f + 1.5f * (Uniform(seed, 2 * i) + Uniform(seed, 2 * i + 1)));
    }
  }
  if (dtype == DType::kFloat32) return x;
  return kernels::cpu::CastFromFloat32(Context::Cpu(), x, dtype).value();
}

Tensor RandomVector(int64_t h, float lo, float hi, uint64_t seed) {
  Tensor t = Tensor::Zeros(DType::kFloat32, {h}).value();
  for (int64_t c = 0; c < h; ++c) {
    t.data<float>()[c] = lo + (hi - lo) * 0.5f * (Uniform(seed, c) + 1.0f);
  }
  return t;
}

// Position of an FP8 code in value order (-0 and +0 share 0).
int Ordinal(uint8_t code) { return (code & 0x80) ? -static_cast<int>(code & 0x7F) : code; }

uint8_t Encode(DType format, float v) {
  return format == DType::kFloat8E4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

std::string ShapeName(int64_t n, int64_t h) { return absl::StrCat(n, "x", h); }

std::vector<double> AsDoubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Forward-error scale of y = (x - mu) rsigma w + b: (|x| + mean |x|) rsigma |w| + |b| (the
// mean's error is relative to mean |x|). mean_abs receives mean |x| per row.
std::vector<double> ForwardScale(const std::vector<float>& x, int64_t n, int64_t h,
                                 const std::vector<float>& rsigma, const float* gamma,
                                 const float* beta, bool zero_centered,
                                 std::vector<double>* mean_abs) {
  std::vector<double> scale(n * h);
  mean_abs->assign(n, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < h; ++j) s += std::fabs(x[r * h + j]);
    (*mean_abs)[r] = s / h;
    for (int64_t j = 0; j < h; ++j) {
      const double w = std::fabs(gamma[j] + (zero_centered ? 1.0 : 0.0));
      scale[r * h + j] = (std::fabs(x[r * h + j]) + (*mean_abs)[r]) * rsigma[r] * w +
                         (beta != nullptr ? std::fabs(beta[j]) : 0.0);
    }
  }
  return scale;
}

// Forward-error scales of the backward outputs: dx = rsigma (dyw - mean(dyw) - xhat
// mean(dyw xhat)), dgamma = sum_rows dy xhat, dbeta = sum_rows dy.
void BackwardScales(const std::vector<float>& x, const std::vector<float>& dy, int64_t n, int64_t h,
                    const std::vector<float>& mu, const std::vector<float>& rsigma,
                    const float* gamma, bool zero_centered, std::vector<double>* dx_scale,
                    std::vector<double>* dgamma_scale, std::vector<double>* dbeta_scale) {
  dx_scale->assign(n * h, 0.0);
  dgamma_scale->assign(h, 0.0);
  dbeta_scale->assign(h, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    double abs_dyw = 0.0, abs_dyw_xhat = 0.0;
    for (int64_t j = 0; j < h; ++j) {
      const double w = gamma[j] + (zero_centered ? 1.0 : 0.0);
      const double xhat = (x[r * h + j] - double{mu[r]}) * rsigma[r];
      abs_dyw += std::fabs(dy[r * h + j] * w);
      abs_dyw_xhat += std::fabs(dy[r * h + j] * w * xhat);
      (*dgamma_scale)[j] += std::fabs(dy[r * h + j] * xhat);
      (*dbeta_scale)[j] += std::fabs(dy[r * h + j]);
    }
    for (int64_t j = 0; j < h; ++j) {
      const double w = gamma[j] + (zero_centered ? 1.0 : 0.0);
      const double xhat = (x[r * h + j] - double{mu[r]}) * rsigma[r];
      (*dx_scale)[r * h + j] = rsigma[r] * (std::fabs(dy[r * h + j] * w) + abs_dyw / h +
                                            std::fabs(xhat) * abs_dyw_xhat / h);
    }
  }
}

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
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormForwardGpuTest, ::testing::ValuesIn(ForwardCases()),
                         ForwardName);

// ---------------------------------------------------------------------------------------
// Backward.

struct BackwardCase {
  NormType type;
  DType dtype;
  int64_t n, h;
  bool zero_centered;
};

std::string BackwardName(const ::testing::TestParamInfo<BackwardCase>& info) {
  const BackwardCase& c = info.param;
  return absl::StrCat(c.type == NormType::kLayerNorm ? "LayerNorm" : "RmsNorm", "_",
                      DTypeName(c.dtype), "_", ShapeName(c.n, c.h),
                      c.zero_centered ? "_ZeroCentered" : "");
}

class NormBackwardGpuTest : public ::testing::TestWithParam<BackwardCase> {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    const BackwardCase& c = GetParam();
    const uint64_t seed = static_cast<uint64_t>(c.n * 733 + c.h);
    host_x_ = RandomInput(c.dtype, c.n, c.h, seed);
    host_dy_ = RandomInput(c.dtype, c.n, c.h, seed + 7);
    gamma_ = c.zero_centered ? RandomVector(c.h, -0.5f, 0.5f, seed + 1)
                             : RandomVector(c.h, 0.5f, 1.5f, seed + 1);
    // Statistics from the CPU forward, given to both backward passes.
    NormForwardOptions forward;
    forward.zero_centered_gamma = c.zero_centered;
    forward.y_dtype = DType::kFloat32;
    const Tensor beta = layer_norm() ? RandomVector(c.h, -1.0f, 1.0f, seed + 2) : Tensor();
    auto fwd = kernels::NormalizationForward(Context::Cpu(), c.type, host_x_, gamma_, beta, forward);
    ASSERT_TRUE(fwd.ok()) << fwd.status();
    mu_ = fwd->mu;
    rsigma_ = fwd->rsigma;
    options_.zero_centered_gamma = c.zero_centered;
  }

  bool layer_norm() const { return GetParam().type == NormType::kLayerNorm; }

  absl::StatusOr<kernels::NormBackwardOutputs> Gpu(const NormBackwardOptions& options) const {
    return kernels::NormalizationBackward(GpuContext(), GetParam().type, OnDevice(host_dy_),
                                          OnDevice(host_x_), layer_norm() ? OnDevice(mu_) : Tensor(),
                                          OnDevice(rsigma_), OnDevice(gamma_), options);
  }

  Tensor host_x_, host_dy_, gamma_, mu_, rsigma_;
  NormBackwardOptions options_;
};

TEST_P(NormBackwardGpuTest, MatchesCpu) {
  const BackwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs gpu, Gpu(options_));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs cpu,
                       kernels::NormalizationBackward(Context::Cpu(), c.type, host_dy_, host_x_, mu_,
                                                      rsigma_, gamma_, options_));
  ASSERT_EQ(gpu.dx.dtype(), c.dtype);
  const std::vector<float> x = Floats(host_x_), dy = Floats(host_dy_);
  const std::vector<float> mu = layer_norm() ? Floats(mu_) : std::vector<float>(c.n, 0.0f);
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
  BackwardScales(x, dy, c.n, c.h, mu, Floats(rsigma_), gamma_.data<float>(), c.zero_centered,
                 &dx_scale, &dgamma_scale, &dbeta_scale);
  const std::vector<float> dx_cpu = Floats(cpu.dx);
  EXPECT_TRUE(AllClose(Floats(gpu.dx), AsDoubles(dx_cpu), c.dtype, dx_scale));
  const std::vector<float> dgamma_cpu = Floats(cpu.dgamma);
  EXPECT_TRUE(AllClose(Floats(gpu.dgamma), std::vector<double>(dgamma_cpu.begin(), dgamma_cpu.end()),
                       DType::kFloat32, dgamma_scale));
  ASSERT_EQ(gpu.dbeta.defined(), layer_norm());
  if (layer_norm()) {
    const std::vector<float> dbeta_cpu = Floats(cpu.dbeta);
    EXPECT_TRUE(AllClose(Floats(gpu.dbeta), std::vector<double>(dbeta_cpu.begin(), dbeta_cpu.end()),
                         DType::kFloat32, dbeta_scale));
  }
}

// A direct launch into a poisoned dx and workspace reproduces the op's outputs.
TEST_P(NormBackwardGpuTest, DirectLaunchWritesEveryOutputElement) {
  const BackwardCase& c = GetParam();
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs want, Gpu(options_));
  const Tensor dy = OnDevice(host_dy_), x = OnDevice(host_x_), rsigma = OnDevice(rsigma_);
  const Tensor gamma = OnDevice(gamma_);
  const Tensor mu = layer_norm() ? OnDevice(mu_) : Tensor();
  kernels::cuda::NormBackwardParams p;
  p.rms = !layer_norm();
  p.dy = dy.raw_data();
  p.x = x.raw_data();
  p.type = c.dtype == DType::kFloat32   ? kernels::cuda::NormDType::kFloat32
           : c.dtype == DType::kFloat16 ? kernels::cuda::NormDType::kFloat16
                                        : kernels::cuda::NormDType::kBFloat16;
  p.rows = c.n;
  p.cols = c.h;
  p.mu = layer_norm() ? mu.data<float>() : nullptr;
  p.rsigma = rsigma.data<float>();
  p.gamma = gamma.data<float>();
  p.zero_centered_gamma = c.zero_centered;
  int64_t workspace_floats = 0;
  ASSERT_EQ(kernels::cuda::NormBackwardWorkspaceFloats(p, &workspace_floats), cudaSuccess);
  const int64_t dx_bytes = want.dx.nbytes();
  void* dx = nullptr;
  float *dgamma = nullptr, *dbeta = nullptr, *workspace = nullptr;
  ASSERT_EQ(DeviceAlloc(&dx, dx_bytes), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&dgamma, c.h * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&dbeta, c.h * 4), cudaSuccess);
  ASSERT_EQ(DeviceAlloc(&workspace, workspace_floats * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dx, 0xFF, dx_bytes), cudaSuccess);
  ASSERT_EQ(cudaMemset(dgamma, 0xFF, c.h * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(dbeta, 0xFF, c.h * 4), cudaSuccess);
  ASSERT_EQ(cudaMemset(workspace, 0xFF, workspace_floats * 4), cudaSuccess);
  p.dx = dx;
  p.dgamma = dgamma;
  p.dbeta = layer_norm() ? dbeta : nullptr;
  p.workspace = workspace;
  ASSERT_EQ(kernels::cuda::LaunchNormBackward(p, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto bytes_of = [](const void* device, int64_t n) {
    std::vector<uint8_t> host(n);
    EXPECT_EQ(cudaMemcpy(host.data(), device, n, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  };
  EXPECT_EQ(bytes_of(dx, dx_bytes), Bytes(want.dx));
  EXPECT_EQ(bytes_of(dgamma, c.h * 4), Bytes(want.dgamma));
  if (layer_norm()) {
    EXPECT_EQ(bytes_of(dbeta, c.h * 4), Bytes(want.dbeta));
  }
  for (void* ptr : {dx, static_cast<void*>(dgamma), static_cast<void*>(dbeta),
                    static_cast<void*>(workspace)}) {
    cudaFree(ptr);
  }
}

std::vector<BackwardCase> BackwardCases() {
  const NormType ln = NormType::kLayerNorm, rms = NormType::kRmsNorm;
  const DType f32 = DType::kFloat32, f16 = DType::kFloat16, bf16 = DType::kBFloat16;
  return {
      {ln, f32, 1, 259, false},        // one row, streaming (259 not a vector multiple)
      {rms, bf16, 257, 259, true},     // tails, streaming
      {ln, f16, 128, 129, false},
      {rms, f32, 128, 1024, false},    // registers, 1 vector per thread
      {ln, bf16, 300, 8192, true},     // registers, 4 vectors per thread
      {rms, f16, 5, 16384, false},     // registers, 8 vectors per thread
      {ln, f32, 3, 9000, false},       // too long for registers: streaming
      {ln, bf16, 16384, 8192, false},  // the benchmark shape
      {rms, bf16, 16384, 8192, false},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, NormBackwardGpuTest, ::testing::ValuesIn(BackwardCases()),
                         BackwardName);

// ---------------------------------------------------------------------------------------
// sm_margin, the FP32 entry points, empty inputs.

int SmCount() {
  int sms = 0;
  EXPECT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  return sms;
}

TEST(NormGpu, SmMarginShrinksTheGridAndChangesNoResult) {
  TESERVE_SKIP_WITHOUT_GPU();
  const int sms = SmCount();
  const int64_t n = 4096, h = 2048;
  const Tensor host_x = RandomInput(DType::kBFloat16, n, h, 5);
  const Tensor host_dy = RandomInput(DType::kBFloat16, n, h, 6);
  const Tensor host_gamma = RandomVector(h, 0.5f, 1.5f, 7);
  const std::vector<float> x_values = Floats(host_x), dy_values = Floats(host_dy);
  const Tensor x = OnDevice(host_x), dy = OnDevice(host_dy);
  const Tensor gamma = OnDevice(host_gamma);
  const Tensor beta = OnDevice(RandomVector(h, -1.0f, 1.0f, 8));
  NormForwardOptions options;
  options.quantize = true;
  options.quantize_options.columnwise = true;
  options.quantize_options.scale = 64.0f;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult base,
                       kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma,
                                                     beta, options));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs base_grad,
                       kernels::NormalizationBackward(GpuContext(), NormType::kLayerNorm, dy, x,
                                                      base.mu, base.rsigma, gamma, {}));
  for (const int margin : {1, sms / 2, sms - 1}) {
    SCOPED_TRACE(absl::StrCat("sm_margin ", margin));
    kernels::cuda::NormForwardParams p;
    p.x = x.raw_data();
    p.x_type = kernels::cuda::NormDType::kBFloat16;
    p.rows = n;
    p.cols = h;
    p.columnwise = static_cast<uint8_t*>(const_cast<void*>(x.raw_data()));  // planning: presence only
    p.sm_margin = margin;
    kernels::cuda::NormForwardPlan plan;
    ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
    EXPECT_EQ(plan.usable_sms, sms - margin);
    EXPECT_LE(plan.ctas, (sms - margin) * plan.ctas_per_sm);
    EXPECT_GE(plan.ctas, 1);
    kernels::cuda::NormBackwardParams bp;
    bp.dy = dy.raw_data();
    bp.x = x.raw_data();
    bp.dx = const_cast<void*>(dy.raw_data());  // planning only checks its alignment
    bp.gamma = gamma.data<float>();
    bp.type = kernels::cuda::NormDType::kBFloat16;
    bp.rows = n;
    bp.cols = h;
    bp.sm_margin = margin;
    kernels::cuda::NormBackwardPlan bplan;
    ASSERT_EQ(kernels::cuda::PlanNormBackward(bp, &bplan), cudaSuccess);
    EXPECT_LE(bplan.ctas, (sms - margin) * bplan.ctas_per_sm);

    options.sm_margin = margin;
    ASSERT_OK_AND_ASSIGN(const NormForwardResult got,
                         kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma,
                                                       beta, options));
    EXPECT_EQ(Bytes(got.y), Bytes(base.y));
    EXPECT_EQ(Bytes(got.fp8.rowwise_data), Bytes(base.fp8.rowwise_data));
    EXPECT_EQ(Bytes(got.fp8.columnwise_data), Bytes(base.fp8.columnwise_data));
    EXPECT_EQ(Bytes(got.mu), Bytes(base.mu));
    EXPECT_EQ(Bytes(got.rsigma), Bytes(base.rsigma));
    NormBackwardOptions grad_options;
    grad_options.sm_margin = margin;
    ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad,
                         kernels::NormalizationBackward(GpuContext(), NormType::kLayerNorm, dy, x,
                                                        base.mu, base.rsigma, gamma, grad_options));
    EXPECT_EQ(Bytes(grad.dx), Bytes(base_grad.dx));
    std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
    BackwardScales(x_values, dy_values, n, h, Floats(base.mu), Floats(base.rsigma), host_gamma.data<float>(),
                   false, &dx_scale, &dgamma_scale, &dbeta_scale);
    EXPECT_TRUE(AllClose(Floats(grad.dgamma), AsDoubles(Floats(base_grad.dgamma)), DType::kFloat32,
                         dgamma_scale));
    EXPECT_TRUE(AllClose(Floats(grad.dbeta), AsDoubles(Floats(base_grad.dbeta)), DType::kFloat32,
                         dbeta_scale));
  }
  options.sm_margin = sms;
  auto refused = kernels::NormalizationForward(GpuContext(), NormType::kLayerNorm, x, gamma, beta, options);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("options.sm_margin: expected 0.."), std::string::npos)
      << refused.status();
}

TEST(NormGpu, Fp32EntryPointsRunOnCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor host_x = RandomInput(DType::kFloat32, 37, 300, 9);
  const Tensor host_dy = RandomInput(DType::kFloat32, 37, 300, 10);
  const Tensor gamma = RandomVector(300, 0.5f, 1.5f, 11), beta = RandomVector(300, -1.0f, 1.0f, 12);
  ASSERT_OK_AND_ASSIGN(const kernels::NormForwardOutputs cpu,
                       kernels::LayerNormForward(Context::Cpu(), host_x, gamma, beta, 1e-5f, false));
  ASSERT_OK_AND_ASSIGN(const kernels::NormForwardOutputs gpu,
                       kernels::LayerNormForward(GpuContext(), OnDevice(host_x), OnDevice(gamma),
                                                 OnDevice(beta), 1e-5f, false));
  EXPECT_EQ(gpu.y.dtype(), DType::kFloat32);
  EXPECT_EQ(gpu.y.device(), kGpu);
  const std::vector<float> x = Floats(host_x), dy = Floats(host_dy), rsigma = Floats(cpu.rsigma);
  std::vector<double> mean_abs;
  const std::vector<double> y_scale = ForwardScale(x, 37, 300, rsigma, gamma.data<float>(),
                                                   beta.data<float>(), false, &mean_abs);
  EXPECT_TRUE(AllClose(Floats(gpu.y), AsDoubles(Floats(cpu.y)), DType::kFloat32, y_scale));
  EXPECT_TRUE(AllClose(Floats(gpu.mu), AsDoubles(Floats(cpu.mu)), DType::kFloat32, mean_abs));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad_cpu,
                       kernels::RmsNormBackward(Context::Cpu(), host_dy, host_x, cpu.rsigma, gamma, false));
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad_gpu,
                       kernels::RmsNormBackward(GpuContext(), OnDevice(host_dy), OnDevice(host_x),
                                                OnDevice(cpu.rsigma), OnDevice(gamma), false));
  EXPECT_FALSE(grad_gpu.dbeta.defined());
  std::vector<double> dx_scale, dgamma_scale, dbeta_scale;
  BackwardScales(x, dy, 37, 300, std::vector<float>(37, 0.0f), rsigma, gamma.data<float>(), false,
                 &dx_scale, &dgamma_scale, &dbeta_scale);
  EXPECT_TRUE(AllClose(Floats(grad_gpu.dx), AsDoubles(Floats(grad_cpu.dx)), DType::kFloat32, dx_scale));
  EXPECT_TRUE(AllClose(Floats(grad_gpu.dgamma), AsDoubles(Floats(grad_cpu.dgamma)), DType::kFloat32,
                       dgamma_scale));
}

TEST(NormGpu, EmptyInputWritesScaleInvAndZeroGradients) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor x = OnDevice(Tensor::Zeros(DType::kBFloat16, {0, 64}).value());
  const Tensor gamma = OnDevice(RandomVector(64, 0.5f, 1.5f, 13));
  NormForwardOptions options;
  options.write_y = false;
  options.quantize = true;
  options.quantize_options.scale = 4.0f;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const NormForwardResult out,
                       kernels::NormalizationForward(GpuContext(), NormType::kRmsNorm, x, gamma,
                                                     Tensor(), options));
  EXPECT_EQ(out.fp8.amax, 0.0f);
  EXPECT_EQ(Floats(out.fp8.rowwise_scale_inv), std::vector<float>{0.25f});
  EXPECT_EQ(Floats(out.fp8.columnwise_scale_inv), std::vector<float>{0.25f});
  ASSERT_OK_AND_ASSIGN(const kernels::NormBackwardOutputs grad,
                       kernels::NormalizationBackward(GpuContext(), NormType::kRmsNorm, x, x, Tensor(),
                                                      OnDevice(Tensor::Zeros(DType::kFloat32, {0}).value()),
                                                      gamma, {}));
  EXPECT_EQ(Floats(grad.dgamma), std::vector<float>(64, 0.0f));
}

#else

TEST(NormGpu, SkippedWithoutCuda) {
  TESERVE_SKIP_WITHOUT_GPU();
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
