// Multi-tensor AdamW and SGD. Each block takes chunks (kOptimizerChunk elements of one
// tensor) in a grid-stride loop; a chunk of a vectorizable tensor moves through 16-byte
// float4 loads/stores (4 elements per thread per iteration, two iterations' loads issued
// together for bytes in flight), the rest of the chunk and unaligned tensors go element
// by element.
// The math per element is kernels/optimizer_math.h, as on the CPU.
#include "kernels/cuda/optimizer/optimizer_kernels.h"

#include <algorithm>

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

using optimizer_math::ModelCopyKind;

constexpr int kThreads = 512;

struct AdamWUpdate {
  optimizer_math::AdamWScalars s;
  __device__ __forceinline__ void operator()(float g, float* p, float* m, float* v) const {
    optimizer_math::AdamWElement(s, g, p, m, v);
  }
};

struct SgdUpdate {
  optimizer_math::SgdScalars s;
  __device__ __forceinline__ void operator()(float g, float* p, float* m, float*) const {
    optimizer_math::SgdElement(s, g, p, m);
  }
};

__device__ __forceinline__ void StoreCopy4(const MultiTensorSlot& s, int64_t e, const float4& p) {
  const ModelCopyKind kind = static_cast<ModelCopyKind>(s.copy_kind);
  const uint32_t c0 = optimizer_math::ModelCopyCode(kind, p.x, s.copy_scale);
  const uint32_t c1 = optimizer_math::ModelCopyCode(kind, p.y, s.copy_scale);
  const uint32_t c2 = optimizer_math::ModelCopyCode(kind, p.z, s.copy_scale);
  const uint32_t c3 = optimizer_math::ModelCopyCode(kind, p.w, s.copy_scale);
  if (optimizer_math::IsSixteenBitCopy(kind)) {
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(s.copy) + e) = make_uint2(c0 | (c1 << 16), c2 | (c3 << 16));
  } else {
    *reinterpret_cast<uint32_t*>(static_cast<uint8_t*>(s.copy) + e) = c0 | (c1 << 8) | (c2 << 16) | (c3 << 24);
  }
}

__device__ __forceinline__ void StoreCopy1(const MultiTensorSlot& s, int64_t e, float p) {
  const ModelCopyKind kind = static_cast<ModelCopyKind>(s.copy_kind);
  const uint16_t c = optimizer_math::ModelCopyCode(kind, p, s.copy_scale);
  if (optimizer_math::IsSixteenBitCopy(kind)) {
    static_cast<uint16_t*>(s.copy)[e] = c;
  } else {
    static_cast<uint8_t*>(s.copy)[e] = static_cast<uint8_t>(c);
  }
}

// Four consecutive elements of one tensor in registers.
struct Vec4 {
  float4 p, g, m, v;
};

__device__ __forceinline__ Vec4 Load4(const MultiTensorSlot& s, int64_t e) {
  Vec4 x;
  x.p = *reinterpret_cast<const float4*>(s.p + e);
  x.g = __ldg(reinterpret_cast<const float4*>(s.g + e));
  x.m = s.m != nullptr ? *reinterpret_cast<const float4*>(s.m + e) : make_float4(0, 0, 0, 0);
  x.v = s.v != nullptr ? *reinterpret_cast<const float4*>(s.v + e) : make_float4(0, 0, 0, 0);
  return x;
}

template <typename Update>
__device__ __forceinline__ void UpdateAndStore4(const MultiTensorSlot& s, int64_t e, Vec4 x, const Update& update) {
  // m and v always point at registers (zeros when the tensor has no such buffer): SGD
  // touches its buffer only with momentum, which the host pairs with a non-null m.
  update(x.g.x, &x.p.x, &x.m.x, &x.v.x);
  update(x.g.y, &x.p.y, &x.m.y, &x.v.y);
  update(x.g.z, &x.p.z, &x.m.z, &x.v.z);
  update(x.g.w, &x.p.w, &x.m.w, &x.v.w);
  *reinterpret_cast<float4*>(s.p + e) = x.p;
  if (s.m != nullptr) *reinterpret_cast<float4*>(s.m + e) = x.m;
  if (s.v != nullptr) *reinterpret_cast<float4*>(s.v + e) = x.v;
  if (s.copy != nullptr) StoreCopy4(s, e, x.p);
}

