// Status helpers used on every host path: RETURN_IF_ERROR / ASSIGN_OR_RETURN in the
// style of ABSL's internal macros, and small builders for the error messages teserve
// promises (name the field, say expected vs got).
#ifndef TESERVE_CORE_STATUS_H_
#define TESERVE_CORE_STATUS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

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

}  // namespace teserve

#endif  // TESERVE_CORE_STATUS_H_
