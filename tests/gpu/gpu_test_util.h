// Shared by the tests in tests/gpu: whether a usable GPU is present, and why not.
// Those tests call TESERVE_SKIP_WITHOUT_GPU() first, so they build everywhere (also
// under --config=cpu) and skip with a clear message on machines without a GPU.
#ifndef TESERVE_TESTS_GPU_GPU_TEST_UTIL_H_
#define TESERVE_TESTS_GPU_GPU_TEST_UTIL_H_

#include <string>

#include "core/context.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace teserve {
namespace testing {

// True when the CUDA backend is compiled in and at least one GPU is visible;
// otherwise false with `reason` set.
inline bool GpuAvailable(std::string* reason) {
#if TESERVE_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    *reason = std::string("no usable GPU: cudaGetDeviceCount failed with ") +
              cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
    return false;
  }
  if (count == 0) {
    *reason = "no usable GPU: cudaGetDeviceCount returned 0";
    return false;
  }
  return true;
#else
  *reason = "teserve was built without CUDA (--config=cpu or no toolkit): GPU test skipped";
  return false;
#endif
}

#if TESERVE_WITH_CUDA
// A non-blocking stream for a test's context. Tensors allocated on a stream are freed in
// its order, so the stream must outlive them: declare this before them.
class ScopedStream {
 public:
  ScopedStream() { ok_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking) == cudaSuccess; }
  ~ScopedStream() {
    if (ok_) cudaStreamDestroy(stream_);
  }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;
  bool ok() const { return ok_; }
  cudaStream_t get() const { return stream_; }
  // A Context of CUDA device `device` on this stream.
  Context context(int device = 0) const {
    Context ctx;
    ctx.device = Device::Cuda(device);
    ctx.stream = stream_;
    return ctx;
  }

 private:
  cudaStream_t stream_ = nullptr;
  bool ok_ = false;
};
#endif

}  // namespace testing
}  // namespace teserve

#define TESERVE_SKIP_WITHOUT_GPU()                                           \
  do {                                                                       \
    std::string teserve_skip_reason_;                                        \
    if (!::teserve::testing::GpuAvailable(&teserve_skip_reason_)) {          \
      GTEST_SKIP() << teserve_skip_reason_;                                  \
    }                                                                        \
  } while (0)

// ASSERT_OK_AND_ASSIGN(lhs, expr): fails the test with the status if `expr` (an
// absl::StatusOr) is not OK, else moves its value into `lhs` (may be a declaration).
#define TESERVE_TEST_CONCAT_INNER_(a, b) a##b
#define TESERVE_TEST_CONCAT_(a, b) TESERVE_TEST_CONCAT_INNER_(a, b)
#define ASSERT_OK_AND_ASSIGN(lhs, expr) \
  TESERVE_ASSERT_OK_AND_ASSIGN_IMPL_(TESERVE_TEST_CONCAT_(teserve_statusor_, __LINE__), lhs, expr)
#define TESERVE_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                       \
  ASSERT_TRUE(statusor.ok()) << statusor.status();              \
  lhs = std::move(statusor).value()

#endif  // TESERVE_TESTS_GPU_GPU_TEST_UTIL_H_
