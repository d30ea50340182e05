// Plain-socket HTTP GET on loopback for the metrics tests (no HTTP client library in
// the tree, and the request is one line).
#ifndef TESERVE_TESTS_INTEGRATION_HTTP_GET_H_
#define TESERVE_TESTS_INTEGRATION_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"

namespace teserve {
namespace testing {

// The whole response (status line, headers and body) of GET `path` on 127.0.0.1:port.
absl::StatusOr<std::string> HttpGet(int port, const std::string& path);
// The same with extra request header lines, each ending in "\r\n".
absl::StatusOr<std::string> HttpGet(int port, const std::string& path, const std::string& headers);

// A port that was free a moment ago (bind to 0, read it, close).
absl::StatusOr<int> FreeLoopbackPort();

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_HTTP_GET_H_
