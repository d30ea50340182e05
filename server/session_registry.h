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
#include "absl/time/clock.h"
#include "absl/time/time.h"
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

struct RegistryLimits {
  int64_t max_sessions = 64;             // --max_sessions
  int64_t max_sessions_per_tenant = 0;   // --max_sessions_per_tenant; 0: max_sessions
};

class SessionRegistry {
 public:
  // Ids are 128 random bits from the OS CSPRNG, so they can't be guessed from other ids;
  // still not a credential (anyone who sees one can use it): the owning tenant is
  // checked on every lookup (see Get).
  explicit SessionRegistry(int64_t max_sessions);
  explicit SessionRegistry(RegistryLimits limits);

  // RESOURCE_EXHAUSTED (naming the limit) when max_sessions are live, or `tenant` holds
  // its quota. Cheap; callers check before building a session so a full server rejects
  // without doing the work.
  absl::Status CheckCapacity(absl::string_view tenant) const;
  // Registers `session` for `tenant` under a fresh random id (NewSessionId: 32 hex
  // digits) and returns the id. `memory_bytes` is the admission estimate (CreateSession),
  // counted in committed_bytes() while the session lives. Re-checks the limits, since
  // another CreateSession may have won the race; UNAVAILABLE when the OS gives no
  // randomness.
  absl::StatusOr<std::string> Add(std::shared_ptr<train::Session> session,
                                  absl::string_view tenant, int64_t memory_bytes);
  // NOT_FOUND "session_id: no session 'xyz'" (a long id quoted truncated, core/status.h
  // Quoted) for an unknown id and for another tenant's session alike, so ids of other
  // tenants can't even be confirmed; INVALID_ARGUMENT for an empty id. Marks the session
  // used now (idle expiry).
  absl::StatusOr<std::shared_ptr<train::Session>> Get(absl::string_view id,
                                                      absl::string_view tenant) const;
  absl::Status Remove(absl::string_view id, absl::string_view tenant);
  // `tenant`'s sessions, sorted by id, so listings are stable.
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> List(
      absl::string_view tenant) const;
  // Every tenant's sessions (shutdown).
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> ListAll() const;
  // Removes the sessions not used for `idle` or longer (as of `now`) and not in use by a
  // call right now; returns them, sorted by id (the caller's references are then the
  // last: no call can reach them any more).
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> RemoveIdle(absl::Duration idle,
                                                                                  absl::Time now);

  int64_t size() const;
  int64_t size_of(absl::string_view tenant) const;
  // The sum of the admission estimates of the live sessions.
  int64_t committed_bytes() const;
  int64_t max_sessions() const { return limits_.max_sessions; }
  int64_t max_sessions_per_tenant() const;

 private:
  struct Entry {
    std::shared_ptr<train::Session> session;
    std::string tenant;
    int64_t memory_bytes = 0;
    mutable absl::Time last_used;
  };
  absl::Status CapacityLocked(absl::string_view tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t CountLocked(absl::string_view tenant) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RegistryLimits limits_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> sessions_ ABSL_GUARDED_BY(mu_);
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_SESSION_REGISTRY_H_
