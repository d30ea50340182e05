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

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
