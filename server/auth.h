// Authentication for teserve: bearer tokens for the gRPC API (token -> tenant) and HTTP
// basic auth for the metrics endpoint.
//
// Token file (--auth_tokens_file): one "<token> <tenant>" pair per line; blank lines and
// lines starting with '#' are ignored. Tokens are 16..4096 printable ASCII characters
// without spaces; tenants are 1..64 characters of [A-Za-z0-9._-]. Several tokens may map
// to one tenant (rotation). The file is read at startup (an error stops the server) and
// again on SIGHUP (an error keeps the tokens already loaded).
//
// Basic-auth file (--metrics_basic_auth_file): one "<user>:<password>" pair per line,
// same comment rules; user without ':' and non-empty password.
//
// Only SHA-256 digests of the secrets are kept in memory, and lookups compare digests,
// so neither timing nor a core dump reveals a token directly. Tokens never appear in
// log lines, error messages or metric labels.
//
// Thread-safety: all methods may be called concurrently (Reload swaps the table under a
// lock).
#ifndef TESERVE_SERVER_AUTH_H_
#define TESERVE_SERVER_AUTH_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace teserve {
namespace server {

// The binary SHA-256 digest of `text` (32 bytes).
std::string Sha256(absl::string_view text);

// digest(token) -> tenant, parsed from the text of a token file. INVALID_ARGUMENT naming
// `path`, the line number and what is wrong (never the token itself).
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseTokenFile(
    absl::string_view text, absl::string_view path);

class TokenAuthenticator {
 public:
  // Reads and parses `path` (see above); an empty file is an error (nobody could call).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Load(const std::string& path);

  // Re-reads the file. On error the loaded tokens stay in force and the error is
  // returned. On success returns OK and the new table replaces the old atomically.
  absl::Status Reload();

  // The tenant of the call whose "authorization" metadata value is `authorization`
  // (nullptr: the call sent none). UNAUTHENTICATED, without echoing the value, when it is
  // missing, not "Bearer <token>", or names no known token.
  absl::StatusOr<std::string> Authenticate(const std::string* authorization) const;

  int64_t size() const;
  const std::string& path() const { return path_; }

 private:
  explicit TokenAuthenticator(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> tenants_ ABSL_GUARDED_BY(mu_);
};

class BasicAuthenticator {
 public:
  static absl::StatusOr<std::unique_ptr<BasicAuthenticator>> Load(const std::string& path);
  absl::Status Reload();
  // Whether an HTTP "Authorization" header value ("Basic base64(user:password)") names a
  // listed user and password.
  bool Check(absl::string_view header_value) const;

 private:
  explicit BasicAuthenticator(std::string path) : path_(std::move(path)) {}

  const std::string path_;
  mutable absl::Mutex mu_;
  absl::flat_hash_set<std::string> digests_ ABSL_GUARDED_BY(mu_);  // Sha256("user:password")
};

// The whole text of `path`; NOT_FOUND / PERMISSION_DENIED etc. naming `flag` and the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag);

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_AUTH_H_
