#include "kernels/cpu/elementwise_cpu.h"

#include <cstring>

namespace teserve {
namespace kernels {
namespace cpu {

absl::Status AddInto(const Context&, const Tensor& x, Tensor* into) {
  const float* in = x.data<float>();
  float* out = into->data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) out[i] += in[i];
  return absl::OkStatus();
}

absl::Status Scale(const Context&, float factor, Tensor* x) {
  float* v = x->data<float>();
  for (int64_t i = 0; i < x->numel(); ++i) v[i] *= factor;
  return absl::OkStatus();
}

absl::StatusOr<double> SumOfSquares(const Context&, absl::Span<const Tensor> tensors) {
  double sum = 0.0;
  for (const Tensor& t : tensors) {
    const float* v = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) sum += static_cast<double>(v[i]) * v[i];
  }
  return sum;
}

absl::Status FillZero(const Context&, Tensor* x) {
  if (x->nbytes() > 0) std::memset(x->raw_data(), 0, static_cast<size_t>(x->nbytes()));
  return absl::OkStatus();
}

absl::Status CopyInto(const Context&, const Tensor& src, Tensor* dst) {
  if (src.nbytes() > 0 && src.raw_data() != dst->raw_data()) {
    std::memcpy(dst->raw_data(), src.raw_data(), static_cast<size_t>(src.nbytes()));
  }
  return absl::OkStatus();
}

absl::Status CopyColumns(const Context&, const Tensor& src, int64_t src_col, Tensor* dst, int64_t dst_col,
                         int64_t cols) {
  const int64_t bytes = DTypeBits(src.dtype()) / 8;
  const char* from = static_cast<const char*>(src.raw_data());
  char* to = static_cast<char*>(dst->raw_data());
  for (int64_t r = 0; r < src.dim(0); ++r) {
    std::memcpy(to + (r * dst->dim(1) + dst_col) * bytes, from + (r * src.dim(1) + src_col) * bytes,
                static_cast<size_t>(cols * bytes));
  }
  return absl::OkStatus();
}

absl::Status BiasDropoutAdd(const Context&, const Tensor& h, const Tensor& bias, const Tensor& residual,
                            const ResidualDropout& dropout, Tensor* out) {
  const int64_t hidden = h.shape().back();
  const float* hv = h.data<float>();
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  const float* r = residual.data<float>();
  float* o = out->data<float>();
  const bool active = dropout.active();
  for (int64_t i = 0; i < h.numel(); ++i) {
    float v = hv[i] + (b != nullptr ? b[i % hidden] : 0.0f);
    if (active) v *= ResidualDropoutFactor(dropout, i, hidden);
    o[i] = r[i] + v;
  }
  return absl::OkStatus();
}

absl::Status DropoutScale(const Context&, const ResidualDropout& dropout, Tensor* x) {
  if (!dropout.active()) return absl::OkStatus();
  const int64_t hidden = x->shape().back();
  float* v = x->data<float>();
  for (int64_t i = 0; i < x->numel(); ++i) v[i] *= ResidualDropoutFactor(dropout, i, hidden);
  return absl::OkStatus();
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
