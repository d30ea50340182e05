// CUDA forward kernels for the activations of kernels/activation.h, with the fused
// per-tensor FP8 output (rowwise + transposed columnwise codes and amax in one pass over
// x). Backward: activation_backward_kernels.cu; shared helpers: activation_common.cuh.
//
// Design:
// - Bit-exactness: the scalar formulas are kernels/activation_math.h's (the CPU
//   reference's, evaluated in the same order), narrow inputs widen and outputs narrow
//   through core/float_codec.h, y * scale is one FP32 multiply (__fmul_rn), and the FP8
//   code is the cvt.rn.satfinite instruction (RNE and satfinite like the codec; NaN
//   patched to the codec's 0x7F) or the codec itself. So given the FP32 y the codes and
//   amax are the CPU's bit for bit; the FP32 y itself can differ from the host's by a
//   few ulp (the device sigmoid of activation_math.h: ex2.approx / rcp.approx; FMA
//   contraction).
// - Forward, main kernel (rows and cols positive multiples of 8, x / y 16-byte and codes
//   8-byte aligned; ActivationForwardTiledKernel): cast_kernels.cu's 128 x 128 register
//   tile (8 rows x 8 columns per thread, 16-byte loads, both halves for gated kinds), f
//   applied to each register value, cvt.rn.satfinite pairs with the NaN patch only in rows
//   whose max |y| is not finite, byte-permute transpose to 8-byte columnwise stores,
//   max.NaN amax and one atomicMax per block; y (any type) and the codec encoder too.
//   Gated kinds without the clamp are compiled without it (kClamped).
//   Target: the bandwidth of the FP8 cast-transpose, ~3.7-4.1 TB/s on an H200 for BF16
//   16384 x 8192 (bench/activation_bench), i.e. memory-bound for every kind. Two things
//   keep it there. The device sigmoid is branch-free (9 instructions per gelu value; expf
//   plus an IEEE reciprocal with its slow-path branch made the sigmoid kinds
//   instruction-bound at about half that). And each row's two code words go straight to
//   the rowwise store and into a shared-memory slot of the thread (`parked`, 16 KiB per
//   block) for the transposes: kept in registers they spilled 36-52 bytes per thread, and
//   that local-memory traffic loaded the L2 fabric, the busiest unit, with ~30% more
//   write sectors than the codes themselves. Without spills ptxas needs 76-80 registers
//   element-wise on 16-bit x, 113-128 elsewhere. Columnwise stores go under an L2
//   evict-last policy.
// - Forward fallback (every other shape, and ActForwardKernel::kTiled64): a 256-thread
//   block owns a 64x64 tile of the output (16 threads across, 4 consecutive columns
//   each, 16 rows per pass, 4 passes), looping over tiles with a
//   grid sized to the resident blocks. Each thread first loads all 4 passes (16-byte FP32
//   / 8-byte BF16/FP16 loads, both halves for gated kinds), then computes, stores y and
//   the rowwise codes (4 bytes per store) and parks the codes in a shared-memory tile,
//   which the block writes transposed (4 consecutive bytes per thread) after a barrier.
//   amax: FP32 magnitude bits (integer order is value order, NaN above Inf), warp
//   reductions, one atomicMax per block.
// - Vectorized access when K % 4 == 0 and the pointers are aligned (transposed stores:
//   rows % 4 == 0); otherwise the same kernels run bounds-checked scalar accesses.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

#include "core/float_codec.h"
#include "kernels/activation_math.h"
#include "kernels/cuda/activation/activation_kernels.h"
#include "kernels/cuda/activation/activation_common.cuh"
#include "kernels/cuda/device_common.cuh"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

// Forward tiling.
constexpr int kTile = 64;
constexpr int kForwardThreads = 256;
constexpr int kAcross = kTile / kVec;                        // 16
constexpr int kRowsPerPass = kForwardThreads / kAcross;      // 16
constexpr int kPasses = kTile / kRowsPerPass;                // 4
constexpr int kTileRowPadBytes = 4;

