// Device and host helpers shared by the LayerNorm / RMSNorm kernel files
// (normalization_forward_kernels.cu, normalization_register_tile.cu,
// normalization_backward_kernels.cu): element types and their conversions, the FP8
// encoders (hardware cvt.rn.satfinite pair or the integer codec, identical codes), warp
// and block reductions, and the cached device limits / occupancy queries of the launchers.
//
// Only .cu files include this, after their own headers. Everything sits in an unnamed
// namespace, so every file keeps its own internal copy.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_COMMON_CUH_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_COMMON_CUH_

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "core/float_codec.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/normalization/normalization_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// ---------------------------------------------------------------------------------------
// Element types.

template <NormDType kType>
struct Elem;

template <>
struct Elem<NormDType::kFloat32> {
  using Storage = float;
  __device__ static float ToFloat(float v) { return v; }
};

template <>
struct Elem<NormDType::kBFloat16> {
  using Storage = uint16_t;
  __device__ static float ToFloat(uint16_t v) { return Bf16ToFloat(v); }
};

template <>
struct Elem<NormDType::kFloat16> {
  using Storage = uint16_t;
  // FP16 -> FP32 is exact, so the hardware conversion equals the codec.
  __device__ static float ToFloat(uint16_t v) { return __half2float(__ushort_as_half(v)); }
};

// Unpacks the 16-byte vector `v` (4 FP32 or 8 16-bit values) into floats.
template <NormDType kType>
__device__ __forceinline__ void Unpack16(const uint4& v, float* out) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
  if constexpr (kType == NormDType::kFloat32) {
    for (int i = 0; i < 4; ++i) out[i] = __uint_as_float(words[i]);
  } else {
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = Elem<kType>::ToFloat(static_cast<uint16_t>(words[i] & 0xFFFFu));
      out[2 * i + 1] = Elem<kType>::ToFloat(static_cast<uint16_t>(words[i] >> 16));
    }
  }
}

// Four consecutive elements from shared memory (8- or 16-byte aligned).
template <NormDType kType>
__device__ __forceinline__ void LoadShared4(const unsigned char* p, float out[4]) {
  if constexpr (kType == NormDType::kFloat32) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  } else {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.x & 0xFFFFu));
    out[1] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.x >> 16));
    out[2] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.y & 0xFFFFu));
    out[3] = Elem<kType>::ToFloat(static_cast<uint16_t>(v.y >> 16));
  }
}

__device__ __forceinline__ uint16_t FloatTo16(NormDType type, float v) {
  return type == NormDType::kBFloat16 ? FloatToBf16(v) : __half_as_ushort(__float2half_rn(v));
}

template <NormDType kType>
__device__ __forceinline__ uint16_t FloatTo16(float v) {
  return FloatTo16(kType, v);
}

// Stores v[0..n) at y[index..index+n) in `type`; all four with one vector store when
// `vector` (index % 4 == 0 and y aligned).
__device__ __forceinline__ void StoreY4(void* y, NormDType type, int64_t index, const float v[4],
                                        int n, bool vector) {
  if (type == NormDType::kFloat32) {
    float* out = static_cast<float*>(y) + index;
    if (vector && n == 4) {
      *reinterpret_cast<float4*>(out) = make_float4(v[0], v[1], v[2], v[3]);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if (i < n) out[i] = v[i];
      }
    }
    return;
  }
  uint16_t* out = static_cast<uint16_t*>(y) + index;
  uint16_t h[4];
  for (int i = 0; i < 4; ++i) h[i] = FloatTo16(type, v[i]);
  if (vector && n == 4) {
    *reinterpret_cast<uint2*>(out) =
        make_uint2(h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i < n) out[i] = h[i];
    }
  }
}

// ---------------------------------------------------------------------------------------
// FP8 encoding.

