// Launchers for the cast kernels in cast_kernels.cu. Light header: CUDA runtime types
// only (no abseil), so both nvcc and the host wrappers (cast_cuda.cc) include it.
//
// Every launcher takes device pointers and a stream, returns the launch status
// (cudaGetLastError right after the launch) and does not synchronize. Callers validate
// shapes and dtypes; the launchers only pick grids and kernel variants.
#ifndef TESERVE_KERNELS_CUDA_CAST_KERNELS_H_
#define TESERVE_KERNELS_CUDA_CAST_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace kernels {
namespace cuda {

enum class SourceType { kFloat32, kBFloat16 };
enum class Fp8Format { kE4M3, kE5M2 };

// amax_bits: one device uint32 that receives max(|x|) as FP32 bits (NaN propagates,
// since every NaN's magnitude bits exceed those of Inf). The launcher zeroes it first.
cudaError_t LaunchAmax(const void* x, SourceType type, int64_t numel, uint32_t* amax_bits,
                       cudaStream_t stream);

// Current scaling's scale on the device: scale_pair[0] = CurrentScale(amax, fp8_max,
// amax_epsilon, power_2) of the FP32 amax in amax_bits (kernels/scaling_math.h), and
// scale_pair[1] = 1 / scale_pair[0], the bits the host would compute. One thread.
cudaError_t LaunchCurrentScale(const uint32_t* amax_bits, float fp8_max, float amax_epsilon, bool power_2,
                               float* scale_pair, cudaStream_t stream);

// Which cast-transpose kernel LaunchQuantizePerTensor runs (benchmarks compare them):
// kAuto takes the 128 x 128 tile kernel whenever rows and cols are multiples of 8 and the
// pointers aligned, else the 64 x 64 one; kTiled64 always takes the 64 x 64 tile kernel.
enum class CastTransposeKernel { kAuto, kTiled64 };

struct QuantizeLaunchParams {
  const void* x = nullptr;          // [rows, cols]
  SourceType type = SourceType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  float scale = 1.0f;               // q = satfinite_rne(x * scale), product in FP32
  float scale_inv = 1.0f;           // 1 / scale as the host computed it; written as is
  // When set, the kernels read {scale, scale_inv} from here (device memory written earlier
  // on the stream, LaunchCurrentScale) instead of the two values above.
  const float* scale_pair = nullptr;
  Fp8Format format = Fp8Format::kE4M3;
  uint8_t* rowwise = nullptr;       // [rows, cols] or null
  uint8_t* columnwise = nullptr;    // [cols, rows] or null
  float* rowwise_scale_inv = nullptr;     // [1] or null
  float* columnwise_scale_inv = nullptr;  // [1] or null
  uint32_t* amax_bits = nullptr;    // [1], zeroed by the launcher
  CastTransposeKernel kernel = CastTransposeKernel::kAuto;
  // Fused dbias (optional): dbias [cols] FP32 = column sums of x. The cast kernel writes
  // the FP32 column sums of each tile's rows into dbias_workspace [row tiles, cols]
  // (QuantizeDbiasWorkspaceFloats floats), and a second kernel adds those partials per
  // column in FP64 (in row-tile order, so the result is deterministic) into dbias.
  float* dbias = nullptr;
  float* dbias_workspace = nullptr;
};

// Floats of dbias_workspace LaunchQuantizePerTensor needs for these params (0 without
// dbias or without elements). Depends on the shape, the pointers' alignment and `kernel`.
int64_t QuantizeDbiasWorkspaceFloats(const QuantizeLaunchParams& params);

// Fused amax + rowwise cast + transposed columnwise cast (+ dbias), one pass over x.
// rows == 0 with dbias set zeroes dbias.
cudaError_t LaunchQuantizePerTensor(const QuantizeLaunchParams& params, cudaStream_t stream);

// out[i] = decode(codes[i]) * scale_inv[0], FP32 product.
cudaError_t LaunchDequantize(const uint8_t* codes, Fp8Format format, int64_t numel,
                             const float* scale_inv, float* out, cudaStream_t stream);

// Plain conversions (convert_kernels.cu), element for element as the CPU reference:
// dst = decode(src) to FP32, or dst = encode(src) from FP32 (RNE; FP8 saturates).
enum class ConvertType { kFloat32, kFloat16, kBFloat16, kE4M3, kE5M2 };
cudaError_t LaunchToFloat32(const void* src, ConvertType type, int64_t n, float* dst, cudaStream_t stream);
cudaError_t LaunchFromFloat32(const float* src, int64_t n, ConvertType type, void* dst, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_CAST_KERNELS_H_
