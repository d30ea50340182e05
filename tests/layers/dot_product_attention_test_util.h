// Helpers shared by dot_product_attention_test.cc and dot_product_attention_errors_test.cc:
// INT32 (cu_seqlens) and BOOL (mask) side-input tensors and the small layer's options.
#ifndef TESERVE_TESTS_LAYERS_DOT_PRODUCT_ATTENTION_TEST_UTIL_H_
#define TESERVE_TESTS_LAYERS_DOT_PRODUCT_ATTENTION_TEST_UTIL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention.h"
#include "layers/dot_product_attention.h"

namespace teserve {
namespace layers {
namespace testing_dpa {

inline Tensor Int32Tensor(const std::vector<int32_t>& values) {
  Tensor t = Tensor::Zeros(DType::kInt32, {static_cast<int64_t>(values.size())}).value();
  std::copy(values.begin(), values.end(), t.data<int32_t>());
  return t;
}

// BOOL tensor of `shape` from 0/1 values.
inline Tensor BoolTensor(const Shape& shape, const std::vector<int>& values) {
  Tensor t = Tensor::Zeros(DType::kBool, shape).value();
  for (size_t i = 0; i < values.size(); ++i) t.data<uint8_t>()[i] = values[i] != 0;
  return t;
}

// [B, 1, 1, S] padding mask with the given real lengths (right padding).
inline Tensor PaddingMask(int64_t seq, const std::vector<int>& lengths) {
  std::vector<int> values;
  for (int len : lengths) {
    for (int64_t j = 0; j < seq; ++j) values.push_back(j >= len ? 1 : 0);
  }
  return BoolTensor({static_cast<int64_t>(lengths.size()), 1, 1, seq}, values);
}

inline DotProductAttentionOptions Options(kernels::QkvFormat format, kernels::AttnMaskType mask, int64_t heads = 2,
                                          int64_t groups = 0, int64_t channels = 4) {
  DotProductAttentionOptions o;
  o.num_attention_heads = heads;
  o.num_gqa_groups = groups;
  o.kv_channels = channels;
  o.qkv_format = format;
  o.attn_mask_type = mask;
  return o;
}

}  // namespace testing_dpa
}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_TESTS_LAYERS_DOT_PRODUCT_ATTENTION_TEST_UTIL_H_
