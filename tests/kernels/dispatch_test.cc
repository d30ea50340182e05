// Dispatch and NoKernel (kernels/dispatch.h): which callable runs for which context, and
// the one UNIMPLEMENTED answer for an op without a kernel on the context's device.
#include "kernels/dispatch.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/test_util.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::HasError;

Context CudaContext(int index) {
  Context ctx;
  ctx.device = Device::Cuda(index);
  return ctx;
}

TEST(Dispatch, CpuContextRunsTheCpuCallableOnly) {
  int cpu_calls = 0, cuda_calls = 0;
  const absl::StatusOr<int> r = Dispatch(
      "Op", Context::Cpu(), [&] { ++cpu_calls; return absl::StatusOr<int>(1); },
      [&] { ++cuda_calls; return absl::StatusOr<int>(2); });
  EXPECT_EQ(r.value(), 1);
  EXPECT_EQ(cpu_calls, 1);
  EXPECT_EQ(cuda_calls, 0);
  // A marker is never consulted on the CPU.
  EXPECT_TRUE(Dispatch("Op", Context::Cpu(), [] { return absl::OkStatus(); }, kNoCudaKernel).ok());
  EXPECT_TRUE(Dispatch("Op", Context::Cpu(), [] { return absl::OkStatus(); }, kNoCudaBackend).ok());
}

TEST(Dispatch, CudaContextRunsTheCudaCallableOnly) {
  int cpu_calls = 0;
  const absl::StatusOr<int> r = Dispatch(
      "Op", CudaContext(1), [&] { ++cpu_calls; return absl::StatusOr<int>(1); },
      [] { return absl::StatusOr<int>(2); });
  EXPECT_EQ(r.value(), 2);
  EXPECT_EQ(cpu_calls, 0);
  // The CUDA callable's errors come back unchanged.
  EXPECT_THAT(Dispatch("Op", CudaContext(0), [] { return absl::OkStatus(); },
                       [] { return absl::InternalError("launch failed"); }),
              HasError(absl::StatusCode::kInternal, "launch failed"));
}

TEST(Dispatch, MarkersAnswerUnimplementedNamingTheOpAndTheDevice) {
  int cpu_calls = 0;
  EXPECT_THAT(Dispatch("Gemm", CudaContext(0), [&] { ++cpu_calls; return absl::OkStatus(); }, kNoCudaKernel),
              HasError(absl::StatusCode::kUnimplemented,
                       "Gemm has no kernel for cuda:0 (only the CPU reference exists)"));
  EXPECT_THAT(Dispatch("Amax", CudaContext(3), [&] { ++cpu_calls; return absl::StatusOr<float>(1.0f); },
                       kNoCudaBackend),
              HasError(absl::StatusCode::kUnimplemented,
                       "Amax has no kernel for cuda:3 (teserve was built without CUDA)"));
  EXPECT_EQ(cpu_calls, 0);
}

TEST(Dispatch, CudaKernelMacroFollowsTheBuild) {
  const absl::StatusOr<int> r = Dispatch("Op", CudaContext(0), [] { return absl::StatusOr<int>(1); },
                                         TESERVE_CUDA_KERNEL([] { return absl::StatusOr<int>(2); }));
#if TESERVE_WITH_CUDA
  EXPECT_EQ(r.value(), 2);
#else
  EXPECT_THAT(r, HasError(absl::StatusCode::kUnimplemented, "Op has no kernel for cuda:0 (teserve was built without CUDA)"));
#endif
}

TEST(NoKernel, IsTheSingleAnswer) {
  const absl::Status s = NoKernel("AttentionForward", Device::Cuda(0), kNoCudaKernel);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(), "AttentionForward has no kernel for cuda:0 (only the CPU reference exists)");
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