// ---------------------------------------------------------------------------------------
// FP8 encoding.

// Hardware pair conversion: code of a in the low byte, b in the high byte.
__device__ __forceinline__ uint32_t CvtPair(bool e4m3, float a, float b) {
  return e4m3 ? CvtPair<Fp8Format::kE4M3>(a, b) : CvtPair<Fp8Format::kE5M2>(a, b);
}

// Codes of v[0..3] packed little-endian (element k in byte k), exactly core/float_codec.h's.
__device__ __forceinline__ uint32_t Encode4(Fp8Format format, ActFp8Encoder encoder, const float (&v)[kVec]) {
  const bool e4m3 = format == Fp8Format::kE4M3;
  uint32_t word = 0;
  if (encoder == ActFp8Encoder::kCodec) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const uint32_t code = e4m3 ? FloatToE4M3(v[k]) : FloatToE5M2(v[k]);
      word |= code << (8 * k);
    }
    return word;
  }
  word = CvtPair(e4m3, v[0], v[1]) | (CvtPair(e4m3, v[2], v[3]) << 16);
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (v[k] != v[k]) word = (word & ~(0xFFu << (8 * k))) | (0x7Fu << (8 * k));
  }
  return word;
}

// ---------------------------------------------------------------------------------------
// Scalar activation, in the CPU reference's order (kernels/cpu/activation_cpu.cc).

template <typename Op, bool kGated>
__device__ __forceinline__ float ForwardValue(const Op& op, const act::GateClamp& clamp, float a, float b) {
  if (!kGated) return op.Value(a);
  return op.Value(clamp.ActIn(a)) * (clamp.LinearIn(b) + clamp.offset);
}

template <typename Op>
struct ForwardArgs {
  ActivationForwardParams p;
  Op op;
  act::GateClamp clamp;
  bool vectorized;            // K % 4 == 0, x / y / rowwise aligned
  bool columnwise_vectorized; // rows % 4 == 0, columnwise aligned
};

__device__ __forceinline__ void StoreBytes(uint8_t* p, uint32_t word, const bool (&valid)[kVec], bool vectorized) {
  if (vectorized) {
    if (valid[0]) *reinterpret_cast<uint32_t*>(p) = word;
    return;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    if (valid[k]) p[k] = static_cast<uint8_t>(word >> (8 * k));
  }
}

