// Plain dtype conversions on the device (kernels/cast.h ToFloat32 / CastFromFloat32):
// one thread per element, grid-stride, each element through the same core/float_codec.h
// encoder or decoder the CPU reference uses, so results are bit-identical to it (FP8
// encodes saturate to the largest finite code, FP16/BF16 round to nearest even).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

struct Fp16Decode {
  __device__ static float Apply(uint16_t c) { return Fp16ToFloat(c); }
};
struct Bf16Decode {
  __device__ static float Apply(uint16_t c) { return Bf16ToFloat(c); }
};
struct E4M3Decode {
  __device__ static float Apply(uint8_t c) { return E4M3ToFloat(c); }
};
struct E5M2Decode {
  __device__ static float Apply(uint8_t c) { return E5M2ToFloat(c); }
};
struct Fp16Encode {
  __device__ static uint16_t Apply(float x) { return FloatToFp16(x); }
};
struct Bf16Encode {
  __device__ static uint16_t Apply(float x) { return FloatToBf16(x); }
};
struct E4M3Encode {
  __device__ static uint8_t Apply(float x) { return FloatToE4M3(x); }
};
struct E5M2Encode {
  __device__ static uint8_t Apply(float x) { return FloatToE5M2(x); }
};

template <typename Code, typename Op>
__global__ void __launch_bounds__(kThreads) DecodeKernel(const Code* src, int64_t n, float* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = Op::Apply(src[i]);
  }
}

template <typename Code, typename Op>
__global__ void __launch_bounds__(kThreads) EncodeKernel(const float* src, int64_t n, Code* dst) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    dst[i] = Op::Apply(src[i]);
  }
}

int BlocksFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > kMaxBlocks ? kMaxBlocks : blocks));
}

}  // namespace

cudaError_t LaunchToFloat32(const void* src, ConvertType type, int64_t n, float* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int blocks = BlocksFor(n);
  switch (type) {
    case ConvertType::kFloat32:
      return cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case ConvertType::kFloat16:
      DecodeKernel<uint16_t, Fp16Decode><<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(src), n, dst);
      break;
    case ConvertType::kBFloat16:
      DecodeKernel<uint16_t, Bf16Decode><<<blocks, kThreads, 0, stream>>>(static_cast<const uint16_t*>(src), n, dst);
      break;
    case ConvertType::kE4M3:
      DecodeKernel<uint8_t, E4M3Decode><<<blocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(src), n, dst);
      break;
    case ConvertType::kE5M2:
      DecodeKernel<uint8_t, E5M2Decode><<<blocks, kThreads, 0, stream>>>(static_cast<const uint8_t*>(src), n, dst);
      break;
  }
  return cudaGetLastError();
}

cudaError_t LaunchFromFloat32(const float* src, int64_t n, ConvertType type, void* dst, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int blocks = BlocksFor(n);
  switch (type) {
    case ConvertType::kFloat32:
      return cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, stream);
    case ConvertType::kFloat16:
      EncodeKernel<uint16_t, Fp16Encode><<<blocks, kThreads, 0, stream>>>(src, n, static_cast<uint16_t*>(dst));
      break;
    case ConvertType::kBFloat16:
      EncodeKernel<uint16_t, Bf16Encode><<<blocks, kThreads, 0, stream>>>(src, n, static_cast<uint16_t*>(dst));
      break;
    case ConvertType::kE4M3:
      EncodeKernel<uint8_t, E4M3Encode><<<blocks, kThreads, 0, stream>>>(src, n, static_cast<uint8_t*>(dst));
      break;
    case ConvertType::kE5M2:
      EncodeKernel<uint8_t, E5M2Encode><<<blocks, kThreads, 0, stream>>>(src, n, static_cast<uint8_t*>(dst));
      break;
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
