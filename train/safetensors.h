// The safetensors file format (https://github.com/huggingface/safetensors), written and
// read without the library:
//   8 bytes   N, the header length, unsigned little-endian
//   N bytes   a JSON object: {"__metadata__": {"k": "v", ...},
//                             "<name>": {"dtype": "F32", "shape": [2, 3],
//                                        "data_offsets": [begin, end]}, ...}
//             padded with spaces to a multiple of 8 (so the data is 8-byte aligned)
//   the data  each tensor's row-major little-endian bytes at [begin, end) of this part,
//             packed back to back in header order, nothing before, between or after.
// The Python package (safetensors.numpy.load_file, safe_open) reads what EncodeSafetensors
// writes. Dtypes: F32, F16, BF16, I32, I64, BOOL (the core dtypes with a safetensors
// name).
//
// DecodeSafetensors trusts nothing: every length, offset and shape is checked against the
// bytes present (no read past the end, no overflow, no overlap or gap between tensors,
// no trailing bytes) and errors are DATA_LOSS messages that start with `file` and say
// what is wrong ("parameters.safetensors: truncated: ...").
#ifndef TESERVE_TRAIN_SAFETENSORS_H_
#define TESERVE_TRAIN_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/named_tensor.h"

namespace teserve {
namespace train {

// The largest header DecodeSafetensors accepts (the Python package's limit too).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;  // "__metadata__"
  std::vector<NamedTensor> tensors;             // CPU tensors, in data order
};

// `tensors` must be CPU tensors of a dtype listed above with distinct names;
// INVALID_ARGUMENT otherwise.
absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata);

// Parses a whole file's bytes (see above for the checks).
absl::StatusOr<SafetensorsFile> DecodeSafetensors(absl::string_view bytes, absl::string_view file);

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_SAFETENSORS_H_