template <typename Op, bool kGated, ActDType kIn>
__global__ void __launch_bounds__(kForwardThreads) ActivationForwardKernel(const ForwardArgs<Op> args) {
  __shared__ uint8_t tile[kTile][kTile + kTileRowPadBytes];
  const ActivationForwardParams& p = args.p;
  const int64_t rows = p.rows;
  const int64_t cols = p.cols;
  const int64_t in_cols = kGated ? 2 * cols : cols;
  const int64_t tiles_across = (cols + kTile - 1) / kTile;
  const int64_t tiles = ((rows + kTile - 1) / kTile) * tiles_across;
  const bool quantize = p.rowwise != nullptr || p.columnwise != nullptr;
  const int lane_across = threadIdx.x % kAcross;
  const int lane_down = threadIdx.x / kAcross;
  const int tc = lane_across * kVec;

  uint32_t local_amax = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row0 = (t / tiles_across) * kTile;
    const int64_t c = (t % tiles_across) * kTile + tc;
    float a[kPasses][kVec];
    float b[kPasses][kVec];
    bool valid[kPasses][kVec];
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int64_t r = row0 + pass * kRowsPerPass + lane_down;
#pragma unroll
      for (int k = 0; k < kVec; ++k) valid[pass][k] = r < rows && c + k < cols;
      LoadValues<kIn>(p.x, r * in_cols + c, valid[pass], args.vectorized, a[pass]);
      if (kGated) LoadValues<kIn>(p.x, r * in_cols + cols + c, valid[pass], args.vectorized, b[pass]);
    }
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int tr = pass * kRowsPerPass + lane_down;
      const int64_t r = row0 + tr;
      float y[kVec];
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        y[k] = ForwardValue<Op, kGated>(args.op, args.clamp, a[pass][k], kGated ? b[pass][k] : 0.0f);
        if (valid[pass][k]) local_amax = max(local_amax, MagnitudeBits(y[k]));
      }
      if (p.y != nullptr) StoreValues(p.y, p.y_type, r * cols + c, y, valid[pass], args.vectorized);
      if (quantize) {
        float scaled[kVec];
#pragma unroll
        for (int k = 0; k < kVec; ++k) scaled[k] = __fmul_rn(y[k], p.scale);
        const uint32_t word = Encode4(p.format, p.encoder, scaled);
        if (p.rowwise != nullptr) StoreBytes(p.rowwise + r * cols + c, word, valid[pass], args.vectorized);
        if (p.columnwise != nullptr) *reinterpret_cast<uint32_t*>(&tile[tr][tc]) = word;
      }
    }
    if (p.columnwise != nullptr) {  // uniform across the block: the barriers are safe
      __syncthreads();
      const int64_t col0 = c - tc;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int oc = pass * kRowsPerPass + lane_down;  // output row = source column
        const int orr = lane_across * kVec;              // 4 consecutive source rows
        const int64_t cc = col0 + oc;
        const int64_t r = row0 + orr;
        bool ok[kVec];
        uint32_t word = 0;
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          ok[k] = cc < cols && r + k < rows;
          word |= static_cast<uint32_t>(tile[orr + k][oc]) << (8 * k);
        }
        if (cc < cols) StoreBytes(p.columnwise + cc * rows + r, word, ok, args.columnwise_vectorized);
      }
      __syncthreads();  // the tile is rewritten by the next iteration
    }
  }

  if (p.amax_bits != nullptr) {
    const uint32_t block_amax = BlockMax<kForwardThreads>(local_amax);
    if (threadIdx.x == 0 && block_amax != 0u) atomicMax(p.amax_bits, block_amax);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
  }
}

// ---------------------------------------------------------------------------------------
// Register-tile forward (rows, cols positive multiples of 8; x, y 16-byte and the codes
// 8-byte aligned).

constexpr int kTiledThreads = 256;  // 8 warps
constexpr int kUnit = 8;            // each thread owns 8 rows x 8 columns
constexpr int kHalfRows = 4;        // rows per half fragment
constexpr int kLanesDown = 4;       // lanes of a warp along rows
constexpr int kLanesAcross = 8;     // lanes of a warp along columns
constexpr int kWarpsDown = 4;
constexpr int kWarpsAcross = 2;
constexpr int kTiledRows = kWarpsDown * kLanesDown * kUnit;        // 128
constexpr int kTiledCols = kWarpsAcross * kLanesAcross * kUnit;    // 128
constexpr float kInf = __builtin_huge_valf();

// Resident 256-thread blocks per SM the register budget aims at: 3 (<= 80 registers) for
// element-wise kinds on 16-bit x, whose 8 x 8 fragment is 32 registers, 2 otherwise. Each
// block loads its whole fragment up front, so a third block is 50% more bytes in flight
// (gelu ~5% faster on an H200); the gated kinds (twice the input per thread) already reach
// ~4 TB/s with 2.
template <bool kGated, ActDType kIn>
constexpr int kTiledMinBlocks = kGated || kIn == ActDType::kFloat32 ? 2 : 3;

