// Shared by the two files of activation_gpu_test (activation_gpu_test.cc: CPU reference,
// forward, edges and errors; activation_launch_gpu_test.cc: backward and direct launches):
// inputs, the forward-error scale of each formula, the tolerance check, the test cases.
// CUDA builds only (TESERVE_WITH_CUDA).
#ifndef TESERVE_TESTS_GPU_ACTIVATION_GPU_TEST_UTIL_H_
#define TESERVE_TESTS_GPU_ACTIVATION_GPU_TEST_UTIL_H_

#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/activation.h"
#include "kernels/cpu/cast_cpu.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#include "tests/kernels/tolerances.h"

namespace teserve {
namespace activation_gpu_test {

using kernels::Activation;
using kernels::ActivationBackwardOptions;
using kernels::ActivationBackwardResult;
using kernels::ActivationForwardOptions;
using kernels::ActivationForwardResult;
using kernels::ActivationParams;

inline const Device kGpu = Device::Cuda(0);

using testing::Bytes;
using testing::Floats;
using testing::GpuContext;
using testing::OnDevice;
using testing::OnHost;
using testing::Uniform;

inline uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

inline uint8_t Encode(DType format, float v) { return format == DType::kFloat8E4M3 ? FloatToE4M3(v) : FloatToE5M2(v); }

// Position of an FP8 code in value order (-0 and +0 share 0).
inline int Ordinal(uint8_t code) { return (code & 0x80) ? -static_cast<int>(code & 0x7F) : code; }

inline const ActivationParams kParams;  // clamped_swiglu: limit 7, alpha 1.702

// Host input [rows, cols] of `dtype`: uniforms in [-4.5, 4.5), every 5th row 3x larger
// (so the clamp limit 7 is crossed), exact zeros, exact +-limit, and with `specials` a few
// NaN and +-Inf.
inline Tensor MakeInput(DType dtype, int64_t rows, int64_t cols, uint64_t seed, bool specials) {
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

inline double SigmoidD(double u) { return 1.0 / (1.0 + std::exp(-u)); }

struct TermScale {
  double value;  // |f(x)|
  double grad;   // sum of |terms| of f'(x)
};

inline TermScale ScaleOf(Activation kind, double x) {
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

inline double ClampA(Activation kind, double a) {
  return kind == Activation::kClampedSwiglu ? std::min(a, static_cast<double>(kParams.limit)) : a;
}

inline double LinearOf(Activation kind, double b) {
  if (kind != Activation::kClampedSwiglu) return b;
  const double l = kParams.limit;
  return std::max(-l, std::min(b, l)) + 1.0;
}

// Scales of y [rows, K] and of dx [rows, in_cols] (dy given).
inline void Scales(Activation kind, const std::vector<float>& x, const std::vector<float>* dy, int64_t rows, int64_t k,
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
inline void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const std::vector<double>& scale,
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

inline std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return absl::StrCat(kernels::ActivationName(c.kind), "_", c.rows, "x", c.k, "_", DTypeName(c.dtype), "_",
                      c.format == DType::kFloat8E4M3 ? "E4M3" : "E5M2");
}

inline constexpr Activation kKinds[] = {
    Activation::kGelu,  Activation::kGeglu,  Activation::kQgelu, Activation::kQgeglu,
    Activation::kRelu,  Activation::kReglu,  Activation::kSrelu, Activation::kSreglu,
    Activation::kSilu,  Activation::kSwiglu, Activation::kClampedSwiglu,
};

struct Shape2 {
  int64_t rows, k;
};

// Small shapes for every kind and dtype: one row (scalar and vectorized widths), odd
// widths and row counts (scalar path, tile tails), multiples of 4 (vectorized path).
inline constexpr Shape2 kSmallShapes[] = {{1, 259}, {1, 1024}, {257, 259}, {128, 129}, {128, 128}, {260, 192}};

inline std::vector<Case> SmallCases() {
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
// 400 and 376 rows (rows % 32 = 16 and 24, several tile rows): columnwise runs that start
// inside a 32-byte sector.
inline constexpr Shape2 kTiledShapes[] = {{256, 256}, {136, 200}, {8, 8}, {400, 264}, {376, 136}};

inline std::vector<Case> TiledCases() {
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
inline std::vector<Case> LargeForwardCases() {
  std::vector<Case> cases;
  for (Activation kind : kKinds) cases.push_back({kind, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3});
  return cases;
}

inline std::vector<Case> LargeBackwardCases() {
  return {{Activation::kGelu, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3},
          {Activation::kSwiglu, 16384, 8192, DType::kBFloat16, DType::kFloat8E4M3},
          {Activation::kClampedSwiglu, 16384, 8192, DType::kFloat32, DType::kFloat8E4M3}};
}

inline int64_t InputWidth(const Case& c) { return kernels::ActivationInputWidth(c.kind, c.k); }

inline uint64_t SeedOf(const Case& c) {
  return static_cast<uint64_t>(c.rows * 7919 + c.k * 31 + static_cast<int>(c.kind));
}

inline constexpr float kScale = 16.0f;  // saturates the largest srelu / sreglu values in E4M3

}  // namespace activation_gpu_test
}  // namespace teserve

#endif  // TESERVE_WITH_CUDA
#endif  // TESERVE_TESTS_GPU_ACTIVATION_GPU_TEST_UTIL_H_
