// Checked entry points of kernels/rope.h: validate metadata (FP32 t of rank 4 for
// sbhd/bshd or 3 for thd; FP32 freqs [s2, r] with r even, 0 < r <= d and s2 covering
// every position; INT32 cu_seqlens [batch + 1] starting at 0, non-decreasing, ending at
// most at t's token count; devices; errors name the argument and say expected vs got),
// then dispatch on the Context's device: kernels/cpu, or kernels/cuda when the CUDA
// backend is compiled in (TESERVE_WITH_CUDA; otherwise UNIMPLEMENTED naming the op, after
// the checks, from kernels/dispatch.h). t and freqs live on ctx's device; cu_seqlens is always a host
// tensor, since the checks read its values (the CUDA op copies it to the device).
// The frequency table is computed here on the host (it is small and made once per
// module), in FP32 with the operations TE's RotaryPositionEmbedding uses.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/cpu/rope_cpu.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"
#include "kernels/timing.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/rope/rope_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

// The sequence positions of t must have rows in freqs: the s dimension for sbhd/bshd,
// the longest sequence of cu_seqlens for thd (cu_seqlens already checked).
int64_t PositionsUsed(const Tensor& t, RopeFormat format, const Tensor* cu_seqlens) {
  switch (format) {
    case RopeFormat::kSbhd:
      return t.dim(0);
    case RopeFormat::kBshd:
      return t.dim(1);
    case RopeFormat::kThd:
      break;
  }
  const int32_t* c = cu_seqlens->data<int32_t>();
  int64_t longest = 0;
  for (int64_t k = 0; k + 1 < cu_seqlens->dim(0); ++k) longest = std::max<int64_t>(longest, c[k + 1] - c[k]);
  return longest;
}

absl::Status CheckCuSeqlens(const Tensor* cu_seqlens, int64_t tokens, const Context& ctx) {
  if (cu_seqlens == nullptr) return InvalidField("cu_seqlens", "an INT32 [batch + 1] tensor for thd", "none");
  // Host values for every context (read here and by PositionsUsed).
  RETURN_IF_ERROR(CheckTensor("cu_seqlens", *cu_seqlens, DType::kInt32, 1, Context::Cpu()));
  if (cu_seqlens->dim(0) < 1) return InvalidField("cu_seqlens.shape", "[batch + 1] with batch >= 0", "[0]");
  const int32_t* c = cu_seqlens->data<int32_t>();
  if (c[0] != 0) return InvalidField("cu_seqlens[0]", 0, c[0]);
  for (int64_t k = 1; k < cu_seqlens->dim(0); ++k) {
    if (c[k] < c[k - 1]) {
      return InvalidField(absl::StrCat("cu_seqlens[", k, "]"),
                          absl::StrCat("a value >= cu_seqlens[", k - 1, "] = ", c[k - 1]), c[k]);
    }
  }
  const int64_t last = c[cu_seqlens->dim(0) - 1];
  if (last > tokens) {
    return InvalidField(absl::StrCat("cu_seqlens[", cu_seqlens->dim(0) - 1, "]"),
                        absl::StrCat("at most the token count of t (", tokens, ")"), last);
  }
  return absl::OkStatus();
}

