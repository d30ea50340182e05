#include "core/dtype.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/float_codec.h"

namespace teserve {

int DTypeBits(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 32;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 16;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2:
    case DType::kFloat8E8M0:
    case DType::kBool:
      return 8;
    case DType::kFloat4E2M1:
      return 4;
    case DType::kInt64:
      return 64;
  }
  return 0;
}

absl::StatusOr<int64_t> DTypeStorageBytes(DType dtype, int64_t numel) {
  if (numel < 0) return absl::InvalidArgumentError(absl::StrCat("negative element count ", numel));
  const int bits = DTypeBits(dtype);
  if (numel > std::numeric_limits<int64_t>::max() / bits) {
    return absl::InvalidArgumentError(
        absl::StrCat(numel, " elements of ", DTypeName(dtype), " overflow a 64-bit byte count"));
  }
  return (numel * bits + 7) / 8;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return "FLOAT32";
    case DType::kFloat16: return "FLOAT16";
    case DType::kBFloat16: return "BFLOAT16";
    case DType::kFloat8E4M3: return "FLOAT8_E4M3";
    case DType::kFloat8E5M2: return "FLOAT8_E5M2";
    case DType::kFloat4E2M1: return "FLOAT4_E2M1";
    case DType::kFloat8E8M0: return "FLOAT8_E8M0";
    case DType::kInt32: return "INT32";
    case DType::kInt64: return "INT64";
    case DType::kBool: return "BOOL";
  }
  return "UNKNOWN";
}

bool IsFloat8(DType dtype) {
  return dtype == DType::kFloat8E4M3 || dtype == DType::kFloat8E5M2;
}

bool IsHighPrecisionFloat(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat16 || dtype == DType::kBFloat16;
}

float DTypeMaxFinite(DType dtype) {
  switch (dtype) {
    case DType::kFloat8E4M3: return kE4M3Max;
    case DType::kFloat8E5M2: return kE5M2Max;
    case DType::kFloat4E2M1: return kE2M1Max;
    default: return 0.0f;
  }
}

}  // namespace teserve