// One row's 8 elements of a thread's fragment, as loaded (16-byte accesses). 16-bit
// types: columns c0 .. c0 + 7, one load. FP32: columns c0 .. c0 + 3 and c0 + 32 .. + 35
// (two loads, so each warp load still covers whole 32-byte sectors). Element i is in
// group i / 4, at column c0 + (i / 4) * kGroupStride + i % 4.
template <ActDType kType>
struct RowOf8 {
  static constexpr bool kWide = kType == ActDType::kFloat32;
  static constexpr int kLoads = kWide ? 2 : 1;
  static constexpr int kGroupStride = kWide ? 32 : 4;
  using T = typename Elem<kType>::Type;
  uint4 raw[kLoads];

  __device__ __forceinline__ void Load(const void* base, int64_t index, const bool (&valid)[2]) {
    const T* p = static_cast<const T*>(base) + index;
#pragma unroll
    for (int l = 0; l < kLoads; ++l) {
      raw[l] = valid[l] ? *reinterpret_cast<const uint4*>(p + l * kGroupStride) : make_uint4(0u, 0u, 0u, 0u);
    }
  }
  __device__ static __forceinline__ uint32_t Word(const uint4& v, int j) {
    return j == 0 ? v.x : (j == 1 ? v.y : (j == 2 ? v.z : v.w));
  }
  __device__ __forceinline__ float Value(int i) const {
    if constexpr (kWide) {
      return __uint_as_float(Word(raw[i / 4], i % 4));
    } else {
      const uint32_t word = Word(raw[0], i / 2);
      return Elem<kType>::Widen(static_cast<uint16_t>(i % 2 ? word >> 16 : word & 0xFFFFu));
    }
  }
};

// Stores one row's 8 FP32 values (RowOf8<kType>'s column layout) in `type`; pairs: the
// row holds no NaN (Pack8x16).
template <ActDType kType>
__device__ __forceinline__ void StoreRowY(void* base, ActDType type, int64_t index, const float (&v)[kUnit],
                                          const bool (&valid)[2], bool pairs) {
  constexpr int kStride = RowOf8<kType>::kGroupStride;
  if (type == ActDType::kFloat32) {
    float* p = static_cast<float*>(base) + index;
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      if (valid[g]) {
        StoreGlobal16(p + g * kStride, __float_as_uint(v[4 * g]), __float_as_uint(v[4 * g + 1]),
                      __float_as_uint(v[4 * g + 2]), __float_as_uint(v[4 * g + 3]));
      }
    }
    return;
  }
  uint32_t w[4];
  Pack8x16(type, v, pairs, w);
  uint16_t* p = static_cast<uint16_t*>(base) + index;
  if constexpr (kStride == 4) {  // 8 adjacent columns: one 16-byte store
    if (valid[0]) StoreGlobal16(p, w[0], w[1], w[2], w[3]);
  } else {
#pragma unroll
    for (int g = 0; g < 2; ++g) {
      if (valid[g]) StoreGlobal8(p + g * kStride, w[2 * g], w[2 * g + 1]);
    }
  }
}


enum class TileEncode { kHardware, kHardwarePatchNan, kCodec };

// Codes of one fragment row: codes[g] = group g (column i of the group in byte i), each
// code encode(y * scale) with the product one FP32 multiply. kHardware is only used when
// no product can be NaN (the row's |y| finite and the scale finite); otherwise
// kHardwarePatchNan gives NaN products the codec's 0x7F. kCodec: core/float_codec.h.
template <Fp8Format kFormat, TileEncode kEncode>
__device__ __forceinline__ void EncodeRow(const float (&y)[kUnit], float scale, uint32_t (&codes)[2]) {
#pragma unroll
  for (int g = 0; g < 2; ++g) {
    float s[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) s[i] = __fmul_rn(y[4 * g + i], scale);
    uint32_t word = 0;
    if constexpr (kEncode == TileEncode::kCodec) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const uint32_t code = kFormat == Fp8Format::kE4M3 ? FloatToE4M3(s[i]) : FloatToE5M2(s[i]);
        word |= code << (8 * i);
      }
    } else {
      word = CvtPair<kFormat>(s[0], s[1]) | (CvtPair<kFormat>(s[2], s[3]) << 16);
      if constexpr (kEncode == TileEncode::kHardwarePatchNan) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (s[i] != s[i]) word = (word & ~(0xFFu << (8 * i))) | (0x7Fu << (8 * i));
        }
      }
    }
    codes[g] = word;
  }
}

