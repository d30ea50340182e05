#include "core/tensor.h"

#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "core/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

TEST(CheckedNumElements, MultipliesDimensions) {
  EXPECT_EQ(CheckedNumElements({2, 3, 4}).value(), 24);
  EXPECT_EQ(CheckedNumElements({}).value(), 1) << "a scalar has one element";
  EXPECT_EQ(CheckedNumElements({5, 0, 7}).value(), 0);
  EXPECT_EQ(CheckedNumElements({kInt64Max, 0}).value(), 0) << "zero wins over a huge dim";
}

TEST(CheckedNumElements, RejectsNegativeDimensionNamingFieldAndIndex) {
  const auto result = CheckedNumElements({2, -3}, "forward.input.shape");
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(),
              HasSubstr("forward.input.shape[1]: expected a non-negative dimension, got -3"));
}

TEST(CheckedNumElements, RejectsInt64Overflow) {
  const auto result = CheckedNumElements({1 << 20, 1 << 20, 1 << 20, 1 << 20});
  ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(result.status().message(), HasSubstr("shape: expected an element count that fits"));
  EXPECT_THAT(result.status().message(), HasSubstr("overflows at dimension 3"));
  EXPECT_TRUE(CheckedNumElements({kInt64Max, 1}).ok()) << "exactly int64 max still fits";
  EXPECT_FALSE(CheckedNumElements({kInt64Max, 2}).ok());
}

TEST(ShapeToString, ListsDimensions) {
  EXPECT_EQ(ShapeToString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeToString({}), "[]");
}

TEST(DTypeStorageBytes, CountsBytesAndPacksFp4RoundingUp) {
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat32, 5).value(), 20);
  EXPECT_EQ(DTypeStorageBytes(DType::kBFloat16, 3).value(), 6);
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat8E4M3, 7).value(), 7);
  EXPECT_EQ(DTypeStorageBytes(DType::kInt64, 2).value(), 16);
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat4E2M1, 0).value(), 0);
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat4E2M1, 1).value(), 1);
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat4E2M1, 2).value(), 1);
  EXPECT_EQ(DTypeStorageBytes(DType::kFloat4E2M1, 3).value(), 2);
  EXPECT_EQ(DTypeBits(DType::kFloat4E2M1), 4);
  EXPECT_EQ(DTypeBits(DType::kFloat8E8M0), 8);
}

TEST(DTypeStorageBytes, RejectsNegativeAndOverflowingCounts) {
  EXPECT_THAT(DTypeStorageBytes(DType::kFloat32, -1).status().message(),
              HasSubstr("negative element count -1"));
  const auto overflow = DTypeStorageBytes(DType::kFloat32, kInt64Max / 4);
  ASSERT_EQ(overflow.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(overflow.status().message(), HasSubstr("FLOAT32 overflow a 64-bit byte count"));
}

TEST(Tensor, ZerosIsZeroFilledWithPackedSize) {
  auto t = Tensor::Zeros(DType::kFloat4E2M1, {3, 5});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->numel(), 15);
  EXPECT_EQ(t->nbytes(), 8);
  const uint8_t* bytes = t->data<uint8_t>();
  for (int64_t i = 0; i < t->nbytes(); ++i) EXPECT_EQ(bytes[i], 0);
}

