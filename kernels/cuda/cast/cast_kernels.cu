// CUDA kernels for amax, fused per-tensor FP8 cast(+transpose) and dequantize.
//
// Fused cast-transpose: the 128 x 128 register-tile kernel of
// cast_transpose_tile_kernels.cu whenever rows and cols are multiples of 8 and the
// pointers aligned (its comment has the design and the bandwidth it reaches).
// Fallback (every other shape: 1 x 259, 257 x 259, 128 x 129, ...; QuantizeTileKernel),
// also selectable with CastTransposeKernel::kTiled64:
// - Every conversion uses the integer-only codecs of core/float_codec.h (the same code the
//   CPU runs), and x * scale is one FP32 multiply (__fmul_rn).
// - amax is kept as the FP32 bits of |x| in a uint32: for non-negative floats integer
//   order is value order, and every NaN's magnitude bits exceed Inf's, so a plain
//   unsigned max (warp __reduce_max_sync, shared memory across warps, one atomicMax per
//   block) propagates NaN without a separate flag.
// - 64x64 tiles, one 256-thread block each (16 threads across a row, 4 elements per
//   thread, 4 passes down the tile). Rows are read once, coalesced; the rowwise codes are
//   stored straight away and also parked in a shared-memory tile; after one barrier the
//   block writes the tile transposed, 4 consecutive bytes per thread. The tile row is
//   padded by 4 bytes so the transposed reads spread over the shared-memory banks.
// - A vectorized variant (float4 / 8-byte BF16 loads, 32-bit packed stores) runs when
//   rows and cols are multiples of 4 and the pointers are aligned; a scalar, bounds-
//   checked variant handles every other shape.
// Both grids are 1-D over tiles, so no grid-dimension limit caps the row count.
// Fused dbias (QuantizeLaunchParams::dbias): each block adds its tile's column sums in
// FP32 (per thread over its rows, then across the row lanes in a fixed order through
// shared memory) and writes one partial row per tile row into dbias_workspace;
// DbiasReduceKernel adds the partial rows of each column in FP64. Every order is fixed,
// so dbias is deterministic; the FP32 part sums at most 20 terms serially (64 x 64
// tiles) or 14 (128 x 128), far inside the FP32 reduction tolerance of the FP64 sum.
// The kernels take kDbias as a template flag: without dbias the code is unchanged.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/cast/cast_kernels.h"
#include "kernels/cuda/cast/cast_transpose_tile_kernels.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/source.cuh"
#include "kernels/scaling_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kTile = 64;                                  // tile is kTile x kTile
constexpr int kElementsPerThread = 4;                      // consecutive elements
constexpr int kThreadsPerTile = 256;
constexpr int kThreadsAcrossTile = kTile / kElementsPerThread;          // 16
constexpr int kRowsPerPass = kThreadsPerTile / kThreadsAcrossTile;      // 16
constexpr int kPasses = kTile / kRowsPerPass;                           // 4
constexpr int kTileRowPadBytes = 4;

constexpr int kReduceThreads = 256;
constexpr int kMaxReduceBlocks = 1024;
constexpr int kElementwiseThreads = 256;
constexpr int kMaxElementwiseBlocks = 4096;

// Named flags for the kernel variants.
constexpr bool kVectorized = true;
constexpr bool kScalar = false;

template <Fp8Format kFormat>
__device__ __forceinline__ uint8_t EncodeFp8(float v) {
  return kFormat == Fp8Format::kE4M3 ? FloatToE4M3(v) : FloatToE5M2(v);
}

template <SourceType kType, bool kVectorizedAccess>
__global__ void __launch_bounds__(kReduceThreads)
    AmaxKernel(const typename Source<kType>::Element* x, int64_t numel, uint32_t* amax_bits) {
  uint32_t local = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (kVectorizedAccess) {
    const int64_t groups = numel / kElementsPerThread;
    for (int64_t g = first; g < groups; g += stride) {
      float v[kElementsPerThread];
      Source<kType>::Load4(x + g * kElementsPerThread, v);
      for (int k = 0; k < kElementsPerThread; ++k) local = max(local, MagnitudeBits(v[k]));
    }
  } else {
    for (int64_t i = first; i < numel; i += stride) {
      local = max(local, MagnitudeBits(Source<kType>::ToFloat(x[i])));
    }
  }
  const uint32_t block_max = BlockMax<kReduceThreads>(local);
  if (threadIdx.x == 0 && block_max != 0u) atomicMax(amax_bits, block_max);
}

