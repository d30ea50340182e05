// LayerNorm and RMSNorm, forward and backward, over the last dimension.
//
// x: [n, h]; gamma, beta: FP32 [h]. With zero_centered_gamma the effective
// weight is (1 + gamma) (TE's zero_centered_gamma).
//   LayerNorm: mu = mean(x), rsigma = 1 / sqrt(var(x) + eps) (biased variance),
//              y = (x - mu) * rsigma * w + beta.
//   RMSNorm:   rsigma = 1 / sqrt(mean(x^2) + eps), y = x * rsigma * w.
// mu and rsigma are FP32 [n], saved for the backward pass.
// Backward returns dx [n, h] and the parameter gradients dgamma (and dbeta) [h]
// (fresh values, not accumulated). Reductions accumulate in FP64 on the CPU.
//
// Two API levels:
// - LayerNormForward / RmsNormForward / LayerNormBackward / RmsNormBackward: FP32 tensors
//   throughout, default launch options.
// - NormalizationForward / NormalizationBackward: x and dy in FP32, BF16 or FP16 (dx has
//   x's dtype), y in a chosen dtype, and an optional per-tensor FP8 output fused into the
//   forward (rowwise [n, h] and/or columnwise [h, n] codes plus the amax of y). The FP8
//   codes quantize the FP32 normalized values, before any rounding to y's dtype:
//     q = satfinite_rne(y_fp32 * scale), amax = max |y_fp32| (NaN propagates),
//   i.e. exactly kernels::QuantizePerTensor applied to the FP32 y. The CPU reference is
//   that composition (FP32 norm, then QuantizePerTensor / CastFromFloat32).
//   MXFP8 output (options.mxfp8, exclusive with options.quantize): the FP32 y quantized
//   exactly as kernels::QuantizeMxfp8 (kernels/block_quantize.h) quantizes it: 1x32
//   rowwise blocks (h % 32 == 0) and/or 32x1 columnwise blocks (n % 32 == 0), E8M0
//   scales rounded up, in result.fp8 (mode kMxfp8_1D, its scale layout). Every device
//   computes it as that composition (FP32 norm, then QuantizeMxfp8; on CUDA one fused
//   kernel where the register-tile kernel applies, cuda::FusesMxfp8, else two passes),
//   so given the same FP32 y the codes and E8M0 scales are the same on every device.
//   sm_margin (CUDA only, TE's sm_margin): the grid is sized for (SMs - sm_margin)
//   multiprocessors, leaving that many free for concurrent kernels.
// Numerical contract between devices: y, mu, rsigma, dx, dgamma, dbeta agree within the
// FP32 (or output dtype) tolerance; given the same FP32 y value the FP8 code is the same
// on every device, so CPU and CUDA codes can differ only where their FP32 y values differ
// (by an ulp or so), and then by one code step.
#ifndef TESERVE_KERNELS_NORMALIZATION_H_
#define TESERVE_KERNELS_NORMALIZATION_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/block_quantize.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {

struct NormForwardOutputs {
  Tensor y;       // [n, h]
  Tensor mu;      // [n] (LayerNorm only)
  Tensor rsigma;  // [n]
};

struct NormBackwardOutputs {
  Tensor dx;      // [n, h]
  Tensor dgamma;  // [h]
  Tensor dbeta;   // [h] (LayerNorm only)
};

absl::StatusOr<NormForwardOutputs> LayerNormForward(const Context& ctx, const Tensor& x,
                                                    const Tensor& gamma, const Tensor& beta,
                                                    float eps, bool zero_centered_gamma);

absl::StatusOr<NormBackwardOutputs> LayerNormBackward(const Context& ctx, const Tensor& dy,
                                                      const Tensor& x, const Tensor& mu,
                                                      const Tensor& rsigma, const Tensor& gamma,
                                                      bool zero_centered_gamma);

absl::StatusOr<NormForwardOutputs> RmsNormForward(const Context& ctx, const Tensor& x,
                                                  const Tensor& gamma, float eps,
                                                  bool zero_centered_gamma);

absl::StatusOr<NormBackwardOutputs> RmsNormBackward(const Context& ctx, const Tensor& dy,
                                                    const Tensor& x, const Tensor& rsigma,
                                                    const Tensor& gamma, bool zero_centered_gamma);

enum class NormType { kLayerNorm, kRmsNorm };

struct NormForwardOptions {
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  // Write y (in y_dtype: FP32, FP16 or BF16; unset = x's dtype). May be false only when
  // `quantize` or `mxfp8` is set.
  bool write_y = true;
  std::optional<DType> y_dtype;
  // Fused per-tensor FP8 output of the FP32 y (format, scale, rowwise, columnwise).
  bool quantize = false;
  PerTensorQuantizeOptions quantize_options;
  // MXFP8 output of the FP32 y (format, rowwise, columnwise; dbias must be null).
  bool mxfp8 = false;
  Mxfp8QuantizeOptions mxfp8_options;
  int sm_margin = 0;  // >= 0 (CUDA: < the device's SM count); ignored on the CPU
};

struct NormForwardResult {
  Tensor y;            // [n, h] in y_dtype, when write_y
  QuantizedTensor fp8; // when quantize: per-tensor copies, scale_inv = 1 / scale, amax;
                       // when mxfp8: the MXFP8 copies and E8M0 scales
  Tensor mu;           // [n] FP32 (LayerNorm only)
  Tensor rsigma;       // [n] FP32
};

struct NormBackwardOptions {
  bool zero_centered_gamma = false;
  int sm_margin = 0;  // as in NormForwardOptions
};

// beta: FP32 [h] for LayerNorm; must be undefined for RMSNorm.
absl::StatusOr<NormForwardResult> NormalizationForward(const Context& ctx, NormType type,
                                                       const Tensor& x, const Tensor& gamma,
                                                       const Tensor& beta,
                                                       const NormForwardOptions& options);

// dy and x: [n, h] of one dtype (FP32, FP16 or BF16); mu: FP32 [n] for LayerNorm, undefined
// for RMSNorm; rsigma: FP32 [n]; gamma: FP32 [h]. dx has x's dtype; dgamma, dbeta FP32.
absl::StatusOr<NormBackwardOutputs> NormalizationBackward(const Context& ctx, NormType type,
                                                          const Tensor& dy, const Tensor& x,
                                                          const Tensor& mu, const Tensor& rsigma,
                                                          const Tensor& gamma,
                                                          const NormBackwardOptions& options);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_NORMALIZATION_H_
