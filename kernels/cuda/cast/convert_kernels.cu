// Plain dtype conversions on the device (kernels/cast.h ToFloat32 / CastFromFloat32):
// one thread per element, grid-stride, each element through the same core/float_codec.h
// encoder or decoder the CPU reference uses, so results are bit-identical to it (FP8
// encodes saturate to the largest finite code, FP16/BF16 round to nearest even).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// One codec per stored type: its code word and the core/float_codec.h pair.
template <ConvertType kType>
struct Codec;
template <>
struct Codec<ConvertType::kFloat16> {
  using Code = uint16_t;
  __device__ static float Decode(Code c) { return Fp16ToFloat(c); }
  __device__ static Code Encode(float x) { return FloatToFp16(x); }
};
template <>
struct Codec<ConvertType::kBFloat16> {
  using Code = uint16_t;
  __device__ static float Decode(Code c) { return Bf16ToFloat(c); }
  __device__ static Code Encode(float x) { return FloatToBf16(x); }
};
template <>
struct Codec<ConvertType::kE4M3> {
  using Code = uint8_t;
  __device__ static float Decode(Code c) { return E4M3ToFloat(c); }
  __device__ static Code Encode(float x) { return FloatToE4M3(x); }
};
template <>
struct Codec<ConvertType::kE5M2> {
  using Code = uint8_t;
  __device__ static float Decode(Code c) { return E5M2ToFloat(c); }
  __device__ static Code Encode(float x) { return FloatToE5M2(x); }
};

template <ConvertType kType>
__global__ void __launch_bounds__(kThreads)
    DecodeKernel(const typename Codec<kType>::Code* src, int64_t n, float* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = Codec<kType>::Decode(src[i]);
  }
}

template <ConvertType kType>
__global__ void __launch_bounds__(kThreads)
    EncodeKernel(const float* src, int64_t n, typename Codec<kType>::Code* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = Codec<kType>::Encode(src[i]);
  }
}

int BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

template <ConvertType kType>
cudaError_t Decode(const void* src, int64_t n, float* dst, cudaStream_t stream) {
  using Code = typename Codec<kType>::Code;
  DecodeKernel<kType><<<BlocksFor(n), kThreads, 0, stream>>>(static_cast<const Code*>(src), n, dst);
  return cudaGetLastError();
}

template <ConvertType kType>
cudaError_t Encode(const float* src, int64_t n, void* dst, cudaStream_t stream) {
  using Code = typename Codec<kType>::Code;
  EncodeKernel<kType><<<BlocksFor(n), kThreads, 0, stream>>>(src, n, static_cast<Code*>(dst));
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchToFloat32(const void* src, ConvertType type, int64_t n, float* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case ConvertType::kFloat32:
      return cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case ConvertType::kFloat16: return Decode<ConvertType::kFloat16>(src, n, dst, stream);
    case ConvertType::kBFloat16: return Decode<ConvertType::kBFloat16>(src, n, dst, stream);
    case ConvertType::kE4M3: return Decode<ConvertType::kE4M3>(src, n, dst, stream);
    case ConvertType::kE5M2: return Decode<ConvertType::kE5M2>(src, n, dst, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchFromFloat32(const float* src, int64_t n, ConvertType type, void* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (type) {
    case ConvertType::kFloat32:
      return cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case ConvertType::kFloat16: return Encode<ConvertType::kFloat16>(src, n, dst, stream);
    case ConvertType::kBFloat16: return Encode<ConvertType::kBFloat16>(src, n, dst, stream);
    case ConvertType::kE4M3: return Encode<ConvertType::kE4M3>(src, n, dst, stream);
    case ConvertType::kE5M2: return Encode<ConvertType::kE5M2>(src, n, dst, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
