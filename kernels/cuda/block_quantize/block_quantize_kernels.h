// Launchers for the block-scaled FP8 kernels (block_quantize_kernels.cu,
// block_quantize_tile_kernels.cu, block_dequantize_kernels.cu): MXFP8 and FP8 block
// scaling (1x128 / 128x128) quantization with both copies, the amax and an optional dbias
// in one pass, their dequantization, and the cuBLASLt scale layouts. Contract and formulas:
// kernels/block_quantize.h. Light header (CUDA runtime types only) shared by nvcc, the
// host wrappers (block_quantize_cuda.cc) and the benchmarks.
//
// Every launcher takes device pointers and a stream, returns the launch status
// (cudaGetLastError right after the launch) and does not synchronize. Callers validate
// shapes, dtypes and divisibility; the launchers only pick grids and kernel variants.
#ifndef TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_KERNELS_H_
#define TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

enum class BlockRecipe { kMxfp8, kBlock1D, kBlock2D };

// How FP32 products become FP8 codes. Both give the bits of core/float_codec.h
// (round-to-nearest-even, satfinite, NaN -> 0x7F): kHardware uses the cvt.rn.satfinite
// instruction (two elements per instruction) and patches NaN codes explicitly;
// kSoftware runs the integer codec itself (~30 integer operations per element). The
// GPU tests hold both to the CPU reference; kHardware is the default.
enum class Fp8Encoder { kHardware, kSoftware };

// Which quantize kernel runs. kAuto: the register-tiled MXFP8 kernel
// (block_quantize_tile_kernels.cu) when it applies (MXFP8, kHardware, rows and cols
// multiples of 32, x 16-byte and copies 8-byte aligned), else the generic kernel.
// kGeneric forces the generic kernel (tests and benchmarks compare the two).
enum class BlockQuantizeKernel { kAuto, kGeneric };

struct BlockQuantizeLaunchParams {
  const void* x = nullptr;  // [rows, cols], FP32 or BF16
  SourceType type = SourceType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  BlockRecipe recipe = BlockRecipe::kMxfp8;
  Fp8Format format = Fp8Format::kE4M3;
  Fp8Encoder encoder = Fp8Encoder::kHardware;
  bool power_2_scale = true;  // block scaling only
  float amax_epsilon = 0.0f;  // block scaling only
  // Copies (null when not requested). MXFP8: scale_inv is E8M0 bytes [R, C/32] per copy.
  // Block scaling: FP32, 1D [R, ceil(C/128)] per copy; 2D rowwise [ceil(rows/128),
  // ceil(cols/128)] and columnwise its transpose.
  uint8_t* rowwise = nullptr;      // [rows, cols]
  void* rowwise_scale_inv = nullptr;
  uint8_t* columnwise = nullptr;   // [cols, rows]
  void* columnwise_scale_inv = nullptr;
  uint32_t* amax_bits = nullptr;   // [1]: max |x| as FP32 bits (NaN wins); zeroed here
  BlockQuantizeKernel kernel = BlockQuantizeKernel::kAuto;
  // Fused dbias (optional): dbias [cols] FP32 = column sums of x. The kernel writes one
  // FP32 partial row per slab of rows into dbias_workspace
  // [BlockQuantizeDbiasSlabs(params), cols]; a second kernel sums them in FP64.
  float* dbias = nullptr;
  float* dbias_workspace = nullptr;
};

// Rows of dbias_workspace the launch needs for these params (0 when rows == 0).
int64_t BlockQuantizeDbiasSlabs(const BlockQuantizeLaunchParams& params);

// One pass over x: amax, rowwise copy, transposed columnwise copy and the dbias partial
// sums (then their reduction). Divisibility (MXFP8: cols % 32 for the rowwise copy, rows %
// 32 for the columnwise copy) is the caller's check. rows == 0 zeroes dbias.
cudaError_t LaunchBlockQuantize(const BlockQuantizeLaunchParams& params, cudaStream_t stream);

// out [rows, cols] = decode(codes) * scale_inv of the element's block, one FP32
// product, stored as FP32 or (bf16_out) rounded to BF16 as FloatToBf16 rounds. Blocks are block_rows x block_cols (MXFP8 1x32, 1D 1x128, 2D 128x128);
// scale_inv is row-major [ceil(rows/block_rows), scale_cols], E8M0 bytes when
// e8m0_scales, else FP32.
struct BlockDequantizeLaunchParams {
  const uint8_t* codes = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
  int64_t rows = 0;
  int64_t cols = 0;
  int block_rows = 1;
  int block_cols = 32;
  const void* scale_inv = nullptr;
  bool e8m0_scales = true;
  int64_t scale_cols = 0;
  void* out = nullptr;  // FP32, or BF16 bits with bf16_out
  bool bf16_out = false;
};
cudaError_t LaunchBlockDequantize(const BlockDequantizeLaunchParams& params,
                                  cudaStream_t stream);

// E8M0 [rows, cols] row-major <-> the 128x4-tiled VEC32_UE8M0 order over
// [roundup(rows, 128), roundup(cols, 4)]. Swizzle writes every byte of `swizzled`
// (padding 0); unswizzle reads only the entries inside [rows, cols].
cudaError_t LaunchSwizzleMxfp8Scales(const uint8_t* scales, int64_t rows, int64_t cols,
                                     uint8_t* swizzled, cudaStream_t stream);
// The same tiled order for any one-byte block scales (NVFP4's E4M3 ones too), each source
// row repeated row_repeat times: [rows * row_repeat, cols] swizzled into
// [roundup(rows * row_repeat, 128), roundup(cols, 4)] (a 2D NVFP4 weight's 16x16 block
// scales become the per-row scales cuBLASLt's VEC16 mode reads with row_repeat 16).
cudaError_t LaunchSwizzleBlockScales(const uint8_t* scales, int64_t rows, int64_t cols, int64_t row_repeat,
                                     uint8_t* swizzled, cudaStream_t stream);
cudaError_t LaunchUnswizzleMxfp8Scales(const uint8_t* swizzled, int64_t rows, int64_t cols,
                                       uint8_t* scales, cudaStream_t stream);

// FP32 scale_inv [rows, cols] -> out [out_rows, ld] (every entry written, padding 0):
// transpose (1D, VEC128) out[c][r] = s[r][c] with out_rows = cols, ld = roundup(rows, 4);
// else (2D, BLK128x128) out[r][c] = s[r][c] with out_rows = rows, ld = roundup(cols, 4).
cudaError_t LaunchBlockScalesGemmLayout(const float* scale_inv, int64_t rows, int64_t cols,
                                        bool transpose, float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_BLOCK_QUANTIZE_KERNELS_H_
