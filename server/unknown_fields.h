// Rejects fields a message carries that this server's schema does not know.
//
// proto3 keeps unknown fields silently; for specs that would mean a newer client's
// "use MXFP8" arriving here as "no recipe" and training in high precision without a
// word. So CreateSession refuses them, naming where they sit.
#ifndef TESERVE_SERVER_UNKNOWN_FIELDS_H_
#define TESERVE_SERVER_UNKNOWN_FIELDS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

namespace teserve {
namespace server {

// OK, or INVALID_ARGUMENT for the first unknown field found in `message` or any message
// below it, e.g. "recipe.delayed: unknown field number 99 (not in
// teserve.v1.DelayedScaling; is the client newer than the server?)". `path` names
// `message` itself ("recipe").
absl::Status RejectUnknownFields(const google::protobuf::Message& message,
                                 absl::string_view path);

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_UNKNOWN_FIELDS_H_
