// CUDA kernels of kernels/block_quantize.h besides quantization: block dequantization
// (decode(code) * the block's scale_inv, one FP32 product) and the cuBLASLt scale
// layouts (MXFP8 128x4 swizzle and its inverse, the FP32 VEC128 / BLK128x128 layouts).
// Launchers declared in block_quantize_kernels.h. Simple grid-stride kernels: these ops
// are not on the quantization hot path.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/float_codec.h"
#include "kernels/cuda/block_quantize/block_quantize_kernels.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/quantize_math.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

constexpr int kElementwiseThreads = 256;
constexpr int kMaxRowBlocks = 65535;

struct DequantizeArgs {
  const uint8_t* codes;
  int64_t rows;
  int64_t cols;
  int block_rows_log2;
  int block_cols_log2;
  const void* scale_inv;
  int64_t scale_cols;
  void* out;
};

__device__ __forceinline__ void StoreValue(float v, float* out) { *out = v; }
__device__ __forceinline__ void StoreValue(float v, uint16_t* out) { *out = FloatToBf16(v); }

// One block of threads per row (grid-stride over rows), threads across the columns.
// Out: float, or uint16_t holding BF16.
template <Fp8Format kFormat, bool kE8M0, typename Out>
__global__ void __launch_bounds__(kElementwiseThreads) BlockDequantizeKernel(const DequantizeArgs a) {
  Out* out = static_cast<Out*>(a.out);
  for (int64_t r = blockIdx.x; r < a.rows; r += gridDim.x) {
    const int64_t scale_row = (r >> a.block_rows_log2) * a.scale_cols;
    for (int64_t c = threadIdx.x; c < a.cols; c += blockDim.x) {
      const int64_t s = scale_row + (c >> a.block_cols_log2);
      const float inv = kE8M0 ? E8M0ToFloat(static_cast<const uint8_t*>(a.scale_inv)[s])
                              : static_cast<const float*>(a.scale_inv)[s];
      StoreValue(__fmul_rn(DecodeFp8<kFormat>(a.codes[r * a.cols + c]), inv), &out[r * a.cols + c]);
    }
  }
}

// Grid-stride over the padded [padded_rows, padded_cols] scale matrix: each entry lands
// at its swizzled offset (a bijection, so every output byte is written once).
__global__ void __launch_bounds__(kElementwiseThreads)
    SwizzleKernel(const uint8_t* src, int64_t rows, int64_t cols, int64_t row_repeat, int64_t padded_rows,
                  int64_t padded_cols, uint8_t* dst) {
  const int64_t total = padded_rows * padded_cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const int64_t r = i / padded_cols;
    const int64_t c = i % padded_cols;
    dst[Mxfp8SwizzledOffset(r, c, padded_cols)] =
        r < rows * row_repeat && c < cols ? src[(r / row_repeat) * cols + c] : 0;
  }
}

__global__ void __launch_bounds__(kElementwiseThreads)
    UnswizzleKernel(const uint8_t* src, int64_t rows, int64_t cols, int64_t padded_cols,
                    uint8_t* dst) {
  const int64_t total = rows * cols;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    dst[i] = src[Mxfp8SwizzledOffset(i / cols, i % cols, padded_cols)];
  }
}

// out [out_rows, ld]: out[i][k] = s[k][i] (transpose) or s[i][k], 0 past the source.
__global__ void __launch_bounds__(kElementwiseThreads)
    GemmLayoutKernel(const float* s, int64_t rows, int64_t cols, bool transpose,
                     int64_t out_rows, int64_t ld, float* out) {
  const int64_t total = out_rows * ld;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; o < total;
       o += stride) {
    const int64_t i = o / ld;
    const int64_t k = o % ld;
    if (transpose) {
      out[o] = k < rows ? s[k * cols + i] : 0.0f;
    } else {
      out[o] = k < cols ? s[i * cols + k] : 0.0f;
    }
  }
}