TEST(Tensor, ZerosRejectsBadShapes) {
  EXPECT_EQ(Tensor::Zeros(DType::kFloat32, {2, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Tensor::Zeros(DType::kFloat32, {kInt64Max / 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(Tensor, ZerosOnCudaWithoutAllocatorFailsCleanly) {
  const auto t = Tensor::Zeros(DType::kFloat32, {4}, Device::Cuda(0));
  ASSERT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(t.status().message(), HasSubstr("no allocator for device cuda:0"));
}

TEST(Tensor, FromFloatsChecksTheCount) {
  auto t = Tensor::FromFloats({1, 2, 3, 4, 5, 6}, {2, 3});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->floats()[5], 6.0f);
  const auto bad = Tensor::FromFloats({1, 2, 3}, {2, 3});
  ASSERT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("holds 6 elements, got 3 values"));
}

TEST(Tensor, FloatsIsEmptyForOtherDtypes) {
  auto t = Tensor::Zeros(DType::kBFloat16, {4});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(t->floats().empty());
  EXPECT_TRUE(t->mutable_floats().empty());
}

TEST(TensorDeathTest, HostAccessorsOnADeviceTensorAbort) {
  float storage[4] = {1, 2, 3, 4};  // never read: the device tensor only borrows its address
  Tensor t = Tensor::Borrow(storage, DType::kFloat32, {2, 2}, Device::Cuda(0));
  EXPECT_DEATH(t.floats(), "floats\\(\\) on a cuda:0 tensor \\[2, 2\\]: host accessors need a CPU tensor");
  EXPECT_DEATH(t.mutable_floats(), "mutable_floats");
}

TEST(Tensor, EmptyAndZerosOnAreHostAllocationsOnTheCpu) {
  auto empty = Tensor::Empty(DType::kFloat32, {3, 5}, Device::Cpu(), nullptr);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->nbytes(), 60);
  auto zeros = Tensor::ZerosOn(DType::kBFloat16, {7}, Device::Cpu(), nullptr);
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  for (int i = 0; i < 7; ++i) EXPECT_EQ(zeros->data<uint16_t>()[i], 0);
}

TEST(Tensor, ReshapeSharesTheBuffer) {
  auto t = Tensor::FromFloats({1, 2, 3, 4, 5, 6}, {2, 3});
  ASSERT_TRUE(t.ok());
  auto r = t->Reshape({3, 2});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->shape(), (Shape{3, 2}));
  EXPECT_EQ(r->raw_data(), t->raw_data());
  r->mutable_floats()[0] = 42.0f;
  EXPECT_EQ(t->floats()[0], 42.0f);
}

TEST(Tensor, ReshapeRejectsDifferentElementCount) {
  auto t = Tensor::Zeros(DType::kFloat32, {2, 3});
  ASSERT_TRUE(t.ok());
  const auto r = t->Reshape({4, 2});
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("reshape: expected 6 elements ([2, 3]), got 8"));
  EXPECT_EQ(t->Reshape({-6}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Tensor, As2DFoldsLeadingDims) {
  auto t = Tensor::Zeros(DType::kFloat32, {2, 3, 4});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->As2D()->shape(), (Shape{6, 4}));
  auto v = Tensor::Zeros(DType::kFloat32, {7});
  EXPECT_EQ(v->As2D()->shape(), (Shape{1, 7}));
  auto empty_rows = Tensor::Zeros(DType::kFloat32, {0, 5});
  EXPECT_EQ(empty_rows->As2D()->shape(), (Shape{0, 5}));
}

TEST(Tensor, As2DRejectsScalars) {
  auto s = Tensor::Zeros(DType::kFloat32, {});
  ASSERT_TRUE(s.ok());
  EXPECT_THAT(s->As2D().status().message(), HasSubstr("expected a tensor of rank >= 1, got shape []"));
}

TEST(Tensor, CloneCopiesTheBytes) {
  auto t = Tensor::FromFloats({1, 2, 3}, {3});
  ASSERT_TRUE(t.ok());
  auto c = t->Clone();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_NE(c->raw_data(), t->raw_data());
  EXPECT_TRUE(BitwiseEqual(*t, *c));
  c->mutable_floats()[1] = -2.0f;
  EXPECT_EQ(t->floats()[1], 2.0f);
  EXPECT_FALSE(BitwiseEqual(*t, *c));
}

TEST(Tensor, DeviceAllocationWithoutTheCudaBackendNamesTheDevice) {
  // core alone has no CUDA allocator (kernels/cuda registers it).
  const Tensor device_view = Tensor::Borrow(nullptr, DType::kFloat32, {4}, Device::Cuda(0));
  const absl::Status status = device_view.Clone().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("no allocator for device cuda:0"));
}

TEST(Tensor, BorrowDoesNotOwnAndPacksFp4) {
  std::vector<uint8_t> storage(3, 0xAB);
  const Tensor t = Tensor::Borrow(storage.data(), DType::kFloat4E2M1, {5});
  EXPECT_EQ(t.nbytes(), 3);
  EXPECT_EQ(t.raw_data(), storage.data());
  EXPECT_TRUE(t.defined());
  EXPECT_FALSE(Tensor().defined());
}

TEST(BitwiseEqual, ComparesDtypeShapeAndBytes) {
  auto a = Tensor::FromFloats({1, 2, 3, 4}, {2, 2});
  auto b = Tensor::FromFloats({1, 2, 3, 4}, {2, 2});
  auto flat = Tensor::FromFloats({1, 2, 3, 4}, {4});
  ASSERT_TRUE(a.ok() && b.ok() && flat.ok());
  EXPECT_TRUE(BitwiseEqual(*a, *b));
  EXPECT_FALSE(BitwiseEqual(*a, *flat)) << "same bytes, different shape";
  std::vector<int32_t> ints = {1, 2, 3, 4};
  const Tensor as_int = Tensor::Borrow(ints.data(), DType::kInt32, {2, 2});
  EXPECT_FALSE(BitwiseEqual(*a, as_int)) << "different dtype";
  // -0.0 and 0.0 compare equal as floats but not bitwise.
  auto zero = Tensor::FromFloats({0.0f}, {1});
  auto negative_zero = Tensor::FromFloats({-0.0f}, {1});
  EXPECT_FALSE(BitwiseEqual(*zero, *negative_zero));
  auto empty_a = Tensor::Zeros(DType::kFloat32, {0, 3});
  auto empty_b = Tensor::Zeros(DType::kFloat32, {0, 3});
  EXPECT_TRUE(BitwiseEqual(*empty_a, *empty_b));
}

TEST(ParseDevice, AcceptsCpuAndCuda) {
  EXPECT_EQ(ParseDevice("cpu").value(), Device::Cpu());
  EXPECT_EQ(ParseDevice("cuda").value(), Device::Cuda(0));
  EXPECT_EQ(ParseDevice("cuda:3").value(), Device::Cuda(3));
  EXPECT_EQ(Device::Cuda(3).ToString(), "cuda:3");
  EXPECT_EQ(Device::Cpu().ToString(), "cpu");
  EXPECT_NE(Device::Cuda(0), Device::Cuda(1));
}

TEST(ParseDevice, RejectsOtherSpellings) {
  for (const char* text : {"gpu", "cuda:", "cuda:-1", "cuda:x", "CPU", "", "cuda:1:2"}) {
    const auto device = ParseDevice(text);
    ASSERT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(device.status().message(), HasSubstr("device: expected cpu, cuda or cuda:N"))
        << text;
  }
}

}  // namespace
// Without a registered pinned allocator (no CUDA backend in this process),
// EmptyPinnedHost is an ordinary host tensor of the asked dtype and shape.
TEST(EmptyPinnedHost, FallsBackToHostMemoryWithoutAPinnedAllocator) {
  absl::StatusOr<Tensor> t = Tensor::EmptyPinnedHost(DType::kFloat32, {3, 5});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_TRUE(t->device().is_cpu());
  EXPECT_EQ(t->shape(), (Shape{3, 5}));
  EXPECT_EQ(t->dtype(), DType::kFloat32);
  for (int i = 0; i < 15; ++i) t->mutable_floats()[i] = static_cast<float>(i);
  EXPECT_EQ(t->floats()[14], 14.0f);
  EXPECT_FALSE(Tensor::EmptyPinnedHost(DType::kFloat32, {-1}).ok());
}

}  // namespace teserve
