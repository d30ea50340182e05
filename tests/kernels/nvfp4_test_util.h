// Helpers shared by nvfp4_test.cc and nvfp4_gradient_test.cc: FP4 nibbles, option
// builders, checked quantize/dequantize, banded inputs and the per-element formula check.
#ifndef TESERVE_TESTS_KERNELS_NVFP4_TEST_UTIL_H_
#define TESERVE_TESTS_KERNELS_NVFP4_TEST_UTIL_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/context.h"
#include "core/float_codec.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/nvfp4.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace testing_kernels {

inline uint8_t Nibble(const Tensor& packed, int64_t i) {
  const uint8_t byte = packed.data<uint8_t>()[i / 2];
  return (i % 2) ? (byte >> 4) : (byte & 0xF);
}

inline Tensor Matrix(std::vector<float> values, int64_t rows, int64_t cols) {
  return Tensor::FromFloats(values, {rows, cols}).value();
}

inline kernels::Nvfp4QuantizeOptions Options(bool rowwise, bool columnwise, bool two_d = false) {
  kernels::Nvfp4QuantizeOptions options;
  options.rowwise = rowwise;
  options.columnwise = columnwise;
  options.two_d = two_d;
  return options;
}

inline QuantizedTensor Quantize(const Tensor& x, const kernels::Nvfp4QuantizeOptions& options,
                                const Context& ctx = Context::Cpu()) {
  auto q = kernels::QuantizeNvfp4(ctx, x, options);
  EXPECT_TRUE(q.ok()) << q.status();
  return q.ok() ? *q : QuantizedTensor{};
}

inline Tensor Dequantized(const QuantizedTensor& q, kernels::Copy copy) {
  auto out = kernels::DequantizeNvfp4(Context::Cpu(), q, copy);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *out : Tensor{};
}

// Random values whose magnitude changes by 10x from one 16-wide column band to the
// next, so block scales differ and several E4M3 binades appear.
inline Tensor BandedTensor(int64_t rows, int64_t cols, uint32_t seed) {
  Tensor x = RandomTensor({rows, cols}, -1.0f, 1.0f, seed);
  float* v = x.mutable_floats().data();
  for (int64_t i = 0; i < x.numel(); ++i) v[i] *= std::pow(10.0f, static_cast<float>((i % cols) / 16 % 5) - 2.0f);
  return x;
}

// Recomputes codes and scale bytes of a 1D copy from the header's formula.
inline void ExpectMatchesFormula(const Tensor& src, const Tensor& data, const Tensor& scales, float s) {
  const int64_t rows = src.dim(0), cols = src.dim(1);
  const float inv_s = 1.0f / s;
  int64_t mismatches = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 16; ++b) {
      float block_amax = 0.0f;
      for (int k = 0; k < 16; ++k) block_amax = std::max(block_amax, std::fabs(src.floats()[r * cols + b * 16 + k]));
      const uint8_t byte = FloatToE4M3(block_amax / 6.0f * s);
      mismatches += scales.data<uint8_t>()[r * (cols / 16) + b] != byte;
      const float sd = E4M3ToFloat(byte);
      const float e = sd > 0 ? std::min(1.0f / (sd * inv_s), FLT_MAX) : 0.0f;
      for (int k = 0; k < 16; ++k) {
        const int64_t i = r * cols + b * 16 + k;
        mismatches += Nibble(data, i) != FloatToE2M1(src.floats()[i] * e);
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_NVFP4_TEST_UTIL_H_
