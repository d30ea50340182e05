// CPU reference L2 normalization, one row at a time with the sums in double. As in
// the LayerNorm/RMSNorm reference, the backward uses the FP32 rsigma the forward saved
// (as a GPU backward would) rather than recomputing it.
#include "kernels/cpu/l2_norm_cpu.h"

#include <cmath>

#include "core/status.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<L2NormForwardOutputs> L2NormalizationForward(const Context&, const Tensor& x, float eps) {
  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  L2NormForwardOutputs out;
  ASSIGN_OR_RETURN(out.y, Tensor::Zeros(DType::kFloat32, {n, h}));
  ASSIGN_OR_RETURN(out.rsigma, Tensor::Zeros(DType::kFloat32, {n}));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = x.data<float>() + i * h;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < h; ++j) sum_sq += static_cast<double>(row[j]) * row[j];
    const double rsigma = 1.0 / std::sqrt(sum_sq + eps);
    float* y = out.y.data<float>() + i * h;
    for (int64_t j = 0; j < h; ++j) y[j] = static_cast<float>(row[j] * rsigma);
    out.rsigma.data<float>()[i] = static_cast<float>(rsigma);
  }
  return out;
}

absl::StatusOr<Tensor> L2NormalizationBackward(const Context&, const Tensor& dy, const Tensor& x,
                                               const Tensor& rsigma) {
  const int64_t n = x.dim(0);
  const int64_t h = x.dim(1);
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(DType::kFloat32, {n, h}));
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x.data<float>() + i * h;
    const float* dyr = dy.data<float>() + i * h;
    const double r = rsigma.data<float>()[i];
    double dot = 0.0;
    for (int64_t j = 0; j < h; ++j) dot += static_cast<double>(dyr[j]) * xr[j];
    const double r3_dot = r * r * r * dot;
    float* dxr = dx.data<float>() + i * h;
    for (int64_t j = 0; j < h; ++j) dxr[j] = static_cast<float>(r * dyr[j] - r3_dot * xr[j]);
  }
  return dx;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
