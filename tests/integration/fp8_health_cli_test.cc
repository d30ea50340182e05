// `teserve_cli fp8-health SESSION [--watch]` as a user runs it, against an in-process
// server: every row equals GetQuantizationState (window max = max of the amax history,
// health in percent), missing health shows "-", --watch redraws, errors exit 1 and bad
// usage 2.
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/client.h"
#include "client/demo.h"
#include "client/fp8_health.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;
using testing::CommandResult;
using testing::RunCommand;
using testing::Runfile;

constexpr int64_t kRows = 32;
constexpr int64_t kFeatures = 32;


std::string Cli(const testing::LoopbackServer& s, const std::string& arguments) {
  return absl::StrCat(Runfile("client/teserve_cli"), " --server=", s.address, " ", arguments);
}

// A trained demo-architecture session under `recipe`.
std::string TrainedSession(client::Client& client, const std::string& recipe, int steps) {
  absl::StatusOr<v1::CreateSessionRequest> request = client::DemoSessionRequestFor(21, 0.05f, recipe, 1e-2f);
  EXPECT_TRUE(request.ok()) << request.status();
  absl::StatusOr<v1::CreateSessionResponse> created = client.CreateSession(*request);
  EXPECT_TRUE(created.ok()) << created.status();
  if (!created.ok()) return "";
  for (int step = 1; step <= steps; ++step) {
    v1::ForwardBackwardRequest fb;
    fb.set_session_id(created->session_id());
    *fb.add_inputs() =
        client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kFeatures, step), {kRows, kFeatures});
    fb.mutable_loss()->mutable_mse();
    *fb.mutable_target() =
        client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kFeatures, 50 + step), {kRows, kFeatures});
    EXPECT_TRUE(client.ForwardBackward(fb).ok());
    EXPECT_TRUE(client.Step(created->session_id(), /*zero_grad=*/true).ok());
  }
  return created->session_id();
}

// The table row of layer.tensor split into its columns.
std::vector<std::string> Row(const std::string& table, const std::string& layer, const std::string& tensor) {
  for (absl::string_view line : absl::StrSplit(table, '\n')) {
    std::vector<std::string> columns = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (columns.size() >= 2 && columns[0] == layer && columns[1] == tensor) return columns;
  }
  return {};
}

// %.6g and %.4f round-trip to within their printed digits.
void ExpectPrinted(const std::string& text, double want, double absolute, const std::string& what) {
  const double got = std::strtod(text.c_str(), nullptr);
  EXPECT_NEAR(got, want, absolute + 5e-6 * std::fabs(want)) << what << ": printed '" << text << "'";
}

TEST(Fp8HealthCli, EveryRowEqualsGetQuantizationState) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.metrics_port = 0;
  options.fp8_stats_interval = 2;  // step 2 is sampled: the table has health stats
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  const std::string id = TrainedSession(*s.client, "delayed", 3);
  absl::StatusOr<v1::QuantizationState> state = s.client->GetQuantizationState(id);
  ASSERT_TRUE(state.ok()) << state.status();

  const CommandResult run = RunCommand(Cli(s, absl::StrCat("fp8-health ", id)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr(absl::StrCat("session ", id, " at step 3")));
  EXPECT_THAT(run.output, ::testing::ContainsRegex(
                              "layer +tensor +format +amax +window_max +scale +underflow_% +overflow_% +mse +execution"));
  ASSERT_EQ(state->tensors_size(), 6);
  for (const v1::QuantizedTensorState& t : state->tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    const std::vector<std::string> row = Row(run.output, t.layer(), t.tensor());
    ASSERT_EQ(row.size(), 10u) << run.output;
    EXPECT_EQ(row[2], v1::DType_Name(t.format()));
    ExpectPrinted(row[3], t.amax(), 0.0, "amax");
    ASSERT_EQ(t.amax_history_size(), 16);
    const float window = *std::max_element(t.amax_history().begin(), t.amax_history().end());
    ExpectPrinted(row[4], window, 0.0, "window_max");
    EXPECT_GE(window, t.amax());
    ExpectPrinted(row[5], t.scale(), 0.0, "scale");
    ASSERT_TRUE(t.has_health());
    ExpectPrinted(row[6], 100.0 * t.health().underflow_ratio(), 5e-5, "underflow %");
    ExpectPrinted(row[7], 100.0 * t.health().overflow_ratio(), 5e-5, "overflow %");
    ExpectPrinted(row[8], t.health().mse(), 0.0, "mse");
    EXPECT_EQ(row[9], t.execution());
  }
}

// Block recipes keep no history (window max = amax); a server without sampling leaves
// the health columns empty.
TEST(Fp8HealthCli, NoHealthStatsShowDashes) {
  testing::LoopbackServer s = testing::StartLoopbackServer();  // metrics off: no sampling
  ASSERT_NE(s.server, nullptr);
  const std::string id = TrainedSession(*s.client, "mxfp8", 1);
  absl::StatusOr<v1::QuantizationState> state = s.client->GetQuantizationState(id);
  ASSERT_TRUE(state.ok()) << state.status();
  const CommandResult run = RunCommand(Cli(s, absl::StrCat("fp8-health ", id)));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (const v1::QuantizedTensorState& t : state->tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    const std::vector<std::string> row = Row(run.output, t.layer(), t.tensor());
    ASSERT_EQ(row.size(), 10u) << run.output;
    EXPECT_EQ(row[3], row[4]);  // window max = amax
    EXPECT_EQ(client::AmaxWindowMax(t), t.amax());
    EXPECT_EQ(row[6], "-");
    EXPECT_EQ(row[7], "-");
    EXPECT_EQ(row[8], "-");
  }
}

TEST(Fp8HealthCli, HighPrecisionSessionHasNoRows) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> created =
      s.client->CreateSession(client::DemoSessionRequest(3, 0.05f, /*fp8=*/false, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  const CommandResult run = RunCommand(Cli(s, absl::StrCat("fp8-health ", created->session_id())));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("no quantized tensors"));
}

TEST(Fp8HealthCli, WatchRedrawsUntilInterrupted) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  const std::string id = TrainedSession(*s.client, "current", 1);
  // timeout sends SIGINT after 1.5 s and exits 124.
  const CommandResult run =
      RunCommand(absl::StrCat("timeout -s INT 1.5 ", Cli(s, absl::StrCat("fp8-health ", id, " --watch --interval=200ms"))));
  EXPECT_EQ(run.exit_code, 124) << run.output;
  const std::string header = absl::StrCat("session ", id, " at step 1");
  size_t tables = 0;
  for (size_t at = run.output.find(header); at != std::string::npos; at = run.output.find(header, at + 1)) ++tables;
  EXPECT_GE(tables, 3u) << run.output;
  EXPECT_THAT(run.output, ::testing::ContainsRegex("fc1 +input +FLOAT8_E4M3"));
}

TEST(Fp8HealthCli, ErrorsAndUsage) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  CommandResult run = RunCommand(Cli(s, "fp8-health 0123456789abcdef"));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("fp8-health: NOT_FOUND"));
  run = RunCommand(Cli(s, "fp8-health"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("fp8-health: expected one SESSION id"));
  run = RunCommand(Cli(s, "fp8-health abc --watch --interval=0s"));
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--interval: expected a positive duration, got 0"));
}

}  // namespace
}  // namespace teserve
