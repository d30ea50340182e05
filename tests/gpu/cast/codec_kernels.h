// Test-only kernels that run core/float_codec.h on the device, so tests can compare the
// device codec with the host codec bit for bit.
#ifndef TESERVE_TESTS_GPU_CODEC_KERNELS_H_
#define TESERVE_TESTS_GPU_CODEC_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace teserve {
namespace testing {

// Encodes each of `n` floats into every format (device pointers, n elements each).
struct EncodeOutputs {
  uint8_t* e4m3;
  uint8_t* e5m2;
  uint8_t* e2m1;
  uint16_t* fp16;
  uint16_t* bf16;
  uint8_t* e8m0_round_up;
};
cudaError_t LaunchEncodeEveryFormat(const float* in, int64_t n, EncodeOutputs out,
                                    cudaStream_t stream);

// Decodes every code of every format: outputs hold 65536 (fp16, bf16), 256 (e4m3,
// e5m2, e8m0) and 16 (e2m1) floats, indexed by code.
struct DecodeOutputs {
  float* e4m3;
  float* e5m2;
  float* e2m1;
  float* e8m0;
  float* fp16;
  float* bf16;
};
cudaError_t LaunchDecodeEveryCode(DecodeOutputs out, cudaStream_t stream);

// The hardware pair conversions the normalization kernels write 16-bit y with
// (cvt.rn.bf16x2.f32 / cvt.rn.f16x2.f32, low half = the second operand) against
// FloatToBf16 / __float2half_rn, for all 2^32 FP32 patterns x, paired as (low x, high -x).
// mismatches[0] / [1] count BF16 / FP16 patterns (NaN excluded) where either half differs;
// first_mismatch[0] / [1] hold the smallest such pattern (0xFFFFFFFF when none). Both
// device arrays are overwritten.
cudaError_t LaunchPairConversionsEveryFloat(unsigned long long* mismatches, uint32_t* first_mismatch,
                                            cudaStream_t stream);

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_GPU_CODEC_KERNELS_H_
