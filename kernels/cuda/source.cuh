// Source<kType>: how a kernel reads its FP32 or BF16 input (SourceType, cast_kernels.h).
// The cast, block-quantize and NVFP4 kernels are templated on the source type and read
// through this one set of loaders, so the element type, the scalar conversion and the
// vector loads are spelled once.
//
// - ToFloat(e): one element as FP32 (BF16 is the high half of an FP32, so the widening is
//   a shift and exact).
// - Load4(p, out): four consecutive elements in one load: a 16-byte float4 for FP32, an
//   8-byte uint2 for BF16; p must be kAlignment-byte aligned.
// - Load(p, out): kVec consecutive elements in one 16-byte load (4 FP32 or 8 BF16); p
//   must be 16-byte aligned. The block-quantize tiles use it, so a thread's load is 16
//   bytes whatever the source type.
//
// Only .cu files include this. As in device_common.cuh, everything sits in an unnamed
// namespace, so each kernel file keeps its own internal copy and compiles to the same
// code as with the loaders written in the file.
#ifndef TESERVE_KERNELS_CUDA_SOURCE_CUH_
#define TESERVE_KERNELS_CUDA_SOURCE_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

template <SourceType kType>
struct Source;

template <>
struct Source<SourceType::kFloat32> {
  using Element = float;
  static constexpr int kAlignment = 16;  // of a Load4 address
  static constexpr int kVec = 4;         // elements per 16-byte Load
  __device__ static float ToFloat(float v) { return v; }
  __device__ static void Load4(const float* p, float out[4]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
  __device__ static void Load(const float* p, float out[kVec]) { Load4(p, out); }
};

template <>
struct Source<SourceType::kBFloat16> {
  using Element = uint16_t;
  static constexpr int kAlignment = 8;
  static constexpr int kVec = 8;
  __device__ static float ToFloat(uint16_t v) { return Bf16ToFloat(v); }
  __device__ static void Load4(const uint16_t* p, float out[4]) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = Bf16ToFloat(static_cast<uint16_t>(v.x & 0xFFFFu));
    out[1] = Bf16ToFloat(static_cast<uint16_t>(v.x >> 16));
    out[2] = Bf16ToFloat(static_cast<uint16_t>(v.y & 0xFFFFu));
    out[3] = Bf16ToFloat(static_cast<uint16_t>(v.y >> 16));
  }
  __device__ static void Load(const uint16_t* p, float out[kVec]) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      out[2 * k] = __uint_as_float(words[k] << 16);
      out[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
  }
};

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_SOURCE_CUH_