// Loads the thread's 4 elements of row `r` starting at column `c`; `valid` marks those
// inside the tensor.
template <SourceType kType, bool kVectorizedAccess>
__device__ __forceinline__ void LoadRowSegment(const typename Source<kType>::Element* x,
                                               int64_t rows, int64_t cols, int64_t r,
                                               int64_t c, float v[4], bool valid[4]) {
  if (kVectorizedAccess) {
    const bool inside = r < rows && c < cols;  // cols % 4 == 0: all four or none
    if (inside) Source<kType>::Load4(x + r * cols + c, v);
    for (int k = 0; k < kElementsPerThread; ++k) valid[k] = inside;
  } else {
    for (int k = 0; k < kElementsPerThread; ++k) {
      valid[k] = r < rows && c + k < cols;
      v[k] = valid[k] ? Source<kType>::ToFloat(x[r * cols + c + k]) : 0.0f;
    }
  }
}

__device__ __forceinline__ uint32_t Pack4(const uint8_t codes[4]) {
  return static_cast<uint32_t>(codes[0]) | (static_cast<uint32_t>(codes[1]) << 8) |
         (static_cast<uint32_t>(codes[2]) << 16) | (static_cast<uint32_t>(codes[3]) << 24);
}

// dbias of a 64 x 64 tile: adds the 16 row lanes' column sums (each over 4 rows) in lane
// order and writes the tile's FP32 partial row, partial_row[c] for the tile's columns.
__device__ __forceinline__ void WriteTileColumnSums64(const float sum[kElementsPerThread],
                                                      int lane_down, int tc, int64_t tile_col0,
                                                      int64_t cols, float* partial_row) {
  __shared__ float sums[kRowsPerPass][kTile];
  for (int k = 0; k < kElementsPerThread; ++k) sums[lane_down][tc + k] = sum[k];
  __syncthreads();
  const int t = threadIdx.x;
  if (t < kTile && tile_col0 + t < cols) {
    float total = 0.0f;
    for (int i = 0; i < kRowsPerPass; ++i) total += sums[i][t];
    partial_row[tile_col0 + t] = total;
  }
}

