#include "server/unknown_fields.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"

namespace teserve {
namespace server {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// Specs nest a handful of levels; the bound only guards against pathological input
// (protobuf's parser already limits recursion to 100).
constexpr int kMaxDepth = 64;

absl::Status Walk(const Message& message, const std::string& path, int depth) {
  if (depth > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected at most ", kMaxDepth, " levels of nesting, got more"));
  }
  const Reflection* reflection = message.GetReflection();
  const google::protobuf::UnknownFieldSet& unknown = reflection->GetUnknownFields(message);
  if (unknown.field_count() > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": unknown field number ", unknown.field(0).number(), " (not in ",
        message.GetDescriptor()->full_name(), "; is the client newer than the server?)"));
  }
  std::vector<const FieldDescriptor*> fields;
  reflection->ListFields(message, &fields);
  for (const FieldDescriptor* field : fields) {
    if (field->cpp_type() != FieldDescriptor::CPPTYPE_MESSAGE) continue;
    const std::string child = absl::StrCat(path, ".", field->name());
    if (field->is_repeated()) {
      const int n = reflection->FieldSize(message, field);
      for (int i = 0; i < n; ++i) {
        absl::Status status = Walk(reflection->GetRepeatedMessage(message, field, i),
                                   absl::StrCat(child, "[", i, "]"), depth + 1);
        if (!status.ok()) return status;
      }
    } else {
      absl::Status status = Walk(reflection->GetMessage(message, field), child, depth + 1);
      if (!status.ok()) return status;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RejectUnknownFields(const Message& message, absl::string_view path) {
  return Walk(message, std::string(path), 0);
}

}  // namespace server
}  // namespace teserve
