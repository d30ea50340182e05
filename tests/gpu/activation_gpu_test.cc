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
// the argument checks; they run in every build, with or without a GPU.
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
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/activation.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/activation_kernels.h"
#include "kernels/cuda/cast_cuda.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/tolerances.h"
#endif

namespace teserve {
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

using kernels::Activation;
using kernels::ActivationBackwardOptions;
using kernels::ActivationBackwardResult;
using kernels::ActivationForwardOptions;
using kernels::ActivationForwardResult;
using kernels::ActivationParams;

const Device kGpu = Device::Cuda(0);

using testing::Bytes;
using testing::Floats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::Uniform;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

uint8_t Encode(DType format, float v) { return format == DType::kFloat8E4M3 ? FloatToE4M3(v) : FloatToE5M2(v); }

// Position of an FP8 code in value order (-0 and +0 share 0).
int Ordinal(uint8_t code) { return (code & 0x80) ? -static_cast<int>(code & 0x7F) : code; }

const ActivationParams kParams;  // clamped_swiglu: limit 7, alpha 1.702

// Host input [rows, cols] of `dtype`: uniforms in [-4.5, 4.5), every 5th row 3x larger
// (so the clamp limit 7 is crossed), exact zeros, exact +-limit, and with `specials` a few
// NaN and +-Inf.
Tensor MakeInput(DType dtype, int64_t rows, int64_t cols, uint64_t seed, bool specials) {
  Tensor x = Tensor::Zeros(DType::kFloat32, {rows, cols}).value();
  float* v = x.data<float>();
  const int64_t n = rows * cols;
  for (int64_t r = 0; r < rows; ++r) {
    const float row_scale = r % 5 == 2 ? 3.0f : 1.0f;
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      float value = 4.5f * row_scale * Uniform(seed, static_cast<uint64_t>(i));
      if (i % 97 == 13) value = 0.0f;
      if (i % 89 == 7) value = (i % 2) ? kParams.limit : -kParams.limit;
      v[i] = value;
    }
  }
  if (specials && n > 64) {
    v[n / 7] = std::numeric_limits<float>::quiet_NaN();
    v[n / 3] = std::numeric_limits<float>::infinity();
    v[(2 * n) / 3] = -std::numeric_limits<float>::infinity();
  }
  if (dtype == DType::kFloat32) return x;
  return kernels::cpu::CastFromFloat32(Context::Cpu(), x, dtype).value();
}

// ---------------------------------------------------------------------------------------
// Forward-error scales: sums of the magnitudes of each formula's terms, in double.

double SigmoidD(double u) { return 1.0 / (1.0 + std::exp(-u)); }

struct TermScale {
  double value;  // |f(x)|
  double grad;   // sum of |terms| of f'(x)
};

TermScale ScaleOf(Activation kind, double x) {
  switch (kind) {
    case Activation::kGelu:
    case Activation::kGeglu: {
      const double c = 0.7978845608028654, k = 0.044715;
      const double s = SigmoidD(2.0 * c * (x + k * x * x * x));
      const double du = 2.0 * c * (1.0 + 3.0 * k * x * x);
      return {std::fabs(x * s), s + std::fabs(x) * s * (1.0 - s) * du};
    }
    case Activation::kQgelu:
    case Activation::kQgeglu:
    case Activation::kSilu:
    case Activation::kSwiglu:
    case Activation::kClampedSwiglu: {
      const double alpha = kind == Activation::kSilu || kind == Activation::kSwiglu ? 1.0
                           : kind == Activation::kClampedSwiglu                  ? kParams.alpha
                                                                                  : 1.702;
      const double s = SigmoidD(alpha * x);
      return {std::fabs(x) * s, s + alpha * std::fabs(x) * s * (1.0 - s)};
    }
    case Activation::kRelu:
    case Activation::kReglu: return {std::max(x, 0.0), 1.0};
    case Activation::kSrelu:
    case Activation::kSreglu: return {x > 0.0 ? x * x : 0.0, 2.0 * std::fabs(x)};
  }
  return {0.0, 0.0};
}

