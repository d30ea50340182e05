// kernels::HostReadback on a CUDA device: Start returns while the stream is still busy,
// Wait returns once the work enqueued before Start is done (its values are read) while
// work enqueued after Start still runs, and the page-locked staging is kept across calls.
#include "kernels/host_readback.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/context.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "tests/gpu/lazy_amax/spin_kernel.h"
#endif

namespace teserve {
namespace kernels {
namespace {

#if TESERVE_WITH_CUDA
constexpr uint64_t kMillisecond = 1000 * 1000;

std::vector<float> FloatsOf(absl::Span<const uint8_t> bytes) {
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}
#endif

TEST(HostReadbackGpu, WaitsForTheWorkBeforeStartOnly) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = stream.context();
  const Tensor a_host = Tensor::FromFloats({1.0f, -2.0f, 3.5f}, {3}).value();
  const Tensor b_host = Tensor::FromFloats({7.0f}, {1}).value();
  ASSERT_OK_AND_ASSIGN(Tensor a, CopyTo(ctx, a_host, ctx.device));
  ASSERT_OK_AND_ASSIGN(Tensor b, CopyTo(ctx, b_host, ctx.device));
  HostReadback r;
  // A first round makes the staging and the event.
  ASSERT_TRUE(r.Start(ctx, {a, b}).ok());
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_EQ(FloatsOf(r.bytes(0)), (std::vector<float>{1.0f, -2.0f, 3.5f}));
  const uint8_t* staging = r.bytes(0).data();
  cudaPointerAttributes attributes;
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, staging), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);  // page-locked

  // Work before Start: a doubling of a, then a long kernel (in that order: kernels::Scale
  // may wait for the stream itself, which would drain a spin queued before it).
  ASSERT_TRUE(Scale(ctx, 2.0f, &a).ok());
  ASSERT_EQ(testing::LaunchSpin(400 * kMillisecond, stream.get()), cudaSuccess);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(r.Start(ctx, {a, b}).ok());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.2);
  EXPECT_TRUE(r.in_flight());
  EXPECT_FALSE(r.ready());
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);
  // Work after Start, which Wait must not wait for.
  ASSERT_EQ(testing::LaunchSpin(600 * kMillisecond, stream.get()), cudaSuccess);
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_TRUE(r.ready());
  EXPECT_EQ(cudaStreamQuery(stream.get()), cudaErrorNotReady);
  EXPECT_EQ(FloatsOf(r.bytes(0)), (std::vector<float>{2.0f, -4.0f, 7.0f}));
  EXPECT_EQ(FloatsOf(r.bytes(1)), (std::vector<float>{7.0f}));
  EXPECT_EQ(r.bytes(0).data(), staging);  // the same staging, not a new allocation
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
#endif
}

// From cuda::kGatherFrom tensors on, the read is gathered on the device and copied once:
// tensors of odd byte sizes and dtypes, some empty, land at their offsets intact, and a
// second, larger read through the same object (a bigger table and staging) too.
TEST(HostReadbackGpu, ManyTensorsAreGatheredIntact) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = stream.context();
  HostReadback r;
  for (int round = 0; round < 2; ++round) {
    std::vector<Tensor> hosts, devices;
    const int count = round == 0 ? 7 : 3000;
    for (int i = 0; i < count; ++i) {
      const int64_t n = (i * 7 + round) % 13;  // 0..12 elements
      Tensor host = Tensor::Zeros(i % 3 == 0 ? DType::kBFloat16 : DType::kFloat32, {n}).value();
      uint8_t* bytes = static_cast<uint8_t*>(host.raw_data());
      for (int64_t b = 0; b < host.nbytes(); ++b) bytes[b] = static_cast<uint8_t>(31 * i + 7 * b + round);
      ASSERT_OK_AND_ASSIGN(Tensor dev, CopyTo(ctx, host, ctx.device));
      hosts.push_back(std::move(host));
      devices.push_back(std::move(dev));
    }
    ASSERT_TRUE(r.Start(ctx, devices).ok());
    ASSERT_TRUE(r.Wait().ok());
    ASSERT_EQ(r.size(), devices.size());
    for (int i = 0; i < count; ++i) {
      const absl::Span<const uint8_t> got = r.bytes(i);
      ASSERT_EQ(got.size(), static_cast<size_t>(hosts[i].nbytes())) << "round " << round << " tensor " << i;
      if (got.empty()) continue;
      EXPECT_EQ(std::memcmp(got.data(), hosts[i].raw_data(), got.size()), 0) << "round " << round << " tensor " << i;
    }
  }
#endif
}

TEST(HostReadbackGpu, DestroyedInFlight) {
  TESERVE_SKIP_WITHOUT_GPU();
#if TESERVE_WITH_CUDA
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = stream.context();
  const Tensor a_host = Tensor::FromFloats({1.0f}, {1}).value();
  ASSERT_OK_AND_ASSIGN(Tensor a, CopyTo(ctx, a_host, ctx.device));
  {
    HostReadback r;
    ASSERT_EQ(testing::LaunchSpin(100 * kMillisecond, stream.get()), cudaSuccess);
    ASSERT_TRUE(r.Start(ctx, {a}).ok());
  }  // waits for its copy before the staging goes
  ASSERT_EQ(cudaStreamSynchronize(stream.get()), cudaSuccess);
#endif
}

}  // namespace
}  // namespace kernels
}  // namespace teserve