template <Fp8Format kFormat>
__device__ __forceinline__ void EncodeRowAs(ActFp8Encoder encoder, bool patch, const float (&y)[kUnit], float scale,
                                            uint32_t (&codes)[2]) {
  if (encoder == ActFp8Encoder::kCodec) {
    EncodeRow<kFormat, TileEncode::kCodec>(y, scale, codes);
  } else if (patch) {
    EncodeRow<kFormat, TileEncode::kHardwarePatchNan>(y, scale, codes);
  } else {
    EncodeRow<kFormat, TileEncode::kHardware>(y, scale, codes);
  }
}

// max(a, b), NaN if either is NaN (sm_80+).
__device__ __forceinline__ float MaxNan(float a, float b) {
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// One 128 x 128 output tile per block, the thread layout of cast_kernels.cu's
// FastCastTransposeKernel: warp w covers rows 32 (w % 4) .. + 31 and columns 64 (w / 4)
// .. + 63; lane l owns rows 8 (l % 4) .. + 7 and 8 columns (RowOf8) from 8 (l / 4) (16-bit
// x) or 4 (l / 4) (FP32 x). All 8 rows (and the gate half b for gated kinds) are loaded
// first; the rows are then processed in two halves of 4 (a loop, not unrolled, to keep
// the body small), row by row: y = f(a) [* (b' + offset)] in FP32, optional y store,
// max |y|, codes (the NaN patch only where the row's max |y| is not finite or the scale
// is not), 8-byte rowwise stores. The two halves' codes give the 8-byte columnwise stores through
// byte-permute transposes. f(0) = 0 for every function, so the zero-filled loads of
// threads outside the tensor never raise the amax. kPrefetch = false (FP32 gated x: 128
// registers of input) loads the second half after the first is done instead. kClamped:
// args.clamp.enabled, fixed at compile time so that unclamped gated kinds compute
// f(a) * (b + offset) without the clamp's selects.
template <typename Op, bool kGated, ActDType kIn, bool kClamped>
__global__ void __launch_bounds__(kTiledThreads, kTiledMinBlocks<kGated, kIn>)
    ActivationForwardTiledKernel(const ForwardArgs<Op> args) {
  constexpr bool kPrefetch = !(kGated && kIn == ActDType::kFloat32);
  constexpr int kStride = RowOf8<kIn>::kGroupStride;
  const ActivationForwardParams& p = args.p;
  act::GateClamp clamp = args.clamp;
  clamp.enabled = kClamped;
  const int64_t rows = p.rows;
  const int64_t cols = p.cols;
  const int64_t in_cols = kGated ? 2 * cols : cols;
  const int64_t tiles_across = (cols + kTiledCols - 1) / kTiledCols;
  const int64_t tile_row0 = (static_cast<int64_t>(blockIdx.x) / tiles_across) * kTiledRows;
  const int64_t tile_col0 = (static_cast<int64_t>(blockIdx.x) % tiles_across) * kTiledCols;
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int64_t r0 = tile_row0 + (warp % kWarpsDown) * (kLanesDown * kUnit) + (lane % kLanesDown) * kUnit;
  const int64_t c0 = tile_col0 + (warp / kWarpsDown) * (kLanesAcross * kUnit) +
                     (lane / kLanesDown) * (RowOf8<kIn>::kWide ? 4 : kUnit);
  bool valid[2];
#pragma unroll
  for (int g = 0; g < 2; ++g) valid[g] = r0 < rows && c0 + g * kStride < cols;  // rows, cols % 8 == 0
  const bool quantize = p.rowwise != nullptr || p.columnwise != nullptr;
  const bool e4m3 = p.format == Fp8Format::kE4M3;
  const bool scale_finite = isfinite(p.scale);

  float amax = 0.0f;
  if (valid[0] || valid[1]) {
    RowOf8<kIn> a[kHalfRows], b[kHalfRows], next_a[kHalfRows], next_b[kHalfRows];
#pragma unroll
    for (int k = 0; k < kHalfRows; ++k) {
      a[k].Load(p.x, (r0 + k) * in_cols + c0, valid);
      if (kGated) b[k].Load(p.x, (r0 + k) * in_cols + cols + c0, valid);
    }
    if (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kHalfRows; ++k) {
        next_a[k].Load(p.x, (r0 + kHalfRows + k) * in_cols + c0, valid);
        if (kGated) next_b[k].Load(p.x, (r0 + kHalfRows + k) * in_cols + cols + c0, valid);
      }
    }
    // The codes wait for the columnwise transposes in shared memory (each thread reads back
    // only its own words, so no barrier): the first half's 8 words kept in registers pushed
    // the 3-blocks-per-SM kernels (80 registers) into spilling 36-52 bytes per thread, and
    // that local-memory traffic reached L2 as ~30% more write sectors than the codes.
    __shared__ uint32_t parked[2][kHalfRows * 2][kTiledThreads];
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {
      const int64_t row = r0 + h * kHalfRows;
#pragma unroll
      for (int k = 0; k < kHalfRows; ++k) {
        float y[kUnit];
        float row_max = 0.0f;
#pragma unroll
        for (int i = 0; i < kUnit; ++i) {
          y[i] = ForwardValue<Op, kGated>(args.op, clamp, a[k].Value(i), kGated ? b[k].Value(i) : 0.0f);
          row_max = MaxNan(row_max, fabsf(y[i]));
        }
        amax = MaxNan(amax, row_max);
        if (p.y != nullptr) StoreRowY<kIn>(p.y, p.y_type, (row + k) * cols + c0, y, valid, row_max == row_max);
        if (!quantize) continue;
        const bool patch = !(row_max < kInf) || !scale_finite;
        uint32_t codes[2];  // this row's codes, stored and parked right away
        if (e4m3) {
          EncodeRowAs<Fp8Format::kE4M3>(p.encoder, patch, y, p.scale, codes);
        } else {
          EncodeRowAs<Fp8Format::kE5M2>(p.encoder, patch, y, p.scale, codes);
        }
        if (p.rowwise != nullptr) {
          uint8_t* out = p.rowwise + (row + k) * cols + c0;
          if constexpr (kStride == 4) {  // both groups adjacent: one 8-byte store
            if (valid[0]) *reinterpret_cast<uint2*>(out) = make_uint2(codes[0], codes[1]);
          } else {
#pragma unroll
            for (int g = 0; g < 2; ++g) {
              if (valid[g]) *reinterpret_cast<uint32_t*>(out + g * kStride) = codes[g];
            }
          }
        }
        if (p.columnwise != nullptr) {
          parked[h][2 * k][threadIdx.x] = codes[0];
          parked[h][2 * k + 1][threadIdx.x] = codes[1];
        }
      }
      if (h == 0) {
#pragma unroll
        for (int k = 0; k < kHalfRows; ++k) {
          if (kPrefetch) {
            a[k] = next_a[k];
            if (kGated) b[k] = next_b[k];
          } else {
            a[k].Load(p.x, (r0 + kHalfRows + k) * in_cols + c0, valid);
            if (kGated) b[k].Load(p.x, (r0 + kHalfRows + k) * in_cols + cols + c0, valid);
          }
        }
      }
    }
    if (p.columnwise != nullptr) {
#pragma unroll
      for (int g = 0; g < 2; ++g) {
        uint32_t top_in[4], bottom_in[4], top_out[4], bottom_out[4];
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          top_in[k] = parked[0][2 * k + g][threadIdx.x];
          bottom_in[k] = parked[1][2 * k + g][threadIdx.x];
        }
        Transpose4x4(top_in, top_out);
        Transpose4x4(bottom_in, bottom_out);
        if (valid[g]) {
          const uint64_t policy = L2EvictLastPolicy();
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            StoreGlobal8EvictLast(p.columnwise + (c0 + g * kStride + i) * rows + r0, top_out[i], bottom_out[i], policy);
          }
        }
      }
    }
  }

  if (p.amax_bits != nullptr) {  // uniform across the block: the barrier is safe
    // |y| max as FP32 bits: non-negative, so integer order is value order; max.NaN gives
    // the canonical NaN 0x7FFFFFFF, above every other magnitude.
    const uint32_t block_amax = BlockMax<kTiledThreads>(__float_as_uint(amax));
    if (threadIdx.x == 0 && block_amax != 0u) atomicMax(p.amax_bits, block_amax);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (p.rowwise_scale_inv != nullptr) *p.rowwise_scale_inv = p.scale_inv;
    if (p.columnwise_scale_inv != nullptr) *p.columnwise_scale_inv = p.scale_inv;
  }
}

