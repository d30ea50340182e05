// The real server binary under load (issue "reliability"): 32 concurrent clients, each on
// its own session, Forward / Backward / Step and ForwardBackward / Step for
// TESERVE_LOAD_SECONDS (10 by default; 60 for the recorded run, bench/results/load_*.md).
// Asserts that no call fails, that the server's RSS grows by less than 10% after the
// warm-up, that every session is gone afterwards and that SIGTERM still exits 0; prints
// p50 / p99 latency per RPC (also written to $TEST_UNDECLARED_OUTPUTS_DIR/load.md).
//
//   bazel test --jobs=2 //tests/load:load_test --test_env=TESERVE_LOAD_SECONDS=60
//     --test_output=streamed --nocache_test_results   (one command line)
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/load/load_generator.h"

namespace teserve {
namespace {

int64_t EnvInt(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  int64_t parsed = 0;
  if (value == nullptr || *value == '\0' || !absl::SimpleAtoi(value, &parsed) || parsed < 1) return fallback;
  return parsed;
}

TEST(Load, ConcurrentTrainingKeepsMemoryFlatAndFailsNothing) {
  testing::ServerProcess server;
  // Metrics on: updating the series after every call, and adding and removing a
  // session's series, is part of what runs under load.
  ASSERT_TRUE(server.Start({"--metrics_port=0", "--shutdown_grace_seconds=5"}, testing::TempPath("load_server.log")))
      << server.Log();

  load::LoadOptions options;
  options.clients = static_cast<int>(EnvInt("TESERVE_LOAD_CLIENTS", 32));
  options.duration = absl::Seconds(EnvInt("TESERVE_LOAD_SECONDS", 10));
  absl::StatusOr<load::LoadReport> report = load::RunLoad(server.address(), server.pid(), options);
  ASSERT_TRUE(report.ok()) << report.status() << "\n" << server.Log();
  const std::string table = load::FormatReport(*report, options);
  std::printf("%s", table.c_str());
  if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    testing::WriteWholeFile(absl::StrCat(dir, "/load.md"), table);
  }

  EXPECT_EQ(report->error_count, 0) << table;
  EXPECT_LT(report->rss_growth, 0.10) << table;
  for (const char* method : {"Forward", "Backward", "ForwardBackward", "Step"}) {
    bool seen = false;
    for (const load::MethodStats& m : report->methods) seen |= m.method == method && m.calls > 0;
    EXPECT_TRUE(seen) << method << " never succeeded after the warm-up\n" << table;
  }

  // Every client deleted its sessions; the server still serves and stops cleanly.
  client::Client probe(server.address());
  absl::StatusOr<v1::ListSessionsResponse> left = probe.ListSessions();
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->sessions_size(), 0);
  EXPECT_EQ(probe.Health().value_or("unreachable"), "SERVING");
  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(15)), 0) << server.Log();
}

}  // namespace
}  // namespace teserve
