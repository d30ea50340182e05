// Wire tensors (teserve.v1.Tensor) <-> core Tensors, at the RPC edge.
//
// Decoding validates everything a client controls before any byte is touched, in this
// order, so the first problem reported is the most basic one:
//   1. dtype is a known, accepted element type (not DTYPE_UNSPECIFIED),
//   2. every dim is non-negative and the element count fits in int64,
//   3. data holds exactly shape x element-size bytes,
// then converts the accepted high-precision types to FP32 (what sessions compute in).
// Every error is INVALID_ARGUMENT and names the field, e.g.
//   "inputs[0].data: expected 24 bytes (shape [2, 3] x FLOAT32), got 20".
// Raw data is little-endian like the wire; teserve only builds for little-endian hosts.
#ifndef TESERVE_SERVER_TENSOR_CODEC_H_
#define TESERVE_SERVER_TENSOR_CODEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "layers/module.h"
#include "google/protobuf/repeated_field.h"
#include "teserve/v1/tensor.pb.h"

namespace teserve {
namespace server {

// Core <-> wire element types. FromWire fails (naming `field`) for UNSPECIFIED and for
// values this build does not know.
absl::StatusOr<DType> DTypeFromWire(int wire, absl::string_view field);
v1::DType DTypeToWire(DType dtype);

// Where a decoded tensor's bytes live: ordinary host memory, or page-locked memory for
// a tensor on its way to a GPU (Tensor::EmptyPinnedHost: the copy to the device then runs
// at full bus speed from the bytes the decoder wrote, with no staging copy).
enum class HostMemory { kPageable, kPinned };

// Decodes one tensor whose dtype is FLOAT32, BFLOAT16 or FLOAT16 into a new FP32 CPU
// tensor (the result owns its bytes; `wire` may be freed afterwards): one pass from the
// wire bytes into the result. `field` prefixes error messages ("inputs[0]").
absl::StatusOr<Tensor> DecodeFloatTensor(const v1::Tensor& wire, absl::string_view field,
                                         HostMemory memory = HostMemory::kPageable);

// DecodeFloatTensor over a repeated field; element i is named "<field>[i]".
absl::StatusOr<std::vector<Tensor>> DecodeFloatTensors(
    const google::protobuf::RepeatedPtrField<v1::Tensor>& wire, absl::string_view field,
    HostMemory memory = HostMemory::kPageable);

// One tensor of any accepted element type: FLOAT32 / BFLOAT16 / FLOAT16 decode to FP32,
// INT32 / INT64 / BOOL stay as they are; other dtypes are rejected naming `field`.
absl::StatusOr<Tensor> DecodeTensor(const v1::Tensor& wire, absl::string_view field);

// Side inputs by name ("side_inputs.<name>" in errors), each decoded by DecodeTensor;
// repeated names are rejected.
absl::StatusOr<layers::SideInputs> DecodeSideInputs(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& wire);

// Writes `tensor` (a CPU tensor of any dtype) to the wire as raw bytes.
absl::Status EncodeTensor(const Tensor& tensor, v1::Tensor* wire);

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_TENSOR_CODEC_H_
