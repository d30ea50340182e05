// A tensor with its name: what GetParameters returns and what checkpoints store.
#ifndef TESERVE_TRAIN_NAMED_TENSOR_H_
#define TESERVE_TRAIN_NAMED_TENSOR_H_

#include <string>

#include "core/tensor.h"

namespace teserve {
namespace train {

struct NamedTensor {
  std::string name;
  Tensor tensor;
};

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_NAMED_TENSOR_H_
