// Metadata checks shared by the checked entry points in //kernels (cast, gemm,
// normalization, block_quantize, nvfp4, hadamard). Each returns OK or INVALID_ARGUMENT
// through InvalidField, naming the argument (and its .dtype/.shape/.device) and saying
// expected vs got; tests match these messages, so the wording is part of the contract.
#ifndef TESERVE_KERNELS_TENSOR_CHECKS_H_
#define TESERVE_KERNELS_TENSOR_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/quantized_tensor.h"
#include "core/tensor.h"
#include "kernels/cast.h"

namespace teserve {
namespace kernels {

// For CheckTensor: accept any rank.
inline constexpr int kAnyRank = -1;

// The accepted FP8 formats, as error messages name them.
inline constexpr char kFloat8Formats[] = "FLOAT8_E4M3 or FLOAT8_E5M2";

absl::Status CheckDefined(absl::string_view name, const Tensor& t);
absl::Status CheckDType(absl::string_view name, const Tensor& t, DType dtype);
absl::Status CheckRank(absl::string_view name, const Tensor& t, int rank);
absl::Status CheckShape(absl::string_view name, const Tensor& t, const Shape& expected);
// On the Context's device: nothing in //kernels copies between devices.
absl::Status CheckDevice(absl::string_view name, const Tensor& t, const Context& ctx);

// Defined, of `dtype`, of `rank` (kAnyRank: any) and on the Context's device.
absl::Status CheckTensor(absl::string_view name, const Tensor& t, DType dtype, int rank,
                         const Context& ctx);
// Defined, of `dtype`, of shape `expected` and on the Context's device.
absl::Status CheckTensorOfShape(absl::string_view name, const Tensor& t, DType dtype,
                                const Shape& expected, const Context& ctx);

// `field` is FLOAT8_E4M3 or FLOAT8_E5M2.
absl::Status CheckFloat8(absl::string_view field, DType format);
// At least one of the two copies of a quantization is requested (`field` names the options).
absl::Status CheckCopiesRequested(absl::string_view field, bool rowwise, bool columnwise);
absl::Status CheckFinitePositive(absl::string_view field, float value);
absl::Status CheckFiniteNonNegative(absl::string_view field, float value);
// The dtype a block / NVFP4 dequantization writes: FLOAT32 or BFLOAT16 ("out_dtype").
absl::Status CheckDequantizeOutput(DType out_dtype);

// One copy of a QuantizedTensor of rank 2, with the field names its errors use.
struct QuantizedCopy {
  const char* data_name;   // "q.rowwise_data" or "q.columnwise_data"
  const char* scale_name;  // "q.rowwise_scale_inv" or "q.columnwise_scale_inv"
  const Tensor& data;
  const Tensor& scale_inv;
  int64_t rows;  // of the copy: q's cols for the columnwise copy
  int64_t cols;
};
QuantizedCopy SelectCopy(const QuantizedTensor& q, Copy copy);

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_TENSOR_CHECKS_H_