template <SourceType kType, Fp8Format kFormat, bool kVectorizedAccess, bool kDbias>
__global__ void __launch_bounds__(kThreadsPerTile)
    QuantizeTileKernel(const typename Source<kType>::Element* x, int64_t rows, int64_t cols,
                       float scale, float scale_inv, const float* scale_pair, uint8_t* rowwise,
                       uint8_t* columnwise, float* rowwise_scale_inv, float* columnwise_scale_inv,
                       uint32_t* amax_bits, float* dbias_partial) {
  __shared__ uint8_t tile[kTile][kTile + kTileRowPadBytes];
  if (scale_pair != nullptr) {
    scale = scale_pair[0];
    scale_inv = scale_pair[1];
  }
  const int64_t tiles_across = (cols + kTile - 1) / kTile;
  const int64_t tile_row0 = (static_cast<int64_t>(blockIdx.x) / tiles_across) * kTile;
  const int64_t tile_col0 = (static_cast<int64_t>(blockIdx.x) % tiles_across) * kTile;
  const int lane_across = threadIdx.x % kThreadsAcrossTile;
  const int lane_down = threadIdx.x / kThreadsAcrossTile;

  uint32_t local_amax = 0;
  float column_sum[kElementsPerThread] = {0.0f, 0.0f, 0.0f, 0.0f};  // kDbias only
  for (int pass = 0; pass < kPasses; ++pass) {
    const int tr = pass * kRowsPerPass + lane_down;
    const int tc = lane_across * kElementsPerThread;
    const int64_t r = tile_row0 + tr;
    const int64_t c = tile_col0 + tc;
    float v[kElementsPerThread];
    bool valid[kElementsPerThread];
    LoadRowSegment<kType, kVectorizedAccess>(x, rows, cols, r, c, v, valid);
    uint8_t codes[kElementsPerThread];
    for (int k = 0; k < kElementsPerThread; ++k) {
      if (valid[k]) local_amax = max(local_amax, MagnitudeBits(v[k]));
      if (kDbias && valid[k]) column_sum[k] += v[k];
      codes[k] = EncodeFp8<kFormat>(__fmul_rn(v[k], scale));
    }
    if (rowwise != nullptr) {
      if (kVectorizedAccess) {
        if (valid[0]) *reinterpret_cast<uint32_t*>(rowwise + r * cols + c) = Pack4(codes);
      } else {
        for (int k = 0; k < kElementsPerThread; ++k) {
          if (valid[k]) rowwise[r * cols + c + k] = codes[k];
        }
      }
    }
    if (columnwise != nullptr) {
      for (int k = 0; k < kElementsPerThread; ++k) tile[tr][tc + k] = codes[k];
    }
  }

  if (columnwise != nullptr) {  // uniform across the block: the barrier is safe
    __syncthreads();
    for (int pass = 0; pass < kPasses; ++pass) {
      const int tc = pass * kRowsPerPass + lane_down;    // output row = source column
      const int tr = lane_across * kElementsPerThread;   // 4 consecutive source rows
      const int64_t c = tile_col0 + tc;
      const int64_t r = tile_row0 + tr;
      if (c >= cols) continue;
      uint8_t codes[kElementsPerThread];
      for (int k = 0; k < kElementsPerThread; ++k) codes[k] = tile[tr + k][tc];
      if (kVectorizedAccess) {
        if (r < rows) *reinterpret_cast<uint32_t*>(columnwise + c * rows + r) = Pack4(codes);
      } else {
        for (int k = 0; k < kElementsPerThread; ++k) {
          if (r + k < rows) columnwise[c * rows + r + k] = codes[k];
        }
      }
    }
  }

  if constexpr (kDbias) {
    WriteTileColumnSums64(column_sum, lane_down, lane_across * kElementsPerThread, tile_col0,
                          cols, dbias_partial + (static_cast<int64_t>(blockIdx.x) / tiles_across) * cols);
  }
  const uint32_t block_amax = BlockMax<kThreadsPerTile>(local_amax);
  if (threadIdx.x == 0) {
    if (block_amax != 0u) atomicMax(amax_bits, block_amax);
    if (blockIdx.x == 0) {
      if (rowwise_scale_inv != nullptr) *rowwise_scale_inv = scale_inv;
      if (columnwise_scale_inv != nullptr) *columnwise_scale_inv = scale_inv;
    }
  }
}

template <Fp8Format kFormat>
__global__ void __launch_bounds__(kElementwiseThreads)
    DequantizeKernel(const uint8_t* codes, int64_t numel, const float* scale_inv, float* out) {
  const float inv = *scale_inv;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < numel;
       i += stride) {
    out[i] = __fmul_rn(DecodeFp8<kFormat>(codes[i]), inv);
  }
}

__global__ void CurrentScaleKernel(const uint32_t* amax_bits, float fp8_max, float amax_epsilon, bool power_2,
                                   float* scale_pair) {
  const float scale = scaling_math::CurrentScale(BitsToFloat(*amax_bits), fp8_max, amax_epsilon, power_2);
  scale_pair[0] = scale;
  scale_pair[1] = __fdiv_rn(1.0f, scale);
}

// dbias[c] = sum over the row tiles t of partial[t * cols + c]. A block covers 32
// columns; its 8 warps each add every 8th row tile (t = warp, warp + 8, ...) in FP64,
// then warp 0 adds the 8 sums in warp order: a fixed order, so dbias is deterministic.
constexpr int kDbiasReduceColumns = 32;
constexpr int kDbiasReduceSlices = 8;

