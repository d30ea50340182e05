// Status helpers used on every host path: RETURN_IF_ERROR / ASSIGN_OR_RETURN in the
// style of ABSL's internal macros, and small builders for the error messages teserve
// promises (name the field, say expected vs got).
#ifndef TESERVE_CORE_STATUS_H_
#define TESERVE_CORE_STATUS_H_

#include <cstddef>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#define TESERVE_STATUS_CONCAT_INNER_(a, b) a##b
#define TESERVE_STATUS_CONCAT_(a, b) TESERVE_STATUS_CONCAT_INNER_(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                         \
  do {                                                \
    ::absl::Status teserve_status_ = (expr);          \
    if (!teserve_status_.ok()) return teserve_status_; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error
// returns its status, else moves the value into `lhs` (which may be a declaration).
#define ASSIGN_OR_RETURN(lhs, expr) \
  TESERVE_ASSIGN_OR_RETURN_IMPL_(TESERVE_STATUS_CONCAT_(teserve_statusor_, __LINE__), lhs, expr)

#define TESERVE_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                   \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

namespace teserve {

// Prefixes a non-OK status's message with context ("in layer 'fc1': ...").
inline absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// INVALID_ARGUMENT naming `field`, with what was expected and what arrived.
template <typename Expected, typename Got>
absl::Status InvalidField(absl::string_view field, const Expected& expected, const Got& got) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": expected ", expected, ", got ", got));
}

// Text from a client, quoted for an error message. Short text comes back as 'text';
// longer text as its first kQuotedMaxBytes bytes (never splitting a UTF-8 sequence),
// an ellipsis and the original length: 'abc...' (200000 bytes). Every message that
// echoes a session id, name or other request string goes through this, so a huge input
// gives a short error (not gRPC's metadata-limit RESOURCE_EXHAUSTED).
inline constexpr size_t kQuotedMaxBytes = 128;
inline std::string Quoted(absl::string_view client_text) {
  if (client_text.size() <= kQuotedMaxBytes) return absl::StrCat("'", client_text, "'");
  size_t cut = kQuotedMaxBytes;
  // Back up over UTF-8 continuation bytes (10xxxxxx) so the prefix ends on a boundary.
  while (cut > 0 && (static_cast<unsigned char>(client_text[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat("'", client_text.substr(0, cut), "...' (", client_text.size(), " bytes)");
}

// The backstop for messages built from many pieces (lists of names, nested
// annotations): a message longer than kMaxStatusMessageBytes keeps its first bytes and
// says how long it was. ToGrpcStatus applies it to every status the server sends.
inline constexpr size_t kMaxStatusMessageBytes = 4096;
inline std::string BoundedMessage(absl::string_view message) {
  if (message.size() <= kMaxStatusMessageBytes) return std::string(message);
  size_t cut = kMaxStatusMessageBytes - 64;
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;
  return absl::StrCat(message.substr(0, cut), "... (message truncated, ", message.size(), " bytes in all)");
}

}  // namespace teserve

#endif  // TESERVE_CORE_STATUS_H_
