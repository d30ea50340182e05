// How the LayerNorm / RMSNorm forward kernels zero their amax word. First the norm launches
// themselves (back to back on one stream, with and without an amax_sync workspace; the
// workspace's validation), then the grid-side reset (kernels/cuda/amax_sync.cuh) driven
// directly through a probe kernel (tests/gpu/normalization/amax_sync_kernels.cu): CTA b adds b + 1 to the amax word after its wait,
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

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cpu/cast_cpu.h"
#include "kernels/cuda/normalization/normalization_kernels.h"
#include "tests/gpu/normalization/amax_sync_kernels.h"
#include "tests/gpu/normalization/normalization_gpu_test_util.h"
#include "tests/gpu/quantize_gpu_test_util.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::cuda::NormForwardKernel;
using norm_gpu_test::DeviceAlloc;
using norm_gpu_test::ForwardBuffers;
using norm_gpu_test::RandomInput;
using norm_gpu_test::RandomVector;
using norm_gpu_test::ShapeName;
using norm_gpu_test::ToHost;
using testing::OnDevice;

// The amax word is reset by a kernel that lets the norm kernel start before the reset has
// finished (programmatic dependent launch: LaunchRtClusters); the norm kernel waits for it
// only before its atomicMax. Launches queued back to back on one stream, alternating two
// gammas (the second a quarter of the first, so a missed reset shows the larger amax and a
// late one a smaller value or 0), each followed by a device-side copy of the word: every
// copy must hold the amax of a launch of that gamma alone. A tiny one-CTA shape (the kernel
// is done within microseconds, so the reset's and the kernel's windows overlap most) and a
// cluster-of-8 shape, each on the stats-warp and the register-tile kernel, with and without
// y (the codes-only launch takes the paired order), and with rowwise codes only (kAuto: the
// one-CTA-per-row kernel; on the 8-row shape one cluster of 8 CTAs that zeroes the word
// itself behind a cluster barrier, on 256 rows the reset kernel in front as above). Each of
// them once more with an amax_sync workspace, with which the stats-warp and the one-CTA-per-
// row kernels zero the word themselves (the first CTA to start does, amax_sync.cuh) and the
// others keep their reset: the workspace is zeroed once for the whole test and carries over
// from launch to launch, across shapes and grid sizes, as a caller's would.
TEST(StatsWarpGpu, EveryLaunchOfAStreamResetsTheAmaxBeforeAddingToIt) {
  TESERVE_SKIP_WITHOUT_GPU();
  constexpr int kLaunches = 24;
  struct Shape {
    int64_t n, h;
  };
  uint32_t* sync = nullptr;
  ASSERT_EQ(DeviceAlloc(&sync, 16), cudaSuccess);
  ASSERT_EQ(cudaMemset(sync, 0, 16), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (const bool with_sync : {false, true})
  for (const Shape shape : {Shape{8, 64}, Shape{256, 8192}, Shape{4096, 4096}}) {
    Tensor x32 = RandomInput(DType::kFloat32, shape.n, shape.h, 4242 + shape.h);
    const Tensor x = OnDevice(kernels::cpu::CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value());
    Tensor gamma_host = RandomVector(shape.h, 0.5f, 1.5f, 17);
    Tensor quarter_host = gamma_host.Clone().value();
    for (int64_t j = 0; j < shape.h; ++j) quarter_host.data<float>()[j] *= 0.25f;
    const Tensor gammas[2] = {OnDevice(gamma_host), OnDevice(quarter_host)};
    const Tensor beta = OnDevice(RandomVector(shape.h, -0.01f, 0.01f, 18));
    const ForwardBuffers buffers(shape.n, shape.h);
    uint32_t* copies = nullptr;
    ASSERT_EQ(DeviceAlloc(&copies, kLaunches * 4), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    for (const NormForwardKernel kernel : {NormForwardKernel::kAuto, NormForwardKernel::kRegisterTile}) {
      for (const int mode : {0, 1, 2}) {  // codes only, with y, rowwise codes only
        const bool with_y = mode == 1;
        SCOPED_TRACE(absl::StrCat(ShapeName(shape.n, shape.h), kernel == NormForwardKernel::kAuto ? " stats warp"
                                                                                                   : " register tile",
                                  mode == 0 ? " codes only" : mode == 1 ? " with y" : " rowwise codes only",
                                  with_sync ? ", amax_sync" : ""));
        kernels::cuda::NormForwardParams p;
        p.x = x.raw_data();
        p.x_type = kernels::cuda::NormDType::kBFloat16;
        p.rows = shape.n;
        p.cols = shape.h;
        p.beta = beta.data<float>();
        p.eps = 1e-5f;
        buffers.Attach(&p, with_y);
        if (mode == 2) {  // few rows: the one-CTA-per-row kernel (kAuto)
          p.columnwise = nullptr;
          p.columnwise_scale_inv = nullptr;
        }
        p.scale = 1.0f;
        p.scale_inv = 1.0f;
        p.kernel = kernel;
        p.amax_sync = with_sync ? sync : nullptr;
        kernels::cuda::NormForwardPlan plan;
        ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
        EXPECT_EQ(plan.stats_warp || plan.row_per_cta, kernel == NormForwardKernel::kAuto);
        EXPECT_EQ(plan.row_per_cta, kernel == NormForwardKernel::kAuto && mode == 2 && shape.n <= 256);
        EXPECT_EQ(plan.amax_zeroed_in_kernel,
                  kernel == NormForwardKernel::kAuto && (with_sync || (plan.row_per_cta && plan.ctas <= 8)));
        // Each gamma alone, synchronized, from a poisoned word.
        uint32_t want[2] = {0, 0};
        for (int g = 0; g < 2; ++g) {
          p.gamma = gammas[g].data<float>();
          ASSERT_EQ(cudaMemsetAsync(buffers.amax, 0xFF, 4, stream), cudaSuccess);
          ASSERT_EQ(kernels::cuda::LaunchNormForward(p, stream), cudaSuccess);
          ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
          ASSERT_EQ(cudaMemcpy(&want[g], buffers.amax, 4, cudaMemcpyDeviceToHost), cudaSuccess);
        }
        float want_f[2];
        std::memcpy(want_f, want, 8);
        ASSERT_GT(want_f[0], want_f[1]);  // |y| scales with gamma (beta is small)
        ASSERT_GT(want_f[1], 0.0f);
        // Back to back, no synchronization in between.
        ASSERT_EQ(cudaMemsetAsync(copies, 0xFF, kLaunches * 4, stream), cudaSuccess);
        for (int i = 0; i < kLaunches; ++i) {
          p.gamma = gammas[i % 2].data<float>();
          ASSERT_EQ(kernels::cuda::LaunchNormForward(p, stream), cudaSuccess);
          ASSERT_EQ(cudaMemcpyAsync(copies + i, buffers.amax, 4, cudaMemcpyDeviceToDevice, stream), cudaSuccess);
        }
        ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
        const std::vector<uint8_t> got = ToHost(copies, kLaunches * 4);
        for (int i = 0; i < kLaunches; ++i) {
          uint32_t bits = 0;
          std::memcpy(&bits, got.data() + 4 * i, 4);
          EXPECT_EQ(bits, want[i % 2]) << "launch " << i;
        }
      }
    }
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    cudaFree(copies);
    // Every launch turned the ticket over: no arrival left over, the generation published.
    uint32_t words[4];
    ASSERT_EQ(cudaMemcpy(words, sync, 16, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(words[0], 0u) << "arrivals left in the ticket";
    EXPECT_EQ(words[1], words[2]) << "ticket generation against released";
    if (with_sync) EXPECT_GT(words[2], 0u);
  }
  cudaFree(sync);
}

// amax_sync must be 8-byte aligned (a 64-bit atomic on its first word) and apart from the
// amax word: rejected otherwise, before anything is launched.
TEST(StatsWarpGpu, MisalignedAmaxSyncIsRejected) {
  TESERVE_SKIP_WITHOUT_GPU();
  const ForwardBuffers buffers(256, 1024);
  Tensor x32 = RandomInput(DType::kFloat32, 256, 1024, 5);
  const Tensor x = OnDevice(kernels::cpu::CastFromFloat32(Context::Cpu(), x32, DType::kBFloat16).value());
  const Tensor gamma = OnDevice(RandomVector(1024, 0.5f, 1.5f, 6));
  const Tensor beta = OnDevice(RandomVector(1024, -0.5f, 0.5f, 7));
  uint32_t* sync = nullptr;
  ASSERT_EQ(DeviceAlloc(&sync, 32), cudaSuccess);
  ASSERT_EQ(cudaMemset(sync, 0, 32), cudaSuccess);
  kernels::cuda::NormForwardParams p;
  p.x = x.raw_data();
  p.x_type = kernels::cuda::NormDType::kBFloat16;
  p.rows = 256;
  p.cols = 1024;
  p.gamma = gamma.data<float>();
  p.beta = beta.data<float>();
  buffers.Attach(&p, /*with_y=*/false);
  kernels::cuda::NormForwardPlan plan;
  ASSERT_EQ(kernels::cuda::PlanNormForward(p, &plan), cudaSuccess);
  EXPECT_TRUE(plan.stats_warp);
  p.amax_sync = sync + 1;
  EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaErrorInvalidValue);
  p.amax_sync = sync + 2;
  uint32_t* const amax = p.amax_bits;
  p.amax_bits = sync + 5;  // inside [amax_sync, amax_sync + 16)
  EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaErrorInvalidValue);
  p.amax_bits = sync + 1;  // the 4 bytes just before it
  EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaSuccess);
  p.amax_bits = amax;
  EXPECT_EQ(kernels::cuda::LaunchNormForward(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  uint32_t words[6];
  ASSERT_EQ(cudaMemcpy(words, sync, 24, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(words[2], 0u);  // the workspace at sync + 2: two launches, no arrival left over
  EXPECT_EQ(words[3], 2u);
  EXPECT_EQ(words[4], 2u);
  cudaFree(sync);
}


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