__global__ void __launch_bounds__(kDbiasReduceColumns * kDbiasReduceSlices)
    DbiasReduceKernel(const float* partial, int64_t row_tiles, int64_t cols, float* dbias) {
  __shared__ double sums[kDbiasReduceSlices][kDbiasReduceColumns];
  const int column = threadIdx.x % kDbiasReduceColumns;
  const int slice = threadIdx.x / kDbiasReduceColumns;
  const int64_t c = static_cast<int64_t>(blockIdx.x) * kDbiasReduceColumns + column;
  double s = 0.0;
  if (c < cols) {
    for (int64_t t = slice; t < row_tiles; t += kDbiasReduceSlices) s += partial[t * cols + c];
  }
  sums[slice][column] = s;
  __syncthreads();
  if (slice == 0 && c < cols) {
    double total = 0.0;
    for (int i = 0; i < kDbiasReduceSlices; ++i) total += sums[i][column];
    dbias[c] = __double2float_rn(total);
  }
}

bool IsAligned(const void* p, uintptr_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

int BlocksFor(int64_t work_items, int threads, int max_blocks) {
  const int64_t blocks = (work_items + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

template <SourceType kType>
cudaError_t LaunchAmaxTyped(const void* x_raw, int64_t numel, uint32_t* amax_bits,
                            cudaStream_t stream) {
  using Element = typename Source<kType>::Element;
  const Element* x = static_cast<const Element*>(x_raw);
  const bool vectorized = numel % kElementsPerThread == 0 &&
                          IsAligned(x, sizeof(Element) * kElementsPerThread);
  const int64_t items = vectorized ? numel / kElementsPerThread : numel;
  const int blocks = BlocksFor(items, kReduceThreads, kMaxReduceBlocks);
  if (vectorized) {
    AmaxKernel<kType, kVectorized><<<blocks, kReduceThreads, 0, stream>>>(x, numel, amax_bits);
  } else {
    AmaxKernel<kType, kScalar><<<blocks, kReduceThreads, 0, stream>>>(x, numel, amax_bits);
  }
  return cudaGetLastError();
}

int64_t RowTilesOf(const QuantizeLaunchParams& p) {
  const int64_t tile_rows = CastTransposeTileApplies(p) ? kCastTransposeTileRows : kTile;
  return (p.rows + tile_rows - 1) / tile_rows;
}

template <SourceType kType, Fp8Format kFormat, bool kDbias>
cudaError_t LaunchCastTyped(const QuantizeLaunchParams& p, cudaStream_t stream) {
  using Element = typename Source<kType>::Element;
  const Element* x = static_cast<const Element*>(p.x);
  if (CastTransposeTileApplies(p)) return LaunchCastTransposeTile(p, stream);
  const bool vectorized =
      p.rows % kElementsPerThread == 0 && p.cols % kElementsPerThread == 0 &&
      IsAligned(x, sizeof(Element) * kElementsPerThread) &&
      (p.rowwise == nullptr || IsAligned(p.rowwise, kElementsPerThread)) &&
      (p.columnwise == nullptr || IsAligned(p.columnwise, kElementsPerThread));
  const int64_t tiles = ((p.rows + kTile - 1) / kTile) * ((p.cols + kTile - 1) / kTile);
  if (tiles > INT32_MAX) return cudaErrorInvalidConfiguration;
  const unsigned blocks = static_cast<unsigned>(tiles);
  if (vectorized) {
    QuantizeTileKernel<kType, kFormat, kVectorized, kDbias><<<blocks, kThreadsPerTile, 0, stream>>>(
        x, p.rows, p.cols, p.scale, p.scale_inv, p.scale_pair, p.rowwise, p.columnwise, p.rowwise_scale_inv,
        p.columnwise_scale_inv, p.amax_bits, p.dbias_workspace);
  } else {
    QuantizeTileKernel<kType, kFormat, kScalar, kDbias><<<blocks, kThreadsPerTile, 0, stream>>>(
        x, p.rows, p.cols, p.scale, p.scale_inv, p.scale_pair, p.rowwise, p.columnwise, p.rowwise_scale_inv,
        p.columnwise_scale_inv, p.amax_bits, p.dbias_workspace);
  }
  return cudaGetLastError();
}

template <SourceType kType, Fp8Format kFormat>
cudaError_t LaunchQuantizeTyped(const QuantizeLaunchParams& p, cudaStream_t stream) {
  if (p.dbias == nullptr) return LaunchCastTyped<kType, kFormat, false>(p, stream);
  cudaError_t status = LaunchCastTyped<kType, kFormat, true>(p, stream);
  if (status != cudaSuccess) return status;
  const int64_t blocks = (p.cols + kDbiasReduceColumns - 1) / kDbiasReduceColumns;
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  DbiasReduceKernel<<<static_cast<unsigned>(blocks), kDbiasReduceColumns * kDbiasReduceSlices, 0,
                      stream>>>(p.dbias_workspace, RowTilesOf(p), p.cols, p.dbias);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchCurrentScale(const uint32_t* amax_bits, float fp8_max, float amax_epsilon, bool power_2,
                               float* scale_pair, cudaStream_t stream) {
  CurrentScaleKernel<<<1, 1, 0, stream>>>(amax_bits, fp8_max, amax_epsilon, power_2, scale_pair);
  return cudaGetLastError();
}

cudaError_t LaunchAmax(const void* x, SourceType type, int64_t numel, uint32_t* amax_bits,
                       cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream);
  if (status != cudaSuccess || numel == 0) return status;
  return type == SourceType::kFloat32
             ? LaunchAmaxTyped<SourceType::kFloat32>(x, numel, amax_bits, stream)
             : LaunchAmaxTyped<SourceType::kBFloat16>(x, numel, amax_bits, stream);
}

int64_t QuantizeDbiasWorkspaceFloats(const QuantizeLaunchParams& p) {
  if (p.dbias == nullptr || p.rows == 0 || p.cols == 0) return 0;
  return RowTilesOf(p) * p.cols;
}

cudaError_t LaunchQuantizePerTensor(const QuantizeLaunchParams& p, cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(p.amax_bits, 0, sizeof(uint32_t), stream);
  if (status != cudaSuccess) return status;
  if (p.rows == 0 || p.cols == 0) {
    if (p.dbias != nullptr && p.cols > 0) {  // the sum over no rows
      status = cudaMemsetAsync(p.dbias, 0, p.cols * sizeof(float), stream);
      if (status != cudaSuccess) return status;
    }
    // No elements: only the scale_inv values need writing.
    if (p.rowwise_scale_inv != nullptr) {
      status = cudaMemcpyAsync(p.rowwise_scale_inv, &p.scale_inv, sizeof(float),
                               cudaMemcpyHostToDevice, stream);
      if (status != cudaSuccess) return status;
    }
    if (p.columnwise_scale_inv != nullptr) {
      status = cudaMemcpyAsync(p.columnwise_scale_inv, &p.scale_inv, sizeof(float),
                               cudaMemcpyHostToDevice, stream);
      if (status != cudaSuccess) return status;
    }
    return cudaStreamSynchronize(stream);  // the source is a host stack value
  }
  const bool e4m3 = p.format == Fp8Format::kE4M3;
  if (p.type == SourceType::kFloat32) {
    return e4m3 ? LaunchQuantizeTyped<SourceType::kFloat32, Fp8Format::kE4M3>(p, stream)
                : LaunchQuantizeTyped<SourceType::kFloat32, Fp8Format::kE5M2>(p, stream);
  }
  return e4m3 ? LaunchQuantizeTyped<SourceType::kBFloat16, Fp8Format::kE4M3>(p, stream)
              : LaunchQuantizeTyped<SourceType::kBFloat16, Fp8Format::kE5M2>(p, stream);
}

cudaError_t LaunchDequantize(const uint8_t* codes, Fp8Format format, int64_t numel,
                             const float* scale_inv, float* out, cudaStream_t stream) {
  if (numel == 0) return cudaSuccess;
  const int blocks = BlocksFor(numel, kElementwiseThreads, kMaxElementwiseBlocks);
  if (format == Fp8Format::kE4M3) {
    DequantizeKernel<Fp8Format::kE4M3>
        <<<blocks, kElementwiseThreads, 0, stream>>>(codes, numel, scale_inv, out);
  } else {
    DequantizeKernel<Fp8Format::kE5M2>
        <<<blocks, kElementwiseThreads, 0, stream>>>(codes, numel, scale_inv, out);
  }
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
