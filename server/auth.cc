#include "server/auth.h"

#include <openssl/sha.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace teserve {
namespace server {
namespace {

constexpr size_t kMinTokenLength = 16;
constexpr size_t kMaxTokenLength = 4096;
constexpr size_t kMaxTenantLength = 64;

bool ValidTenant(absl::string_view tenant) {
  if (tenant.empty() || tenant.size() > kMaxTenantLength) return false;
  for (char c : tenant) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') {
      return false;
    }
  }
  return true;
}

bool ValidToken(absl::string_view token) {
  if (token.size() < kMinTokenLength || token.size() > kMaxTokenLength) return false;
  for (char c : token) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

// The non-comment, non-blank lines of `text` with their 1-based numbers.
std::vector<std::pair<int, absl::string_view>> ContentLines(absl::string_view text) {
  std::vector<std::pair<int, absl::string_view>> out;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    out.emplace_back(number, line);
  }
  return out;
}

absl::StatusOr<absl::flat_hash_set<std::string>> ParseBasicAuthFile(absl::string_view text,
                                                                     absl::string_view path) {
  absl::flat_hash_set<std::string> digests;
  for (const auto& [number, line] : ContentLines(text)) {
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || colon == 0 || colon + 1 == line.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_basic_auth_file ", path, ":", number,
          ": expected \"<user>:<password>\" with a non-empty user and password"));
    }
    digests.insert(Sha256(line));
  }
  if (digests.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics_basic_auth_file ", path,
                                                   ": expected at least one \"<user>:<password>\" line, got none"));
  }
  return digests;
}

}  // namespace

std::string Sha256(absl::string_view text) {
  unsigned char digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return std::string(reinterpret_cast<const char*>(digest), sizeof(digest));
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path, absl::string_view flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    return absl::NotFoundError(absl::StrCat(flag, ": cannot read '", path, "': ", std::strerror(error)));
  }
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

absl::StatusOr<absl::flat_hash_map<std::string, std::string>> ParseTokenFile(
    absl::string_view text, absl::string_view path) {
  absl::flat_hash_map<std::string, std::string> tenants;
  for (const auto& [number, line] : ContentLines(text)) {
    std::vector<absl::string_view> fields =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    const std::string where = absl::StrCat("--auth_tokens_file ", path, ":", number, ": ");
    if (fields.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "expected \"<token> <tenant>\", got ", fields.size(), " field(s)"));
    }
    if (!ValidToken(fields[0])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected a token of ", kMinTokenLength, "..", kMaxTokenLength,
          " printable ASCII characters without spaces, got one of ", fields[0].size(), " characters"));
    }
    if (!ValidTenant(fields[1])) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, "expected a tenant of 1..", kMaxTenantLength, " characters [A-Za-z0-9._-]"));
    }
    if (!tenants.emplace(Sha256(fields[0]), std::string(fields[1])).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, "expected each token once, got a repeated token"));
    }
  }
  if (tenants.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--auth_tokens_file ", path, ": expected at least one \"<token> <tenant>\" line, got none"));
  }
  return tenants;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Load(const std::string& path) {
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(path));
  absl::Status loaded = auth->Reload();
  if (!loaded.ok()) return loaded;
  return auth;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<std::string> text = ReadSecretFile(path_, "--auth_tokens_file");
  if (!text.ok()) return text.status();
  absl::StatusOr<absl::flat_hash_map<std::string, std::string>> parsed = ParseTokenFile(*text, path_);
  if (!parsed.ok()) return parsed.status();
  absl::MutexLock lock(&mu_);
  tenants_ = std::move(*parsed);
  return absl::OkStatus();
}

absl::StatusOr<std::string> TokenAuthenticator::Authenticate(const std::string* authorization) const {
  if (authorization == nullptr) {
    return absl::UnauthenticatedError(
        "authorization: expected \"Bearer <token>\" call metadata, got none");
  }
  absl::string_view value = *authorization;
  // RFC 6750: the scheme is case-insensitive.
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError(
        "authorization: expected \"Bearer <token>\" call metadata, got another scheme");
  }
  value = absl::StripLeadingAsciiWhitespace(value.substr(7));
  const std::string digest = Sha256(value);
  absl::MutexLock lock(&mu_);
  auto it = tenants_.find(digest);
  if (it == tenants_.end()) {
    return absl::UnauthenticatedError("authorization: the bearer token is not valid");
  }
  return it->second;
}

int64_t TokenAuthenticator::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tenants_.size());
}

absl::StatusOr<std::unique_ptr<BasicAuthenticator>> BasicAuthenticator::Load(const std::string& path) {
  std::unique_ptr<BasicAuthenticator> auth(new BasicAuthenticator(path));
  absl::Status loaded = auth->Reload();
  if (!loaded.ok()) return loaded;
  return auth;
}

absl::Status BasicAuthenticator::Reload() {
  absl::StatusOr<std::string> text = ReadSecretFile(path_, "--metrics_basic_auth_file");
  if (!text.ok()) return text.status();
  absl::StatusOr<absl::flat_hash_set<std::string>> parsed = ParseBasicAuthFile(*text, path_);
  if (!parsed.ok()) return parsed.status();
  absl::MutexLock lock(&mu_);
  digests_ = std::move(*parsed);
  return absl::OkStatus();
}

bool BasicAuthenticator::Check(absl::string_view header_value) const {
  header_value = absl::StripAsciiWhitespace(header_value);
  if (header_value.size() < 6 || !absl::EqualsIgnoreCase(header_value.substr(0, 6), "basic ")) {
    return false;
  }
  std::string decoded;
  if (!absl::Base64Unescape(absl::StripAsciiWhitespace(header_value.substr(6)), &decoded)) return false;
  const std::string digest = Sha256(decoded);
  absl::MutexLock lock(&mu_);
  return digests_.contains(digest);
}

}  // namespace server
}  // namespace teserve
