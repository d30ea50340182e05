// Internal to kernels/cuda/normalization_*: the register-tile forward kernel
// (normalization_register_tile.cu) that LaunchNormForward / PlanNormForward select for the
// shapes it covers. Light header: CUDA runtime types only.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_H_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/normalization/normalization_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Plans (and with launch = true, launches on `stream`) the register-tile forward for `p`
// on `usable_sms` multiprocessors. *handled is false (and nothing is launched) when the
// kernel does not cover `p`: x not BF16/FP16, cols not a multiple of 64 or above 8192,
// rows not a multiple of 8, misaligned pointers, the codec encoder, or a cluster that does
// not fit on the usable SMs. The caller has validated p and written nothing yet; amax is
// zeroed here when launched. With p.mxfp8 (the MXFP8 output, which only this kernel
// computes) it also needs rows % 32 == 0 when the columnwise copy is requested, and an
// uncovered p returns cudaErrorNotSupported instead of *handled = false.
cudaError_t RegisterTileForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan,
                                cudaStream_t stream, bool launch, bool* handled);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_REGISTER_TILE_H_