int GridFor(int64_t items, int threads, int max_blocks) {
  const int64_t blocks = (items + threads - 1) / threads;
  return static_cast<int>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

int Log2(int power_of_two) {
  int n = 0;
  while ((1 << n) < power_of_two) ++n;
  return n;
}

template <typename Out>
cudaError_t LaunchDequantize(const BlockDequantizeLaunchParams& p, const DequantizeArgs& args, int blocks,
                             cudaStream_t stream) {
  const bool e4m3 = p.format == Fp8Format::kE4M3;
  if (p.e8m0_scales) {
    if (e4m3) {
      BlockDequantizeKernel<Fp8Format::kE4M3, true, Out><<<blocks, kElementwiseThreads, 0, stream>>>(args);
    } else {
      BlockDequantizeKernel<Fp8Format::kE5M2, true, Out><<<blocks, kElementwiseThreads, 0, stream>>>(args);
    }
  } else if (e4m3) {
    BlockDequantizeKernel<Fp8Format::kE4M3, false, Out><<<blocks, kElementwiseThreads, 0, stream>>>(args);
  } else {
    BlockDequantizeKernel<Fp8Format::kE5M2, false, Out><<<blocks, kElementwiseThreads, 0, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchBlockDequantize(const BlockDequantizeLaunchParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.cols == 0) return cudaSuccess;
  DequantizeArgs args;
  args.codes = p.codes;
  args.rows = p.rows;
  args.cols = p.cols;
  args.block_rows_log2 = Log2(p.block_rows);
  args.block_cols_log2 = Log2(p.block_cols);
  args.scale_inv = p.scale_inv;
  args.scale_cols = p.scale_cols;
  args.out = p.out;
  const int blocks = static_cast<int>(p.rows < kMaxRowBlocks ? p.rows : kMaxRowBlocks);
  if (p.bf16_out) return LaunchDequantize<uint16_t>(p, args, blocks, stream);
  return LaunchDequantize<float>(p, args, blocks, stream);
  return cudaGetLastError();
}

cudaError_t LaunchSwizzleMxfp8Scales(const uint8_t* scales, int64_t rows, int64_t cols,
                                     uint8_t* swizzled, cudaStream_t stream) {
  return LaunchSwizzleBlockScales(scales, rows, cols, /*row_repeat=*/1, swizzled, stream);
}

cudaError_t LaunchSwizzleBlockScales(const uint8_t* scales, int64_t rows, int64_t cols, int64_t row_repeat,
                                     uint8_t* swizzled, cudaStream_t stream) {
  const int64_t padded_rows = (rows * row_repeat + 127) / 128 * 128;
  const int64_t padded_cols = (cols + 3) / 4 * 4;
  if (padded_rows * padded_cols == 0 || row_repeat < 1) return row_repeat < 1 ? cudaErrorInvalidValue : cudaSuccess;
  SwizzleKernel<<<GridFor(padded_rows * padded_cols, kElementwiseThreads, 4096),
                  kElementwiseThreads, 0, stream>>>(scales, rows, cols, row_repeat, padded_rows,
                                                    padded_cols, swizzled);
  return cudaGetLastError();
}

cudaError_t LaunchUnswizzleMxfp8Scales(const uint8_t* swizzled, int64_t rows, int64_t cols,
                                       uint8_t* scales, cudaStream_t stream) {
  if (rows * cols == 0) return cudaSuccess;
  UnswizzleKernel<<<GridFor(rows * cols, kElementwiseThreads, 4096), kElementwiseThreads, 0,
                    stream>>>(swizzled, rows, cols, (cols + 3) / 4 * 4, scales);
  return cudaGetLastError();
}

cudaError_t LaunchBlockScalesGemmLayout(const float* scale_inv, int64_t rows, int64_t cols,
                                        bool transpose, float* out, cudaStream_t stream) {
  const int64_t out_rows = transpose ? cols : rows;
  const int64_t ld = ((transpose ? rows : cols) + 3) / 4 * 4;
  if (out_rows * ld == 0) return cudaSuccess;
  GemmLayoutKernel<<<GridFor(out_rows * ld, kElementwiseThreads, 4096), kElementwiseThreads, 0,
                     stream>>>(scale_inv, rows, cols, transpose, out_rows, ld, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
