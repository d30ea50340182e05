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
#ifndef TESERVE_KERNELS_ACTIVATION_H_
#define TESERVE_KERNELS_ACTIVATION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

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

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ACTIVATION_H_
