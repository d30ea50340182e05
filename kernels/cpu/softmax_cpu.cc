// CPU reference of kernels/softmax.h (contract there).
#include "kernels/cpu/softmax_cpu.h"

#include <cmath>
#include <limits>

#include "core/status.h"

namespace teserve {
namespace kernels {
namespace cpu {

absl::StatusOr<Tensor> ScaledSoftmaxForward(const Tensor& x, float scale, SoftmaxMask kind, const Tensor& mask) {
  ASSIGN_OR_RETURN(Tensor y, Tensor::Zeros(DType::kFloat32, x.shape()));
  const int64_t heads = x.dim(1), sq = x.dim(2), sk = x.dim(3);
  const int64_t rows = x.dim(0) * heads * sq;
  const float* in = x.data<float>();
  float* out = y.data<float>();
  const uint8_t* m = kind == SoftmaxMask::kPadding ? mask.data<uint8_t>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % sq;
    const int64_t b = r / (heads * sq);
    const float* xr = in + r * sk;
    float* yr = out + r * sk;
    const uint8_t* mr = m == nullptr ? nullptr : m + (b * sq + i) * sk;
    auto masked = [&](int64_t j) { return (mr != nullptr && mr[j] != 0) || CausallyMasked(kind, i, j, sq, sk); };
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < sk; ++j) {
      if (!masked(j)) max = std::fmax(max, scale * xr[j]);
    }
    if (max == -std::numeric_limits<float>::infinity()) continue;  // fully masked: zeros
    double sum = 0.0;
    for (int64_t j = 0; j < sk; ++j) {
      if (!masked(j)) sum += std::exp(static_cast<double>(scale * xr[j]) - max);
    }
    for (int64_t j = 0; j < sk; ++j) {
      yr[j] = masked(j) ? 0.0f : static_cast<float>(std::exp(static_cast<double>(scale * xr[j]) - max) / sum);
    }
  }
  return y;
}

absl::StatusOr<Tensor> ScaledSoftmaxBackward(const Tensor& y, const Tensor& dy, float scale) {
  ASSIGN_OR_RETURN(Tensor dx, Tensor::Zeros(DType::kFloat32, y.shape()));
  const int64_t sk = y.dim(3);
  const int64_t rows = sk == 0 ? 0 : y.numel() / sk;
  const float* yv = y.data<float>();
  const float* g = dy.data<float>();
  float* out = dx.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0.0;
    for (int64_t j = 0; j < sk; ++j) dot += static_cast<double>(g[r * sk + j]) * yv[r * sk + j];
    for (int64_t j = 0; j < sk; ++j) {
      const int64_t k = r * sk + j;
      out[k] = static_cast<float>(static_cast<double>(scale) * yv[k] * (g[k] - dot));
    }
  }
  return dx;
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
