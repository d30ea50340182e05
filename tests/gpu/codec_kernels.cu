// Device side of the codec test: one thread per value, no tiling; correctness only.
#include "tests/gpu/codec_kernels.h"

#include <cuda_runtime.h>

#include "core/float_codec.h"

namespace teserve {
namespace testing {
namespace {

constexpr int kThreads = 256;
constexpr int kSixteenBitCodes = 1 << 16;

__global__ void EncodeEveryFormatKernel(const float* in, int64_t n, EncodeOutputs out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float x = in[i];
  out.e4m3[i] = FloatToE4M3(x);
  out.e5m2[i] = FloatToE5M2(x);
  out.e2m1[i] = FloatToE2M1(x);
  out.fp16[i] = FloatToFp16(x);
  out.bf16[i] = FloatToBf16(x);
  out.e8m0_round_up[i] = FloatToE8M0RoundUp(x);
}

__global__ void DecodeEveryCodeKernel(DecodeOutputs out) {
  const int code = blockIdx.x * blockDim.x + threadIdx.x;
  if (code >= kSixteenBitCodes) return;
  out.fp16[code] = Fp16ToFloat(static_cast<uint16_t>(code));
  out.bf16[code] = Bf16ToFloat(static_cast<uint16_t>(code));
  if (code < 256) {
    out.e4m3[code] = E4M3ToFloat(static_cast<uint8_t>(code));
    out.e5m2[code] = E5M2ToFloat(static_cast<uint8_t>(code));
    out.e8m0[code] = E8M0ToFloat(static_cast<uint8_t>(code));
  }
  if (code < 16) out.e2m1[code] = E2M1ToFloat(static_cast<uint8_t>(code));
}

}  // namespace

cudaError_t LaunchEncodeEveryFormat(const float* in, int64_t n, EncodeOutputs out,
                                    cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  EncodeEveryFormatKernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(in, n, out);
  return cudaGetLastError();
}

cudaError_t LaunchDecodeEveryCode(DecodeOutputs out, cudaStream_t stream) {
  DecodeEveryCodeKernel<<<kSixteenBitCodes / kThreads, kThreads, 0, stream>>>(out);
  return cudaGetLastError();
}

}  // namespace testing
}  // namespace teserve
