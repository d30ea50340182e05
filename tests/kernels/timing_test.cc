// kernels/timing.h: which calls a KernelTimingSink times, and what ScopedKernelTimer
// reports (op, device, a duration covering the scope).
#include "kernels/timing.h"

#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/kernels/recording_sink.h"

namespace teserve {
namespace kernels {
namespace {

using ::teserve::testing_kernels::Recorded;
using ::teserve::testing_kernels::RecordingSink;

TEST(KernelTimingSink, SamplesEveryNthCallOfEachOpFromTheFirst) {
  RecordingSink sink(3);
  std::vector<int> sampled_gemm, sampled_amax;
  for (int call = 0; call < 10; ++call) {
    if (sink.Sample(KernelOp::kGemm)) sampled_gemm.push_back(call);
  }
  for (int call = 0; call < 4; ++call) {
    if (sink.Sample(KernelOp::kAmax)) sampled_amax.push_back(call);
  }
  EXPECT_EQ(sampled_gemm, (std::vector<int>{0, 3, 6, 9}));
  EXPECT_EQ(sampled_amax, (std::vector<int>{0, 3}));  // counted per op
  EXPECT_EQ(sink.calls(KernelOp::kGemm), 10);
  EXPECT_EQ(sink.calls(KernelOp::kAmax), 4);
  EXPECT_EQ(sink.calls(KernelOp::kRopeForward), 0);
}

TEST(KernelTimingSink, IntervalZeroSamplesNothing) {
  RecordingSink sink(0);
  for (int call = 0; call < 5; ++call) EXPECT_FALSE(sink.Sample(KernelOp::kGemm));
}

TEST(ScopedKernelTimer, ReportsTheScopeOnTheCpu) {
  RecordingSink sink(2);
  Context ctx = Context::Cpu();
  ctx.kernel_timing = &sink;
  for (int call = 0; call < 3; ++call) {
    ScopedKernelTimer timer(ctx, KernelOp::kQuantizeMxfp8);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_EQ(sink.recorded.size(), 2u);  // calls 0 and 2
  for (const Recorded& r : sink.recorded) {
    EXPECT_EQ(r.op, KernelOp::kQuantizeMxfp8);
    EXPECT_EQ(r.device, Device::Cpu());
    EXPECT_GE(r.seconds, 0.002);
    EXPECT_LT(r.seconds, 1.0);
  }
}

TEST(ScopedKernelTimer, NoSinkAndCudaContextsRecordNothing) {
  { ScopedKernelTimer timer(Context::Cpu(), KernelOp::kGemm); }  // no sink: nothing to do
  RecordingSink sink(1);
  Context ctx;
  ctx.device = Device::Cuda(0);
  ctx.kernel_timing = &sink;
  { ScopedKernelTimer timer(ctx, KernelOp::kGemm); }
  // A host clock would time the launch only: CUDA contexts are timed by the CUDA
  // backend's event timer, which is not registered here (tests/gpu/timing covers it).
  EXPECT_TRUE(sink.recorded.empty());
  EXPECT_EQ(sink.calls(KernelOp::kGemm), 0);
}

TEST(KernelOpName, EveryOpHasItsOwnLabel) {
  std::set<std::string> names;
  for (int op = 0; op < kNumKernelOps; ++op) {
    const std::string name(KernelOpName(static_cast<KernelOp>(op)));
    EXPECT_NE(name, "unknown");
    EXPECT_TRUE(names.insert(name).second) << name;
  }
  EXPECT_EQ(KernelOpName(KernelOp::kGemm), "gemm");
  EXPECT_EQ(KernelOpName(KernelOp::kQuantizePerTensor), "quantize_per_tensor");
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
