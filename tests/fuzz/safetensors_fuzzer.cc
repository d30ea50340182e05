// train::DecodeSafetensors on arbitrary bytes: the parser a checkpoint's four
// .safetensors files go through before their checksum is checked (train/checkpoint.cc),
// so it sees whatever is on disk.
//
// Invariants besides "no crash, no sanitizer report": every error is DATA_LOSS and
// starts with the file name; a file that decodes re-encodes (EncodeSafetensors) into one
// that decodes to the same metadata and tensors, and encoding that again gives the same
// bytes.
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "tests/fuzz/fuzz_support.h"
#include "train/safetensors.h"

namespace teserve {
namespace {

constexpr absl::string_view kFile = "fuzz.safetensors";

void CheckSame(const train::SafetensorsFile& a, const train::SafetensorsFile& b) {
  FUZZ_CHECK(a.metadata == b.metadata, "metadata changed in a round trip");
  FUZZ_CHECK(a.tensors.size() == b.tensors.size(), "tensor count changed in a round trip");
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor& x = a.tensors[i].tensor;
    const Tensor& y = b.tensors[i].tensor;
    FUZZ_CHECK(a.tensors[i].name == b.tensors[i].name, "name changed: " + a.tensors[i].name);
    FUZZ_CHECK(x.dtype() == y.dtype() && x.shape() == y.shape() && x.nbytes() == y.nbytes(),
               "dtype or shape changed: " + a.tensors[i].name);
    FUZZ_CHECK(x.nbytes() == 0 || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) == 0,
               "data changed: " + a.tensors[i].name);
  }
}

}  // namespace
}  // namespace teserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace teserve;
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<train::SafetensorsFile> decoded = train::DecodeSafetensors(bytes, kFile);
  if (!decoded.ok()) {
    FUZZ_CHECK(decoded.status().code() == absl::StatusCode::kDataLoss, decoded.status().ToString());
    FUZZ_CHECK(absl::StartsWith(decoded.status().message(), absl::StrCat(kFile, ": ")),
               decoded.status().ToString());
    return 0;
  }
  absl::StatusOr<std::string> encoded = train::EncodeSafetensors(decoded->tensors, decoded->metadata);
  FUZZ_CHECK(encoded.ok(), "a decoded file does not encode: " + encoded.status().ToString());
  absl::StatusOr<train::SafetensorsFile> again = train::DecodeSafetensors(*encoded, kFile);
  FUZZ_CHECK(again.ok(), "an encoded file does not decode: " + again.status().ToString());
  CheckSame(*decoded, *again);
  absl::StatusOr<std::string> reencoded = train::EncodeSafetensors(again->tensors, again->metadata);
  FUZZ_CHECK(reencoded.ok() && *reencoded == *encoded, "encoding is not stable");
  return 0;
}
