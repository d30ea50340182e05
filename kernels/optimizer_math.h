// Per-element update rules of the optimizers (kernels/optimizer.h), shared by the CPU
// reference and the CUDA kernels. Header-only, no abseil. Every product, sum, quotient
// and square root is one IEEE FP32 operation rounded to nearest, in the order written
// (on the device through the __f*_rn intrinsics, so nvcc cannot contract a*b+c into an
// FMA), so the CPU and CUDA updates are bit-identical for the same inputs.
#ifndef TESERVE_KERNELS_OPTIMIZER_MATH_H_
#define TESERVE_KERNELS_OPTIMIZER_MATH_H_

#include <cmath>
#include <cstdint>

#include "core/float_codec.h"

namespace teserve {
namespace kernels {
namespace optimizer_math {

#if defined(__CUDA_ARCH__)
TESERVE_HD float Mul(float a, float b) { return __fmul_rn(a, b); }
TESERVE_HD float Add(float a, float b) { return __fadd_rn(a, b); }
TESERVE_HD float Sub(float a, float b) { return __fsub_rn(a, b); }
TESERVE_HD float Div(float a, float b) { return __fdiv_rn(a, b); }
TESERVE_HD float Sqrt(float a) { return __fsqrt_rn(a); }
#else
TESERVE_HD float Mul(float a, float b) { return a * b; }
TESERVE_HD float Add(float a, float b) { return a + b; }
TESERVE_HD float Sub(float a, float b) { return a - b; }
TESERVE_HD float Div(float a, float b) { return a / b; }
TESERVE_HD float Sqrt(float a) { return std::sqrt(a); }
#endif

// Step-dependent scalars of AdamW, computed once per step on the host:
//   decay = 1 - lr * weight_decay, step_size = lr / (1 - beta1^t),
//   bias_correction2_sqrt = sqrt(1 - beta2^t)   (powers in FP32, std::pow).
struct AdamWScalars {
  float beta1 = 0.9f;
  float one_minus_beta1 = 0.1f;
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float decay = 1.0f;
  float step_size = 0.0f;
  float bias_correction2_sqrt = 1.0f;
};

// p *= decay; m = b1 m + (1 - b1) g; v = b2 v + ((1 - b2) g) g;
// p -= (step_size m) / (sqrt(v) / bias_correction2_sqrt + eps).
TESERVE_HD void AdamWElement(const AdamWScalars& s, float g, float* p, float* m, float* v) {
  float param = Mul(*p, s.decay);
  const float m_new = Add(Mul(s.beta1, *m), Mul(s.one_minus_beta1, g));
  const float v_new = Add(Mul(s.beta2, *v), Mul(Mul(s.one_minus_beta2, g), g));
  const float denom = Add(Div(Sqrt(v_new), s.bias_correction2_sqrt), s.eps);
  param = Sub(param, Div(Mul(s.step_size, m_new), denom));
  *p = param;
  *m = m_new;
  *v = v_new;
}

struct SgdScalars {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float momentum = 0.0f;  // 0: no momentum buffer
  float one_minus_dampening = 1.0f;
  bool nesterov = false;
  bool first_step = false;  // buf = g instead of the momentum update
};

// g' = g + wd p; with momentum: buf = first ? g' : mom buf + (1 - damp) g',
// g' = nesterov ? g' + mom buf : buf; p -= lr g'. `buf` is unused without momentum.
TESERVE_HD void SgdElement(const SgdScalars& s, float g, float* p, float* buf) {
  float d = Add(g, Mul(s.weight_decay, *p));
  if (s.momentum != 0.0f) {
    const float b = s.first_step ? d : Add(Mul(s.momentum, *buf), Mul(s.one_minus_dampening, d));
    *buf = b;
    d = s.nesterov ? Add(d, Mul(s.momentum, b)) : b;
  }
  *p = Sub(*p, Mul(s.lr, d));
}

// Model copy kinds written from the updated FP32 master weight.
enum class ModelCopyKind : int32_t { kNone = 0, kBFloat16 = 1, kE4M3 = 2, kE5M2 = 3, kFloat16 = 4 };

// 16-bit copies (2-byte codes) as opposed to FP8 ones.
TESERVE_HD bool IsSixteenBitCopy(ModelCopyKind kind) {
  return kind == ModelCopyKind::kBFloat16 || kind == ModelCopyKind::kFloat16;
}

// The copy's code of master value p: BF16 / FP16 round-to-nearest-even (the encoders
// kernels::Convert uses, so a copy equals Convert(p) bit for bit), or FP8 satfinite of
// the FP32 product p * scale.
TESERVE_HD uint16_t ModelCopyCode(ModelCopyKind kind, float p, float scale) {
  switch (kind) {
    case ModelCopyKind::kBFloat16: return FloatToBf16(p);
    case ModelCopyKind::kFloat16: return FloatToFp16(p);
    case ModelCopyKind::kE4M3: return FloatToE4M3(Mul(p, scale));
    case ModelCopyKind::kE5M2: return FloatToE5M2(Mul(p, scale));
    default: return 0;
  }
}

}  // namespace optimizer_math
}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_OPTIMIZER_MATH_H_
