// The shipped binaries as a user runs them: //server:teserve as a subprocess, driven by
// //client:teserve_cli, scraped over HTTP, stopped with SIGTERM.
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/server_process.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

using testing::CommandResult;
using testing::Runfile;
using testing::RunCommand;

std::string ReadFile(const std::string& path) { return testing::ReadWholeFile(path); }

class ServerProcess {
 public:
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }

  // Starts teserve with its stderr in `log_path` and waits for the listening line.
  bool Start(int port, int metrics_port, const std::string& log_path) {
    log_path_ = log_path;
    const std::string binary = Runfile("server/teserve");
    const std::string port_flag = absl::StrCat("--port=", port);
    const std::string metrics_flag = absl::StrCat("--metrics_port=", metrics_port);
    pid_ = fork();
    if (pid_ == 0) {
      FILE* log = std::freopen(log_path.c_str(), "w", stderr);
      if (log == nullptr) _exit(127);
      execl(binary.c_str(), binary.c_str(), "--host=127.0.0.1", port_flag.c_str(),
            metrics_flag.c_str(), "--device=auto", "--shutdown_grace_seconds=5",
            static_cast<char*>(nullptr));
      _exit(127);
    }
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      if (ReadFile(log_path).find("gRPC listening on") != std::string::npos) return true;
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // SIGTERM, then the exit code (-1 if it did not exit within the deadline).
  int Terminate() {
    kill(pid_, SIGTERM);
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      absl::SleepFor(absl::Milliseconds(50));
    }
    return -1;
  }

  std::string Log() const { return ReadFile(log_path_); }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

