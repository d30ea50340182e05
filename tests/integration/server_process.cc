#include "tests/integration/server_process.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace teserve {
namespace testing {

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "teserve", "/", path);
}

std::string TestDevice() {
  const char* device = std::getenv("TESERVE_TEST_DEVICE");
  return device != nullptr && *device != '\0' ? device : "cpu";
}

std::string TempPath(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp ? tmp : "/tmp", "/", name);
}

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteWholeFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

CommandResult RunCommand(const std::string& command) {
  CommandResult run;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

std::string ServerProcess::address() const { return absl::StrCat("127.0.0.1:", port_); }

bool ServerProcess::Start(const std::vector<std::string>& flags, const std::string& log_path,
                          const std::vector<std::string>& env) {
  log_path_ = log_path;
  const std::string binary = Runfile("server/teserve");
  std::vector<std::string> args = {binary, "--host=127.0.0.1", "--port=0", "--device=" + TestDevice()};
  args.insert(args.end(), flags.begin(), flags.end());
  // The default metrics port (9464) would collide between tests running in parallel.
  bool metrics_port_given = false;
  for (const std::string& flag : flags) metrics_port_given |= flag.rfind("--metrics_port", 0) == 0;
  if (!metrics_port_given) args.push_back("--metrics_port=-1");
  // The inherited environment less the names `env` sets, then `env`.
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string entry(*e);
    bool replaced = false;
    for (const std::string& extra : env) {
      const std::string name = extra.substr(0, extra.find('=') + 1);
      replaced |= entry.rfind(name, 0) == 0;
    }
    if (!replaced) environment.push_back(entry);
  }
  environment.insert(environment.end(), env.begin(), env.end());
  pid_ = fork();
  if (pid_ == 0) {
    FILE* log = std::freopen(log_path.c_str(), "w", stderr);
    if (log == nullptr) _exit(127);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<char*> envp;
    for (std::string& e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);
    execve(binary.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  const std::regex listening("gRPC listening on 127\\.0\\.0\\.1:([0-9]+)");
  const std::regex metrics("metrics on http://[0-9.]+:([0-9]+)/metrics");
  while (absl::Now() < deadline) {
    const std::string log = Log();
    std::smatch match;
    if (std::regex_search(log, match, listening)) {
      if (!absl::SimpleAtoi(match[1].str(), &port_)) return false;
      if (std::regex_search(log, match, metrics)) {
        if (!absl::SimpleAtoi(match[1].str(), &metrics_port_)) metrics_port_ = -1;
      }
      return true;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return false;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

void ServerProcess::Signal(int signal_number) const {
  if (pid_ > 0) kill(pid_, signal_number);
}

int ServerProcess::WaitExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (pid_ > 0) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      return exit_code_;
    }
    if (absl::Now() >= deadline) return -2;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return exit_code_;
}

bool ServerProcess::WaitForLog(const std::string& text, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (Log().find(text) != std::string::npos) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return false;
}

}  // namespace testing
}  // namespace teserve