template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t CodecEncode(float v) {
  return kFormat == Fp8Format::kE4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

// Codes of a (low byte) and b (high byte), exactly core/float_codec.h's (NaN -> 0x7F).
template <Fp8Format kFormat, Fp8Encoder kEncoder>
__device__ __forceinline__ uint32_t Encode2(float a, float b) {
  if constexpr (kEncoder == Fp8Encoder::kCodec) {
    return CodecEncode<kFormat>(a) | (CodecEncode<kFormat>(b) << 8);
  } else {
    uint32_t codes = CvtPair<kFormat>(a, b);
    if (a != a) codes = (codes & 0xFF00u) | 0x7Fu;
    if (b != b) codes = (codes & 0x00FFu) | 0x7F00u;
    return codes;
  }
}

// Four codes of v[0..3] * scale, v[0] in the low byte. kMayHaveNan = false skips the NaN
// patch of the hardware path (callers know no value is NaN).
template <Fp8Format kFormat, Fp8Encoder kEncoder, bool kMayHaveNan>
__device__ __forceinline__ uint32_t Encode4(const float v[4], float scale) {
  const float s0 = __fmul_rn(v[0], scale), s1 = __fmul_rn(v[1], scale);
  const float s2 = __fmul_rn(v[2], scale), s3 = __fmul_rn(v[3], scale);
  if constexpr (kEncoder == Fp8Encoder::kHardware && !kMayHaveNan) {
    return CvtPair<kFormat>(s0, s1) | (CvtPair<kFormat>(s2, s3) << 16);
  } else {
    return Encode2<kFormat, kEncoder>(s0, s1) | (Encode2<kFormat, kEncoder>(s2, s3) << 16);
  }
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}



// ---------------------------------------------------------------------------------------
// Host side.

int BytesOf(NormDType type) { return type == NormDType::kFloat32 ? 4 : 2; }

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct DeviceLimits {
  int sms = 0;
  int max_shared_optin = 0;
};

cudaError_t GetDeviceLimits(DeviceLimits* limits) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<int, DeviceLimits> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it == cache.end()) {
    DeviceLimits l;
    status = cudaDeviceGetAttribute(&l.sms, cudaDevAttrMultiProcessorCount, device);
    if (status != cudaSuccess) return status;
    status = cudaDeviceGetAttribute(&l.max_shared_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                    device);
    if (status != cudaSuccess) return status;
    it = cache.emplace(device, l).first;
  }
  *limits = it->second;
  return cudaSuccess;
}

// Occupancy answers are cached per (device, kernel, shared bytes, cluster size).
using OccupancyKey = std::tuple<int, const void*, int, int>;

template <typename Kernel>
cudaError_t ResidentCtasPerSm(Kernel kernel, int shared_bytes, int* ctas) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<OccupancyKey, int> cache;
  const OccupancyKey key{device, reinterpret_cast<const void*>(kernel), shared_bytes, 0};
  static std::map<std::pair<int, const void*>, int> shared_limit;  // only ever raised
  std::lock_guard<std::mutex> lock(mutex);
  int& limit = shared_limit[{device, reinterpret_cast<const void*>(kernel)}];
  if (shared_bytes > 48 * 1024 && shared_bytes > limit) {
    status = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, shared_bytes);
    if (status != cudaSuccess) return status;
    limit = shared_bytes;
  }
  auto it = cache.find(key);
  if (it == cache.end()) {
    int n = 0;
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, shared_bytes);
    if (status != cudaSuccess) return status;
    it = cache.emplace(key, n).first;
  }
  *ctas = it->second;
  return cudaSuccess;
}

// Launch configuration of `grid` CTAs of `threads` threads in clusters of `cluster` CTAs
// along x; `attribute` receives the cluster dimension and must outlive the configuration.
inline cudaLaunchConfig_t ClusterLaunchConfig(dim3 grid, int cluster, int threads, int shared_bytes,
                                              cudaStream_t stream, cudaLaunchAttribute* attribute) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads, 1, 1);
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  attribute->id = cudaLaunchAttributeClusterDimension;
  attribute->val.clusterDim.x = cluster;
  attribute->val.clusterDim.y = 1;
  attribute->val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return config;
}

template <typename Kernel>
cudaError_t MaxActiveClusters(Kernel kernel, int shared_bytes, int cluster, int* clusters) {
  int device = 0;
  cudaError_t status = cudaGetDevice(&device);
  if (status != cudaSuccess) return status;
  static std::mutex mutex;
  static std::map<OccupancyKey, int> cache;
  const OccupancyKey key{device, reinterpret_cast<const void*>(kernel), shared_bytes, cluster};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    cudaLaunchAttribute attribute;
    const cudaLaunchConfig_t config =
        ClusterLaunchConfig(dim3(cluster, 1, 1), cluster, kThreads, shared_bytes, nullptr, &attribute);
    int n = 0;
    status = cudaOccupancyMaxActiveClusters(&n, kernel, &config);
    if (status != cudaSuccess) return status;
    it = cache.emplace(key, n).first;
  }
  *clusters = it->second;
  return cudaSuccess;
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_COMMON_CUH_
