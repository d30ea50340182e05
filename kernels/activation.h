// Activation functions of TE's LayerNormMLP, forward and backward, over the last
// dimension of an FP32 [rows, cols] tensor. Scalar formulas: kernels/activation_math.h.
//
// Element-wise kinds (input [rows, K], output [rows, K]):
//   gelu   x/2 (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  (tanh approximation)
//   qgelu  x * sigmoid(1.702 x)
//   relu   max(x, 0)
//   srelu  max(x, 0)^2
//   silu   x * sigmoid(x)
// Gated kinds (input [rows, 2K] = [a | b], output [rows, K]). As in TE, the activation
// goes on the FIRST half and the second half is the linear gate (PyTorch's GLU uses
// the opposite convention):
//   geglu  gelu(a) * b        qgeglu  qgelu(a) * b        reglu  relu(a) * b
//   sreglu srelu(a) * b       swiglu  silu(a) * b
//   clamped_swiglu (GPT-OSS)  a' = min(a, limit), b' = clamp(b, -limit, limit),
//                             out = a' * sigmoid(alpha a') * (b' + 1)
//                             (ActivationParams: limit 7.0, alpha 1.702 by default)
//
// ActivationForward(x) returns y; ActivationBackward(dy, x) returns dx = dy * dy/dx
// (shape of x) from the forward input x, which the caller keeps. Both are computed in
// FP32 per element; rows or K may be 0.
//
// Fused entry points (FusedActivationForward / FusedActivationBackward): x and dy in FP32,
// BF16 or FP16, widened exactly to FP32, the same FP32 math, then
//   forward:  y in a chosen dtype (RNE from the FP32 value) and/or a per-tensor FP8 copy
//             of the FP32 y: q = satfinite_rne(y_fp32 * scale), rowwise [rows, K] and/or
//             columnwise [K, rows], amax = max |y_fp32| (NaN propagates); exactly
//             kernels::QuantizePerTensor applied to the FP32 y (the CPU reference is that
//             composition).
//   backward: dx in x's dtype and, optionally, dbias = column sums of the FP32 dx
//             (FP32 [cols of x]; the bias gradient of the GEMM that produced x, as
//             LayerNormMLP's fc1 needs). The CPU sums in FP64, CUDA in FP32 partial sums.
// Numerical contract between devices: the FP32 values agree within the FP32 tolerance
// (the CUDA forward's sigmoid on the special-function unit, kernels/activation_math.h,
// and FMA contraction differ from the host's by a few ulp); given the same FP32 y the FP8
// code is the same on every device, so codes differ only where the FP32 values do, and
// then by one code step.
#ifndef TESERVE_KERNELS_ACTIVATION_H_
#define TESERVE_KERNELS_ACTIVATION_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {

enum class Activation {
  kGelu,
  kGeglu,
  kQgelu,
  kQgeglu,
  kRelu,
  kReglu,
  kSrelu,
  kSreglu,
  kSilu,
  kSwiglu,
  kClampedSwiglu,
};

// clamped_swiglu only (TE's activation_params); ignored by the other kinds.
struct ActivationParams {
  float limit = 7.0f;
  float alpha = 1.702f;
};

// TE's names: "gelu", "geglu", ..., "clamped_swiglu".
absl::string_view ActivationName(Activation kind);
// Parses a TE name; anything else is INVALID_ARGUMENT naming `field` and listing the
// accepted names.
absl::StatusOr<Activation> ParseActivation(absl::string_view name, absl::string_view field = "activation");
// "gelu, geglu, qgelu, ..." (the accepted names, for messages).
std::string ActivationNames();

bool IsGated(Activation kind);
// Input width that gives `output_width` outputs: 2x for gated kinds.
inline int64_t ActivationInputWidth(Activation kind, int64_t output_width) {
  return IsGated(kind) ? 2 * output_width : output_width;
}

// x: FP32 [rows, cols] (cols even for gated kinds). Returns y [rows, cols or cols/2].
// clamped_swiglu needs finite params with limit > 0 and alpha > 0.
absl::StatusOr<Tensor> ActivationForward(const Context& ctx, Activation kind, const ActivationParams& params,
                                         const Tensor& x);

// dy: FP32 shaped like ActivationForward's output for x. Returns dx, shaped like x.
absl::StatusOr<Tensor> ActivationBackward(const Context& ctx, Activation kind, const ActivationParams& params,
                                          const Tensor& dy, const Tensor& x);

struct ActivationForwardOptions {
  // Write y (in y_dtype: FP32, FP16 or BF16; unset = x's dtype). May be false only when
  // `quantize` is set.
  bool write_y = true;
  std::optional<DType> y_dtype;
  // Fused per-tensor FP8 output of the FP32 y (format, scale, rowwise, columnwise).
  bool quantize = false;
  PerTensorQuantizeOptions quantize_options;
};

struct ActivationForwardResult {
  Tensor y;             // [rows, K] in y_dtype, when write_y
  QuantizedTensor fp8;  // when quantize: per-tensor copies, scale_inv = 1 / scale, amax
};

// x: [rows, cols] FP32, FP16 or BF16 (cols even for gated kinds); K = cols or cols / 2.
absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options);

struct ActivationBackwardOptions {
  bool compute_dbias = false;
};

struct ActivationBackwardResult {
  Tensor dx;     // shaped like x, x's dtype
  Tensor dbias;  // FP32 [cols of x], when compute_dbias
};

// dy: [rows, K] of x's dtype; x: the forward input.
absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ACTIVATION_H_
