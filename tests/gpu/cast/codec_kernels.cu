// Device side of the codec test: one thread per value, no tiling; correctness only.
#include "tests/gpu/cast/codec_kernels.h"

#include <cuda_fp16.h>
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

__device__ void Note(unsigned long long* count, uint32_t* first, uint32_t bits) {
  atomicAdd(count, 1ull);
  atomicMin(first, bits);
}

__global__ void PairConversionsKernel(unsigned long long* mismatches, uint32_t* first) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (1ull << 32);
       i += stride) {
    const uint32_t bits = static_cast<uint32_t>(i);
    const float x = __uint_as_float(bits);
    if (x != x) continue;  // NaN: the kernels re-store such tiles with the exact conversion
    const float neg = -x;
    uint32_t bf, hf;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(bf) : "f"(neg), "f"(x));
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(hf) : "f"(neg), "f"(x));
    if ((bf & 0xFFFFu) != FloatToBf16(x) || (bf >> 16) != FloatToBf16(neg)) Note(&mismatches[0], &first[0], bits);
    if ((hf & 0xFFFFu) != __half_as_ushort(__float2half_rn(x)) ||
        (hf >> 16) != __half_as_ushort(__float2half_rn(neg)) || (hf & 0xFFFFu) != FloatToFp16(x) ||
        (hf >> 16) != FloatToFp16(neg)) {
      Note(&mismatches[1], &first[1], bits);
    }
  }
}

}  // namespace

cudaError_t LaunchPairConversionsEveryFloat(unsigned long long* mismatches, uint32_t* first_mismatch,
                                            cudaStream_t stream) {
  cudaError_t status = cudaMemsetAsync(mismatches, 0, 2 * sizeof(unsigned long long), stream);
  if (status != cudaSuccess) return status;
  status = cudaMemsetAsync(first_mismatch, 0xFF, 2 * sizeof(uint32_t), stream);
  if (status != cudaSuccess) return status;
  PairConversionsKernel<<<4096, kThreads, 0, stream>>>(mismatches, first_mismatch);
  return cudaGetLastError();
}

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
