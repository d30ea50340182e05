// Launchers for the NVFP4 kernels in nvfp4_kernels.cu (contract: kernels/nvfp4.h) and
// the 16-point random Hadamard transform (kernels/hadamard.h). Light header (CUDA
// runtime types only) for nvcc, the host wrappers (nvfp4_cuda.cc) and the benchmarks.
//
// Every launcher takes device pointers and a stream, returns the launch status
// (cudaGetLastError right after the launch) and does not synchronize. Callers validate
// shapes (the blocked dimensions divisible by 16) and options.
#ifndef TESERVE_KERNELS_CUDA_NVFP4_KERNELS_H_
#define TESERVE_KERNELS_CUDA_NVFP4_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/cast/cast_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

inline constexpr int kHadamardPoints = 16;

// The fixed RHT sign diagonal d (kernels/hadamard.h kHadamardSigns), passed by value.
struct HadamardSigns {
  float d[kHadamardPoints];
};

// Pass 1 of NVFP4 quantization: max |x| into amax_bits and, when rht_amax_bits is not
// null, max |RHT(x^T)| (each 16-row run of each column transformed, rows % 16 == 0)
// into rht_amax_bits; FP32 magnitude bits, NaN wins. The launcher zeroes both.
cudaError_t LaunchNvfp4Amax(const void* x, SourceType type, int64_t rows, int64_t cols,
                            const HadamardSigns& signs, uint32_t* amax_bits,
                            uint32_t* rht_amax_bits, cudaStream_t stream);

struct Nvfp4QuantizeLaunchParams {
  const void* x = nullptr;  // [rows, cols], FP32 or BF16
  SourceType type = SourceType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool two_d = false;             // 16x16 blocks; both copies share codes and draws
  bool random_hadamard = false;   // columnwise copy of RHT(x^T); 1D only
  HadamardSigns signs = {};
  float global_scale = 1.0f;      // S
  float global_scale_inv = 1.0f;  // 1 / S as the host computed it
  bool stochastic_rounding = false;
  uint64_t rowwise_key = 0;       // RandomKey(seed, stream, copy id 0); 2D: both copies
  uint64_t columnwise_key = 0;    // RandomKey(seed, stream, copy id 1)
  // Packed E2M1 data (two per byte, element 2i low) and E4M3 scale bytes; null when the
  // copy is not requested. 1D scales [R, C/16] per copy; 2D rowwise [rows/16, cols/16],
  // columnwise its transpose.
  uint8_t* rowwise = nullptr;          // [rows, cols]
  uint8_t* rowwise_scales = nullptr;
  uint8_t* columnwise = nullptr;       // [cols, rows]
  uint8_t* columnwise_scales = nullptr;
};

// Pass 2: block scales and codes of both copies from one read of x.
cudaError_t LaunchNvfp4Quantize(const Nvfp4QuantizeLaunchParams& params, cudaStream_t stream);

// out [rows, cols] = (E2M1(code) * E4M3(block scale)) * global_scale_inv, FP32 or (bf16_out)
// BF16 bits rounded as FloatToBf16 rounds; blocks are 1x16 (scales [rows, cols/16]) or
// 16x16 (two_d, scales [rows/16, cols/16]).
cudaError_t LaunchNvfp4Dequantize(const uint8_t* codes, int64_t rows, int64_t cols,
                                  const uint8_t* scales, bool two_d, float global_scale_inv,
                                  void* out, bool bf16_out, cudaStream_t stream);

// Unscaled E2M1 conversions of numel elements (packed; an odd count leaves the last
// high nibble 0).
cudaError_t LaunchCastToE2M1(const float* x, int64_t numel, uint8_t* packed,
                             cudaStream_t stream);
cudaError_t LaunchE2M1ToFloat(const uint8_t* packed, int64_t numel, float* out,
                              cudaStream_t stream);

// The RHT of every 16-element run of x (numel % 16 == 0), forward or inverse, in the
// FP32 operation order of kernels/hadamard.h.
cudaError_t LaunchHadamard16(const float* x, int64_t numel, const HadamardSigns& signs,
                             bool inverse, float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NVFP4_KERNELS_H_
