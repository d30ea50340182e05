#include "train/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace teserve {
namespace train {
namespace {

constexpr char kMetadataKey[] = "__metadata__";

struct DTypeCode {
  DType dtype;
  const char* code;
};
constexpr DTypeCode kCodes[] = {
    {DType::kFloat32, "F32"}, {DType::kFloat16, "F16"}, {DType::kBFloat16, "BF16"},
    {DType::kInt32, "I32"},   {DType::kInt64, "I64"},   {DType::kBool, "BOOL"},
};

const char* CodeOf(DType dtype) {
  for (const DTypeCode& c : kCodes) {
    if (c.dtype == dtype) return c.code;
  }
  return nullptr;
}

bool DTypeOf(absl::string_view code, DType* dtype) {
  for (const DTypeCode& c : kCodes) {
    if (code == c.code) {
      *dtype = c.dtype;
      return true;
    }
  }
  return false;
}

// A JSON string literal.
// Appends s as a JSON string to *out.
void AppendJsonString(absl::string_view s, std::string* out_ptr) {
  std::string& out = *out_ptr;
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

std::string JsonString(absl::string_view s) {
  std::string out;
  AppendJsonString(s, &out);
  return out;
}

absl::Status Corrupt(absl::string_view file, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(file, ": ", what));
}

// A JSON number that is an exact non-negative integer (< 2^53, where doubles are exact).
bool ToIndex(const google::protobuf::Value& v, uint64_t* out) {
  if (v.kind_case() != google::protobuf::Value::kNumberValue) return false;
  const double d = v.number_value();
  if (!(d >= 0.0) || d > 9007199254740992.0 || std::floor(d) != d) return false;
  *out = static_cast<uint64_t>(d);
  return true;
}

struct Entry {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

}  // namespace

absl::StatusOr<std::string> EncodeSafetensors(const std::vector<NamedTensor>& tensors,
                                              const std::map<std::string, std::string>& metadata) {
  std::string header = "{";
  bool first = true;
  if (!metadata.empty()) {
    header += absl::StrCat(JsonString(kMetadataKey), ":{");
    bool first_meta = true;
    for (const auto& [key, value] : metadata) {
      if (!first_meta) header += ",";
      first_meta = false;
      header += absl::StrCat(JsonString(key), ":", JsonString(value));
    }
    header += "}";
    first = false;
  }
  // A state holds ~60 small tensors per layer (amax histories, scales): the header is
  // built in place, with no temporary string per tensor.
  absl::flat_hash_set<absl::string_view> names;
  names.reserve(tensors.size());
  header.reserve(header.size() + tensors.size() * 96);
  uint64_t offset = 0;
  for (const NamedTensor& t : tensors) {
    const char* code = CodeOf(t.tensor.dtype());
    if (code == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors: ", t.name, ": dtype ", DTypeName(t.tensor.dtype()), " has no safetensors name"));
    }
    if (!t.tensor.device().is_cpu()) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: ", t.name, ": expected a CPU tensor, got one on ",
                                                     t.tensor.device().ToString()));
    }
    if (t.name.empty() || t.name == kMetadataKey || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors: tensor name '", t.name, "' is empty, reserved or repeated"));
    }
    const uint64_t end = offset + static_cast<uint64_t>(t.tensor.nbytes());
    if (!first) header += ',';
    first = false;
    AppendJsonString(t.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", code, "\",\"shape\":[");
    for (size_t i = 0; i < t.tensor.shape().size(); ++i) {
      if (i > 0) header += ',';
      absl::StrAppend(&header, t.tensor.shape()[i]);
    }
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", end, "]}");
    offset = end;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');

  std::string out;
  out.reserve(8 + header.size() + offset);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xFF));
  out += header;
  for (const NamedTensor& t : tensors) {
    out.append(static_cast<const char*>(t.tensor.raw_data()), static_cast<size_t>(t.tensor.nbytes()));
  }
  return out;
}

