// CPU reference RoPE. One token at a time: the cos and sin of its frequency row are
// evaluated once in double and reused for every head; each output channel is one
// two-term sum in double, rounded to FP32. Forward and backward share the loop and
// differ only in the per-channel formula (the rotation or its transpose), so the two
// cannot drift apart in how they walk the layouts.
#include "kernels/cpu/rope_cpu.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/status.h"

namespace teserve {
namespace kernels {
namespace cpu {
namespace {

enum class Direction { kForward, kTranspose };

// Partner channel and sign of channel j within the rotary dims [0, r).
struct Pairing {
  int64_t partner;
  double sign;
};

Pairing PairOf(int64_t j, int64_t r, bool interleaved) {
  if (interleaved) return (j % 2 == 0) ? Pairing{j + 1, -1.0} : Pairing{j - 1, 1.0};
  const int64_t half = r / 2;
  return j < half ? Pairing{j + half, -1.0} : Pairing{j - half, 1.0};
}

// Rotates the `heads` rows of length d at `in` with frequency row `f` into `out`.
void RotateToken(const float* in, float* out, int64_t heads, int64_t d, const std::vector<double>& cos_f,
                 const std::vector<double>& sin_f, bool interleaved, Direction direction) {
  const int64_t r = static_cast<int64_t>(cos_f.size());
  for (int64_t h = 0; h < heads; ++h) {
    const float* x = in + h * d;
    float* y = out + h * d;
    for (int64_t j = 0; j < r; ++j) {
      const Pairing p = PairOf(j, r, interleaved);
      const double rotated = direction == Direction::kForward ? p.sign * x[p.partner] * sin_f[j]
                                                              : -p.sign * x[p.partner] * sin_f[p.partner];
      y[j] = static_cast<float>(x[j] * cos_f[j] + rotated);
    }
    for (int64_t j = r; j < d; ++j) y[j] = x[j];
  }
}

absl::StatusOr<Tensor> Apply(const Tensor& t, const Tensor& freqs, RopeFormat format, bool interleaved,
                             const Tensor* cu_seqlens, Direction direction) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, t.shape()));
  const int64_t d = t.dim(-1);
  const int64_t heads = t.dim(-2);
  const int64_t r = freqs.dim(1);
  const int64_t token_size = heads * d;
  std::vector<double> cos_f(r), sin_f(r);
  auto rotate = [&](int64_t token, int64_t pos) {
    const float* f = freqs.data<float>() + pos * r;
    for (int64_t j = 0; j < r; ++j) {
      cos_f[j] = std::cos(static_cast<double>(f[j]));
      sin_f[j] = std::sin(static_cast<double>(f[j]));
    }
    RotateToken(t.data<float>() + token * token_size, out.data<float>() + token * token_size, heads, d, cos_f, sin_f,
                interleaved, direction);
  };

  switch (format) {
    case RopeFormat::kSbhd:
      for (int64_t s = 0; s < t.dim(0); ++s) {
        for (int64_t b = 0; b < t.dim(1); ++b) rotate(s * t.dim(1) + b, s);
      }
      break;
    case RopeFormat::kBshd:
      for (int64_t b = 0; b < t.dim(0); ++b) {
        for (int64_t s = 0; s < t.dim(1); ++s) rotate(b * t.dim(1) + s, s);
      }
      break;
    case RopeFormat::kThd: {
      const int32_t* c = cu_seqlens->data<int32_t>();
      const int64_t batch = cu_seqlens->dim(0) - 1;
      for (int64_t k = 0; k < batch; ++k) {
        for (int64_t i = c[k]; i < c[k + 1]; ++i) rotate(i, i - c[k]);
      }
      // Padding tokens after the last sequence are copied unchanged.
      const int64_t end = batch >= 0 ? c[batch] : 0;
      if (end < t.dim(0)) {
        std::memcpy(out.data<float>() + end * token_size, t.data<float>() + end * token_size,
                    sizeof(float) * (t.dim(0) - end) * token_size);
      }
      break;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<Tensor> RopeForward(const Context&, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens) {
  return Apply(t, freqs, format, interleaved, cu_seqlens, Direction::kForward);
}

absl::StatusOr<Tensor> RopeBackward(const Context&, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens) {
  return Apply(dy, freqs, format, interleaved, cu_seqlens, Direction::kTranspose);
}

}  // namespace cpu
}  // namespace kernels
}  // namespace teserve
