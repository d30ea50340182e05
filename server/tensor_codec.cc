#include "server/tensor_codec.h"

#include <cstdint>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "core/float_codec.h"
#include "core/status.h"

namespace teserve {
namespace server {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "wire tensors are little-endian and copied raw");

constexpr char kAcceptedFloatTypes[] = "one of FLOAT32, BFLOAT16, FLOAT16";

// "INT32", or the number for values outside the enum (proto3 enums are open).
std::string WireDTypeName(int wire) {
  if (v1::DType_IsValid(wire)) return v1::DType_Name(static_cast<v1::DType>(wire));
  return absl::StrCat(wire, " (not a teserve.v1.DType)");
}

}  // namespace

absl::StatusOr<DType> DTypeFromWire(int wire, absl::string_view field) {
  switch (wire) {
    case v1::FLOAT32: return DType::kFloat32;
    case v1::FLOAT16: return DType::kFloat16;
    case v1::BFLOAT16: return DType::kBFloat16;
    case v1::FLOAT8_E4M3: return DType::kFloat8E4M3;
    case v1::FLOAT8_E5M2: return DType::kFloat8E5M2;
    case v1::FLOAT4_E2M1: return DType::kFloat4E2M1;
    case v1::FLOAT8_E8M0: return DType::kFloat8E8M0;
    case v1::INT32: return DType::kInt32;
    case v1::INT64: return DType::kInt64;
    case v1::BOOL: return DType::kBool;
    default:
      return InvalidField(field, "a teserve.v1.DType other than DTYPE_UNSPECIFIED",
                          WireDTypeName(wire));
  }
}

v1::DType DTypeToWire(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return v1::FLOAT32;
    case DType::kFloat16: return v1::FLOAT16;
    case DType::kBFloat16: return v1::BFLOAT16;
    case DType::kFloat8E4M3: return v1::FLOAT8_E4M3;
    case DType::kFloat8E5M2: return v1::FLOAT8_E5M2;
    case DType::kFloat4E2M1: return v1::FLOAT4_E2M1;
    case DType::kFloat8E8M0: return v1::FLOAT8_E8M0;
    case DType::kInt32: return v1::INT32;
    case DType::kInt64: return v1::INT64;
    case DType::kBool: return v1::BOOL;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<Tensor> DecodeFloatTensor(const v1::Tensor& wire, absl::string_view field, HostMemory memory) {
  const std::string dtype_field = absl::StrCat(field, ".dtype");
  const int wire_dtype = wire.dtype();
  if (wire_dtype != v1::FLOAT32 && wire_dtype != v1::BFLOAT16 && wire_dtype != v1::FLOAT16) {
    return InvalidField(dtype_field, kAcceptedFloatTypes, WireDTypeName(wire_dtype));
  }
  ASSIGN_OR_RETURN(const DType dtype, DTypeFromWire(wire_dtype, dtype_field));

  const std::string shape_field = absl::StrCat(field, ".shape");
  Shape shape(wire.shape().begin(), wire.shape().end());
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumElements(shape, shape_field));
  absl::StatusOr<int64_t> nbytes = DTypeStorageBytes(dtype, numel);
  if (!nbytes.ok()) {
    return InvalidField(shape_field,
                        absl::StrCat("a size that fits in int64 bytes of ", DTypeName(dtype)),
                        absl::StrCat(ShapeToString(shape), " (", numel, " elements)"));
  }

  const int64_t got = static_cast<int64_t>(wire.data().size());
  if (got != *nbytes) {
    return InvalidField(absl::StrCat(field, ".data"),
                        absl::StrCat(*nbytes, " bytes (shape ", ShapeToString(shape), " x ",
                                     DTypeName(dtype), ")"),
                        got);
  }

  // Into a buffer we own, widened on the way: protobuf's string storage has no alignment
  // promise and must not be kept alive by a session.
  ASSIGN_OR_RETURN(Tensor out, memory == HostMemory::kPinned
                                   ? Tensor::EmptyPinnedHost(DType::kFloat32, shape)
                                   : Tensor::Empty(DType::kFloat32, shape, Device::Cpu(), nullptr));
  const char* bytes = wire.data().data();
  float* dst = out.data<float>();
  if (dtype == DType::kFloat32) {
    if (got > 0) std::memcpy(dst, bytes, static_cast<size_t>(got));
    return out;
  }
  const bool bf16 = dtype == DType::kBFloat16;
  for (int64_t i = 0; i < numel; ++i) {
    uint16_t code;
    std::memcpy(&code, bytes + 2 * i, sizeof(code));
    dst[i] = bf16 ? Bf16ToFloat(code) : Fp16ToFloat(code);
  }
  return out;
}

