// CPU reference activations: one element-wise template for the element-wise kinds and
// one for the gated kinds, each taking the scalar op of kernels/activation_math.h as a
// parameter. Everything is FP32, as the CUDA kernels will compute it; the tests judge
// it against closed forms evaluated in double.
#include "kernels/cpu/activation_cpu.h"

#include <vector>

#include "core/status.h"
#include "kernels/activation_math.h"
#include "kernels/cpu/cast_cpu.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

constexpr bool kGated = true;
constexpr bool kElementwise = false;

// Calls fn(op, gated, clamp) with the scalar op of `kind`.
template <typename Fn>
absl::StatusOr<Tensor> WithOp(Activation kind, const ActivationParams& params, Fn&& fn) {
  const act::GateClamp no_clamp;
  const act::SigmoidLinearOp qgelu{act::kQuickGeluAlpha};
  const act::SigmoidLinearOp silu{1.0f};
  switch (kind) {
    case Activation::kGelu: return fn(act::GeluOp(), kElementwise, no_clamp);
    case Activation::kGeglu: return fn(act::GeluOp(), kGated, no_clamp);
    case Activation::kQgelu: return fn(qgelu, kElementwise, no_clamp);
    case Activation::kQgeglu: return fn(qgelu, kGated, no_clamp);
    case Activation::kRelu: return fn(act::ReluOp(), kElementwise, no_clamp);
    case Activation::kReglu: return fn(act::ReluOp(), kGated, no_clamp);
    case Activation::kSrelu: return fn(act::SquaredReluOp(), kElementwise, no_clamp);
    case Activation::kSreglu: return fn(act::SquaredReluOp(), kGated, no_clamp);
    case Activation::kSilu: return fn(silu, kElementwise, no_clamp);
    case Activation::kSwiglu: return fn(silu, kGated, no_clamp);
    case Activation::kClampedSwiglu:
      return fn(act::SigmoidLinearOp{params.alpha}, kGated, act::GateClamp{true, params.limit, 1.0f});
  }
  return absl::InternalError("activation: unknown kind");
}

template <typename Op>
void ElementwiseForward(const Op& op, const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = op.Value(x[i]);
}

template <typename Op>
void ElementwiseBackward(const Op& op, const float* dy, const float* x, int64_t n, float* dx) {
  for (int64_t i = 0; i < n; ++i) dx[i] = dy[i] * op.Grad(x[i]);
}

// x [rows, 2k] = [a | b] -> y [rows, k], y = f(a') * (b' + offset).
template <typename Op>
void GatedForward(const Op& op, const act::GateClamp& clamp, const float* x, int64_t rows, int64_t k, float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * k;
    const float* b = a + k;
    float* out = y + r * k;
    for (int64_t j = 0; j < k; ++j) out[j] = op.Value(clamp.ActIn(a[j])) * (clamp.LinearIn(b[j]) + clamp.offset);
  }
}

// da = dy * f'(a') * [a unclamped] * (b' + offset),  db = dy * f(a') * [b unclamped].
template <typename Op>
void GatedBackward(const Op& op, const act::GateClamp& clamp, const float* dy, const float* x, int64_t rows,
                   int64_t k, float* dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* a = x + r * 2 * k;
    const float* b = a + k;
    const float* g = dy + r * k;
    float* da = dx + r * 2 * k;
    float* db = da + k;
    for (int64_t j = 0; j < k; ++j) {
      const float a_in = clamp.ActIn(a[j]);
      const float linear = clamp.LinearIn(b[j]) + clamp.offset;
      da[j] = g[j] * op.Grad(a_in) * clamp.ActInGrad(a[j]) * linear;
      db[j] = g[j] * op.Value(a_in) * clamp.LinearInGrad(b[j]);
    }
  }
}

}  // namespace

