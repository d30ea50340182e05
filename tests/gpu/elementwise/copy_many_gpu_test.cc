// kernels::CopyManyInto / CopyManyTo on CUDA: the batched host <-> device copies of
// session checkpoints. Many tensors of mixed dtypes and sizes (empty ones included) go to
// the device and back through the pinned staging buffer, with the default chunk and with
// small odd chunks that split tensors across chunks, and come back byte for byte.
#include <vector>

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "gtest/gtest.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/elementwise.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/copy_many_test_util.h"

namespace teserve {
namespace {

using testing_kernels::MixedTensors;
using testing_kernels::MutablePointers;
using testing_kernels::Pointers;

#if TESERVE_WITH_CUDA

Context GpuOn(const testing::ScopedStream& stream) {
  const Context ctx = stream.context();
  return ctx;
}

void ExpectSameBytes(const std::vector<Tensor>& got, const std::vector<Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(got[i].device().is_cpu()) << i;
    EXPECT_TRUE(BitwiseEqual(got[i], want[i])) << "tensor " << i << " " << DTypeName(want[i].dtype()) << " "
                                               << ShapeToString(want[i].shape());
  }
}

// Tensor::EmptyPinnedHost once the CUDA backend is up: page-locked host memory (what the
// server decodes GPU requests into and copies results back into), byte-exact through a
// device round trip; a freed block is handed out again for the next tensor of its size
// class instead of a new cudaHostAlloc.
TEST(PinnedHostGpu, TensorsArePageLockedRoundTripAndReuseFreedBlocks) {
  TESERVE_SKIP_WITHOUT_GPU();
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context gpu = GpuOn(stream);
  // A first device copy enters the CUDA backend, which registers the pinned allocator
  // (a server has entered it by the time a session's first request is decoded).
  ASSERT_TRUE(kernels::CopyTo(gpu, Tensor::Zeros(DType::kFloat32, {1}).value(), gpu.device).ok());
  const void* first = nullptr;
  for (int round = 0; round < 2; ++round) {
    ASSERT_OK_AND_ASSIGN(Tensor host, Tensor::EmptyPinnedHost(DType::kFloat32, {300, 77}));
    EXPECT_TRUE(host.device().is_cpu());
    cudaPointerAttributes attributes{};
    ASSERT_EQ(cudaPointerGetAttributes(&attributes, host.raw_data()), cudaSuccess);
    EXPECT_EQ(attributes.type, cudaMemoryTypeHost) << "not page-locked";
    for (int64_t i = 0; i < host.numel(); ++i) host.mutable_floats()[i] = static_cast<float>(i * 3 + round);
    ASSERT_OK_AND_ASSIGN(const Tensor device, kernels::CopyTo(gpu, host, gpu.device));
    ASSERT_OK_AND_ASSIGN(Tensor back, Tensor::EmptyPinnedHost(DType::kFloat32, {300, 77}));
    ASSERT_TRUE(kernels::CopyInto(gpu, device, &back).ok());
    EXPECT_TRUE(BitwiseEqual(back, host));
    if (round == 0) first = host.raw_data();
    if (round == 1) EXPECT_EQ(host.raw_data(), first) << "the freed block was not reused";
  }
}

TEST(CopyManyGpu, RoundTripIsByteExactForEveryChunkSize) {
  TESERVE_SKIP_WITHOUT_GPU();
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = GpuOn(stream);
  const std::vector<Tensor> host = MixedTensors(3000, 5);
  for (const int64_t chunk : {kernels::kCopyManyChunkBytes, int64_t{1} << 20, int64_t{4099}, int64_t{1}}) {
    SCOPED_TRACE(chunk);
    // chunk 1 is one cudaMemcpyAsync and one wait per byte: keep that batch small.
    std::vector<Tensor> sources = host;
    if (chunk == 1) {
      sources.clear();
      for (const Tensor& t : MixedTensors(60, 9)) {
        if (t.nbytes() <= 1024) sources.push_back(t);
      }
    }
    auto device = kernels::CopyManyTo(ctx, Pointers(sources), Device::Cuda(0), chunk);
    ASSERT_TRUE(device.ok()) << device.status();
    for (const Tensor& t : *device) ASSERT_EQ(t.device(), Device::Cuda(0));
    auto back = kernels::CopyManyTo(ctx, Pointers(*device), Device::Cpu(), chunk);
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSameBytes(*back, sources);
    // The same bytes as the per-tensor copies.
    for (size_t i = 0; i < sources.size(); i += 37) {
      auto one = kernels::CopyTo(ctx, (*device)[i], Device::Cpu());
      ASSERT_TRUE(one.ok()) << one.status();
      EXPECT_TRUE(BitwiseEqual(*one, sources[i])) << i;
    }
  }
}

// A device-to-host batch of more small tensors than one gather launch takes (its table
// holds 65536 pieces), so one chunk ends at the table's limit and the next goes on where
// it stopped; sizes from 1 to 45 bytes, so the pieces have 16-byte bodies and byte tails.
TEST(CopyManyGpu, ManySmallTensorsToTheHostInGatheredChunks) {
  TESERVE_SKIP_WITHOUT_GPU();
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = GpuOn(stream);
  std::vector<Tensor> host;
  for (int i = 0; i < 70000; ++i) {
    Tensor t = Tensor::Zeros(DType::kBool, {1 + i % 45}).value();
    unsigned char* bytes = static_cast<unsigned char*>(t.raw_data());
    for (int64_t b = 0; b < t.nbytes(); ++b) bytes[b] = static_cast<unsigned char>(i * 31 + b * 7);
    host.push_back(std::move(t));
  }
  auto device = kernels::CopyManyTo(ctx, Pointers(host), Device::Cuda(0));
  ASSERT_TRUE(device.ok()) << device.status();
  auto back = kernels::CopyManyTo(ctx, Pointers(*device), Device::Cpu());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameBytes(*back, host);
}

TEST(CopyManyGpu, CopyManyIntoMixesDirectionsInOneBatch) {
  TESERVE_SKIP_WITHOUT_GPU();
  testing::ScopedStream stream;
  ASSERT_TRUE(stream.ok());
  const Context ctx = GpuOn(stream);
  const std::vector<Tensor> host = MixedTensors(400, 21);
  auto device_or = kernels::CopyManyTo(ctx, Pointers(host), Device::Cuda(0));
  ASSERT_TRUE(device_or.ok()) << device_or.status();
  const std::vector<Tensor> device = *std::move(device_or);

  // Pair i: host -> device, device -> host, device -> device or host -> host by i % 4;
  // destinations are zeros of the source's dtype and shape on the other side.
  std::vector<Tensor> dsts;
  std::vector<const Tensor*> srcs;
  for (size_t i = 0; i < host.size(); ++i) {
    const int kind = static_cast<int>(i % 4);
    const bool src_on_device = kind == 1 || kind == 2;
    const bool dst_on_device = kind == 0 || kind == 2;
    srcs.push_back(src_on_device ? &device[i] : &host[i]);
    dsts.push_back(
        Tensor::Zeros(host[i].dtype(), host[i].shape(), dst_on_device ? Device::Cuda(0) : Device::Cpu()).value());
  }
  ASSERT_TRUE(kernels::CopyManyInto(ctx, srcs, MutablePointers(dsts), 4099).ok());
  std::vector<const Tensor*> dst_pointers = Pointers(dsts);
  auto back = kernels::CopyManyTo(ctx, dst_pointers, Device::Cpu());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameBytes(*back, host);
}

TEST(CopyManyGpu, HostCopiesAreCompleteOnReturnOnTheDefaultStream) {
  TESERVE_SKIP_WITHOUT_GPU();
  Context ctx;
  ctx.device = Device::Cuda(0);
  const std::vector<Tensor> host = MixedTensors(500, 3);
  auto device = kernels::CopyManyTo(ctx, Pointers(host), Device::Cuda(0));
  ASSERT_TRUE(device.ok()) << device.status();
  auto back = kernels::CopyManyTo(ctx, Pointers(*device), Device::Cpu());
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameBytes(*back, host);
}

#else

TEST(CopyManyGpu, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif

}  // namespace
}  // namespace teserve
