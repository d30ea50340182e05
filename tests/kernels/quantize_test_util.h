// Helpers shared by the quantization tests (block_quantize*, nvfp4*): raw bits and
// bytes of tensors, a dtype-generic transpose, and the two copies of a QuantizedTensor.
#ifndef TESERVE_TESTS_KERNELS_QUANTIZE_TEST_UTIL_H_
#define TESERVE_TESTS_KERNELS_QUANTIZE_TEST_UTIL_H_

#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace testing_kernels {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// The storage bytes of `t` (packed FP4 holds two elements per byte).
inline std::vector<uint8_t> Bytes(const Tensor& t) {
  const uint8_t* p = t.data<uint8_t>();
  return std::vector<uint8_t>(p, p + t.nbytes());
}

inline std::vector<float> Floats(const Tensor& t) {
  return std::vector<float>(t.floats().begin(), t.floats().end());
}

// x^T of a rank-2 tensor of any whole-byte dtype.
inline Tensor Transposed(const Tensor& x) {
  const int64_t rows = x.dim(0), cols = x.dim(1);
  Tensor t = Tensor::Zeros(x.dtype(), {cols, rows}).value();
  const int64_t bytes = DTypeBits(x.dtype()) / 8;
  const uint8_t* src = static_cast<const uint8_t*>(x.raw_data());
  uint8_t* dst = static_cast<uint8_t*>(t.raw_data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c)
      std::memcpy(dst + (c * rows + r) * bytes, src + (r * cols + c) * bytes, bytes);
  }
  return t;
}

inline const Tensor& DataOf(const QuantizedTensor& q, kernels::Copy copy) {
  return copy == kernels::Copy::kRowwise ? q.rowwise_data : q.columnwise_data;
}
inline const Tensor& ScalesOf(const QuantizedTensor& q, kernels::Copy copy) {
  return copy == kernels::Copy::kRowwise ? q.rowwise_scale_inv : q.columnwise_scale_inv;
}

inline std::string CopyName(kernels::Copy copy) {
  return copy == kernels::Copy::kRowwise ? "Rowwise" : "Columnwise";
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_QUANTIZE_TEST_UTIL_H_