TEST(Binaries, ServeDemoScrapeAndStopOnSigterm) {
  // --port=0 would not be visible from outside, so free ports are picked here.
  absl::StatusOr<int> port = testing::FreeLoopbackPort();
  absl::StatusOr<int> metrics_port = testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok() && metrics_port.ok());
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string log_path = absl::StrCat(tmp ? tmp : "/tmp", "/teserve.log");

  ServerProcess server;
  ASSERT_TRUE(server.Start(*port, *metrics_port, log_path)) << server.Log();
  const std::string startup = server.Log();
  EXPECT_THAT(startup, HasSubstr("teserve 0.1.0 starting"));
  EXPECT_THAT(startup, ::testing::ContainsRegex("device (cpu|cuda:0)"));
  EXPECT_THAT(startup, HasSubstr(absl::StrCat("gRPC listening on 127.0.0.1:", *port)));
  EXPECT_THAT(startup, HasSubstr(absl::StrFormat("metrics on http://127.0.0.1:%d/metrics",
                                                 *metrics_port)));

  const std::string cli = Runfile("client/teserve_cli");
  const std::string server_flag = absl::StrCat("--server=127.0.0.1:", *port);
  CommandResult health = RunCommand(absl::StrCat(cli, " health ", server_flag));
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("SERVING"));

  CommandResult demo = RunCommand(absl::StrCat(cli, " demo ", server_flag, " --steps=20"));
  EXPECT_EQ(demo.exit_code, 0) << demo.output;
  EXPECT_THAT(demo.output, HasSubstr("step 1 loss "));
  EXPECT_THAT(demo.output, HasSubstr("step 20 loss "));
  EXPECT_THAT(demo.output, HasSubstr("recipe delayed: loss "));
  EXPECT_THAT(demo.output,
              ::testing::ContainsRegex("layer +tensor +recipe +format +mode +execution +amax +scale "
                                       "+scale_inv +bsi_min +bsi_max +bsi_mean"));
  EXPECT_THAT(demo.output,
              ::testing::ContainsRegex("fc2 +grad_output +delayed +FLOAT8_E5M2 +per_tensor"));

  CommandResult nvfp4 =
      RunCommand(absl::StrCat(cli, " demo ", server_flag, " --steps=3 --recipe=nvfp4"));
  EXPECT_EQ(nvfp4.exit_code, 0) << nvfp4.output;
  EXPECT_THAT(nvfp4.output, HasSubstr("recipe nvfp4: loss "));
  EXPECT_THAT(nvfp4.output, ::testing::ContainsRegex("fc1 +weight +nvfp4 +FLOAT4_E2M1"));
  CommandResult bad_recipe =
      RunCommand(absl::StrCat(cli, " demo ", server_flag, " --recipe=fp16"));
  EXPECT_EQ(bad_recipe.exit_code, 2) << bad_recipe.output;
  EXPECT_THAT(bad_recipe.output,
              HasSubstr("--recipe: expected one of delayed, current, mxfp8, block, nvfp4, got 'fp16'"));

  CommandResult transformer =
      RunCommand(absl::StrCat(cli, " demo ", server_flag, " --model=transformer --steps=5"));
  EXPECT_EQ(transformer.exit_code, 0) << transformer.output;
  EXPECT_THAT(transformer.output, HasSubstr("step 1 loss "));
  EXPECT_THAT(transformer.output, HasSubstr("step 5 loss "));
  EXPECT_THAT(transformer.output, ::testing::Not(HasSubstr("step 6 loss ")));
  EXPECT_THAT(transformer.output, HasSubstr("model transformer, recipe delayed: loss "));
  EXPECT_THAT(transformer.output,
              ::testing::ContainsRegex("token accuracy [01]\\.[0-9]+ on 512 fresh tokens \\(chance 0\\.031"));
  EXPECT_THAT(transformer.output,
              ::testing::ContainsRegex("block2\\.layernorm_mlp\\.fc2 +grad_output +delayed +FLOAT8_E5M2 +per_tensor"));
  CommandResult bad_model = RunCommand(absl::StrCat(cli, " demo ", server_flag, " --model=gpt"));
  EXPECT_EQ(bad_model.exit_code, 2) << bad_model.output;
  EXPECT_THAT(bad_model.output, HasSubstr("--model: expected mlp or transformer, got 'gpt'"));
  EXPECT_THAT(bad_model.output, HasSubstr("demo [--model=mlp|transformer]"));

  CommandResult unknown = RunCommand(absl::StrCat(cli, " quant-state 0000000000000000 ", server_flag));
  EXPECT_EQ(unknown.exit_code, 1) << unknown.output;
  EXPECT_THAT(unknown.output, HasSubstr("NOT_FOUND: session_id: no session '0000000000000000'"));
  CommandResult usage = RunCommand(absl::StrCat(cli, " frobnicate ", server_flag));
  EXPECT_EQ(usage.exit_code, 2) << usage.output;
  EXPECT_THAT(usage.output, HasSubstr("usage: teserve_cli"));

  absl::StatusOr<std::string> metrics = testing::HttpGet(*metrics_port, "/metrics");
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, HasSubstr("teserve_rpc_requests_total{code=\"OK\",method=\"Forward\"}"));
  EXPECT_THAT(*metrics,
              HasSubstr("teserve_rpc_requests_total{code=\"NOT_FOUND\",method=\"GetQuantizationState\"} 1"));
  EXPECT_THAT(*metrics, HasSubstr("teserve_sessions 0"));

  EXPECT_EQ(server.Terminate(), 0) << server.Log();
  const std::string log = server.Log();
  EXPECT_THAT(log, HasSubstr("received SIGTERM; shutting down"));
  EXPECT_THAT(log, HasSubstr("shutdown complete"));
}

TEST(Binaries, CliFailsCleanlyWhenNoServerListens) {
  absl::StatusOr<int> port = testing::FreeLoopbackPort();
  ASSERT_TRUE(port.ok());
  CommandResult health = RunCommand(
      absl::StrCat(Runfile("client/teserve_cli"), " health --server=127.0.0.1:", *port));
  EXPECT_EQ(health.exit_code, 1) << health.output;
  EXPECT_THAT(health.output, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace teserve
