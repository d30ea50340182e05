#include "kernels/tensor_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace teserve {
namespace kernels {

absl::Status CheckDefined(absl::string_view name, const Tensor& t) {
  if (t.defined()) return absl::OkStatus();
  return InvalidField(name, "a tensor", "an undefined tensor");
}

absl::Status CheckDType(absl::string_view name, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".dtype"), DTypeName(dtype), DTypeName(t.dtype()));
}

absl::Status CheckRank(absl::string_view name, const Tensor& t, int rank) {
  if (t.rank() == rank) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".shape"), absl::StrCat("rank ", rank),
                      absl::StrCat(ShapeToString(t.shape()), " (rank ", t.rank(), ")"));
}

absl::Status CheckShape(absl::string_view name, const Tensor& t, const Shape& expected) {
  if (t.shape() == expected) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".shape"), ShapeToString(expected),
                      ShapeToString(t.shape()));
}

absl::Status CheckDevice(absl::string_view name, const Tensor& t, const Context& ctx) {
  if (t.device() == ctx.device) return absl::OkStatus();
  return InvalidField(absl::StrCat(name, ".device"), ctx.device.ToString(), t.device().ToString());
}

absl::Status CheckTensor(absl::string_view name, const Tensor& t, DType dtype, int rank,
                         const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined(name, t));
  RETURN_IF_ERROR(CheckDType(name, t, dtype));
  if (rank != kAnyRank) RETURN_IF_ERROR(CheckRank(name, t, rank));
  return CheckDevice(name, t, ctx);
}

absl::Status CheckTensorOfShape(absl::string_view name, const Tensor& t, DType dtype,
                                const Shape& expected, const Context& ctx) {
  RETURN_IF_ERROR(CheckDefined(name, t));
  RETURN_IF_ERROR(CheckDType(name, t, dtype));
  RETURN_IF_ERROR(CheckShape(name, t, expected));
  return CheckDevice(name, t, ctx);
}

absl::Status CheckFloat8(absl::string_view field, DType format) {
  if (IsFloat8(format)) return absl::OkStatus();
  return InvalidField(field, kFloat8Formats, DTypeName(format));
}

absl::Status CheckDequantizeOutput(DType out_dtype) {
  if (out_dtype == DType::kFloat32 || out_dtype == DType::kBFloat16) return absl::OkStatus();
  return InvalidField("out_dtype", "FLOAT32 or BFLOAT16", DTypeName(out_dtype));
}

absl::Status CheckCopiesRequested(absl::string_view field, bool rowwise, bool columnwise) {
  if (rowwise || columnwise) return absl::OkStatus();
  return InvalidField(field, "rowwise and/or columnwise", "neither");
}

absl::Status CheckFinitePositive(absl::string_view field, float value) {
  if (std::isfinite(value) && value > 0.0f) return absl::OkStatus();
  return InvalidField(field, "a finite positive value", value);
}

absl::Status CheckFiniteNonNegative(absl::string_view field, float value) {
  if (std::isfinite(value) && value >= 0.0f) return absl::OkStatus();
  return InvalidField(field, "a finite value >= 0", value);
}

QuantizedCopy SelectCopy(const QuantizedTensor& q, Copy copy) {
  if (copy == Copy::kRowwise) {
    return QuantizedCopy{"q.rowwise_data", "q.rowwise_scale_inv", q.rowwise_data,
                         q.rowwise_scale_inv, q.rows(), q.cols()};
  }
  return QuantizedCopy{"q.columnwise_data", "q.columnwise_scale_inv", q.columnwise_data,
                       q.columnwise_scale_inv, q.cols(), q.rows()};
}

}  // namespace kernels
}  // namespace teserve
