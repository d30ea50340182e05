// A real Prometheus server for the integration tests: the `prometheus` binary of the
// Debian package (tools/install_deps.sh), started as a child process on a loopback port
// with its own configuration and TSDB directory, queried through its HTTP API
// (/api/v1/...) and stopped (SIGTERM, then SIGKILL) when destroyed.
//
// JSON answers are parsed into google.protobuf.Struct / Value (protobuf's JSON parser),
// so the tests need no JSON library.
#ifndef TESERVE_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_
#define TESERVE_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_

#include <sys/types.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/struct.pb.h"

namespace teserve {
namespace testing {

inline constexpr char kPrometheusBinary[] = "/usr/bin/prometheus";
inline constexpr char kPromtoolBinary[] = "/usr/bin/promtool";

// FAILED_PRECONDITION saying how to install the package when `binary` is not an
// executable file.
absl::Status CheckExecutable(const std::string& binary);

// Exit status and combined stdout/stderr of `argv` (no shell).
struct CommandResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;
};
CommandResult RunCommand(const std::vector<std::string>& argv);

// One sample of an instant-query vector.
struct Sample {
  std::map<std::string, std::string> labels;  // __name__ included when Prometheus kept it
  double value = 0.0;
};

class PrometheusServer {
 public:
  // Writes `config_yaml` to dir/prometheus.yml and starts
  //   prometheus --config.file=dir/prometheus.yml --storage.tsdb.path=dir/data
  //              --web.listen-address=127.0.0.1:<free port>
  // (log in dir/prometheus.log), then waits up to `ready_timeout` for /-/ready.
  static absl::StatusOr<std::unique_ptr<PrometheusServer>> Start(
      const std::string& dir, const std::string& config_yaml,
      absl::Duration ready_timeout = absl::Seconds(30));
  ~PrometheusServer();  // stops the child and reaps it

  int port() const { return port_; }
  // The tail of the server's log, for failure messages.
  std::string LogTail(size_t max_bytes = 4000) const;

  // Body of GET `path_and_query` (HTTP 200 only; chunked bodies decoded).
  absl::StatusOr<std::string> Get(const std::string& path_and_query) const;
  // GET and parse a JSON answer of the HTTP API; non-"success" is an error carrying
  // Prometheus's errorType and error.
  absl::StatusOr<google::protobuf::Struct> ApiGet(const std::string& path_and_query) const;

  // /api/v1/query at the current time: the "data" object ({resultType, result}).
  absl::StatusOr<google::protobuf::Struct> QueryData(const std::string& promql) const;
  // The same, requiring an instant vector; its samples.
  absl::StatusOr<std::vector<Sample>> QueryVector(const std::string& promql) const;

  // Waits until the latest scrape of `job` started after `after` (Unix time), then
  // `extra_scrapes` more; DEADLINE_EXCEEDED after `timeout`.
  absl::Status WaitForScrapeAfter(const std::string& job, absl::Time after, int extra_scrapes,
                                  absl::Duration timeout) const;

 private:
  PrometheusServer(pid_t pid, int port, std::string log_path)
      : pid_(pid), port_(port), log_path_(std::move(log_path)) {}

  pid_t pid_;
  int port_;
  std::string log_path_;
};

// Percent-encodes everything but RFC 3986 unreserved characters.
std::string UrlEncode(const std::string& text);

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_PROMETHEUS_SERVER_H_
