// The device build of core/float_codec.h against the host build: every BF16 bit pattern
// (as an FP32 value, NaN and Inf included) plus 2^20 random FP32 bit patterns are
// encoded into every format on the GPU and on the CPU, and every code of every format is
// decoded on both; all results must agree bit for bit.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

#if TESERVE_WITH_CUDA
#include "core/float_codec.h"
#include "core/tensor.h"
#include "kernels/cuda/cast/cast_cuda.h"
#include "tests/gpu/cast/codec_kernels.h"
#endif

namespace teserve {
namespace {

#if TESERVE_WITH_CUDA

using kernels::cuda::CopyToDevice;
using kernels::cuda::CopyToHost;

uint32_t Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return u;
}

// Every BF16 pattern widened to FP32, then random FP32 patterns (fixed seed).
std::vector<float> CodecInputs() {
  std::vector<float> values;
  for (uint32_t code = 0; code < (1u << 16); ++code) {
    const uint32_t bits = code << 16;
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    values.push_back(x);
  }
  std::mt19937 rng(7u);
  for (int i = 0; i < (1 << 20); ++i) {
    const uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    values.push_back(x);
  }
  return values;
}

template <typename T>
std::vector<T> HostCopy(const Tensor& device_tensor) {
  auto host = CopyToHost(Context{}, device_tensor);
  EXPECT_TRUE(host.ok()) << host.status();
  if (!host.ok()) return {};
  const T* data = host->data<T>();
  return std::vector<T>(data, data + host->nbytes() / sizeof(T));
}

TEST(DeviceCodec, EncodesLikeTheHostCodec) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Device gpu = Device::Cuda(0);
  const std::vector<float> inputs = CodecInputs();
  const int64_t n = static_cast<int64_t>(inputs.size());
  ASSERT_OK_AND_ASSIGN(Tensor host_in, Tensor::FromFloats(inputs, {n}));
  ASSERT_OK_AND_ASSIGN(Tensor in, CopyToDevice(Context{}, host_in, gpu));
  // DType only sets the storage size here: one byte or two per value.
  ASSERT_OK_AND_ASSIGN(Tensor e4m3, Tensor::Zeros(DType::kFloat8E4M3, {n}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e5m2, Tensor::Zeros(DType::kFloat8E5M2, {n}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e2m1, Tensor::Zeros(DType::kBool, {n}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor fp16, Tensor::Zeros(DType::kFloat16, {n}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor bf16, Tensor::Zeros(DType::kBFloat16, {n}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e8m0, Tensor::Zeros(DType::kFloat8E8M0, {n}, gpu));
  testing::EncodeOutputs outputs{e4m3.data<uint8_t>(),  e5m2.data<uint8_t>(),
                                 e2m1.data<uint8_t>(),  fp16.data<uint16_t>(),
                                 bf16.data<uint16_t>(), e8m0.data<uint8_t>()};
  ASSERT_EQ(testing::LaunchEncodeEveryFormat(in.data<float>(), n, outputs, nullptr), cudaSuccess);
  const auto got_e4m3 = HostCopy<uint8_t>(e4m3);
  const auto got_e5m2 = HostCopy<uint8_t>(e5m2);
  const auto got_e2m1 = HostCopy<uint8_t>(e2m1);
  const auto got_fp16 = HostCopy<uint16_t>(fp16);
  const auto got_bf16 = HostCopy<uint16_t>(bf16);
  const auto got_e8m0 = HostCopy<uint8_t>(e8m0);
  ASSERT_EQ(got_e4m3.size(), inputs.size());
  int mismatches = 0;
  for (int64_t i = 0; i < n && mismatches < 20; ++i) {
    const float x = inputs[i];
    const bool same = got_e4m3[i] == FloatToE4M3(x) && got_e5m2[i] == FloatToE5M2(x) &&
                      got_e2m1[i] == FloatToE2M1(x) && got_fp16[i] == FloatToFp16(x) &&
                      got_bf16[i] == FloatToBf16(x) && got_e8m0[i] == FloatToE8M0RoundUp(x);
    if (!same) {
      ++mismatches;
      ADD_FAILURE() << "device and host encodings differ for FP32 bits 0x" << std::hex << Bits(x);
    }
  }
}

// The pair conversions of the normalization and activation kernels' 16-bit y stores
// (device_common.cuh Cvt16Pair: normalization_stats_warp.cu StoreY8Pairs, activation_kernels.cu
// StoreRowY) round every non-NaN FP32 value as the per-value conversions they replace
// (FloatToBf16, FloatToFp16 and __float2half_rn), and put the second operand in the low half.
TEST(DeviceCodec, PairConversionsRoundLikeThePerValueOnesForEveryFloat) {
  TESERVE_SKIP_WITHOUT_GPU();
  unsigned long long* mismatches = nullptr;
  uint32_t* first = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&mismatches), 2 * sizeof(unsigned long long)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&first), 2 * sizeof(uint32_t)), cudaSuccess);
  ASSERT_EQ(testing::LaunchPairConversionsEveryFloat(mismatches, first, nullptr), cudaSuccess);
  unsigned long long count[2] = {1, 1};
  uint32_t at[2] = {0, 0};
  ASSERT_EQ(cudaMemcpy(count, mismatches, sizeof(count), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(at, first, sizeof(at), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(count[0], 0u) << "BF16, first FP32 pattern 0x" << std::hex << at[0];
  EXPECT_EQ(count[1], 0u) << "FP16, first FP32 pattern 0x" << std::hex << at[1];
  cudaFree(mismatches);
  cudaFree(first);
}

TEST(DeviceCodec, DecodesLikeTheHostCodec) {
  TESERVE_SKIP_WITHOUT_GPU();
  const Device gpu = Device::Cuda(0);
  ASSERT_OK_AND_ASSIGN(Tensor e4m3, Tensor::Zeros(DType::kFloat32, {256}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e5m2, Tensor::Zeros(DType::kFloat32, {256}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e2m1, Tensor::Zeros(DType::kFloat32, {16}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor e8m0, Tensor::Zeros(DType::kFloat32, {256}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor fp16, Tensor::Zeros(DType::kFloat32, {1 << 16}, gpu));
  ASSERT_OK_AND_ASSIGN(Tensor bf16, Tensor::Zeros(DType::kFloat32, {1 << 16}, gpu));
  testing::DecodeOutputs outputs{e4m3.data<float>(), e5m2.data<float>(), e2m1.data<float>(),
                                 e8m0.data<float>(), fp16.data<float>(), bf16.data<float>()};
  ASSERT_EQ(testing::LaunchDecodeEveryCode(outputs, nullptr), cudaSuccess);
  const auto got_e4m3 = HostCopy<uint32_t>(e4m3);
  const auto got_e5m2 = HostCopy<uint32_t>(e5m2);
  const auto got_e2m1 = HostCopy<uint32_t>(e2m1);
  const auto got_e8m0 = HostCopy<uint32_t>(e8m0);
  const auto got_fp16 = HostCopy<uint32_t>(fp16);
  const auto got_bf16 = HostCopy<uint32_t>(bf16);
  ASSERT_EQ(got_fp16.size(), 1u << 16);
  for (uint32_t code = 0; code < 256; ++code) {
    const uint8_t c = static_cast<uint8_t>(code);
    EXPECT_EQ(got_e4m3[code], Bits(E4M3ToFloat(c))) << "E4M3 code " << code;
    EXPECT_EQ(got_e5m2[code], Bits(E5M2ToFloat(c))) << "E5M2 code " << code;
    EXPECT_EQ(got_e8m0[code], Bits(E8M0ToFloat(c))) << "E8M0 code " << code;
    if (code < 16) {
      EXPECT_EQ(got_e2m1[code], Bits(E2M1ToFloat(c))) << "E2M1 code " << code;
    }
  }
  for (uint32_t code = 0; code < (1u << 16); ++code) {
    const uint16_t c = static_cast<uint16_t>(code);
    EXPECT_EQ(got_fp16[code], Bits(Fp16ToFloat(c))) << "FP16 code " << code;
    EXPECT_EQ(got_bf16[code], Bits(Bf16ToFloat(c))) << "BF16 code " << code;
  }
}

#else  // !TESERVE_WITH_CUDA

TEST(DeviceCodec, SkippedWithoutCuda) { TESERVE_SKIP_WITHOUT_GPU(); }

#endif  // TESERVE_WITH_CUDA

}  // namespace
}  // namespace teserve