absl::StatusOr<SafetensorsFile> DecodeSafetensors(absl::string_view bytes, absl::string_view file) {
  if (bytes.size() < 8) {
    return Corrupt(file, absl::StrCat("truncated: ", bytes.size(),
                                      " bytes, shorter than the 8-byte header length of a safetensors file"));
  }
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > kMaxSafetensorsHeaderBytes) {
    return Corrupt(file, absl::StrCat("not a safetensors file: its first 8 bytes give a header of ", n,
                                      " bytes (at most ", kMaxSafetensorsHeaderBytes, ")"));
  }
  if (n > bytes.size() - 8) {
    return Corrupt(file, absl::StrCat("truncated: the header needs ", n, " bytes but only ", bytes.size() - 8,
                                      " follow the length"));
  }
  const absl::string_view json = bytes.substr(8, n);
  if (json.empty() || json[0] != '{') {
    return Corrupt(file, "not a safetensors file: the header is not a JSON object");
  }
  google::protobuf::Struct header;
  google::protobuf::util::JsonParseOptions options;
  const auto parsed = google::protobuf::util::JsonStringToMessage(std::string(json), &header, options);
  if (!parsed.ok()) {
    return Corrupt(file, absl::StrCat("the header is not valid JSON (", std::string(parsed.message()), ")"));
  }

  SafetensorsFile out;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.fields()) {
    if (name == kMetadataKey) {
      if (value.kind_case() != google::protobuf::Value::kStructValue) {
        return Corrupt(file, "__metadata__: expected an object of strings");
      }
      for (const auto& [key, v] : value.struct_value().fields()) {
        if (v.kind_case() != google::protobuf::Value::kStringValue) {
          return Corrupt(file, absl::StrCat("__metadata__.", key, ": expected a string"));
        }
        out.metadata[key] = v.string_value();
      }
      continue;
    }
    const std::string where = absl::StrCat("tensor '", name, "'");
    if (value.kind_case() != google::protobuf::Value::kStructValue) {
      return Corrupt(file, absl::StrCat(where, ": expected an object with dtype, shape and data_offsets"));
    }
    const auto& fields = value.struct_value().fields();
    Entry e;
    e.name = name;
    for (const auto& [key, v] : fields) {
      if (key != "dtype" && key != "shape" && key != "data_offsets") {
        return Corrupt(file, absl::StrCat(where, ": unexpected key '", key, "'"));
      }
    }
    auto dtype = fields.find("dtype");
    if (dtype == fields.end() || dtype->second.kind_case() != google::protobuf::Value::kStringValue) {
      return Corrupt(file, absl::StrCat(where, ": dtype missing or not a string"));
    }
    if (!DTypeOf(dtype->second.string_value(), &e.dtype)) {
      return Corrupt(file, absl::StrCat(where, ": unsupported dtype '", dtype->second.string_value(),
                                        "' (expected F32, F16, BF16, I32, I64 or BOOL)"));
    }
    auto shape = fields.find("shape");
    if (shape == fields.end() || shape->second.kind_case() != google::protobuf::Value::kListValue) {
      return Corrupt(file, absl::StrCat(where, ": shape missing or not a list"));
    }
    for (const google::protobuf::Value& d : shape->second.list_value().values()) {
      uint64_t dim = 0;
      if (!ToIndex(d, &dim)) return Corrupt(file, absl::StrCat(where, ": shape has an entry that is not a size"));
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    auto offsets = fields.find("data_offsets");
    if (offsets == fields.end() || offsets->second.kind_case() != google::protobuf::Value::kListValue ||
        offsets->second.list_value().values_size() != 2 ||
        !ToIndex(offsets->second.list_value().values(0), &e.begin) ||
        !ToIndex(offsets->second.list_value().values(1), &e.end) || e.end < e.begin) {
      return Corrupt(file, absl::StrCat(where, ": data_offsets must be [begin, end] with begin <= end"));
    }
    absl::StatusOr<int64_t> numel = CheckedNumElements(e.shape, "shape");
    if (!numel.ok()) return Corrupt(file, absl::StrCat(where, ": shape ", ShapeToString(e.shape), " overflows"));
    absl::StatusOr<int64_t> nbytes = DTypeStorageBytes(e.dtype, *numel);
    if (!nbytes.ok() || static_cast<uint64_t>(*nbytes) != e.end - e.begin) {
      return Corrupt(file, absl::StrCat(where, ": data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin,
                                        " bytes, but ", dtype->second.string_value(), " ", ShapeToString(e.shape),
                                        " needs ", nbytes.ok() ? absl::StrCat(*nbytes) : "more"));
    }
    entries.push_back(std::move(e));
  }

  // Back to back from 0, covering the data exactly.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t data_size = bytes.size() - 8 - n;
  uint64_t expected = 0;
  for (const Entry& e : entries) {
    if (e.begin != expected) {
      return Corrupt(file, absl::StrCat("tensor '", e.name, "': data starts at ", e.begin, ", expected ", expected,
                                        " (tensors must be packed without gaps or overlap)"));
    }
    expected = e.end;
  }
  if (expected > data_size) {
    return Corrupt(file, absl::StrCat("truncated: the tensors need ", expected, " bytes of data but only ", data_size,
                                      " are present"));
  }
  if (expected < data_size) {
    return Corrupt(file, absl::StrCat(data_size - expected, " unexpected bytes after the tensor data"));
  }
  const char* data = bytes.data() + 8 + n;
  for (const Entry& e : entries) {
    ASSIGN_OR_RETURN(Tensor t, Tensor::Zeros(e.dtype, e.shape));
    if (e.end > e.begin) std::memcpy(t.raw_data(), data + e.begin, e.end - e.begin);
    out.tensors.push_back(NamedTensor{e.name, std::move(t)});
  }
  return out;
}

}  // namespace train
}  // namespace teserve
