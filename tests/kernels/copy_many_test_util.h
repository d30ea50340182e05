// Tensors for the batched-copy tests (kernels::CopyManyInto / CopyManyTo): many CPU
// tensors of mixed dtypes and sizes with random bytes, empty ones and packed FP4 with an
// odd element count included, as a session's checkpoint state mixes them.
#ifndef TESERVE_TESTS_KERNELS_COPY_MANY_TEST_UTIL_H_
#define TESERVE_TESTS_KERNELS_COPY_MANY_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace teserve {
namespace testing_kernels {

inline std::vector<Tensor> MixedTensors(int count, uint32_t seed) {
  static const DType kDTypes[] = {DType::kFloat32,    DType::kFloat16,    DType::kBFloat16,
                                  DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kFloat4E2M1,
                                  DType::kFloat8E8M0, DType::kInt32,      DType::kInt64,
                                  DType::kBool};
  static const Shape kShapes[] = {{0},       {1},   {3, 0},   {7},     {5, 3}, {64, 33},
                                  {1, 1, 1}, {257}, {31, 129}, {2, 0, 4}};
  std::mt19937 rng(seed);
  std::vector<Tensor> out;
  for (int i = 0; i < count; ++i) {
    const DType dtype = kDTypes[rng() % (sizeof(kDTypes) / sizeof(kDTypes[0]))];
    // Now and then a bigger one (about 1 MB of FP32), so a chunk holds several pieces.
    const Shape shape = (i % 97 == 13) ? Shape{512, 517} : kShapes[rng() % (sizeof(kShapes) / sizeof(kShapes[0]))];
    Tensor t = Tensor::Zeros(dtype, shape).value();
    unsigned char* bytes = static_cast<unsigned char*>(t.raw_data());
    for (int64_t b = 0; b < t.nbytes(); ++b) bytes[b] = static_cast<unsigned char>(rng());
    out.push_back(std::move(t));
  }
  return out;
}

inline std::vector<const Tensor*> Pointers(const std::vector<Tensor>& tensors) {
  std::vector<const Tensor*> out;
  for (const Tensor& t : tensors) out.push_back(&t);
  return out;
}

inline std::vector<Tensor*> MutablePointers(std::vector<Tensor>& tensors) {
  std::vector<Tensor*> out;
  for (Tensor& t : tensors) out.push_back(&t);
  return out;
}

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_COPY_MANY_TEST_UTIL_H_
