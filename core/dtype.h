// Element types teserve stores and moves over the wire.
#ifndef TESERVE_CORE_DTYPE_H_
#define TESERVE_CORE_DTYPE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace teserve {

enum class DType : int {
  kFloat32,
  kFloat16,
  kBFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kFloat4E2M1,  // packed two per byte, element 2i in the low nibble
  kFloat8E8M0,
  kInt32,
  kInt64,
  kBool,
};

// Bits per element (4 for kFloat4E2M1).
int DTypeBits(DType dtype);

// Bytes needed for `numel` elements; packed FP4 rounds up to whole bytes.
// Fails when the product overflows int64.
absl::StatusOr<int64_t> DTypeStorageBytes(DType dtype, int64_t numel);

// "FLOAT32", "FLOAT8_E4M3", ... (the wire enum names).
absl::string_view DTypeName(DType dtype);

bool IsFloat8(DType dtype);
bool IsHighPrecisionFloat(DType dtype);  // FP32, FP16, BF16

// Largest finite value of a floating format (FP8/FP4); 0 for others.
float DTypeMaxFinite(DType dtype);

}  // namespace teserve

#endif  // TESERVE_CORE_DTYPE_H_
