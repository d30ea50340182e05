// Sampled kernel timing on a CUDA device (kernels/timing.h, kernels/cuda/timing_cuda.cc):
// a sampled GEMM is timed with CUDA events on the op's stream and reported once they
// have completed, without the launching thread waiting; the reported time is the GPU's.
#include <vector>

#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/timing.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/recording_sink.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::Recorded;
using ::teserve::testing_kernels::RecordingSink;

TEST(CudaKernelTiming, SampledGemmsAreTimedWithEventsAndReportedOnceComplete) {
  TESERVE_SKIP_WITHOUT_GPU();
  Context ctx;
  ctx.device = Device::Cuda(0);
  // Moving a tensor to the device registers the CUDA backend (allocator and timer).
  const int64_t n = 2048;
  Tensor a_host = Tensor::Zeros(DType::kFloat32, {n, n}).value();
  for (float& v : a_host.mutable_floats()) v = 0.5f;
  Tensor a = CopyTo(ctx, a_host, ctx.device).value();
  Tensor c = Tensor::Zeros(DType::kFloat32, {n, n}, ctx.device).value();
  ASSERT_NE(GetDeviceTimerFactory(), nullptr);

  RecordingSink sink(2);
  ctx.kernel_timing = &sink;
  for (int call = 0; call < 4; ++call) ASSERT_TRUE(Gemm(ctx, a, false, a, true, 1.0f, 0.0f, &c).ok());
  // Calls 0 and 2 were sampled; their events may still be in flight.
  EXPECT_EQ(sink.calls(KernelOp::kGemm), 4);
  // Reading the result back waits for the stream, and so for the stop events.
  ASSERT_TRUE(CopyTo(Context{}, c, Device::Cpu()).ok());
  sink.Drain();
  ASSERT_EQ(sink.recorded.size(), 2u);
  EXPECT_EQ(sink.pending(), 0);
  for (const Recorded& r : sink.recorded) {
    EXPECT_EQ(r.op, KernelOp::kGemm);
    EXPECT_EQ(r.device, Device::Cuda(0));
    // A 2048^3 FP32 GEMM: well above the event resolution, a few ms (over a second under
    // compute-sanitizer, which slows kernels ~100x; an unpaired event reads as 0 or as
    // the process's age).
    EXPECT_GT(r.seconds, 1e-6);
    EXPECT_LT(r.seconds, 30.0);
  }
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
