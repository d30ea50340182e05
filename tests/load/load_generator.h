// A load generator for a running teserve server: N concurrent clients, each on its own
// session of small layers, repeating Forward -> Backward -> Step and ForwardBackward ->
// Step for a set duration, while a sampler reads the server's resident memory
// (VmRSS in /proc/<pid>/status). Reports p50 / p99 latency per RPC, every error, and
// how much the server's memory grew after the warm-up.
//
// Used by load_test.cc against the real binary (tests/integration/server_process.h);
// the library itself needs only the address and, for the memory samples, the pid.
#ifndef TESERVE_TESTS_LOAD_LOAD_GENERATOR_H_
#define TESERVE_TESTS_LOAD_LOAD_GENERATOR_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace teserve {
namespace load {

struct LoadOptions {
  int clients = 32;
  absl::Duration duration = absl::Seconds(60);
  // The first `warmup_fraction` of the duration warms up: its latencies are not counted
  // and the memory growth is measured from the RSS at its end.
  double warmup_fraction = 0.25;
  absl::Duration rss_interval = absl::Milliseconds(200);
  // A client deletes its session and creates a fresh one after this many iterations
  // (session churn: creation, deletion and metric series are part of the load); 0 never.
  int recreate_every = 100;
  int64_t batch = 32;  // rows per Forward / ForwardBackward
  absl::Duration rpc_timeout = absl::Seconds(60);
};

// Latencies of one RPC method after the warm-up.
struct MethodStats {
  std::string method;
  int64_t calls = 0;  // successful calls after the warm-up
  double p50_ms = 0.0;
  double p99_ms = 0.0;
  double max_ms = 0.0;
};

struct LoadReport {
  std::vector<MethodStats> methods;  // in a fixed order: Forward, Backward, ForwardBackward, Step, ...
  int64_t iterations = 0;            // training iterations of all clients (whole run)
  int64_t error_count = 0;           // failed calls of all methods (whole run)
  std::vector<std::string> errors;   // the first few, "Forward: DEADLINE_EXCEEDED: ..."
  absl::Duration measured;           // the window after the warm-up
  // Server RSS in KiB: at the start, at the end of the warm-up, the highest after it,
  // and the last sample. rss_growth = (peak - warm) / warm.
  int64_t rss_start_kb = 0;
  int64_t rss_warm_kb = 0;
  int64_t rss_peak_kb = 0;
  int64_t rss_final_kb = 0;
  double rss_growth = 0.0;
  int64_t rss_samples = 0;
};

// VmRSS of process `pid` in KiB, from /proc/<pid>/status.
absl::StatusOr<int64_t> ReadRssKb(pid_t pid);

// Runs the load against `address` ("host:port"); `server_pid` is sampled for memory.
// Fails only when the setup fails (no session could be created, /proc unreadable);
// errors of the calls under load are counted in the report.
absl::StatusOr<LoadReport> RunLoad(const std::string& address, pid_t server_pid, const LoadOptions& options);

// The report as Markdown: a table (RPC, calls, calls/s, p50, p99, max) and a line on
// memory and errors.
std::string FormatReport(const LoadReport& report, const LoadOptions& options);

}  // namespace load
}  // namespace teserve

#endif  // TESERVE_TESTS_LOAD_LOAD_GENERATOR_H_