absl::Status CheckRope(absl::string_view name, const Tensor& t, const Tensor& freqs, RopeFormat format,
                       const Tensor* cu_seqlens, const Context& ctx) {
  const int rank = format == RopeFormat::kThd ? 3 : 4;
  RETURN_IF_ERROR(CheckTensor(name, t, DType::kFloat32, rank, ctx));
  if (format == RopeFormat::kThd) RETURN_IF_ERROR(CheckCuSeqlens(cu_seqlens, t.dim(0), ctx));
  RETURN_IF_ERROR(CheckTensor("freqs", freqs, DType::kFloat32, 2, ctx));
  const int64_t r = freqs.dim(1);
  const int64_t d = t.dim(-1);
  if (r == 0 || r % 2 != 0 || r > d) {
    return InvalidField("freqs.shape",
                        absl::StrCat("[s, r] with r even, 0 < r <= ", d, " (the head dimension of ", name, ")"),
                        ShapeToString(freqs.shape()));
  }
  const int64_t positions = PositionsUsed(t, format, cu_seqlens);
  if (freqs.dim(0) < positions) {
    return InvalidField(
        "freqs.shape",
        absl::StrCat("at least ", positions, " rows (one per position of ", name, ", ", RopeFormatName(format), ")"),
        ShapeToString(freqs.shape()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RopeFormat> ParseRopeFormat(absl::string_view name, absl::string_view field) {
  if (name == "sbhd") return RopeFormat::kSbhd;
  if (name == "bshd") return RopeFormat::kBshd;
  if (name == "thd") return RopeFormat::kThd;
  return InvalidField(field, "one of sbhd, bshd, thd", absl::StrCat("'", name, "'"));
}

absl::string_view RopeFormatName(RopeFormat format) {
  switch (format) {
    case RopeFormat::kSbhd:
      return "sbhd";
    case RopeFormat::kBshd:
      return "bshd";
    case RopeFormat::kThd:
      return "thd";
  }
  return "unknown";
}

absl::StatusOr<int64_t> RotaryDim(const RotaryOptions& options, absl::string_view field) {
  if (options.dim <= 0) return InvalidField(absl::StrCat(field, ".dim"), "a value > 0", options.dim);
  if (!std::isfinite(options.rotary_percent) || options.rotary_percent <= 0.0 || options.rotary_percent > 1.0) {
    return InvalidField(absl::StrCat(field, ".rotary_percent"), "a value in (0, 1]", options.rotary_percent);
  }
  if (!std::isfinite(options.rotary_base) || options.rotary_base <= 0.0f) {
    return InvalidField(absl::StrCat(field, ".rotary_base"), "a finite value > 0", options.rotary_base);
  }
  if (!std::isfinite(options.seq_len_interpolation_factor) || options.seq_len_interpolation_factor < 0.0) {
    return InvalidField(absl::StrCat(field, ".seq_len_interpolation_factor"), "a finite value >= 0 (0 = off)",
                        options.seq_len_interpolation_factor);
  }
  if (options.pretrained_max_position_embeddings < 0) {
    return InvalidField(absl::StrCat(field, ".pretrained_max_position_embeddings"), "a value >= 0 (0 = off)",
                        options.pretrained_max_position_embeddings);
  }
  const int64_t r = options.rotary_percent < 1.0
                        ? static_cast<int64_t>(static_cast<double>(options.dim) * options.rotary_percent)
                        : options.dim;
  if (r == 0 || r % 2 != 0) {
    return InvalidField(
        absl::StrCat(field, ".rotary_percent"),
        absl::StrCat("a rotary dimension floor(", options.dim, " * rotary_percent) that is even and > 0"),
        absl::StrCat(r, " (rotary_percent ", options.rotary_percent, ")"));
  }
  return r;
}

absl::StatusOr<Tensor> RotaryFrequencies(const RotaryOptions& options, int64_t max_seq_len, int64_t offset) {
  ASSIGN_OR_RETURN(const int64_t r, RotaryDim(options, "options"));
  if (max_seq_len < 0) return InvalidField("max_seq_len", "a value >= 0", max_seq_len);
  if (offset < 0) return InvalidField("offset", "a value >= 0", offset);
  const int64_t half = r / 2;
  std::vector<float> inv_freq(half);
  for (int64_t i = 0; i < half; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(r);
    inv_freq[i] = 1.0f / std::pow(options.rotary_base, exponent);
  }
  // Position scale (TE's seq_len_interpolation_factor with pretrained_max_position_embeddings).
  float position_scale = 1.0f;
  if (options.seq_len_interpolation_factor > 0.0 && options.pretrained_max_position_embeddings > 0) {
    const double pretrained = static_cast<double>(options.pretrained_max_position_embeddings);
    position_scale = static_cast<float>(max_seq_len > pretrained * options.seq_len_interpolation_factor
                                            ? 1.0 / (static_cast<double>(max_seq_len) / pretrained)
                                            : 1.0 / options.seq_len_interpolation_factor);
  }
  ASSIGN_OR_RETURN(Tensor freqs, Tensor::Zeros(DType::kFloat32, {max_seq_len, r}));
  float* f = freqs.data<float>();
  for (int64_t s = 0; s < max_seq_len; ++s) {
    float position = static_cast<float>(s) + static_cast<float>(offset);
    if (position_scale != 1.0f) position *= position_scale;
    for (int64_t i = 0; i < half; ++i) {
      const float angle = position * inv_freq[i];
      if (options.interleaved) {
        f[s * r + 2 * i] = f[s * r + 2 * i + 1] = angle;
      } else {
        f[s * r + i] = f[s * r + half + i] = angle;
      }
    }
  }
  return freqs;
}

absl::StatusOr<Tensor> RopeForward(const Context& ctx, const Tensor& t, const Tensor& freqs, RopeFormat format,
                                   bool interleaved, const Tensor* cu_seqlens) {
  RETURN_IF_ERROR(CheckRope("t", t, freqs, format, cu_seqlens, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kRopeForward);
  return Dispatch("RopeForward", ctx,
                  [&] { return cpu::RopeForward(ctx, t, freqs, format, interleaved, cu_seqlens); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::RopeForward(ctx, t, freqs, format, interleaved, cu_seqlens);
                  }));
}

absl::StatusOr<Tensor> RopeBackward(const Context& ctx, const Tensor& dy, const Tensor& freqs, RopeFormat format,
                                    bool interleaved, const Tensor* cu_seqlens) {
  RETURN_IF_ERROR(CheckRope("dy", dy, freqs, format, cu_seqlens, ctx));
  ScopedKernelTimer timer(ctx, KernelOp::kRopeBackward);
  return Dispatch("RopeBackward", ctx,
                  [&] { return cpu::RopeBackward(ctx, dy, freqs, format, interleaved, cu_seqlens); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::RopeBackward(ctx, dy, freqs, format, interleaved, cu_seqlens);
                  }));
}

}  // namespace kernels
}  // namespace teserve
