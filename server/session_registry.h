// The live sessions of one server, by id.
//
// Ownership: the registry holds one shared_ptr per session; RPC handlers take their own
// reference for the duration of a call, so DeleteSession never frees a session that an
// in-flight Forward is still using (the last reference frees it).
// Thread-safety: all methods may be called concurrently.
#ifndef TESERVE_SERVER_SESSION_REGISTRY_H_
#define TESERVE_SERVER_SESSION_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "train/session.h"

namespace teserve {
namespace server {

// The length of a session id: kSessionIdBytes random bytes from the OS CSPRNG
// (getrandom(2), else /dev/urandom), as lowercase hex.
inline constexpr int kSessionIdBytes = 16;  // 128 bits
inline constexpr int kSessionIdLength = 2 * kSessionIdBytes;

// Fills `out` with `size` bytes from the kernel's CSPRNG: getrandom(2), or /dev/urandom
// where the syscall is missing. UNAVAILABLE (with errno's text) when neither works;
// never aborts.
absl::Status SecureRandomBytes(void* out, size_t size);
// A fresh id: kSessionIdLength lowercase hex digits ([0-9a-f]) from SecureRandomBytes.
absl::StatusOr<std::string> NewSessionId();

class SessionRegistry {
 public:
  // Ids are 128 random bits from the OS CSPRNG, so they can't be guessed from other ids;
  // still not a credential (anyone who sees one can use it): no substitute for
  // authentication.
  explicit SessionRegistry(int64_t max_sessions);

  // RESOURCE_EXHAUSTED (naming the limit) when max_sessions are live. Cheap; callers
  // check before building a session so a full server rejects without doing the work.
  absl::Status CheckCapacity() const;
  // Registers `session` under a fresh random id (NewSessionId: 32 hex digits) and returns
  // the id. Re-checks the limit, since another CreateSession may have won the race;
  // UNAVAILABLE when the OS gives no randomness.
  absl::StatusOr<std::string> Add(std::shared_ptr<train::Session> session);
  // NOT_FOUND "session_id: no session 'xyz'" (a long id quoted truncated, core/status.h
  // Quoted); INVALID_ARGUMENT for an empty id.
  absl::StatusOr<std::shared_ptr<train::Session>> Get(absl::string_view id) const;
  absl::Status Remove(absl::string_view id);
  // Sorted by id, so listings are stable.
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> List() const;

  int64_t size() const;
  int64_t max_sessions() const { return max_sessions_; }

 private:
  absl::Status CapacityLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t max_sessions_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<train::Session>> sessions_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_SESSION_REGISTRY_H_