double ClampA(Activation kind, double a) {
  return kind == Activation::kClampedSwiglu ? std::min(a, static_cast<double>(kParams.limit)) : a;
}

double LinearOf(Activation kind, double b) {
  if (kind != Activation::kClampedSwiglu) return b;
  const double l = kParams.limit;
  return std::max(-l, std::min(b, l)) + 1.0;
}

// Scales of y [rows, K] and of dx [rows, in_cols] (dy given).
void Scales(Activation kind, const std::vector<float>& x, const std::vector<float>* dy, int64_t rows, int64_t k,
            std::vector<double>* y_scale, std::vector<double>* dx_scale) {
  const bool gated = kernels::IsGated(kind);
  const int64_t in_cols = gated ? 2 * k : k;
  y_scale->assign(rows * k, 0.0);
  if (dx_scale != nullptr) dx_scale->assign(rows * in_cols, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      const double g = dy != nullptr ? std::fabs((*dy)[r * k + j]) : 0.0;
      if (!gated) {
        const TermScale t = ScaleOf(kind, x[r * k + j]);
        (*y_scale)[r * k + j] = t.value;
        if (dx_scale != nullptr) (*dx_scale)[r * k + j] = g * t.grad;
        continue;
      }
      const double a = ClampA(kind, x[r * in_cols + j]);
      const double linear = std::fabs(LinearOf(kind, x[r * in_cols + k + j]));
      const TermScale t = ScaleOf(kind, a);
      (*y_scale)[r * k + j] = t.value * linear;
      if (dx_scale != nullptr) {
        (*dx_scale)[r * in_cols + j] = g * t.grad * linear;
        (*dx_scale)[r * in_cols + k + j] = g * t.value;
      }
    }
  }
}

// |got - want| <= atol + rtol * max(scale, |want|) for every element; NaN must meet NaN,
// infinities must be equal. Reports the count and the first few failures.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale,
                 DType dtype, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const testing_kernels::Tolerance tol = testing_kernels::ToleranceFor(dtype);
  int64_t failures = 0;
  std::string report;
  for (size_t i = 0; i < got.size(); ++i) {
    const float g = got[i];
    const float w = want[i];
    bool ok;
    if (std::isnan(w) || std::isnan(g)) {
      ok = std::isnan(w) && std::isnan(g);
    } else if (std::isinf(w) || std::isinf(g)) {
      ok = g == w;
    } else {
      double s = std::fabs(static_cast<double>(w));
      if (!scale.empty() && scale[i] > s) s = scale[i];  // a NaN scale is ignored
      ok = std::fabs(static_cast<double>(g) - w) <= tol.atol + tol.rtol * s;
    }
    if (ok) continue;
    if (++failures <= 5) absl::StrAppend(&report, "\n  [", i, "] gpu ", g, " cpu ", w);
  }
  EXPECT_EQ(failures, 0) << what << ": " << failures << " of " << got.size() << " elements out of "
                         << DTypeName(dtype) << " tolerance" << report;
}

// ---------------------------------------------------------------------------------------
// Cases.

