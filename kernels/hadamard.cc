// Checked entry points and the CPU reference of kernels/hadamard.h. The transform is
// small and memory-bound, so the reference is a straight loop over 16-element tiles
// with the butterfly order the header specifies; no separate kernels/cpu file. CUDA
// tensors go to kernels/cuda/nvfp4/nvfp4_cuda.h when the CUDA backend is compiled in, else
// UNIMPLEMENTED (kernels/dispatch.h).
#include "kernels/hadamard.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/nvfp4/nvfp4_cuda.h"
#endif

namespace teserve {
namespace kernels {
namespace {

enum class Direction { kForward, kInverse };

// Unnormalized Walsh-Hadamard butterflies in Sylvester (natural) order.
void Butterflies(float* w) {
  for (int h = 1; h < kHadamardSize; h *= 2) {
    for (int i = 0; i < kHadamardSize; ++i) {
      if ((i & h) != 0) continue;
      const float a = w[i];
      const float b = w[i + h];
      w[i] = a + b;
      w[i + h] = a - b;
    }
  }
}

void TransformTile(const float* in, float* out, Direction direction) {
  float w[kHadamardSize];
  for (int j = 0; j < kHadamardSize; ++j) {
    w[j] = direction == Direction::kForward ? kHadamardSigns[j] * in[j] : in[j];
  }
  Butterflies(w);
  for (int j = 0; j < kHadamardSize; ++j) {
    const float scaled = w[j] * 0.25f;
    out[j] = direction == Direction::kForward ? scaled : kHadamardSigns[j] * scaled;
  }
}

absl::Status CheckInput(absl::string_view name, const Tensor& x, const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined(name, x));
  RETURN_IF_ERROR(CheckDType(name, x, DType::kFloat32));
  if (x.rank() != 2) {
    return InvalidField(absl::StrCat(name, ".shape"), "rank 2", ShapeToString(x.shape()));
  }
  if (x.dim(1) % kHadamardSize != 0) {
    return InvalidField(absl::StrCat(name, ".shape[1]"),
                        "a multiple of 16 (the Hadamard tiles run along it)", x.dim(1));
  }
  return CheckDevice(name, x, ctx);
}

absl::StatusOr<Tensor> TransformCpu(const Tensor& x, Direction direction) {
  ASSIGN_OR_RETURN(Tensor out, Tensor::Zeros(DType::kFloat32, x.shape()));
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  for (int64_t t = 0; t < x.numel() / kHadamardSize; ++t) {
    TransformTile(src + t * kHadamardSize, dst + t * kHadamardSize, direction);
  }
  return out;
}

absl::StatusOr<Tensor> Transform(const Context& ctx, const Tensor& x, Direction direction,
                                 absl::string_view name, absl::string_view op) {
  RETURN_IF_ERROR(CheckInput(name, x, ctx));
  return Dispatch(op, ctx, [&] { return TransformCpu(x, direction); },
                  TESERVE_CUDA_KERNEL([&] {
                    return cuda::ApplyHadamard16(ctx, x, direction == Direction::kInverse);
                  }));
}

}  // namespace

absl::StatusOr<Tensor> ApplyHadamard16(const Context& ctx, const Tensor& x) {
  return Transform(ctx, x, Direction::kForward, "x", "ApplyHadamard16");
}

absl::StatusOr<Tensor> ApplyInverseHadamard16(const Context& ctx, const Tensor& y) {
  return Transform(ctx, y, Direction::kInverse, "y", "ApplyInverseHadamard16");
}

}  // namespace kernels
}  // namespace teserve
