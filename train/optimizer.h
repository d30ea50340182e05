// Optimizers over FP32 master weights, with PyTorch's update rules:
//   SGD:   g = grad + weight_decay * p; with momentum, buf = momentum * buf +
//          (1 - dampening) * g (buf = g on the first step), g = nesterov ? g + momentum *
//          buf : buf; p -= lr * g.
//   AdamW: p *= 1 - lr * weight_decay (decoupled); m = b1 m + (1 - b1) g;
//          v = b2 v + (1 - b2) g^2; p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// The per-element math is kernels/optimizer.h's (AdamWStep / SgdStep), on the CPU
// reference or the multi-tensor CUDA kernels, whichever device the session lives on. Gradient clipping by global L2 norm happens in
// the Session before Apply.
#ifndef TESERVE_TRAIN_OPTIMIZER_H_
#define TESERVE_TRAIN_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/context.h"
#include "layers/module.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // One update of every parameter from its gradient on ctx's device (where the
  // parameters and the optimizer state live); `step` counts from 1. The parameter list
  // and the Context's device must be the same on every call.
  virtual absl::Status Apply(const Context& ctx, const std::vector<layers::Parameter*>& params, int64_t step) = 0;
  // Bytes of the state buffers allocated so far (momentum, Adam moments).
  virtual int64_t StateBytes() const = 0;

  // The per-parameter state buffers by name ("momentum" for SGD with momentum;
  // "exp_avg" and "exp_avg_sq" for AdamW; none for plain SGD). Each vector is empty until
  // the first Apply fills it with one FP32 tensor per parameter (the parameter's shape,
  // on the parameters' device); a vector emptied again is zero-filled anew on the next
  // Apply. Checkpoints read and write them; the step count is the session's.
  struct StateBuffer {
    std::string name;
    std::vector<Tensor>* tensors;
  };
  virtual std::vector<StateBuffer> StateBuffers() = 0;
};

// Validates the spec (INVALID_ARGUMENT naming "optimizer.<field>").
absl::StatusOr<std::unique_ptr<Optimizer>> OptimizerFromProto(const v1::OptimizerSpec& spec);

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_OPTIMIZER_H_
