// Scalar activation functions and their derivatives, in FP32, shared by the CPU
// reference (kernels/cpu/activation_cpu.cc) and the CUDA kernels (TESERVE_HD), so both
// backends evaluate the same formulas in the same order (except as noted below).
//
//   Sigmoid(x)   = 1 / (1 + exp(-x))
//   GELU(x)      = x/2 (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi) (TE's tanh
//                  approximation), evaluated as x * Sigmoid(2c (x + 0.044715 x^3)):
//                  the same function, but 1 + tanh(z) cancels for z << 0 and the
//                  sigmoid form does not.
//   QGELU(x)     = x * Sigmoid(alpha x), alpha = 1.702 (quick GELU)
//   SiLU(x)      = x * Sigmoid(x)
//   ReLU(x)      = max(x, 0)
//   SReLU(x)     = max(x, 0)^2 (squared ReLU)
// Derivatives at the kinks: ReLU'(0) = 0, SReLU'(0) = 0.
// NaN inputs give NaN outputs in every forward function.
//
// Forward values on the device (GeluOp / SigmoidLinearOp::Value compiled for CUDA) take
// the sigmoid from the special-function unit instead: 1 / (1 + 2^t) with t = -log2(e) u
// folded into the argument (GELU: t = x (A + B x^2)), ex2.approx.ftz and rcp.approx.ftz,
// no branches. Same function, same NaN / +-Inf results; the relative error of the value
// stays within ~(3 + 1.2 |u|) ulp (denormal sigmoids flush to 0), under a tenth of the
// FP32 tolerance of the GPU-vs-CPU tests wherever that is not met by atol. Derivatives
// (Grad) keep Sigmoid on every device: 1 - s needs s correctly rounded near 1.
//
// Each op is a functor with Value(x) and Grad(x), so element-wise loops take the op as
// a template parameter.
#ifndef TESERVE_KERNELS_ACTIVATION_MATH_H_
#define TESERVE_KERNELS_ACTIVATION_MATH_H_

#include <math.h>

#ifndef TESERVE_HD
#if defined(__CUDACC__)
#define TESERVE_HD __host__ __device__ __forceinline__
#else
#define TESERVE_HD inline
#endif
#endif

namespace teserve {
namespace kernels {
namespace act {

inline constexpr float kGeluTanhScale = 0.7978845608028654f;  // sqrt(2 / pi)
inline constexpr float kGeluCubic = 0.044715f;
inline constexpr float kQuickGeluAlpha = 1.702f;

TESERVE_HD float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

#if defined(__CUDA_ARCH__)
inline constexpr float kNegLog2E = -1.4426950408889634f;  // -log2(e)
// GELU's sigmoid argument times -log2(e): x (A + B x^2) = -log2(e) 2c (x + k x^3).
inline constexpr float kGeluExp2Linear = static_cast<float>(-1.4426950408889634 * 2.0 * 0.7978845608028654);
inline constexpr float kGeluExp2Cubic = static_cast<float>(-1.4426950408889634 * 2.0 * 0.7978845608028654 * 0.044715);

// 1 / (1 + 2^t) = Sigmoid(-t ln 2) on the special-function unit (forward values only).
__device__ __forceinline__ float SigmoidOfExp2(float t) {
  float e;
  float s;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(s) : "f"(1.0f + e));
  return s;
}
#endif

struct GeluOp {
  TESERVE_HD float Value(float x) const {
#if defined(__CUDA_ARCH__)
    return x * SigmoidOfExp2(x * fmaf(kGeluExp2Cubic, x * x, kGeluExp2Linear));
#else
    return x * Sigmoid(2.0f * kGeluTanhScale * (x + kGeluCubic * x * x * x));
#endif
  }
  // d/dx [x s(u)] = s + x s (1 - s) u',  u = 2c (x + k x^3),  u' = 2c (1 + 3k x^2).
  TESERVE_HD float Grad(float x) const {
    const float s = Sigmoid(2.0f * kGeluTanhScale * (x + kGeluCubic * x * x * x));
    const float du = 2.0f * kGeluTanhScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return s + x * s * (1.0f - s) * du;
  }
};

// x * Sigmoid(alpha x): QGELU with alpha = 1.702, SiLU with alpha = 1.
struct SigmoidLinearOp {
  float alpha = 1.0f;
  TESERVE_HD float Value(float x) const {
#if defined(__CUDA_ARCH__)
    return x * SigmoidOfExp2(x * (alpha * kNegLog2E));
#else
    return x * Sigmoid(alpha * x);
#endif
  }
  TESERVE_HD float Grad(float x) const {
    const float s = Sigmoid(alpha * x);
    return s + alpha * x * s * (1.0f - s);
  }
};

struct ReluOp {
  TESERVE_HD float Value(float x) const { return x < 0.0f ? 0.0f : x; }
  TESERVE_HD float Grad(float x) const { return x > 0.0f ? 1.0f : 0.0f; }
};

struct SquaredReluOp {
  TESERVE_HD float Value(float x) const { return x < 0.0f ? 0.0f : x * x; }
  TESERVE_HD float Grad(float x) const { return x > 0.0f ? 2.0f * x : 0.0f; }
};

// How a gated activation treats its two halves a (activated) and b (linear):
//   out = f(a') * (b' + offset)
// Plain GLU variants use a' = a, b' = b, offset 0. Clamped SwiGLU (GPT-OSS) clamps
// a' = min(a, limit), b' = clamp(b, -limit, limit) and adds offset 1; where a clamp is
// active its input gets no gradient (at exactly the limit the gradient passes).
//
// On the device the clamps are min.NaN / max.NaN (one instruction each instead of a
// compare and a select): for limit > 0 (ActivationParams requires it) they give the
// same values as the selects, NaN included, and -0 stays -0.
#if defined(__CUDA_ARCH__)
__device__ __forceinline__ float MinNaN(float a, float b) {
  float d;
  asm("min.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
__device__ __forceinline__ float MaxNaN(float a, float b) {
  float d;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
  return d;
}
#endif

struct GateClamp {
  bool enabled = false;
  float limit = 0.0f;
  float offset = 0.0f;

  TESERVE_HD float ActIn(float a) const {
#if defined(__CUDA_ARCH__)
    return enabled ? MinNaN(a, limit) : a;
#else
    return enabled && a > limit ? limit : a;
#endif
  }
  TESERVE_HD float LinearIn(float b) const {
    if (!enabled) return b;
#if defined(__CUDA_ARCH__)
    return MaxNaN(MinNaN(b, limit), -limit);
#else
    return b > limit ? limit : (b < -limit ? -limit : b);
#endif
  }
  TESERVE_HD float ActInGrad(float a) const { return enabled && a > limit ? 0.0f : 1.0f; }
  TESERVE_HD float LinearInGrad(float b) const { return enabled && (b > limit || b < -limit) ? 0.0f : 1.0f; }
};

}  // namespace act
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_ACTIVATION_MATH_H_
