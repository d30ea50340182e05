// kernels::CopyManyInto / CopyManyTo on the CPU: the batched copies of session
// checkpoints (tests/gpu/elementwise/copy_many_gpu_test.cc covers the CUDA staging).
// The copies are byte-exact and new; bad batches are refused naming the tensor.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "tests/kernels/copy_many_test_util.h"

namespace teserve {
namespace {

using testing_kernels::MixedTensors;
using testing_kernels::MutablePointers;
using testing_kernels::Pointers;

void ExpectRefused(const absl::Status& status, absl::StatusCode code, const std::string& names) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_NE(status.message().find(names), std::string::npos) << status;
}

TEST(CopyMany, CopyManyToCpuMakesNewByteExactCopies) {
  const std::vector<Tensor> sources = MixedTensors(300, 7);
  auto copies = kernels::CopyManyTo(Context::Cpu(), Pointers(sources), Device::Cpu());
  ASSERT_TRUE(copies.ok()) << copies.status();
  ASSERT_EQ(copies->size(), sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    const Tensor& copy = (*copies)[i];
    EXPECT_TRUE(copy.device().is_cpu());
    EXPECT_TRUE(BitwiseEqual(copy, sources[i])) << i;
    if (sources[i].nbytes() > 0) EXPECT_NE(copy.raw_data(), sources[i].raw_data()) << i;
  }
  // A small chunk size changes nothing on the CPU.
  auto chunked = kernels::CopyManyTo(Context::Cpu(), Pointers(sources), Device::Cpu(), 3);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  for (size_t i = 0; i < sources.size(); ++i) EXPECT_TRUE(BitwiseEqual((*chunked)[i], sources[i])) << i;
}

TEST(CopyMany, CopyManyIntoOverwritesEveryDestination) {
  const std::vector<Tensor> sources = MixedTensors(200, 11);
  std::vector<Tensor> dsts;
  for (const Tensor& t : sources) dsts.push_back(Tensor::Zeros(t.dtype(), t.shape()).value());
  std::vector<const void*> buffers;
  for (const Tensor& t : dsts) buffers.push_back(t.raw_data());
  ASSERT_TRUE(kernels::CopyManyInto(Context::Cpu(), Pointers(sources), MutablePointers(dsts)).ok());
  for (size_t i = 0; i < sources.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(dsts[i], sources[i])) << i;
    EXPECT_EQ(dsts[i].raw_data(), buffers[i]) << i;  // written in place
  }
}

TEST(CopyMany, EmptyBatchesAreFine) {
  auto none = kernels::CopyManyTo(Context::Cpu(), {}, Device::Cpu());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->empty());
  EXPECT_TRUE(kernels::CopyManyInto(Context::Cpu(), {}, {}).ok());
}

TEST(CopyMany, BadBatchesAreRefusedNamingTheTensor) {
  const Tensor a = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  Tensor b = Tensor::Zeros(DType::kFloat32, {2, 3}).value();
  Tensor wrong_dtype = Tensor::Zeros(DType::kBFloat16, {2, 3}).value();
  Tensor wrong_shape = Tensor::Zeros(DType::kFloat32, {3, 2}).value();
  const Tensor undefined;
  const Context cpu = Context::Cpu();

  std::vector<const Tensor*> srcs = {&a, &a};
  std::vector<Tensor*> one_dst = {&b};
  ExpectRefused(kernels::CopyManyInto(cpu, srcs, one_dst), absl::StatusCode::kInvalidArgument, "dsts.size");

  std::vector<Tensor*> dsts = {&b, &wrong_dtype};
  ExpectRefused(kernels::CopyManyInto(cpu, srcs, dsts), absl::StatusCode::kInvalidArgument, "dsts[1].dtype");
  dsts = {&b, &wrong_shape};
  ExpectRefused(kernels::CopyManyInto(cpu, srcs, dsts), absl::StatusCode::kInvalidArgument, "dsts[1].shape");
  dsts = {&b, nullptr};
  ExpectRefused(kernels::CopyManyInto(cpu, srcs, dsts), absl::StatusCode::kInvalidArgument, "dsts[1]");
  dsts = {&b, &b};
  ExpectRefused(kernels::CopyManyInto(cpu, srcs, dsts, 0), absl::StatusCode::kInvalidArgument, "chunk_bytes");

  std::vector<const Tensor*> with_undefined = {&a, &undefined};
  ExpectRefused(kernels::CopyManyTo(cpu, with_undefined, Device::Cpu()).status(), absl::StatusCode::kInvalidArgument,
                "tensors[1]");
  std::vector<const Tensor*> with_null = {nullptr};
  ExpectRefused(kernels::CopyManyTo(cpu, with_null, Device::Cpu()).status(), absl::StatusCode::kInvalidArgument,
                "tensors[0]");
}

#if !TESERVE_WITH_CUDA
TEST(CopyMany, WithoutCudaADeviceTargetHasNoKernel) {
  const std::vector<Tensor> sources = MixedTensors(3, 1);
  const absl::Status status = kernels::CopyManyTo(Context::Cpu(), Pointers(sources), Device::Cuda(0)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kUnimplemented) << status;
}
#endif

}  // namespace
}  // namespace teserve
