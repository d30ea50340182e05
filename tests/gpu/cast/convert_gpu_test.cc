// CUDA plain conversions (kernels::ToFloat32 / kernels::CastFromFloat32 on a CUDA
// context) against the CPU reference, bitwise: every code of each 8- and 16-bit type
// decoded, and FP32 inputs that sweep the whole bit space (a stride through all 2^32
// patterns plus the edges of every target format: zeros, subnormals, the largest finite
// values and the halfway points above them, infinities, NaNs) encoded to each type.
// Compiled into cast_gpu_test.
#include <cstdint>
#include <cstring>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "core/context.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/cast.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/test_util.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/cast/cast_cuda.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

Context Gpu() {
  Context ctx;
  ctx.device = Device::Cuda(0);
  return ctx;
}

::testing::AssertionResult SameBytes(const Tensor& got, const Tensor& want) {
  if (got.dtype() != want.dtype() || got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << "dtype or shape differs: " << DTypeName(got.dtype()) << " "
                                         << ShapeToString(got.shape()) << " vs " << DTypeName(want.dtype())
                                         << " " << ShapeToString(want.shape());
  }
  const int64_t esize = want.numel() == 0 ? 1 : want.nbytes() / want.numel();
  const uint8_t* a = static_cast<const uint8_t*>(got.raw_data());
  const uint8_t* b = static_cast<const uint8_t*>(want.raw_data());
  for (int64_t i = 0; i < want.nbytes(); ++i) {
    if (a[i] != b[i]) {
      return ::testing::AssertionFailure() << "first difference in element " << i / esize << " of " << want.numel();
    }
  }
  return ::testing::AssertionSuccess();
}

// Every code of `dtype` (1 or 2 bytes) as a [codes / 256, 256] tensor.
Tensor EveryCode(DType dtype) {
  const bool one_byte = IsFloat8(dtype);
  const int64_t count = one_byte ? 256 : 65536;
  Tensor t = Tensor::Zeros(dtype, {count / 256, 256}).value();
  for (int64_t c = 0; c < count; ++c) {
    if (one_byte) {
      t.data<uint8_t>()[c] = static_cast<uint8_t>(c);
    } else {
      t.data<uint16_t>()[c] = static_cast<uint16_t>(c);
    }
  }
  return t;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// FP32 inputs: a stride through the 2^32 bit patterns, then the neighbourhoods (+-8 ulp)
// of the format edges, both signs.
Tensor SweepInputs() {
  std::vector<float> v;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4093) v.push_back(FromBits(static_cast<uint32_t>(u)));
  const float edges[] = {0.0f,    1.0f,     448.0f,   464.0f,   480.0f,    57344.0f, 61440.0f,
                         65504.0f, 65520.0f, 3.3895314e38f, 0x1p-6f, 0x1p-9f, 0x1p-10f, 0x1p-14f,
                         0x1p-16f, 0x1p-17f, 0x1p-24f, 0x1p-25f, 0x1p-126f, 0x1p-133f, 0x1p-134f};
  for (float e : edges) {
    uint32_t bits;
    std::memcpy(&bits, &e, sizeof(bits));
    for (int d = -8; d <= 8; ++d) {
      const uint32_t b = bits + static_cast<uint32_t>(d);
      v.push_back(FromBits(b));
      v.push_back(FromBits(b ^ 0x80000000u));
    }
  }
  for (uint32_t special : {0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x80000000u}) {
    v.push_back(FromBits(special));
  }
  while (v.size() % 256 != 0) v.push_back(0.5f);
  Tensor t = Tensor::Zeros(DType::kFloat32, {static_cast<int64_t>(v.size()) / 256, 256}).value();
  std::memcpy(t.raw_data(), v.data(), v.size() * sizeof(float));
  return t;
}

const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                        DType::kFloat8E5M2};

TEST(ConvertGpu, ToFloat32DecodesEveryCodeLikeCpu) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (DType dtype : kTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    const Tensor codes = dtype == DType::kFloat32 ? SweepInputs() : EveryCode(dtype);
    ASSERT_OK_AND_ASSIGN(const Tensor want, kernels::ToFloat32(Context::Cpu(), codes));
    ASSERT_OK_AND_ASSIGN(const Tensor d_codes, kernels::cuda::CopyToDevice(Gpu(), codes, Device::Cuda(0)));
    ASSERT_OK_AND_ASSIGN(const Tensor d_wide, kernels::ToFloat32(Gpu(), d_codes));
    ASSERT_OK_AND_ASSIGN(const Tensor got, kernels::cuda::CopyToHost(Gpu(), d_wide));
    EXPECT_TRUE(SameBytes(got, want));
  }
}

