// Multi-tensor optimizer steps over FP32 master weights (PyTorch's update rules):
//   SGD:   g' = g + weight_decay p; with momentum, buf = momentum buf + (1 - dampening) g'
//          (buf = g' on step 1), g' = nesterov ? g' + momentum buf : buf; p -= lr g'.
//   AdamW: p *= 1 - lr weight_decay (decoupled); m = b1 m + (1 - b1) g;
//          v = b2 v + (1 - b2) g^2; p -= (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// The exact FP32 operation order is kernels/optimizer_math.h; the CPU reference and the
// CUDA kernels evaluate it identically, so their results are bit-identical.
//
// Each OptimizerTensor names one parameter's buffers: param, grad and the state tensors
// FP32 of one shape on the Context's device; an optional model copy of that shape is
// rewritten from the updated master weight: BF16 or FP16 (round to nearest even, as
// kernels::Convert rounds) or FP8 E4M3/E5M2 codes satfinite(p * model_copy_scale). The CUDA backend updates every
// tensor of the list in one launch. `step` counts from 1. Errors are INVALID_ARGUMENT
// naming the tensor ("tensors[2].exp_avg.shape: expected [4, 8], got [8, 4]").
#ifndef TESERVE_KERNELS_OPTIMIZER_H_
#define TESERVE_KERNELS_OPTIMIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/optimizer_math.h"

namespace teserve {
namespace kernels {

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

struct SgdOptions {
  float lr = 1e-3f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};

struct OptimizerTensor {
  Tensor* param = nullptr;       // FP32, updated in place
  const Tensor* grad = nullptr;  // FP32
  Tensor* exp_avg = nullptr;     // AdamW first moment; SGD momentum buffer (null without momentum)
  Tensor* exp_avg_sq = nullptr;  // AdamW second moment (unused by SGD)
  Tensor* model_copy = nullptr;  // optional BF16 / FLOAT16 / FLOAT8_E4M3 / FLOAT8_E5M2
  float model_copy_scale = 1.0f; // FP8 copies only: finite and > 0
};

// The per-step scalars both backends use (bias corrections with std::pow in FP32).
optimizer_math::AdamWScalars AdamWScalarsForStep(const AdamWOptions& options, int64_t step);
optimizer_math::SgdScalars SgdScalarsForStep(const SgdOptions& options, int64_t step);

absl::Status AdamWStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                       const AdamWOptions& options, int64_t step);

absl::Status SgdStep(const Context& ctx, absl::Span<const OptimizerTensor> tensors,
                     const SgdOptions& options, int64_t step);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_OPTIMIZER_H_
