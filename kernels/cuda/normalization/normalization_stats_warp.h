// Internal to kernels/cuda/normalization_*: the stats-warp forward kernel
// (normalization_stats_warp.cu) and the one-CTA-per-row kernel
// (normalization_row_per_cta.cu), which LaunchNormForward / PlanNormForward select before the
// register-tile kernel unless params.kernel says otherwise. Light header: CUDA runtime types
// only.
#ifndef TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_H_
#define TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_H_

#include <cuda_runtime_api.h>

#include "kernels/cuda/normalization/normalization_kernels.h"

namespace teserve {
namespace kernels {
namespace cuda {

// Plans (and with launch = true, launches on `stream`) the stats-warp forward for `p` on
// `usable_sms` multiprocessors, or for up to 256 rows without a columnwise copy the
// one-CTA-per-row kernel. *handled is false (and nothing is launched) when neither covers
// `p`: the register-tile kernel's conditions (x BF16/FP16, cols a multiple of 64 up to 8192,
// rows a multiple of 8 (any row count for the one-CTA-per-row kernel), aligned pointers, the
// hardware encoder; for MXFP8 output the same block conditions), or a cluster that does not
// fit on the usable SMs. The caller has validated p and written nothing yet; amax is zeroed
// here when launched.
cudaError_t StatsWarpForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan,
                             cudaStream_t stream, bool launch, bool* handled);

// The one-CTA-per-row kernel (normalization_row_per_cta.cu): whether kAuto takes it for p
// (up to 256 rows, no columnwise copy, no MXFP8 output), and its plan / launch for such a p
// that StatsWarpForward's conditions cover (any row count).
bool TakesRowPerCta(const NormForwardParams& p);
cudaError_t RowPerCtaForward(const NormForwardParams& p, int usable_sms, NormForwardPlan* plan, cudaStream_t stream,
                             bool launch);

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CUDA_NORMALIZATION_STATS_WARP_H_