struct Case {
  Activation kind;
  int64_t rows;
  int64_t k;  // output width; x is [rows, k] or [rows, 2k]
  DType dtype;
  DType format;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(kernels::ActivationName(c.kind), "_", c.rows, "x", c.k, "_", DTypeName(c.dtype), "_",
                      c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2");
}

constexpr Activation kKinds[] = {
    Activation::kGelu,  Activation::kGeglu,  Activation::kQgelu, Activation::kQgeglu,
    Activation::kRelu,  Activation::kReglu,  Activation::kSrelu, Activation::kSreglu,
    Activation::kSilu,  Activation::kSwiglu, Activation::kClampedSwiglu,
};

struct Shape2 {
  int64_t rows, k;
};

// Small shapes for every kind and dtype: one row (scalar and vectorized widths), odd
// widths and row counts (scalar path, tile tails), multiples of 4 (vectorized path).
constexpr Shape2 kSmallShapes[] = {{1, 259}, {1, 1024}, {257, 259}, {128, 129}, {128, 128}, {260, 192}};

std::vector<Case> SmallCases() {
  std::vector<Case> cases;
  for (Activation kind : kKinds) {
    for (const Shape2& s : kSmallShapes) {
      cases.push_back({kind, s.rows, s.k, DType::kFloat32, DType::kFloat8E4M3});
      cases.push_back({kind, s.rows, s.k, DType::kBFloat16, DType::kFloat8E4M3});
      cases.push_back({kind, s.rows, s.k, DType::kFloat16, DType::kFloat8E5M2});
    }
  }
  return cases;
}

// Shapes the 128 x 128 register-tile forward kernel takes (rows and cols multiples of 8):
// one full tile pair, partial tiles in both directions, a single 8 x 8 fragment.
constexpr Shape2 kTiledShapes[] = {{256, 256}, {136, 200}, {8, 8}};

std::vector<Case> TiledCases() {
  std::vector<Case> cases;
  for (Activation kind : kKinds) {
    for (const Shape2& s : kTiledShapes) {
      cases.push_back({kind, s.rows, s.k, DType::kFloat32, DType::kFloat8E4M3});
      cases.push_back({kind, s.rows, s.k, DType::kBFloat16, DType::kFloat8E4M3});
      cases.push_back({kind, s.rows, s.k, DType::kFloat16, DType::kFloat8E5M2});
    }
  }
  return cases;
}

// The benchmark shape, BF16 input (x is 16384 x 16384 for gated kinds).
std::vector<Case> LargeForwardCases() {
  std::vector<Case> cases;
  for (Activation kind : kKinds) cases.push_back({kind, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3});
  return cases;
}

std::vector<Case> LargeBackwardCases() {
  return {{Activation::kGelu, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3},
          {Activation::kSwiglu, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3},
          {Activation::kClampedSwiglu, 16384, 8192, DType::kFloat32, DType::kFloat8E4M3}};
}

int64_t InputWidth(const Case& c) { return kernels::ActivationInputWidth(c.kind, c.k); }

uint64_t SeedOf(const Case& c) { return static_cast<uint64_t>(c.rows * 7919 + c.k * 31 + static_cast<int>(c.kind)); }

constexpr float kScale = 16.0f;  // saturates the largest srelu / sreglu values in E4M3

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

// ---------------------------------------------------------------------------------------
// Backward.

void CheckBackward(const Case& c, bool specials) {
  const int64_t in_cols = InputWidth(c);
  const Tensor host_x = MakeInput(c.dtype, c.rows, in_cols, SeedOf(c), specials);
  const Tensor host_dy = MakeInput(c.dtype, c.rows, c.k, SeedOf(c) + 1, false);
  ActivationBackwardOptions options;
  options.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult gpu,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, OnDevice(host_dy),
                                                        OnDevice(host_x), options));
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult cpu,
                       kernels::FusedActivationBackward(Context::Cpu(), c.kind, kParams, host_dy, host_x, options));
  ASSERT_EQ(gpu.dx.dtype(), c.dtype);
  ASSERT_EQ(gpu.dx.shape(), (Shape{c.rows, in_cols}));
  ASSERT_EQ(gpu.dbias.shape(), (Shape{in_cols}));
  const std::vector<float> x = Floats(host_x);
  const std::vector<float> dy = Floats(host_dy);
  std::vector<double> y_scale, dx_scale;
  Scales(c.kind, x, &dy, c.rows, c.k, &y_scale, &dx_scale);
  const std::vector<float> cpu_dx = Floats(cpu.dx);
  ExpectClose(Floats(gpu.dx), cpu_dx, dx_scale, c.dtype, "dx");
  // dbias: a sum over rows of FP32 dx, judged on the sum of |dx|.
  std::vector<double> dbias_scale(in_cols, 0.0);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t j = 0; j < in_cols; ++j) dbias_scale[j] += std::max(dx_scale[r * in_cols + j], std::fabs(double{cpu_dx[r * in_cols + j]}));
  }
  ExpectClose(Floats(gpu.dbias), Floats(cpu.dbias), dbias_scale, DType::kFloat32, "dbias");
}

class ActivationBackwardGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationBackwardGpuTest, DxAndDbiasMatchCpu) { CheckBackward(GetParam(), false); }

TEST_P(ActivationBackwardGpuTest, NanAndInfinityInputsMatchCpu) { CheckBackward(GetParam(), true); }

// Without dbias the same dx; the FP32 entry point on a CUDA device gives it too.
TEST_P(ActivationBackwardGpuTest, DxWithoutDbiasAndFp32EntryPointAgree) {
  const Case& c = GetParam();
  const Tensor x = OnDevice(MakeInput(c.dtype, c.rows, InputWidth(c), SeedOf(c), false));
  const Tensor dy = OnDevice(MakeInput(c.dtype, c.rows, c.k, SeedOf(c) + 1, false));
  ActivationBackwardOptions with_dbias;
  with_dbias.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult a,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, dy, x, with_dbias));
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult b,
                       kernels::FusedActivationBackward(GpuContext(), c.kind, kParams, dy, x,
                                                        ActivationBackwardOptions()));
  EXPECT_FALSE(b.dbias.defined());
  EXPECT_EQ(Bytes(a.dx), Bytes(b.dx));
  if (c.dtype == DType::kFloat32) {
    ASSERT_OK_AND_ASSIGN(const Tensor dx, kernels::ActivationBackward(GpuContext(), c.kind, kParams, dy, x));
    EXPECT_EQ(Bytes(dx), Bytes(a.dx));
  }
}

INSTANTIATE_TEST_SUITE_P(Small, ActivationBackwardGpuTest, ::testing::ValuesIn(SmallCases()), CaseName);

class ActivationBackwardLargeGpuTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationBackwardLargeGpuTest, DxAndDbiasMatchCpu) { CheckBackward(GetParam(), false); }

INSTANTIATE_TEST_SUITE_P(Large, ActivationBackwardLargeGpuTest, ::testing::ValuesIn(LargeBackwardCases()),
                         CaseName);

// ---------------------------------------------------------------------------------------
// Direct launches: poisoned outputs, encoders.

template <typename T>
T* PoisonedBuffer(int64_t count, int byte) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemset(p, byte, static_cast<size_t>(std::max<int64_t>(count, 1)) * sizeof(T)), cudaSuccess);
  return static_cast<T*>(p);
}

