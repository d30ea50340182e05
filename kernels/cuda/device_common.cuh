// Device helpers that several kernel files in kernels/cuda use in the same form: FP32
// magnitude bits, a block-wide max, the cvt.rn.satfinite FP8 pair encoder and the codec
// FP8 decoder.
//
// Only .cu files include this, after their own headers. Everything sits in an unnamed
// namespace, as it did in each kernel file, so every file keeps its own internal copy and
// its code is the same as with the definitions written in the file.
#ifndef TESERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_
#define TESERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_

#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr uint32_t kMagnitudeMask = 0x7FFFFFFFu;

// |v| as FP32 bits: non-negative, so integer order is value order.
__device__ __forceinline__ uint32_t MagnitudeBits(float v) {
  return __float_as_uint(v) & kMagnitudeMask;
}

// 4x4 byte transpose: in[k] holds row k's codes of 4 columns (column i in byte i); out[i]
// holds column i's codes of the 4 rows (row k in byte k). The FP8 cast-transpose,
// activation and normalization kernels build their columnwise stores with it.
__device__ __forceinline__ void Transpose4x4(const uint32_t in[4], uint32_t out[4]) {
  const uint32_t a0 = __byte_perm(in[0], in[1], 0x5140);  // r0c0 r1c0 r0c1 r1c1
  const uint32_t a1 = __byte_perm(in[0], in[1], 0x7362);  // r0c2 r1c2 r0c3 r1c3
  const uint32_t a2 = __byte_perm(in[2], in[3], 0x5140);  // r2c0 r3c0 r2c1 r3c1
  const uint32_t a3 = __byte_perm(in[2], in[3], 0x7362);  // r2c2 r3c2 r2c3 r3c3
  out[0] = __byte_perm(a0, a2, 0x5410);
  out[1] = __byte_perm(a0, a2, 0x7632);
  out[2] = __byte_perm(a1, a3, 0x5410);
  out[3] = __byte_perm(a1, a3, 0x7632);
}

// Max over the block, valid in thread 0. Every thread of the block must call it.
template <int kBlockThreads>
__device__ uint32_t BlockMax(uint32_t value) {
  constexpr int kWarps = kBlockThreads / 32;
  __shared__ uint32_t warp_max[kWarps];
  value = __reduce_max_sync(0xFFFFFFFFu, value);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  if (lane == 0) warp_max[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < kWarps ? warp_max[lane] : 0u;
    value = __reduce_max_sync(0xFFFFFFFFu, value);
  }
  return value;
}

// One 16-byte global store (st.global.v4.b32; p 16-byte aligned). Spelled out because for
// the uint4 / float4 assignments of the normalization and activation kernels' y stores
// (a run-time FP32 / 16-bit type switch around them) the compiler emitted four 4-byte
// stores (PTX st.global.u32 / .f32): four times the store instructions and L2 requests.
// No "memory" clobber: the callers store outputs that no thread reads back in the kernel,
// and the clobber pinned every load and store around it in place (the GELU backward
// kernel went from 72 to 124 registers and from 367 to 488 us on the H200). asm volatile
// statements keep their order among themselves (barriers, fences, mbarrier arrives).
__device__ __forceinline__ void StoreGlobal16(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
}

// One 8-byte global store (st.global.v2.b32; p 8-byte aligned), for the same reason.
__device__ __forceinline__ void StoreGlobal8(void* p, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.b32 [%0], {%1, %2};\n" ::"l"(p), "r"(a), "r"(b));
}

// An L2 cache policy that marks every line an access touches evict-last: kept ahead of the
// lines of normal accesses when the L2 replaces lines. For the stores that take it
// (StoreGlobal8EvictLast). volatile, so that each group of stores creates its own instead of
// the compiler keeping one in two registers across a whole kernel (a 4-byte spill in the
// stats-warp kernel at its 96-register limit).
__device__ __forceinline__ uint64_t L2EvictLastPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// StoreGlobal8 under an L2 policy from L2EvictLastPolicy. For the transposed (columnwise)
// code copies, whose lines lie 16 KiB apart and are often completed by the stores of
// several tiles or CTAs: with the lines of the streamed input replaced first, the
// stats-warp LayerNorm + FP8 kernel runs ~1-2% faster, the MXFP8 tile quantize ~4%, the
// activation forward + FP8 kernels 1-1.4% (H200, 16384 x 8192). Marking the rowwise codes
// too, or the input loads evict-first, gained nothing or lost. What the marked lines leave
// behind is small: a kernel reading an L2-resident buffer right after 134 MB of such stores
// runs 1-2% slower.
__device__ __forceinline__ void StoreGlobal8EvictLast(void* p, uint32_t a, uint32_t b, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.b32 [%0], {%1, %2}, %3;\n" ::"l"(p), "r"(a), "r"(b), "l"(policy));
}

