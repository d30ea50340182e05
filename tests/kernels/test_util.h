// Helpers shared by the kernel tests: seeded random tensors and status matchers.
#ifndef TESERVE_TESTS_KERNELS_TEST_UTIL_H_
#define TESERVE_TESTS_KERNELS_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tensor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace teserve {
namespace testing_kernels {

// Uniform values in [lo, hi), reproducible from `seed`.
inline std::vector<float> RandomFloats(int64_t count, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> values(count);
  for (float& v : values) v = dist(rng);
  return values;
}

inline Tensor RandomTensor(Shape shape, float lo, float hi, uint32_t seed) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return Tensor::FromFloats(RandomFloats(count, lo, hi, seed), std::move(shape)).value();
}

inline std::vector<double> ToDoubles(absl::Span<const float> values) {
  return std::vector<double>(values.begin(), values.end());
}

inline absl::Status StatusOf(const absl::Status& status) { return status; }
template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

// EXPECT_THAT(status or StatusOr, HasError(absl::StatusCode::kInvalidArgument, "x.dtype")).
MATCHER_P2(HasError, code, fragment,
           std::string("has code ") + absl::StatusCodeToString(code) + " and a message containing \"" +
               fragment + "\"") {
  const absl::Status status = StatusOf(arg);
  *result_listener << "status is " << status.ToString();
  return status.code() == code && status.message().find(fragment) != absl::string_view::npos;
}

}  // namespace testing_kernels
}  // namespace teserve

// ASSERT_OK(status or StatusOr): fails the test with the status when it is not OK.
#define ASSERT_OK(expr)                                                          \
  do {                                                                           \
    const absl::Status teserve_assert_ok_ = ::teserve::testing_kernels::StatusOf(expr); \
    ASSERT_TRUE(teserve_assert_ok_.ok()) << teserve_assert_ok_;                  \
  } while (0)

#endif  // TESERVE_TESTS_KERNELS_TEST_UTIL_H_