template <typename Update>
__device__ __forceinline__ void UpdateScalar(const MultiTensorSlot& s, int64_t e, const Update& update) {
  float p = s.p[e];
  float m = s.m != nullptr ? s.m[e] : 0.0f;
  float v = s.v != nullptr ? s.v[e] : 0.0f;
  update(s.g[e], &p, &m, &v);
  s.p[e] = p;
  if (s.m != nullptr) s.m[e] = m;
  if (s.v != nullptr) s.v[e] = v;
  if (s.copy != nullptr) StoreCopy1(s, e, p);
}

template <typename Update>
__global__ void __launch_bounds__(kThreads) MultiTensorKernel(const MultiTensorSlot* __restrict__ slots,
                                                              const MultiTensorChunk* __restrict__ chunks,
                                                              int64_t num_chunks, Update update) {
  for (int64_t c = blockIdx.x; c < num_chunks; c += gridDim.x) {
    const MultiTensorChunk chunk = chunks[c];
    const MultiTensorSlot s = slots[chunk.slot];
    int64_t e = chunk.begin;
    if (s.vectorized) {
      const int64_t vec_end = chunk.begin + ((chunk.end - chunk.begin) & ~int64_t{3});
      const int64_t stride = 4 * kThreads;
      int64_t i = chunk.begin + 4 * threadIdx.x;
      for (; i + stride < vec_end; i += 2 * stride) {
        // Both positions' loads are issued before any store (the buffers may alias as far
        // as the compiler knows), so 128 bytes per thread are in flight.
        const Vec4 a = Load4(s, i);
        const Vec4 b = Load4(s, i + stride);
        UpdateAndStore4(s, i, a, update);
        UpdateAndStore4(s, i + stride, b, update);
      }
      for (; i < vec_end; i += stride) UpdateAndStore4(s, i, Load4(s, i), update);
      e = vec_end;
    }
    for (int64_t i = e + threadIdx.x; i < chunk.end; i += kThreads) UpdateScalar(s, i, update);
  }
}

int GridFor(int64_t num_chunks, const void* kernel) {
  int device = 0, sms = 132, per_sm = 1;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0) != cudaSuccess || per_sm < 1) {
    per_sm = 1;
  }
  cudaGetLastError();
  return static_cast<int>(std::min<int64_t>(num_chunks, static_cast<int64_t>(sms) * per_sm));
}

template <typename Update>
cudaError_t Launch(const MultiTensorSlot* slots, const MultiTensorChunk* chunks, int64_t num_chunks,
                   const Update& update, cudaStream_t stream) {
  if (num_chunks <= 0) return cudaSuccess;
  const int grid = GridFor(num_chunks, reinterpret_cast<const void*>(&MultiTensorKernel<Update>));
  MultiTensorKernel<Update><<<grid, kThreads, 0, stream>>>(slots, chunks, num_chunks, update);
  return cudaGetLastError();
}

bool Aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

void AppendChunks(MultiTensorSlot* slot, int32_t slot_index, std::vector<MultiTensorChunk>* chunks) {
  const uintptr_t copy_align = optimizer_math::IsSixteenBitCopy(static_cast<ModelCopyKind>(slot->copy_kind)) ? 8 : 4;
  slot->vectorized = Aligned(slot->p, 16) && Aligned(slot->g, 16) && Aligned(slot->m, 16) &&
                     Aligned(slot->v, 16) && Aligned(slot->copy, copy_align);
  for (int64_t begin = 0; begin < slot->numel; begin += kOptimizerChunk) {
    chunks->push_back({slot_index, 0, begin, std::min(slot->numel, begin + kOptimizerChunk)});
  }
}

cudaError_t LaunchAdamW(const MultiTensorSlot* slots, const MultiTensorChunk* chunks, int64_t num_chunks,
                        const optimizer_math::AdamWScalars& scalars, cudaStream_t stream) {
  return Launch(slots, chunks, num_chunks, AdamWUpdate{scalars}, stream);
}

cudaError_t LaunchSgd(const MultiTensorSlot* slots, const MultiTensorChunk* chunks, int64_t num_chunks,
                      const optimizer_math::SgdScalars& scalars, cudaStream_t stream) {
  return Launch(slots, chunks, num_chunks, SgdUpdate{scalars}, stream);
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