// Hopper's pair conversion: codes of a (low byte) and b (high byte). satfinite saturates
// finite overflow and +-Inf to +-max as core/float_codec.h does; NaN is left to the
// caller. The normalization GPU test compared it with the codec for every FP32 input.
template <Fp8Format kFormat>
__device__ __forceinline__ uint32_t CvtPair(float a, float b) {
  uint16_t packed;
  if constexpr (kFormat == Fp8Format::kE4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(b), "f"(a));
  } else {
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(packed) : "f"(b), "f"(a));
  }
  return packed;
}

// BF16 (bf16 true) or FP16 codes of a (low half) and b (high half) in one instruction
// (cvt.rn.bf16x2 / cvt.rn.f16x2). For every non-NaN input they equal FloatToBf16 /
// FloatToFp16 of core/float_codec.h (round to nearest even, subnormals kept, overflow to
// Inf; DeviceCodec.PairConversionsRoundLikeThePerValueOnesForEveryFloat checks all 2^32
// patterns); NaNs may differ in sign and payload, so callers convert rows holding a NaN
// per value.
__device__ __forceinline__ uint32_t Cvt16Pair(bool bf16, float a, float b) {
  uint32_t out;
  if (bf16) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(b), "f"(a));
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(out) : "f"(b), "f"(a));
  }
  return out;
}

// FP32 value of an FP8 code (core/float_codec.h).
template <Fp8Format kFormat>
__device__ __forceinline__ float DecodeFp8(uint8_t code) {
  return kFormat == Fp8Format::kE4M3 ? E4M3ToFloat(code) : E5M2ToFloat(code);
}

// ---- Whole-line stores of staged FP8 tiles (the 128 x 128 cast-transpose and MXFP8 tile
// kernels). A thread's 8-byte pieces (8 codes of one row, or 8 rows of one column) stored
// straight from registers reach L2 as 32- or 64-byte requests; staged in shared memory as
// lines of 8-byte units and stored by 16 lanes per 128-byte line they make one request per
// line.

// Unit swizzle of a columnwise tile line (128 rows of one column): a fragment thread holds
// 4 or 8 adjacent columns and the lanes of one warp store start 8 (BF16 fragments) or 4
// (FP32) columns apart, so XOR-ing bits 2-3 of the unit with that lane index spreads a
// warp's 256 bytes over all banks (two wavefronts) and keeps every line whole. The division
// is unsigned: a signed one cost the cast-transpose 11%.
template <SourceType kType>
__device__ __forceinline__ int ColumnLineSwizzle(int column) {
  constexpr unsigned kColumnStep = kType == SourceType::kBFloat16 ? 8u : 4u;
  return static_cast<int>(((static_cast<unsigned>(column) / kColumnStep) & 3u) << 2);
}

// Unit swizzle of a rowwise tile line of kUnits 8-byte units (16: 128-byte lines, 8: 64-byte):
// the lanes of one warp store the same units of rows kUnits apart, so those rows go to
// opposite halves of the line; the lanes' stores spread over the banks and every line stays
// whole.
template <int kUnits>
__device__ __forceinline__ int RowLineSwizzle(int row) {
  static_assert(kUnits == 8 || kUnits == 16, "rowwise tile lines of 8 or 16 units");
  constexpr int kShift = kUnits == 16 ? 4 : 3;
  return ((row >> kShift) & 1) << (kShift - 1);
}

// Stores the kLines staged lines of tile[line][kUnits] (unit u of line l at
// tile[l][u ^ swizzle(l)]) to out + (line0 + l) * line_stride + elem0 + 8 u, 8 bytes per lane,
// whole lines per warp instruction; lines at or past line_limit and units at or past
// elem_limit (both multiples of 8) are skipped. Warp w of kThreads / 32 stores its share of
// consecutive lines.
template <int kUnits, int kLines, int kThreads, bool kEvictLast = false, typename Swizzle>
__device__ __forceinline__ void StoreStagedLines(uint8_t* out, int64_t line_stride, int64_t line0, int64_t line_limit,
                                                 int64_t elem0, int64_t elem_limit, const uint2 (*tile)[kUnits],
                                                 Swizzle swizzle, int warp, int lane) {
  const uint64_t policy = kEvictLast ? L2EvictLastPolicy() : 0;
  constexpr int kWarpLines = kLines / (kThreads / 32);
  constexpr int kLinesPerStore = 32 / kUnits;
  const int unit = lane % kUnits;
#pragma unroll
  for (int j = 0; j < kWarpLines / kLinesPerStore; ++j) {
    const int line = warp * kWarpLines + j * kLinesPerStore + lane / kUnits;
    const int64_t elem = elem0 + 8 * unit;
    if (line0 + line < line_limit && elem < elem_limit) {
      const uint2 v = tile[line][unit ^ swizzle(line)];
      if constexpr (kEvictLast) {
        StoreGlobal8EvictLast(out + (line0 + line) * line_stride + elem, v.x, v.y, policy);
      } else {
        *reinterpret_cast<uint2*>(out + (line0 + line) * line_stride + elem) = v;
      }
    }
  }
}

}  // namespace
}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_DEVICE_COMMON_CUH_
