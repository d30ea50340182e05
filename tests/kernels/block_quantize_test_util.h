// Helpers shared by block_quantize_test.cc and block_quantize_shapes_test.cc.
#ifndef TESERVE_TESTS_KERNELS_BLOCK_QUANTIZE_TEST_UTIL_H_
#define TESERVE_TESTS_KERNELS_BLOCK_QUANTIZE_TEST_UTIL_H_

#include <cstdint>
#include <cstring>

#include "core/tensor.h"
#include "kernels/block_quantize.h"

namespace teserve {
namespace testing_kernels {

inline kernels::BlockScalingQuantizeOptions BlockOptions(bool rowwise, bool columnwise,
                                                         bool two_d) {
  kernels::BlockScalingQuantizeOptions o;
  o.rowwise = rowwise;
  o.columnwise = columnwise;
  o.two_d = two_d;
  return o;
}

// E8M0 [rows, cols] with every code `fill`.
inline Tensor ScaleCodes(int64_t rows, int64_t cols, uint8_t fill) {
  Tensor t = Tensor::Zeros(DType::kFloat8E8M0, {rows, cols}).value();
  std::memset(t.raw_data(), fill, t.nbytes());
  return t;
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_BLOCK_QUANTIZE_TEST_UTIL_H_