absl::StatusOr<Tensor> ActivationForward(const Context& ctx, Activation kind, const ActivationParams& params,
                                         const Tensor& x) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  return WithOp(kind, params, [&](const auto& op, bool gated, const act::GateClamp& clamp) -> absl::StatusOr<Tensor> {
    const int64_t k = gated ? cols / 2 : cols;
    ASSIGN_OR_RETURN(Tensor y, Tensor::Zeros(DType::kFloat32, {rows, k}));
    if (gated) {
      GatedForward(op, clamp, x.data<float>(), rows, k, y.data<float>());
    } else {
      ElementwiseForward(op, x.data<float>(), rows * k, y.data<float>());
    }
    return y;
  });
}

absl::StatusOr<Tensor> ActivationBackward(const Context& ctx, Activation kind, const ActivationParams& params,
                                          const Tensor& dy, const Tensor& x) {
  const int64_t rows = x.dim(0);
  const int64_t cols = x.dim(1);
  return WithOp(kind, params, [&](const auto& op, bool gated, const act::GateClamp& clamp) -> absl::StatusOr<Tensor> {
    ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(DType::kFloat32, {rows, cols}));
    if (gated) {
      GatedBackward(op, clamp, dy.data<float>(), x.data<float>(), rows, cols / 2, dx.data<float>());
    } else {
      ElementwiseBackward(op, dy.data<float>(), x.data<float>(), rows * cols, dx.data<float>());
    }
    return dx;
  });
}

namespace {

absl::StatusOr<Tensor> AsFloat32(const Context& ctx, const Tensor& t) {
  if (t.dtype() == DType::kFloat32) return t;
  return cpu::ToFloat32(ctx, t);
}

}  // namespace

absl::StatusOr<ActivationForwardResult> FusedActivationForward(const Context& ctx, Activation kind,
                                                               const ActivationParams& params,
                                                               const Tensor& x,
                                                               const ActivationForwardOptions& options) {
  ASSIGN_OR_RETURN(const Tensor x32, AsFloat32(ctx, x));
  ASSIGN_OR_RETURN(Tensor y32, cpu::ActivationForward(ctx, kind, params, x32));
  ActivationForwardResult out;
  if (options.quantize) {
    ASSIGN_OR_RETURN(out.fp8, cpu::QuantizePerTensor(ctx, y32, options.quantize_options));
  }
  if (options.write_y) {
    const DType y_dtype = options.y_dtype.value_or(x.dtype());
    if (y_dtype == DType::kFloat32) {
      out.y = std::move(y32);
    } else {
      ASSIGN_OR_RETURN(out.y, cpu::CastFromFloat32(ctx, y32, y_dtype));
    }
  }
  return out;
}

absl::StatusOr<ActivationBackwardResult> FusedActivationBackward(const Context& ctx, Activation kind,
                                                                 const ActivationParams& params,
                                                                 const Tensor& dy, const Tensor& x,
                                                                 const ActivationBackwardOptions& options) {
  ASSIGN_OR_RETURN(const Tensor dy32, AsFloat32(ctx, dy));
  ASSIGN_OR_RETURN(const Tensor x32, AsFloat32(ctx, x));
  ASSIGN_OR_RETURN(Tensor dx32, cpu::ActivationBackward(ctx, kind, params, dy32, x32));
  ActivationBackwardResult out;
  if (options.compute_dbias) {
    const int64_t rows = x.dim(0);
    const int64_t cols = x.dim(1);
    std::vector<double> sums(cols, 0.0);
    const float* dx = dx32.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) sums[c] += dx[r * cols + c];
    }
    ASSIGN_OR_RETURN(out.dbias, Tensor::Zeros(DType::kFloat32, {cols}));
    for (int64_t c = 0; c < cols; ++c) out.dbias.data<float>()[c] = static_cast<float>(sums[c]);
  }
  if (x.dtype() == DType::kFloat32) {
    out.dx = std::move(dx32);
  } else {
    ASSIGN_OR_RETURN(out.dx, cpu::CastFromFloat32(ctx, dx32, x.dtype()));
  }
  return out;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