template <typename T>
std::vector<T> Download(const T* p, int64_t count) {
  std::vector<T> out(count);
  EXPECT_EQ(cudaMemcpy(out.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return out;
}

kernels::cuda::ActivationFunctionParams FunctionParams(Activation kind) {
  kernels::cuda::ActivationFunctionParams f;
  f.gated = kernels::IsGated(kind);
  switch (kind) {
    case Activation::kGelu:
    case Activation::kGeglu: f.function = kernels::cuda::ActFunction::kGelu; break;
    case Activation::kSwiglu:
    case Activation::kSilu: f.function = kernels::cuda::ActFunction::kSigmoidLinear; f.alpha = 1.0f; break;
    case Activation::kClampedSwiglu:
      f.function = kernels::cuda::ActFunction::kSigmoidLinear;
      f.alpha = kParams.alpha;
      f.clamped = true;
      f.limit = kParams.limit;
      f.offset = 1.0f;
      break;
    default: ADD_FAILURE() << "not used here";
  }
  return f;
}

struct DirectCase {
  Activation kind;
  int64_t rows, k;
};

std::string DirectName(const ::testing::TestParamInfo<DirectCase>& info) {
  return absl::StrCat(kernels::ActivationName(info.param.kind), "_", info.param.rows, "x", info.param.k);
}

class ActivationDirectLaunchTest : public ::testing::TestWithParam<DirectCase> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

// Outputs poisoned with 0xFF bytes (NaN / 0xFF codes) are fully overwritten, with the
// values of the checked entry point; the codec encoder gives the hardware encoder's codes.
TEST_P(ActivationDirectLaunchTest, WritesEveryOutputElementWithEitherEncoder) {
  const DirectCase& d = GetParam();
  const int64_t in_cols = kernels::ActivationInputWidth(d.kind, d.k);
  const Tensor host_x = MakeInput(DType::kFloat32, d.rows, in_cols, 5, true);
  const Tensor x = OnDevice(host_x);
  ActivationForwardOptions options;
  options.quantize = true;
  options.quantize_options.scale = kScale;
  options.quantize_options.columnwise = true;
  ASSERT_OK_AND_ASSIGN(const ActivationForwardResult api,
                       kernels::FusedActivationForward(GpuContext(), d.kind, kParams, x, options));
  for (auto encoder : {kernels::cuda::ActFp8Encoder::kHardware, kernels::cuda::ActFp8Encoder::kCodec}) {
    kernels::cuda::ActivationForwardParams p;
    p.act = FunctionParams(d.kind);
    p.x = x.raw_data();
    p.rows = d.rows;
    p.cols = d.k;
    p.encoder = encoder;
    p.scale = kScale;
    p.scale_inv = 1.0f / kScale;
    float* y = PoisonedBuffer<float>(d.rows * d.k, 0xFF);
    uint8_t* row = PoisonedBuffer<uint8_t>(d.rows * d.k, 0xFF);
    uint8_t* col = PoisonedBuffer<uint8_t>(d.rows * d.k, 0xFF);
    uint32_t* amax = PoisonedBuffer<uint32_t>(1, 0xFF);
    p.y = y;
    p.rowwise = row;
    p.columnwise = col;
    p.amax_bits = amax;
    ASSERT_EQ(kernels::cuda::LaunchActivationForward(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<float> got_y = Download(y, d.rows * d.k);
    const std::vector<float> want_y = Floats(api.y);
    int64_t y_differs = 0;
    for (size_t i = 0; i < want_y.size(); ++i) {
      const bool same = Bits(got_y[i]) == Bits(want_y[i]) || (std::isnan(got_y[i]) && std::isnan(want_y[i]));
      y_differs += same ? 0 : 1;
    }
    EXPECT_EQ(y_differs, 0) << "y";
    EXPECT_EQ(Download(row, d.rows * d.k), Bytes(api.fp8.rowwise_data));
    EXPECT_EQ(Download(col, d.rows * d.k), Bytes(api.fp8.columnwise_data));
    const uint32_t amax_bits = Download(amax, 1)[0];
    EXPECT_TRUE(amax_bits > 0x7F800000u ? std::isnan(api.fp8.amax) : amax_bits == Bits(api.fp8.amax));
    cudaFree(y);
    cudaFree(row);
    cudaFree(col);
    cudaFree(amax);
  }

  // Backward: dx poisoned, dbias poisoned.
  const Tensor dy = OnDevice(MakeInput(DType::kFloat32, d.rows, d.k, 6, false));
  ActivationBackwardOptions bwd;
  bwd.compute_dbias = true;
  ASSERT_OK_AND_ASSIGN(const ActivationBackwardResult api_bwd,
                       kernels::FusedActivationBackward(GpuContext(), d.kind, kParams, dy, x, bwd));
  kernels::cuda::ActivationBackwardParams b;
  b.act = FunctionParams(d.kind);
  b.dy = dy.raw_data();
  b.x = x.raw_data();
  b.rows = d.rows;
  b.cols = d.k;
  float* dx = PoisonedBuffer<float>(d.rows * in_cols, 0xFF);
  float* dbias = PoisonedBuffer<float>(in_cols, 0xFF);
  b.dx = dx;
  b.dbias = dbias;
  const int64_t workspace_floats = kernels::cuda::ActivationBackwardWorkspaceFloats(b);
  float* workspace = PoisonedBuffer<float>(workspace_floats, 0xFF);
  b.workspace = workspace;
  ASSERT_EQ(kernels::cuda::LaunchActivationBackward(b, nullptr), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<float> got_dx = Download(dx, d.rows * in_cols);
  const std::vector<float> want_dx = Floats(api_bwd.dx);
  int64_t dx_differs = 0;
  for (size_t i = 0; i < want_dx.size(); ++i) {
    const bool same = Bits(got_dx[i]) == Bits(want_dx[i]) || (std::isnan(got_dx[i]) && std::isnan(want_dx[i]));
    dx_differs += same ? 0 : 1;
  }
  EXPECT_EQ(dx_differs, 0) << "dx";
  const std::vector<float> got_dbias = Download(dbias, in_cols);
  const std::vector<float> want_dbias = Floats(api_bwd.dbias);
  for (int64_t j = 0; j < in_cols; ++j) {
    const bool same =
        Bits(got_dbias[j]) == Bits(want_dbias[j]) || (std::isnan(got_dbias[j]) && std::isnan(want_dbias[j]));
    ASSERT_TRUE(same) << "dbias[" << j << "] " << got_dbias[j] << " vs " << want_dbias[j];
  }
  cudaFree(dx);
  cudaFree(dbias);
  cudaFree(workspace);
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationDirectLaunchTest,
                         ::testing::Values(DirectCase{Activation::kGelu, 257, 259}, DirectCase{Activation::kGelu, 1, 1024},
                                           DirectCase{Activation::kSwiglu, 128, 129},
                                           DirectCase{Activation::kSwiglu, 260, 192},
                                           DirectCase{Activation::kClampedSwiglu, 257, 259},
                                           DirectCase{Activation::kGelu, 136, 200},
                                           DirectCase{Activation::kSwiglu, 256, 256},
                                           DirectCase{Activation::kClampedSwiglu, 8, 8}),
                         DirectName);

// The 128 x 128 register-tile kernel (kAuto on these shapes) and the 64 x 64 one
// (kTiled64) give the same FP32 and BF16 y, codes and amax bit for bit, from FP32 and
// BF16 x with NaN and infinities, in both formats and with both encoders.
class ActivationForwardKernelsAgreeTest : public ::testing::TestWithParam<DirectCase> {
 protected:
  void SetUp() override { TESERVE_SKIP_WITHOUT_GPU(); }
};

TEST_P(ActivationForwardKernelsAgreeTest, TileKernelMatchesTheFallbackKernel) {
  const DirectCase& d = GetParam();
  const int64_t in_cols = kernels::ActivationInputWidth(d.kind, d.k);
  const int64_t n = d.rows * d.k;
  for (DType x_dtype : {DType::kFloat32, DType::kBFloat16}) {
    const Tensor x = OnDevice(MakeInput(x_dtype, d.rows, in_cols, 11, true));
    for (auto format : {kernels::cuda::Fp8Format::kE4M3, kernels::cuda::Fp8Format::kE5M2}) {
      for (auto encoder : {kernels::cuda::ActFp8Encoder::kHardware, kernels::cuda::ActFp8Encoder::kCodec}) {
        for (auto y_type : {kernels::cuda::ActDType::kFloat32, kernels::cuda::ActDType::kBFloat16}) {
          const std::string what = absl::StrCat(DTypeName(x_dtype), format == kernels::cuda::Fp8Format::kE4M3 ? " E4M3" : " E5M2",
                                                encoder == kernels::cuda::ActFp8Encoder::kCodec ? " codec" : " cvt",
                                                y_type == kernels::cuda::ActDType::kFloat32 ? " y FP32" : " y BF16");
          std::vector<uint8_t> y_bytes[2], row[2], col[2];
          uint32_t amax[2] = {0, 0};
          const size_t y_size = static_cast<size_t>(n) * (y_type == kernels::cuda::ActDType::kFloat32 ? 4 : 2);
          for (int which = 0; which < 2; ++which) {
            kernels::cuda::ActivationForwardParams p;
            p.act = FunctionParams(d.kind);
            p.kernel = which == 0 ? kernels::cuda::ActForwardKernel::kAuto : kernels::cuda::ActForwardKernel::kTiled64;
            p.x = x.raw_data();
            p.x_type = x_dtype == DType::kFloat32 ? kernels::cuda::ActDType::kFloat32
                                                  : kernels::cuda::ActDType::kBFloat16;
            p.rows = d.rows;
            p.cols = d.k;
            p.format = format;
            p.encoder = encoder;
            p.scale = kScale;
            p.scale_inv = 1.0f / kScale;
            uint8_t* y = PoisonedBuffer<uint8_t>(static_cast<int64_t>(y_size), 0xFF);
            uint8_t* r = PoisonedBuffer<uint8_t>(n, 0xFF);
            uint8_t* c = PoisonedBuffer<uint8_t>(n, 0xFF);
            uint32_t* a = PoisonedBuffer<uint32_t>(1, 0xFF);
            p.y = y;
            p.y_type = y_type;
            p.rowwise = r;
            p.columnwise = c;
            p.amax_bits = a;
            ASSERT_EQ(kernels::cuda::LaunchActivationForward(p, nullptr), cudaSuccess) << what;
            ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
            y_bytes[which] = Download(y, static_cast<int64_t>(y_size));
            row[which] = Download(r, n);
            col[which] = Download(c, n);
            amax[which] = Download(a, 1)[0];
            cudaFree(y);
            cudaFree(r);
            cudaFree(c);
            cudaFree(a);
          }
          // NaN y may differ in payload only (FP32 y); compare the rest bitwise.
          int64_t y_differs = 0;
          if (y_type == kernels::cuda::ActDType::kFloat32) {
            for (int64_t i = 0; i < n; ++i) {
              float u, v;
              std::memcpy(&u, &y_bytes[0][4 * i], 4);
              std::memcpy(&v, &y_bytes[1][4 * i], 4);
              y_differs += (Bits(u) == Bits(v) || (std::isnan(u) && std::isnan(v))) ? 0 : 1;
            }
          } else {
            y_differs = y_bytes[0] == y_bytes[1] ? 0 : 1;
          }
          EXPECT_EQ(y_differs, 0) << what << ": y";
          EXPECT_EQ(row[0], row[1]) << what << ": rowwise codes";
          EXPECT_EQ(col[0], col[1]) << what << ": columnwise codes";
          if (amax[1] > 0x7F800000u) {
            EXPECT_GT(amax[0], 0x7F800000u) << what << ": amax NaN";
          } else {
            EXPECT_EQ(amax[0], amax[1]) << what << ": amax";
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, ActivationForwardKernelsAgreeTest,
                         ::testing::Values(DirectCase{Activation::kGelu, 256, 256},
                                           DirectCase{Activation::kGelu, 136, 200},
                                           DirectCase{Activation::kSwiglu, 136, 200},
                                           DirectCase{Activation::kClampedSwiglu, 256, 256},
                                           DirectCase{Activation::kSilu, 8, 8}),
                         DirectName);

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
TEST(FusedActivationCpuTest, CudaContextWithoutCudaBackendIsFailedPrecondition) {
  Context ctx;
  ctx.device = Device::Cuda(0);
  float storage[8] = {};
  const Tensor x = Tensor::Borrow(storage, DType::kFloat32, {2, 4}, Device::Cuda(0));
  auto fused = kernels::FusedActivationForward(ctx, kernels::Activation::kGelu, kernels::ActivationParams(), x,
                                               kernels::ActivationForwardOptions());
  EXPECT_EQ(fused.status().code(), absl::StatusCode::kFailedPrecondition) << fused.status();
  EXPECT_NE(fused.status().message().find("FusedActivationForward on a CUDA device"), std::string::npos);
  auto plain = kernels::ActivationBackward(ctx, kernels::Activation::kGelu, kernels::ActivationParams(), x, x);
  EXPECT_EQ(plain.status().code(), absl::StatusCode::kFailedPrecondition) << plain.status();
  EXPECT_NE(plain.status().message().find("ActivationBackward on a CUDA device"), std::string::npos);
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
