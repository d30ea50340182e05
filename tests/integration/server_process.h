// //server:teserve as a subprocess, as an operator runs it: flags on the command line,
// the log on stderr, signals to reload (SIGHUP) and stop (SIGTERM). For tests of what
// only the binary does (flag parsing, TLS files, signals, exit codes).
#ifndef TESERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_
#define TESERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/time/time.h"

namespace teserve {
namespace testing {

// $TEST_SRCDIR/<workspace>/<path>.
std::string Runfile(const std::string& path);
// $TEST_TMPDIR (or /tmp) joined with `name`.
std::string TempPath(const std::string& name);
std::string ReadWholeFile(const std::string& path);
void WriteWholeFile(const std::string& path, const std::string& text);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};
// Runs a shell command line.
CommandResult RunCommand(const std::string& command);

// The device the integration tests run their servers on: TESERVE_TEST_DEVICE (e.g.
// cuda:0, for the one run of the reliability cases on a GPU host), cpu by default.
std::string TestDevice();

class ServerProcess {
 public:
  ServerProcess() = default;
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess();  // SIGKILL if still running

  // Starts teserve with --host=127.0.0.1 --port=0 --device=<TestDevice()> plus `flags` (and
  // --metrics_port=-1 unless `flags` set it), its stderr
  // in `log_path`, and waits (up to 30 s) for the "gRPC listening on" line; false if it
  // exited or never said so. port() and metrics_port() come from the log. `env`:
  // "NAME=value" entries added to (or replacing those of) the environment it inherits.
  bool Start(const std::vector<std::string>& flags, const std::string& log_path,
             const std::vector<std::string>& env = {});
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  std::string address() const;
  pid_t pid() const { return pid_; }
  std::string Log() const { return ReadWholeFile(log_path_); }

  void Signal(int signal_number) const;
  // The exit code once the process exits within `timeout` (-1: killed by a signal),
  // or -2 when it is still running then.
  int WaitExit(absl::Duration timeout);
  // Waits until the log contains `text` (true) or `timeout` passes (false).
  bool WaitForLog(const std::string& text, absl::Duration timeout) const;

 private:
  pid_t pid_ = -1;
  int port_ = -1;
  int metrics_port_ = -1;
  int exit_code_ = -1;  // once reaped
  std::string log_path_;
};

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_SERVER_PROCESS_H_