absl::StatusOr<std::vector<Tensor>> DecodeFloatTensors(
    const google::protobuf::RepeatedPtrField<v1::Tensor>& wire, absl::string_view field, HostMemory memory) {
  std::vector<Tensor> out;
  out.reserve(wire.size());
  for (int i = 0; i < wire.size(); ++i) {
    ASSIGN_OR_RETURN(Tensor t, DecodeFloatTensor(wire.Get(i), absl::StrCat(field, "[", i, "]"), memory));
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<Tensor> DecodeTensor(const v1::Tensor& t, absl::string_view field) {
  const int dtype = t.dtype();
  if (dtype == v1::FLOAT32 || dtype == v1::BFLOAT16 || dtype == v1::FLOAT16) return DecodeFloatTensor(t, field);
  if (dtype != v1::INT32 && dtype != v1::INT64 && dtype != v1::BOOL) {
    return InvalidField(absl::StrCat(field, ".dtype"), "one of FLOAT32, BFLOAT16, FLOAT16, INT32, INT64, BOOL",
                        WireDTypeName(dtype));
  }
  ASSIGN_OR_RETURN(const DType core_dtype, DTypeFromWire(dtype, absl::StrCat(field, ".dtype")));
  const std::string shape_field = absl::StrCat(field, ".shape");
  Shape shape(t.shape().begin(), t.shape().end());
  ASSIGN_OR_RETURN(const int64_t numel, CheckedNumElements(shape, shape_field));
  absl::StatusOr<int64_t> nbytes = DTypeStorageBytes(core_dtype, numel);
  if (!nbytes.ok()) return InvalidField(shape_field, "a size that fits in int64 bytes", ShapeToString(shape));
  if (static_cast<int64_t>(t.data().size()) != *nbytes) {
    return InvalidField(absl::StrCat(field, ".data"),
                        absl::StrCat(*nbytes, " bytes (shape ", ShapeToString(shape), " x ", DTypeName(core_dtype), ")"),
                        t.data().size());
  }
  ASSIGN_OR_RETURN(Tensor value, Tensor::Zeros(core_dtype, shape));
  if (*nbytes > 0) std::memcpy(value.raw_data(), t.data().data(), static_cast<size_t>(*nbytes));
  return value;
}

absl::StatusOr<layers::SideInputs> DecodeSideInputs(
    const google::protobuf::RepeatedPtrField<v1::NamedTensor>& wire) {
  layers::SideInputs side;
  for (int i = 0; i < wire.size(); ++i) {
    const v1::NamedTensor& named = wire.Get(i);
    const std::string field = absl::StrCat("side_inputs.", named.name());
    if (named.name().empty()) return InvalidField(absl::StrCat("side_inputs[", i, "].name"), "a name", "''");
    if (side.Find(named.name()) != nullptr) return InvalidField(field, "each name once", "a repeated name");
    ASSIGN_OR_RETURN(Tensor value, DecodeTensor(named.tensor(), field));
    side.Set(named.name(), std::move(value));
  }
  return side;
}

absl::Status EncodeTensor(const Tensor& tensor, v1::Tensor* wire) {
  if (!tensor.defined()) return absl::InternalError("EncodeTensor: undefined tensor");
  if (!tensor.device().is_cpu()) {
    return absl::InternalError(absl::StrCat("EncodeTensor: tensor on ",
                                            tensor.device().ToString(),
                                            "; only CPU tensors are encoded"));
  }
  wire->Clear();
  wire->set_dtype(DTypeToWire(tensor.dtype()));
  for (int64_t d : tensor.shape()) wire->add_shape(d);
  wire->set_data(static_cast<const char*>(tensor.raw_data()),
                 static_cast<size_t>(tensor.nbytes()));
  return absl::OkStatus();
}

}  // namespace server
}  // namespace teserve
