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

SessionRegistry::SessionRegistry(int64_t max_sessions) : max_sessions_(max_sessions) {}

absl::Status SessionRegistry::CapacityLocked() const {
  if (static_cast<int64_t>(sessions_.size()) >= max_sessions_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: expected at most ", max_sessions_, " live sessions (--max_sessions), got ",
        sessions_.size(), " already; delete one first"));
  }
  return absl::OkStatus();
}

absl::Status SessionRegistry::CheckCapacity() const {
  absl::MutexLock lock(&mu_);
  return CapacityLocked();
}

absl::StatusOr<std::string> SessionRegistry::Add(std::shared_ptr<train::Session> session) {
  // The id is drawn outside the lock; a collision (2^-128 per pair) draws again.
  ASSIGN_OR_RETURN(std::string id, NewSessionId());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CapacityLocked());
  while (sessions_.contains(id)) {
    ASSIGN_OR_RETURN(id, NewSessionId());
  }
  sessions_.emplace(id, std::move(session));
  return id;
}

absl::StatusOr<std::shared_ptr<train::Session>> SessionRegistry::Get(absl::string_view id) const {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: expected the id CreateSession returned, got an empty string");
  }
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", Quoted(id)));
  }
  return it->second;
}

absl::Status SessionRegistry::Remove(absl::string_view id) {
  if (id.empty()) {
    return absl::InvalidArgumentError(
        "session_id: expected the id CreateSession returned, got an empty string");
  }
  std::shared_ptr<train::Session> doomed;  // freed after the lock is released
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("session_id: no session ", Quoted(id)));
  }
  doomed = std::move(it->second);
  sessions_.erase(it);
  return absl::OkStatus();
}

std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> SessionRegistry::List()
    const {
  std::vector<std::pair<std::string, std::shared_ptr<train::Session>>> out;
  {
    absl::MutexLock lock(&mu_);
    out.assign(sessions_.begin(), sessions_.end());
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  return out;
}

int64_t SessionRegistry::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(sessions_.size());
}

}  // namespace server
}  // namespace teserve