// ---------------------------------------------------------------------------------------
// Launch helpers.

template <typename Op, bool kGated, ActDType kIn>
cudaError_t LaunchForwardTyped(const ForwardArgs<Op>& args, int64_t tiles, cudaStream_t stream) {
  const auto kernel = ActivationForwardKernel<Op, kGated, kIn>;
  // Resident blocks per SM depend on the kernel only: asked once per instantiation.
  static std::atomic<int> cached_per_sm{0};
  int device = 0;
  int sms = 0;
  int per_sm = cached_per_sm.load(std::memory_order_relaxed);
  cudaError_t status = cudaGetDevice(&device);
  if (status == cudaSuccess) status = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (status == cudaSuccess && per_sm == 0) {
    status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kForwardThreads, 0);
    if (status == cudaSuccess) cached_per_sm.store(per_sm, std::memory_order_relaxed);
  }
  if (status != cudaSuccess) return status;
  const int64_t resident = static_cast<int64_t>(std::max(1, sms)) * std::max(1, per_sm);
  const unsigned blocks = static_cast<unsigned>(std::max<int64_t>(1, std::min(tiles, resident)));
  kernel<<<blocks, kForwardThreads, 0, stream>>>(args);
  return cudaGetLastError();
}

template <typename Op, bool kGated>
cudaError_t LaunchForwardGated(const ForwardArgs<Op>& args, int64_t tiles, cudaStream_t stream) {
  switch (args.p.x_type) {
    case ActDType::kFloat32: return LaunchForwardTyped<Op, kGated, ActDType::kFloat32>(args, tiles, stream);
    case ActDType::kFloat16: return LaunchForwardTyped<Op, kGated, ActDType::kFloat16>(args, tiles, stream);
    case ActDType::kBFloat16: return LaunchForwardTyped<Op, kGated, ActDType::kBFloat16>(args, tiles, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename Op, bool kGated, bool kClamped>
cudaError_t LaunchTiledKernel(const ForwardArgs<Op>& args, unsigned blocks, cudaStream_t stream) {
  switch (args.p.x_type) {
    case ActDType::kFloat32:
      ActivationForwardTiledKernel<Op, kGated, ActDType::kFloat32, kClamped>
          <<<blocks, kTiledThreads, 0, stream>>>(args);
      break;
    case ActDType::kFloat16:
      ActivationForwardTiledKernel<Op, kGated, ActDType::kFloat16, kClamped>
          <<<blocks, kTiledThreads, 0, stream>>>(args);
      break;
    case ActDType::kBFloat16:
      ActivationForwardTiledKernel<Op, kGated, ActDType::kBFloat16, kClamped>
          <<<blocks, kTiledThreads, 0, stream>>>(args);
      break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

// True when the 128 x 128 kernel has an instantiation for `act`: the gate clamp only
// with kSigmoidLinear (clamped_swiglu); other clamped gated functions take the 64 x 64 one.
bool TiledSupports(const ActivationFunctionParams& act) {
  return !(act.gated && act.clamped && act.function != ActFunction::kSigmoidLinear);
}

// One block per 128 x 128 tile (`tiles` <= INT32_MAX, checked by the caller).
template <typename Op, bool kGated>
cudaError_t LaunchForwardTiled(const ForwardArgs<Op>& args, int64_t tiles, cudaStream_t stream) {
  const unsigned blocks = static_cast<unsigned>(tiles);
  if constexpr (kGated && std::is_same_v<Op, act::SigmoidLinearOp>) {
    if (args.clamp.enabled) return LaunchTiledKernel<Op, true, true>(args, blocks, stream);
  }
  return LaunchTiledKernel<Op, kGated, false>(args, blocks, stream);
}

}  // namespace

cudaError_t LaunchActivationForward(const ActivationForwardParams& p, cudaStream_t stream) {
  if (p.amax_bits != nullptr) {
    const cudaError_t status = cudaMemsetAsync(p.amax_bits, 0, sizeof(uint32_t), stream);
    if (status != cudaSuccess) return status;
  }
  if (p.rows == 0 || p.cols == 0) {
    // No elements: only the scale_inv words (allocated unfilled) need writing; the
    // source is a host value, so the copies finish before this returns.
    for (float* s : {p.rowwise_scale_inv, p.columnwise_scale_inv}) {
      if (s == nullptr) continue;
      const cudaError_t status = cudaMemcpyAsync(s, &p.scale_inv, sizeof(float), cudaMemcpyHostToDevice, stream);
      if (status != cudaSuccess) return status;
    }
    return cudaStreamSynchronize(stream);
  }
  const size_t in_bytes = ElementBytes(p.x_type);
  const bool vectorized = p.cols % kVec == 0 && IsAligned(p.x, in_bytes * kVec) &&
                          (p.y == nullptr || IsAligned(p.y, ElementBytes(p.y_type) * kVec)) &&
                          (p.rowwise == nullptr || IsAligned(p.rowwise, kVec));
  const bool columnwise_vectorized = p.rows % kVec == 0 && (p.columnwise == nullptr || IsAligned(p.columnwise, kVec));
  const int64_t tiles = ((p.rows + kTile - 1) / kTile) * ((p.cols + kTile - 1) / kTile);
  const int64_t big_tiles = ((p.rows + kTiledRows - 1) / kTiledRows) * ((p.cols + kTiledCols - 1) / kTiledCols);
  const bool tiled = p.kernel == ActForwardKernel::kAuto && TiledSupports(p.act) && p.rows > 0 && p.cols > 0 &&
                     p.rows % kUnit == 0 && p.cols % kUnit == 0 && big_tiles <= INT32_MAX && IsAligned(p.x, 16) &&
                     (p.y == nullptr || IsAligned(p.y, 16)) && (p.rowwise == nullptr || IsAligned(p.rowwise, 8)) &&
                     (p.columnwise == nullptr || IsAligned(p.columnwise, 8));
  const act::GateClamp clamp = ClampOf(p.act);
  return WithOp(p.act, [&](const auto& op) -> cudaError_t {
    using Op = std::decay_t<decltype(op)>;
    ForwardArgs<Op> args{p, op, clamp, vectorized, columnwise_vectorized};
    if (tiled) {
      return p.act.gated ? LaunchForwardTiled<Op, true>(args, big_tiles, stream)
                         : LaunchForwardTiled<Op, false>(args, big_tiles, stream);
    }
    return p.act.gated ? LaunchForwardGated<Op, true>(args, tiles, stream)
                       : LaunchForwardGated<Op, false>(args, tiles, stream);
  });
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
