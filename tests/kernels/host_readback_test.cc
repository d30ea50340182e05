// kernels::HostReadback on the CPU: Start copies at once, Wait returns at once, the
// staging is reused across calls; argument errors. tests/gpu/lazy_amax covers CUDA.
#include "kernels/host_readback.h"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {
namespace {

std::vector<uint8_t> BytesOf(const Tensor& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.raw_data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

std::vector<uint8_t> Got(const HostReadback& r, size_t i) {
  const absl::Span<const uint8_t> b = r.bytes(i);
  return std::vector<uint8_t>(b.begin(), b.end());
}

TEST(HostReadback, CopiesOnTheCpuAtStart) {
  Tensor a = Tensor::FromFloats({1.5f, -2.0f, 3.25f}, {3}).value();
  Tensor b = Tensor::Zeros(DType::kInt32, {1}).value();
  b.data<int32_t>()[0] = 0x7FC00001;
  Tensor empty = Tensor::Zeros(DType::kFloat32, {0}).value();
  const std::vector<uint8_t> want_a = BytesOf(a), want_b = BytesOf(b);
  HostReadback r;
  EXPECT_FALSE(r.in_flight());
  ASSERT_TRUE(r.Start(Context::Cpu(), {a, empty, b}).ok());
  EXPECT_TRUE(r.in_flight());
  EXPECT_TRUE(r.ready());
  // The values at Start count: the CPU copied them already.
  a.mutable_floats()[0] = 99.0f;
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_FALSE(r.in_flight());
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(Got(r, 0), want_a);
  EXPECT_TRUE(r.bytes(1).empty());
  EXPECT_EQ(Got(r, 2), want_b);
  EXPECT_TRUE(r.bytes(3).empty());
  EXPECT_TRUE(r.Wait().ok());  // nothing in flight: the latest status again

  // Reused for a different set.
  ASSERT_TRUE(r.Start(Context::Cpu(), {b}).ok());
  ASSERT_TRUE(r.Wait().ok());
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(Got(r, 0), want_b);

  ASSERT_TRUE(r.Start(Context::Cpu(), {}).ok());
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_EQ(r.size(), 0u);
}

TEST(HostReadback, StartWithoutWaitThenStartAgain) {
  const Tensor a = Tensor::FromFloats({1.0f}, {1}).value();
  const Tensor b = Tensor::FromFloats({2.0f, 3.0f}, {2}).value();
  HostReadback r;
  ASSERT_TRUE(r.Start(Context::Cpu(), {a}).ok());
  ASSERT_TRUE(r.Start(Context::Cpu(), {b}).ok());  // waits for the first itself
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_EQ(Got(r, 0), BytesOf(b));
}

TEST(HostReadback, RefusesUndefinedAndForeignTensors) {
  HostReadback r;
  absl::Status s = r.Start(Context::Cpu(), {Tensor()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("tensors[0]"), std::string::npos) << s;
  EXPECT_FALSE(r.in_flight());

  float word = 0.0f;
  const Tensor on_gpu = Tensor::Borrow(&word, DType::kFloat32, {1}, Device::Cuda(0));
  const Tensor here = Tensor::FromFloats({1.0f}, {1}).value();
  s = r.Start(Context::Cpu(), {here, on_gpu});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("tensors[1]"), std::string::npos) << s;
  EXPECT_FALSE(r.in_flight());
}

#if !TESERVE_WITH_CUDA
TEST(HostReadback, NoCudaBackend) {
  float word = 0.0f;
  const Tensor on_gpu = Tensor::Borrow(&word, DType::kFloat32, {1}, Device::Cuda(0));
  Context ctx;
  ctx.device = Device::Cuda(0);
  HostReadback r;
  const absl::Status s = r.Start(ctx, {on_gpu});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(s.message(), "HostReadback has no kernel for cuda:0 (teserve was built without CUDA)");
}
#endif

}  // namespace
}  // namespace kernels
}  // namespace teserve
