// Cast, amax, per-tensor quantize and dequantize.
//
// Contract (every device):
//   Amax(x)                   max |x| over all elements; NaN if any element is NaN.
//                             x FP32 or BF16 (as QuantizePerTensor).
//   QuantizePerTensor(x, o)   x FP32 or BF16 [rows, cols] (BF16 is read as its exact
//                             FP32 value, so a BF16 x quantizes as its FP32 copy would). amax = Amax(x) (fused in the same
//                             pass), q = satfinite_rne(x * scale) in o.format (E4M3 or
//                             E5M2), the product taken in FP32; scale_inv = 1 / scale.
//                             scale is o.scale, or with o.current set x's own current
//                             scale, CurrentScale(amax, max finite of o.format, o.current)
//                             (kernels/scaling_math.h): CUDA computes it on the device
//                             from an amax pass before the cast, so the host never waits
//                             for the amax (the scale used is the scale_inv tensors').
//                             Rowwise copy [rows, cols] and/or columnwise copy
//                             [cols, rows] (the transpose), as requested.
//                             Optional fused dbias (o.dbias set): *o.dbias, a defined
//                             FP32 [cols] tensor on the Context's device, is overwritten
//                             with the column sums of x, dbias[c] = sum_r x[r, c] (the
//                             bias gradient of a Linear when x is its dy). The CPU sums
//                             in FP64 and rounds once to FP32; CUDA sums FP32 partials
//                             per tile and reduces them in FP64, within the FP32
//                             tolerance of a reduction (tests/kernels/tolerances.h).
//                             NaN in a column gives NaN, Inf gives Inf (+Inf and -Inf:
//                             NaN); rows == 0 gives zeros. A dbias that is undefined,
//                             not FP32, not [cols] or on another device is
//                             INVALID_ARGUMENT naming "options.dbias".
//   Dequantize(q, copy)       FP32 tensor q * scale_inv of the requested copy, in that
//                             copy's layout.
//   ToFloat32 / CastFromFloat32  plain conversions (no scaling; FP8 casts saturate).
// The CPU versions in kernels/cpu are the numerical reference; CUDA versions
// (kernels/cuda) must match them bit for bit given the same scale.
#ifndef TESERVE_KERNELS_CAST_H_
#define TESERVE_KERNELS_CAST_H_

#include <optional>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

enum class Copy { kRowwise, kColumnwise };

// Current scaling's rule (TE's Float8CurrentScaling): the scale comes from the tensor's
// own amax.
struct CurrentScaleRule {
  float amax_epsilon = 0.0f;  // the amax is floored to it (finite, >= 0)
  bool power_2_scale = false;  // round the scale down to a power of two
};

struct PerTensorQuantizeOptions {
  DType format = DType::kFloat8E4M3;
  float scale = 1.0f;  // ignored when `current` is set
  std::optional<CurrentScaleRule> current;
  bool rowwise = true;
  bool columnwise = false;
  // When set: FP32 [cols] column sums of x (FP64 accumulation on the CPU), see above.
  // Not owned; the caller allocates it.
  Tensor* dbias = nullptr;
  // CUDA: leave the amax on the device (QuantizedTensor::amax_bits) instead of reading it
  // back, so the quantization does not wait for the stream. The CPU computes it in place
  // either way (amax set, amax_bits undefined).
  bool defer_amax = false;
};

absl::StatusOr<float> Amax(const Context& ctx, const Tensor& x);

absl::StatusOr<QuantizedTensor> QuantizePerTensor(const Context& ctx, const Tensor& x,
                                                  const PerTensorQuantizeOptions& options);

absl::StatusOr<Tensor> Dequantize(const Context& ctx, const QuantizedTensor& q, Copy copy);

// FP32 / FP16 / BF16 / FP8 (unscaled) -> new FP32 tensor of the same shape.
absl::StatusOr<Tensor> ToFloat32(const Context& ctx, const Tensor& x);

// FP32 -> `dtype` (FP32, FP16, BF16, E4M3, E5M2), round-to-nearest-even.
absl::StatusOr<Tensor> CastFromFloat32(const Context& ctx, const Tensor& x, DType dtype);

// x (FP32, FP16, BF16 or FP8, unscaled) as `dtype` (FP32, FP16, BF16, E4M3, E5M2): x
// itself when it has that dtype already (shared, no copy), else a converted copy through
// FP32 (exact up to the final rounding). How activations change dtype between layers.
absl::StatusOr<Tensor> Convert(const Context& ctx, const Tensor& x, DType dtype);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_CAST_H_
