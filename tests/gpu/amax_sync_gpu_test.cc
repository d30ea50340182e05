// The grid-side amax reset (kernels/cuda/amax_sync.cuh) driven directly through a probe
// kernel (tests/gpu/amax_sync_kernels.cu): CTA b adds b + 1 to the amax word after its wait,
// so a launch of C CTAs must leave exactly C, from whatever the word held before.
// - The first CTA to arrive is held back 200 us before its zero, so every other CTA reaches
//   its wait (and, without the wait, its atomicMax) long before the zero lands: a missing or
//   weakened wait leaves less than C (the zero overwrites the others' maxima).
// - Grids from 1 CTA to several times what fits on the device at once (1024-thread CTAs), so
//   waiting CTAs hold SMs while later CTAs are not placed yet: the scheme needs no co-residency.
// - The workspace carries over from launch to launch and shape to shape; after each
//   synchronized launch it must read ticket = (generation + 1) << 32 (no arrival left over)
//   and released = generation + 1, also across the 32-bit wraparound of the generation.
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "tests/gpu/amax_sync_kernels.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

struct Workspace {
  uint64_t ticket;
  uint32_t released;
  uint32_t unused;
};

class AmaxSyncGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TESERVE_SKIP_WITHOUT_GPU();
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&sync_), 16), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&amax_), 4), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    cudaFree(sync_);
    cudaFree(amax_);
  }

  void Seed(uint32_t generation) {
    const Workspace w{static_cast<uint64_t>(generation) << 32, generation, 0};
    ASSERT_EQ(cudaMemcpy(sync_, &w, 16, cudaMemcpyHostToDevice), cudaSuccess);
  }
  Workspace Read() {
    Workspace w{};
    EXPECT_EQ(cudaMemcpy(&w, sync_, 16, cudaMemcpyDeviceToHost), cudaSuccess);
    return w;
  }
  // One synchronized launch from a poisoned word; returns the word.
  uint32_t Launch(int ctas, uint32_t zero_delay_ns) {
    EXPECT_EQ(cudaMemsetAsync(amax_, 0xFF, 4, stream_), cudaSuccess);
    EXPECT_EQ(testing::LaunchAmaxSyncProbe(sync_, amax_, ctas, 1024, zero_delay_ns, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    uint32_t got = 0;
    EXPECT_EQ(cudaMemcpy(&got, amax_, 4, cudaMemcpyDeviceToHost), cudaSuccess);
    return got;
  }

  uint32_t* sync_ = nullptr;
  uint32_t* amax_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

TEST_F(AmaxSyncGpuTest, EveryCtaAddsAfterTheLateZero) {
  Seed(0);
  int device = 0, sms = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  uint32_t generation = 0;
  for (const int ctas : {1, 2, 7, sms, 2 * sms + 1, 8 * sms}) {
    SCOPED_TRACE(absl::StrCat(ctas, " CTAs"));
    EXPECT_EQ(Launch(ctas, /*zero_delay_ns=*/200000), static_cast<uint32_t>(ctas));
    ++generation;
    const Workspace w = Read();
    EXPECT_EQ(w.ticket, static_cast<uint64_t>(generation) << 32);
    EXPECT_EQ(w.released, generation);
  }
}

TEST_F(AmaxSyncGpuTest, GenerationWrapsAround) {
  Seed(0xFFFFFFFEu);
  const int ctas[] = {5, 300, 1, 64};
  const uint32_t generations[] = {0xFFFFFFFFu, 0u, 1u, 2u};
  for (int i = 0; i < 4; ++i) {
    SCOPED_TRACE(absl::StrCat("launch ", i, ", ", ctas[i], " CTAs"));
    EXPECT_EQ(Launch(ctas[i], /*zero_delay_ns=*/20000), static_cast<uint32_t>(ctas[i]));
    const Workspace w = Read();
    EXPECT_EQ(w.ticket, static_cast<uint64_t>(generations[i]) << 32);
    EXPECT_EQ(w.released, generations[i]);
  }
}

// Back to back on one stream, no synchronization in between: each launch's word, copied on
// the device right after it, holds that launch's CTA count.
TEST_F(AmaxSyncGpuTest, BackToBackLaunchesOfOtherSizes) {
  Seed(7);
  constexpr int kLaunches = 12;
  uint32_t* copies = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&copies), kLaunches * 4), cudaSuccess);
  std::vector<int> ctas(kLaunches);
  for (int i = 0; i < kLaunches; ++i) {
    ctas[i] = 1 + (i * 97) % 400;
    ASSERT_EQ(cudaMemsetAsync(amax_, 0xFF, 4, stream_), cudaSuccess);
    ASSERT_EQ(testing::LaunchAmaxSyncProbe(sync_, amax_, ctas[i], 256, i % 3 == 0 ? 50000 : 0, stream_),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(copies + i, amax_, 4, cudaMemcpyDeviceToDevice, stream_), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  std::vector<uint32_t> got(kLaunches);
  ASSERT_EQ(cudaMemcpy(got.data(), copies, kLaunches * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (int i = 0; i < kLaunches; ++i) EXPECT_EQ(got[i], static_cast<uint32_t>(ctas[i])) << "launch " << i;
  const Workspace w = Read();
  EXPECT_EQ(w.ticket, static_cast<uint64_t>(7 + kLaunches) << 32);
  EXPECT_EQ(w.released, 7u + kLaunches);
  cudaFree(copies);
}

#else

TEST(AmaxSyncGpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
