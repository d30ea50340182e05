#include "server/session_registry.h"

#include <fcntl.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace teserve {
namespace server {
namespace {

absl::Status ReadUrandom(char* out, size_t size) {
  const int fd = ::open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("session id: no randomness: getrandom(2) is missing and /dev/urandom failed to open: ",
                     std::strerror(errno)));
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd, out + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : EIO;
      ::close(fd);
      return absl::UnavailableError(
          absl::StrCat("session id: no randomness: reading /dev/urandom failed: ", std::strerror(error)));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::Status SecureRandomBytes(void* out, size_t size) {
  char* bytes = static_cast<char*>(out);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::getrandom(bytes + done, size - done, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == ENOSYS) return ReadUrandom(bytes + done, size - done);
      return absl::UnavailableError(
          absl::StrCat("session id: no randomness: getrandom(2) failed: ", std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> NewSessionId() {
  char bytes[kSessionIdBytes];
  RETURN_IF_ERROR(SecureRandomBytes(bytes, sizeof(bytes)));
  return absl::BytesToHexString(absl::string_view(bytes, sizeof(bytes)));
}

SessionRegistry::SessionRegistry(int64_t max_sessions)
    : SessionRegistry(RegistryLimits{max_sessions, 0}) {}

SessionRegistry::SessionRegistry(RegistryLimits limits) : limits_(limits) {}

int64_t SessionRegistry::max_sessions_per_tenant() const {
  return limits_.max_sessions_per_tenant > 0 ? limits_.max_sessions_per_tenant : limits_.max_sessions;
}

int64_t SessionRegistry::CountLocked(absl::string_view tenant) const {
  int64_t count = 0;
  for (const auto& [id, entry] : sessions_) count += entry.tenant == tenant ? 1 : 0;
  return count;
}

absl::Status SessionRegistry::CapacityLocked(absl::string_view tenant) const {
  if (static_cast<int64_t>(sessions_.size()) >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: expected at most ", limits_.max_sessions, " live sessions (--max_sessions), got ",
        sessions_.size(), " already; delete one first"));
  }
  if (limits_.max_sessions_per_tenant > 0) {
    const int64_t mine = CountLocked(tenant);
    if (mine >= limits_.max_sessions_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "sessions: expected at most ", limits_.max_sessions_per_tenant,
          " live sessions per tenant (--max_sessions_per_tenant), got ", mine,
          " already for this tenant; delete one first"));
    }
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::CheckCapacity(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  return CapacityLocked(tenant);
}

absl::StatusOr<std::string> SessionRegistry::Add(std::shared_ptr<train::Session> session,
                                                 absl::string_view tenant, int64_t memory_bytes) {
  // The id is drawn outside the lock; a collision (2^-128 per pair) draws again.
  ASSIGN_OR_RETURN(std::string id, NewSessionId());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CapacityLocked(tenant));
  while (sessions_.contains(id)) {
    ASSIGN_OR_RETURN(id, NewSessionId());
  }
  Entry entry;
  entry.session = std::move(session);
  entry.tenant = std::string(tenant);
  entry.memory_bytes = memory_bytes;
  entry.last_used = absl::Now();
  sessions_.emplace(id, std::move(entry));
  return id;
}

absl::StatusOr<std::shared_ptr<train::Session>> SessionRegistry::Get(absl::string_view id,
                                                                     absl::string_view tenant) const {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: expected the id CreateSession returned, got an empty string");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  // Another tenant's session reads exactly like a missing one.
  if (it == sessions_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", Quoted(id)));
  }
  it->second.last_used = absl::Now();
  return it->second.session;
}

absl::Status SessionRegistry::Remove(absl::string_view id, absl::string_view tenant) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: expected the id CreateSession returned, got an empty string");
  }
  std::shared_ptr<train::Session> doomed;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second.tenant != tenant) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", Quoted(id)));
  }
  doomed = std::move(it->second.session);
  sessions_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> SessionRegistry::List(
    absl::string_view tenant) const {
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : sessions_) {
      if (entry.tenant == tenant) out.emplace_back(id, entry.session);
    }
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> SessionRegistry::ListAll() const {
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, entry] : sessions_) out.emplace_back(id, entry.session);
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> SessionRegistry::RemoveIdle(
    absl::Duration idle, absl::Time now) {
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> removed;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      // use_count 1: only the registry holds it, so no call is using the session now.
      if (now - it->second.last_used >= idle && it->second.session.use_count() == 1) {
        removed.emplace_back(it->first, std::move(it->second.session));
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  std::sort(removed.begin(), removed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  return removed;
}

int64_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

int64_t SessionRegistry::size_of(absl::string_view tenant) const {
  absl::MutexLock lock(&mu_);
  return CountLocked(tenant);
}

int64_t SessionRegistry::committed_bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t total = 0;
  for (const auto& [id, entry] : sessions_) total += entry.memory_bytes;
  return total;
}

}  // namespace server
}  // namespace teserve