TEST(ConvertGpu, CastFromFloat32EncodesLikeCpuAcrossTheBitSpace) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor x = SweepInputs();
  ASSERT_OK_AND_ASSIGN(const Tensor d_x, kernels::cuda::CopyToDevice(Gpu(), x, Device::Cuda(0)));
  for (DType dtype : kTypes) {
    SCOPED_TRACE(DTypeName(dtype));
    ASSERT_OK_AND_ASSIGN(const Tensor want, kernels::CastFromFloat32(Context::Cpu(), x, dtype));
    ASSERT_OK_AND_ASSIGN(const Tensor d_y, kernels::CastFromFloat32(Gpu(), d_x, dtype));
    EXPECT_TRUE(d_y.device() == Device::Cuda(0));
    ASSERT_OK_AND_ASSIGN(const Tensor got, kernels::cuda::CopyToHost(Gpu(), d_y));
    EXPECT_TRUE(SameBytes(got, want));
  }
}

TEST(ConvertGpu, KeepsShapesOfAnyRankIncludingEmpty) {
  TESERVE_SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{1}, Shape{3, 5, 7}, Shape{257, 259}, Shape{0, 4}}) {
    Tensor x = Tensor::Zeros(DType::kFloat32, shape).value();
    for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.37f * static_cast<float>(i) - 11.0f;
    ASSERT_OK_AND_ASSIGN(const Tensor d_x, kernels::cuda::CopyToDevice(Gpu(), x, Device::Cuda(0)));
    ASSERT_OK_AND_ASSIGN(const Tensor d_bf16, kernels::CastFromFloat32(Gpu(), d_x, DType::kBFloat16));
    ASSERT_OK_AND_ASSIGN(const Tensor d_back, kernels::ToFloat32(Gpu(), d_bf16));
    ASSERT_OK_AND_ASSIGN(const Tensor want_bf16, kernels::CastFromFloat32(Context::Cpu(), x, DType::kBFloat16));
    ASSERT_OK_AND_ASSIGN(const Tensor want_back, kernels::ToFloat32(Context::Cpu(), want_bf16));
    EXPECT_EQ(d_back.shape(), shape);
    EXPECT_TRUE(SameBytes(kernels::cuda::CopyToHost(Gpu(), d_back).value(), want_back)) << ShapeToString(shape);
  }
}

TEST(ConvertGpu, RejectsHostTensorsAndUnsupportedTypes) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Tensor host = Tensor::Zeros(DType::kFloat32, {2, 2}).value();
  const auto on_host = kernels::cuda::CastFromFloat32(Gpu(), host, DType::kBFloat16);
  EXPECT_THAT(on_host, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                                 "x.device: expected a CUDA device, got cpu"));
  ASSERT_OK_AND_ASSIGN(const Tensor d_x, kernels::cuda::CopyToDevice(Gpu(), host, Device::Cuda(0)));
  const auto e2m1 = kernels::cuda::CastFromFloat32(Gpu(), d_x, DType::kFloat4E2M1);
  EXPECT_THAT(e2m1, testing_kernels::HasError(absl::StatusCode::kInvalidArgument,
                                              "dtype: expected FLOAT32, FLOAT16"));
  const auto ints = kernels::cuda::ToFloat32(
      Gpu(), Tensor::Borrow(const_cast<void*>(d_x.raw_data()), DType::kInt32, {2, 2}, Device::Cuda(0)));
  EXPECT_NE(ints.status().message().find("x.dtype: expected FLOAT32, FLOAT16"), absl::string_view::npos)
      << ints.status();
}

#else  // !TESERVE_WITH_CUDA

TEST(ConvertGpu, CudaContextWithoutCudaBuildIsAnError) {
  Context gpu;
  gpu.device = Device::Cuda(0);
  const Tensor x = Tensor::Borrow(nullptr, DType::kFloat32, {2}, gpu.device);
  const auto y = kernels::CastFromFloat32(gpu, x, DType::kBFloat16);
  EXPECT_EQ(y.status().code(), absl::StatusCode::kUnimplemented) << y.status();
  EXPECT_NE(y.status().message().find("CastFromFloat32 has no kernel for cuda:0 (teserve was built without CUDA)"),
            absl::string_view::npos);
}

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
