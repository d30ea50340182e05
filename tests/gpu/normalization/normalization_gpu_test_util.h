// Helpers shared by the normalization GPU tests (normalization_gpu_test.cc: forward and
// encoders; normalization_backward_gpu_test.cc: backward, sm_margin, FP32 entry points):
// random inputs with outlier rows, FP8 code ordinals, the forward-error scales the
// tolerances are taken on, and poisoned output buffers for direct forward launches. Only built with CUDA (TESERVE_WITH_CUDA).
#ifndef TESERVE_TESTS_GPU_NORMALIZATION_GPU_TEST_UTIL_H_
#define TESERVE_TESTS_GPU_NORMALIZATION_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "tests/gpu/quantize_gpu_test_util.h"

namespace teserve {
namespace norm_gpu_test {

using testing::Uniform;


template <typename T>
inline cudaError_t DeviceAlloc(T** ptr, int64_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(ptr), static_cast<size_t>(bytes));
}

inline uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Host tensor of `dtype` [n, h]: mean 0.5, spread ~1.5, every 7th row 64x larger.
inline Tensor RandomInput(DType dtype, int64_t n, int64_t h, uint64_t seed) {
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

inline Tensor RandomVector(int64_t h, float lo, float hi, uint64_t seed) {
  Tensor t = Tensor::Zeros(DType::kFloat32, {h}).value();
  for (int64_t c = 0; c < h; ++c) {
    t.data<float>()[c] = lo + (hi - lo) * 0.5f * (Uniform(seed, c) + 1.0f);
  }
  return t;
}

// Position of an FP8 code in value order (-0 and +0 share 0).
inline int Ordinal(uint8_t code) { return (code & 0x80) ? -static_cast<int>(code & 0x7F) : code; }

inline uint8_t Encode(DType format, float v) {
  return format == DType::kFloat8E4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

inline std::string ShapeName(int64_t n, int64_t h) { return absl::StrCat(n, "x", h); }

inline std::vector<double> AsDoubles(const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); }

// Forward-error scale of y = (x - mu) rsigma w + b: (|x| + mean |x|) rsigma |w| + |b| (the
// mean's error is relative to mean |x|). mean_abs receives mean |x| per row.
inline std::vector<double> ForwardScale(const std::vector<float>& x, int64_t n, int64_t h,
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
inline void BackwardScales(const std::vector<float>& x, const std::vector<float>& dy, int64_t n, int64_t h,
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

// Host copy of `bytes` bytes of device memory.
inline std::vector<uint8_t> ToHost(const void* device, int64_t bytes) {
  std::vector<uint8_t> host(bytes);
  EXPECT_EQ(cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

// Device buffers for every output of a forward launch on n x h, poisoned (y NaN, codes 0xA5,
// statistics, scale inverses and amax all ones bits), freed with the object.
struct ForwardBuffers {
  ForwardBuffers(int64_t n, int64_t h) : numel(n * h) {
    EXPECT_EQ(DeviceAlloc(&y, numel * 4), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&rowwise, numel), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&columnwise, numel), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&mu, n * 4), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&rsigma, n * 4), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&scale_inv, 8), cudaSuccess);
    EXPECT_EQ(DeviceAlloc(&amax, 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(y, 0xFF, numel * 4), cudaSuccess);  // NaN
    EXPECT_EQ(cudaMemset(rowwise, 0xA5, numel), cudaSuccess);
    EXPECT_EQ(cudaMemset(columnwise, 0xA5, numel), cudaSuccess);
    EXPECT_EQ(cudaMemset(mu, 0xFF, n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(rsigma, 0xFF, n * 4), cudaSuccess);
    EXPECT_EQ(cudaMemset(scale_inv, 0xFF, 8), cudaSuccess);
    EXPECT_EQ(cudaMemset(amax, 0xFF, 4), cudaSuccess);
    // cudaMemset is ordered on the legacy default stream only: done before any launch on
    // another stream.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  ~ForwardBuffers() {
    for (void* ptr : {y, static_cast<void*>(rowwise), static_cast<void*>(columnwise), static_cast<void*>(mu),
                      static_cast<void*>(rsigma), static_cast<void*>(scale_inv), static_cast<void*>(amax)}) {
      cudaFree(ptr);
    }
  }
  ForwardBuffers(const ForwardBuffers&) = delete;
  ForwardBuffers& operator=(const ForwardBuffers&) = delete;

  // Points p's outputs at these buffers: y only with `with_y`, mu only for LayerNorm.
  void Attach(kernels::cuda::NormForwardParams* p, bool with_y) const {
    p->y = with_y ? y : nullptr;
    p->mu = p->rms ? nullptr : mu;
    p->rsigma = rsigma;
    p->rowwise = rowwise;
    p->columnwise = columnwise;
    p->rowwise_scale_inv = scale_inv;
    p->columnwise_scale_inv = scale_inv + 1;
    p->amax_bits = amax;
  }

  int64_t numel;
  void* y = nullptr;
  uint8_t *rowwise = nullptr, *columnwise = nullptr;
  float *mu = nullptr, *rsigma = nullptr, *scale_inv = nullptr;
  uint32_t* amax = nullptr;
};

}  // namespace norm_gpu_test
}  // namespace teserve

#endif  // TESERVE_TESTS_GPU_NORMALIZATION_GPU_TEST_UTIL_H_
