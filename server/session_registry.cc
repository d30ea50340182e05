#include "server/session_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace teserve {
namespace server {

SessionRegistry::SessionRegistry(int64_t max_sessions) : max_sessions_(max_sessions) {
  std::random_device entropy;
  std::seed_seq seed{entropy(), entropy(), entropy(), entropy()};
  id_bits_.seed(seed);
}

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
  absl::MutexLock lock(&mu_);
  absl::Status capacity = CapacityLocked();
  if (!capacity.ok()) return capacity;
  std::string id;
  do {
    id = absl::StrFormat("%016x", id_bits_());
  } while (sessions_.contains(id));
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
    return absl::NotFoundError(absl::StrCat("session_id: no session '", id, "'"));
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
    return absl::NotFoundError(absl::StrCat("session_id: no session '", id, "'"));
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
