// Helpers shared by the activation kernel files (activation_kernels.cu: forward,
// activation_backward_kernels.cu: backward): 4-element loads and stores of FP32, FP16 or
// BF16 (widened and narrowed through core/float_codec.h), the gate clamp and the scalar
// op of an ActivationFunctionParams.
//
// Only .cu files include this, after their own headers. Everything sits in an unnamed
// namespace, as in device_common.cuh, so each file keeps its own internal copy.
#ifndef TESERVE_KERNELS_CUDA_ACTIVATION_COMMON_CUH_
#define TESERVE_KERNELS_CUDA_ACTIVATION_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/activation_math.h"
#include "kernels/cuda/activation/activation_kernels.h"
#include "kernels/cuda/device_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kVec = 4;  // consecutive elements per thread

bool IsAligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

size_t ElementBytes(ActDType type) { return type == ActDType::kFloat32 ? 4 : 2; }

// ---------------------------------------------------------------------------------------
// Element access.

template <ActDType kType>
struct Elem {
  using Type = uint16_t;
  __device__ static float Widen(uint16_t v) {
    return kType == ActDType::kBFloat16 ? Bf16ToFloat(v) : Fp16ToFloat(v);
  }
  __device__ static void Load4(const uint16_t* p, float (&out)[kVec]) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    out[0] = Widen(static_cast<uint16_t>(v.x & 0xFFFFu));
    out[1] = Widen(static_cast<uint16_t>(v.x >> 16));
    out[2] = Widen(static_cast<uint16_t>(v.y & 0xFFFFu));
    out[3] = Widen(static_cast<uint16_t>(v.y >> 16));
  }
};

template <>
struct Elem<ActDType::kFloat32> {
  using Type = float;
  __device__ static float Widen(float v) { return v; }
  __device__ static void Load4(const float* p, float (&out)[kVec]) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x;
    out[1] = v.y;
    out[2] = v.z;
    out[3] = v.w;
  }
};

// The 4 elements at base[index..index+3] marked valid (0 elsewhere). Vectorized: all
// four are valid or none.
template <ActDType kType>
__device__ __forceinline__ void LoadValues(const void* base, int64_t index, const bool (&valid)[kVec],
                                           bool vectorized, float (&out)[kVec]) {
  using T = typename Elem<kType>::Type;
  const T* p = static_cast<const T*>(base) + index;
  if (vectorized) {
    if (valid[0]) {
      Elem<kType>::Load4(p, out);
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) out[k] = 0.0f;
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) out[k] = valid[k] ? Elem<kType>::Widen(p[k]) : 0.0f;
}

__device__ __forceinline__ uint16_t Narrow16(ActDType type, float v) {
  return type == ActDType::kBFloat16 ? FloatToBf16(v) : FloatToFp16(v);
}

// The 16-bit codes of v[0..8) in `type` (BF16 / FP16), two per word, v[2 j] in the low
// half of w[j]. pairs (no NaN among them): the pair conversions (Cvt16Pair, one instruction
// per two values, the same bits as Narrow16 for every non-NaN value); else per value.
__device__ __forceinline__ void Pack8x16(ActDType type, const float (&v)[8], bool pairs, uint32_t (&w)[4]) {
  if (pairs) {
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = Cvt16Pair(type == ActDType::kBFloat16, v[2 * j], v[2 * j + 1]);
  } else {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[j] = Narrow16(type, v[2 * j]) | (static_cast<uint32_t>(Narrow16(type, v[2 * j + 1])) << 16);
    }
  }
}

// Stores the valid values at base[index..] in `type` (RNE from FP32).
__device__ __forceinline__ void StoreValues(void* base, ActDType type, int64_t index, const float (&v)[kVec],
                                            const bool (&valid)[kVec], bool vectorized) {
  if (type == ActDType::kFloat32) {
    float* p = static_cast<float*>(base) + index;
    if (vectorized) {
      if (valid[0]) StoreGlobal16(p, __float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]), __float_as_uint(v[3]));
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        if (valid[k]) p[k] = v[k];
      }
    }
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + index;
  uint16_t h[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) h[k] = Narrow16(type, v[k]);
  if (vectorized) {
    if (valid[0]) {
      StoreGlobal8(p, h[0] | (static_cast<uint32_t>(h[1]) << 16), h[2] | (static_cast<uint32_t>(h[3]) << 16));
    }
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      if (valid[k]) p[k] = h[k];
    }
  }
}
// ---------------------------------------------------------------------------------------
// Launch helpers.

act::GateClamp ClampOf(const ActivationFunctionParams& act) {
  act::GateClamp clamp;
  clamp.enabled = act.clamped;
  clamp.limit = act.limit;
  clamp.offset = act.offset;
  return clamp;
}

// Calls fn(op) with the scalar op of `act`.
template <typename Fn>
cudaError_t WithOp(const ActivationFunctionParams& act, Fn&& fn) {
  switch (act.function) {
    case ActFunction::kGelu: return fn(act::GeluOp());
    case ActFunction::kSigmoidLinear: return fn(act::SigmoidLinearOp{act.alpha});
    case ActFunction::kRelu: return fn(act::ReluOp());
    case ActFunction::kSquaredRelu: return fn(act::SquaredReluOp());
  }
  return cudaErrorInvalidValue;
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_ACTIVATION_COMMON_CUH_
