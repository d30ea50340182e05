// Helpers shared by the GPU tests (block_quantize, nvfp4, activation, normalization): test
// inputs that hit the block-scaling edge cases, host/device copies, and byte-exact
// comparisons that report the first differing element.
#ifndef TESERVE_TESTS_GPU_QUANTIZE_GPU_TEST_UTIL_H_
#define TESERVE_TESTS_GPU_QUANTIZE_GPU_TEST_UTIL_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/float_codec.h"
#include "core/tensor.h"
#include "kernels/gemm.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/cast/cast_cuda.h"

namespace teserve {
namespace testing {

inline uint32_t FloatBitsOf(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Values over many binades (2^-24 .. 2^8, both signs, +-0), with, at random places:
// whole 16-element runs of zeros, of FP32 subnormals and of one value 448 * 2^k or
// 6 * 2^k (block amaxes on an exact power-of-two boundary), ties of the FP8 grids, and,
// when `specials`, a few NaN and +-Inf. Deterministic in `seed`.
inline std::vector<float> QuantizeTestValues(int64_t n, uint32_t seed, bool specials) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-24, 8);
  std::uniform_int_distribution<int> kind(0, 99);
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = std::ldexp(normal(rng), binade(rng));
  constexpr int64_t kRun = 16;
  for (int64_t start = 0; start + kRun <= n; start += kRun) {
    const int k = kind(rng);
    if (k == 0) {
      for (int64_t i = start; i < start + kRun; ++i) v[i] = (i % 2) ? -0.0f : 0.0f;
    } else if (k == 1) {
      for (int64_t i = start; i < start + kRun; ++i) v[i] = std::ldexp(normal(rng), -135);
    } else if (k == 2) {
      v[start + 3] = std::ldexp(448.0f, binade(rng));
    } else if (k == 3) {
      v[start + 5] = -std::ldexp(6.0f, binade(rng));
    } else if (k == 4) {
      // 1.0625 and 1.1875: exact ties of the E4M3 grid at scale 1 (step 0.125).
      v[start + 7] = 1.0625f;
      v[start + 8] = -1.1875f;
    }
  }
  if (specials && n > 100) {
    v[n / 7] = std::numeric_limits<float>::quiet_NaN();
    v[n / 3] = std::numeric_limits<float>::infinity();
    v[(2 * n) / 3] = -std::numeric_limits<float>::infinity();
  }
  if (n > 0) v[0] = -0.0f;
  return v;
}

// Deterministic pseudo-random uniforms in [-1, 1) (splitmix64), fast enough for the
// 134M-element shapes.
inline float Uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

inline Context GpuContext() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

// Host copy of a device tensor (undefined stays undefined; CPU tensors pass through).
inline Tensor OnHost(const Tensor& t) {
  if (!t.defined() || t.device().is_cpu()) return t;
  auto host = kernels::cuda::CopyToHost(Context{}, t);
  EXPECT_TRUE(host.ok()) << host.status();
  return host.ok() ? *host : Tensor();
}

inline Tensor OnDevice(const Tensor& host) {
  auto device = kernels::cuda::CopyToDevice(Context{}, host, Device::Cuda(0));
  EXPECT_TRUE(device.ok()) << device.status();
  return device.ok() ? *device : Tensor();
}

// A GEMM operand with its data and scale_inv (when defined) copied to the device, the
// rest (transpose, scale mode and layout) as given.
inline kernels::GemmOperand OnDevice(const kernels::GemmOperand& host) {
  kernels::GemmOperand o = host;
  o.data = OnDevice(host.data);
  if (host.scale_inv.defined()) o.scale_inv = OnDevice(host.scale_inv);
  return o;
}

// FP32 values of a tensor of any high-precision dtype (device tensors copied back).
inline std::vector<float> Floats(const Tensor& t) {
  const Tensor host = OnHost(t);
  auto wide = kernels::cpu::ToFloat32(Context::Cpu(), host);
  EXPECT_TRUE(wide.ok()) << wide.status();
  if (!wide.ok()) return {};
  return std::vector<float>(wide->floats().begin(), wide->floats().end());
}

// The bytes of a tensor (device tensors copied back).
inline std::vector<uint8_t> Bytes(const Tensor& t) {
  const Tensor host = OnHost(t);
  const uint8_t* p = host.data<uint8_t>();
  return std::vector<uint8_t>(p, p + host.nbytes());
}

// BF16 host tensor [rows, cols] of the values (RNE) and the FP32 tensor of its exact
// widening, which is what the CPU reference quantizes.
struct Bf16Input {
  std::vector<uint16_t> codes;
  Tensor bf16;     // borrows `codes`
  Tensor widened;  // FP32
};

inline void MakeBf16Input(const std::vector<float>& values, int64_t rows, int64_t cols,
                          Bf16Input* out) {
  out->codes.resize(values.size());
  std::vector<float> widened(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    out->codes[i] = FloatToBf16(values[i]);
    widened[i] = Bf16ToFloat(out->codes[i]);
  }
  out->bf16 = Tensor::Borrow(out->codes.data(), DType::kBFloat16, {rows, cols});
  out->widened = Tensor::FromFloats(widened, {rows, cols}).value();
}

// Same dtype, shape and bytes; on failure names the first differing byte.
inline void ExpectSameBytes(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  const Tensor gpu_host = OnHost(gpu);
  ASSERT_EQ(gpu_host.defined(), cpu.defined()) << what;
  if (!cpu.defined()) return;
  ASSERT_EQ(gpu_host.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu_host.dtype(), cpu.dtype()) << what;
  ASSERT_EQ(gpu_host.nbytes(), cpu.nbytes()) << what;
  const uint8_t* a = gpu_host.data<uint8_t>();
  const uint8_t* b = cpu.data<uint8_t>();
  int64_t differing = 0;
  int64_t first = -1;
  for (int64_t i = 0; i < cpu.nbytes(); ++i) {
    if (a[i] != b[i]) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (differing > 0) {
    ADD_FAILURE() << what << ": " << differing << " of " << cpu.nbytes()
                  << " bytes differ; first at byte " << first << " (gpu 0x" << std::hex
                  << int{a[first]} << ", cpu 0x" << int{b[first]} << ")";
  }
}

// FP32 tensors: every element bit-identical, except that a NaN only has to be a NaN
// (GPU arithmetic returns its canonical NaN where x86 keeps an operand's payload; no
// contract covers NaN payloads).
inline void ExpectSameFloats(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  const Tensor gpu_host = OnHost(gpu);
  ASSERT_EQ(gpu_host.shape(), cpu.shape()) << what;
  ASSERT_EQ(gpu_host.dtype(), DType::kFloat32) << what;
  ASSERT_EQ(cpu.dtype(), DType::kFloat32) << what;
  const float* a = gpu_host.data<float>();
  const float* b = cpu.data<float>();
  int64_t differing = 0;
  int64_t first = -1;
  int64_t nans = 0;
  for (int64_t i = 0; i < cpu.numel(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    nans += both_nan ? 1 : 0;
    if (!both_nan && FloatBitsOf(a[i]) != FloatBitsOf(b[i])) {
      if (first < 0) first = i;
      ++differing;
    }
  }
  if (differing > 0) {
    ADD_FAILURE() << what << ": " << differing << " of " << cpu.numel()
                  << " elements differ; first at " << first << " (gpu " << a[first] << " 0x"
                  << std::hex << FloatBitsOf(a[first]) << ", cpu " << std::dec << b[first]
                  << " 0x" << std::hex << FloatBitsOf(b[first]) << ")";
  }
}

inline void ExpectSameAmax(float gpu, float cpu) {
  EXPECT_EQ(FloatBitsOf(gpu), FloatBitsOf(cpu)) << "amax gpu " << gpu << " cpu " << cpu;
}

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_GPU_QUANTIZE_GPU_TEST_UTIL_H_
