#include "tests/integration/prometheus_server.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "tests/integration/http_get.h"

extern char** environ;

namespace teserve {
namespace testing {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;

std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Spawns argv with stdout and stderr appended to `log_path` (or to the pipe write end
// `pipe_fd` when >= 0).
absl::StatusOr<pid_t> Spawn(const std::vector<std::string>& argv, const std::string& log_path,
                            int pipe_fd) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (pipe_fd >= 0) {
    posix_spawn_file_actions_adddup2(&actions, pipe_fd, STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, pipe_fd, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  }
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("spawning ", argv[0], ": ", std::strerror(rc)));
  }
  return pid;
}

// Removes HTTP/1.1 chunked transfer coding.
absl::StatusOr<std::string> Dechunk(absl::string_view body) {
  std::string out;
  while (true) {
    const size_t line_end = body.find("\r\n");
    if (line_end == absl::string_view::npos) return absl::DataLossError("truncated chunk size");
    absl::string_view size_text = body.substr(0, line_end);
    size_text = size_text.substr(0, size_text.find(';'));
    size_t size = 0;
    if (!absl::SimpleHexAtoi(size_text, &size)) {
      return absl::DataLossError(absl::StrCat("bad chunk size '", size_text, "'"));
    }
    body.remove_prefix(line_end + 2);
    if (size == 0) return out;
    if (body.size() < size + 2) return absl::DataLossError("truncated chunk");
    out.append(body.data(), size);
    body.remove_prefix(size + 2);
  }
}

}  // namespace

absl::Status CheckExecutable(const std::string& binary) {
  if (access(binary.c_str(), X_OK) == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      binary, " is missing or not executable; install the Debian/Ubuntu package "
              "'prometheus' (apt-get install prometheus, or bash tools/install_deps.sh)"));
}

CommandResult RunCommand(const std::vector<std::string>& argv) {
  CommandResult result;
  int fds[2];
  if (pipe(fds) != 0) {
    result.output = std::strerror(errno);
    return result;
  }
  absl::StatusOr<pid_t> pid = Spawn(argv, "", fds[1]);
  close(fds[1]);
  if (!pid.ok()) {
    close(fds[0]);
    result.output = pid.status().ToString();
    return result;
  }
  char buffer[4096];
  ssize_t n;
  while ((n = read(fds[0], buffer, sizeof(buffer))) > 0) result.output.append(buffer, n);
  close(fds[0]);
  int status = 0;
  waitpid(*pid, &status, 0);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

std::string UrlEncode(const std::string& text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const std::string& dir, const std::string& config_yaml, absl::Duration ready_timeout) {
  if (absl::Status s = CheckExecutable(kPrometheusBinary); !s.ok()) return s;
  const std::string config_path = absl::StrCat(dir, "/prometheus.yml");
  {
    std::ofstream out(config_path);
    out << config_yaml;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", config_path));
  }
  const std::string log_path = absl::StrCat(dir, "/prometheus.log");
  const absl::Time deadline = absl::Now() + ready_timeout;
  // The free port may be taken between FreeLoopbackPort and Prometheus binding it; then
  // Prometheus exits at once and another port is tried.
  for (int attempt = 1;; ++attempt) {
    absl::StatusOr<int> port = FreeLoopbackPort();
    if (!port.ok()) return port.status();
    std::remove(log_path.c_str());
    absl::StatusOr<pid_t> pid = Spawn(
        {kPrometheusBinary, absl::StrCat("--config.file=", config_path),
         absl::StrCat("--storage.tsdb.path=", dir, "/data"),
         absl::StrCat("--web.listen-address=127.0.0.1:", *port)},
        log_path, -1);
    if (!pid.ok()) return pid.status();
    std::unique_ptr<PrometheusServer> server(new PrometheusServer(*pid, *port, log_path));
    bool exited = false;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(server->pid_, &status, WNOHANG) == server->pid_) {
        server->pid_ = -1;
        exited = true;
        break;
      }
      if (server->Get("/-/ready").ok()) return server;
      absl::SleepFor(absl::Milliseconds(100));
    }
    const std::string log = server->LogTail();
    if (exited && attempt < 3 && absl::StrContains(log, "address already in use")) continue;
    if (exited) {
      return absl::InternalError(absl::StrCat("prometheus exited during startup; its log:\n", log));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "prometheus not ready after ", absl::FormatDuration(ready_timeout), "; its log:\n", log));
  }
}

PrometheusServer::~PrometheusServer() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int status = 0;
  while (waitpid(pid_, &status, WNOHANG) == 0) {
    if (absl::Now() > deadline) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
}

std::string PrometheusServer::LogTail(size_t max_bytes) const {
  const std::string log = ReadWholeFile(log_path_);
  return log.size() <= max_bytes ? log : log.substr(log.size() - max_bytes);
}

absl::StatusOr<std::string> PrometheusServer::Get(const std::string& path_and_query) const {
  absl::StatusOr<std::string> response = HttpGet(port_, path_and_query);
  if (!response.ok()) return response.status();
  const size_t header_end = response->find("\r\n\r\n");
  if (header_end == std::string::npos) {
    return absl::DataLossError(absl::StrCat("GET ", path_and_query, ": no HTTP header end"));
  }
  const absl::string_view header(response->data(), header_end);
  absl::string_view body(*response);
  body.remove_prefix(header_end + 4);
  const absl::string_view status_line = header.substr(0, header.find("\r\n"));
  // Errors of the HTTP API (400, 422, 503) still carry a JSON body worth showing.
  const bool ok = absl::StrContains(status_line, " 200 ");
  std::string decoded(body);
  const std::string lower_header = absl::AsciiStrToLower(header);
  if (absl::StrContains(lower_header, "transfer-encoding: chunked")) {
    absl::StatusOr<std::string> unchunked = Dechunk(body);
    if (!unchunked.ok()) return unchunked.status();
    decoded = *std::move(unchunked);
  }
  if (!ok && !absl::StrContains(lower_header, "application/json")) {
    return absl::UnavailableError(
        absl::StrCat("GET ", path_and_query, ": ", status_line, " ", decoded));
  }
  return decoded;
}

absl::StatusOr<Struct> PrometheusServer::ApiGet(const std::string& path_and_query) const {
  absl::StatusOr<std::string> body = Get(path_and_query);
  if (!body.ok()) return body.status();
  Struct answer;
  const auto parsed = google::protobuf::util::JsonStringToMessage(*body, &answer);
  if (!parsed.ok()) {
    return absl::DataLossError(
        absl::StrCat("GET ", path_and_query, ": not JSON (", parsed.ToString(), "): ", *body));
  }
  const auto& fields = answer.fields();
  auto status = fields.find("status");
  if (status == fields.end() || status->second.string_value() != "success") {
    auto type = fields.find("errorType");
    auto error = fields.find("error");
    return absl::InvalidArgumentError(absl::StrCat(
        "GET ", path_and_query, ": ", type == fields.end() ? "" : type->second.string_value(),
        ": ", error == fields.end() ? *body : error->second.string_value()));
  }
  return answer;
}

absl::StatusOr<Struct> PrometheusServer::QueryData(const std::string& promql) const {
  absl::StatusOr<Struct> answer = ApiGet(absl::StrCat("/api/v1/query?query=", UrlEncode(promql)));
  if (!answer.ok()) return answer.status();
  auto data = answer->fields().find("data");
  if (data == answer->fields().end() || !data->second.has_struct_value()) {
    return absl::DataLossError(absl::StrCat("query '", promql, "': no data object"));
  }
  return data->second.struct_value();
}

absl::StatusOr<std::vector<Sample>> PrometheusServer::QueryVector(const std::string& promql) const {
  absl::StatusOr<Struct> data = QueryData(promql);
  if (!data.ok()) return data.status();
  const auto& fields = data->fields();
  auto type = fields.find("resultType");
  if (type == fields.end() || type->second.string_value() != "vector") {
    return absl::InvalidArgumentError(absl::StrCat(
        "query '", promql, "': expected an instant vector, got ",
        type == fields.end() ? "no resultType" : type->second.string_value()));
  }
  std::vector<Sample> samples;
  auto result = fields.find("result");
  if (result == fields.end()) return samples;
  for (const Value& item : result->second.list_value().values()) {
    Sample sample;
    const auto& item_fields = item.struct_value().fields();
    auto metric = item_fields.find("metric");
    if (metric != item_fields.end()) {
      for (const auto& [name, value] : metric->second.struct_value().fields()) {
        sample.labels[name] = value.string_value();
      }
    }
    auto value = item_fields.find("value");  // [unix time, "value"]
    if (value == item_fields.end() || value->second.list_value().values_size() != 2 ||
        !absl::SimpleAtod(value->second.list_value().values(1).string_value(), &sample.value)) {
      return absl::DataLossError(absl::StrCat("query '", promql, "': malformed sample"));
    }
    samples.push_back(std::move(sample));
  }
  return samples;
}

absl::Status PrometheusServer::WaitForScrapeAfter(const std::string& job, absl::Time after,
                                                  int extra_scrapes,
                                                  absl::Duration timeout) const {
  const std::string query = absl::StrCat("timestamp(up{job=\"", job, "\"})");
  const absl::Time deadline = absl::Now() + timeout;
  double threshold = absl::ToDoubleSeconds(after - absl::UnixEpoch());
  int scrapes_needed = 1 + extra_scrapes;
  std::string last_error = "no scrape yet";
  while (absl::Now() < deadline) {
    absl::StatusOr<std::vector<Sample>> samples = QueryVector(query);
    if (!samples.ok()) {
      last_error = samples.status().ToString();
    } else if (samples->size() == 1 && (*samples)[0].value > threshold) {
      threshold = (*samples)[0].value;
      if (--scrapes_needed == 0) return absl::OkStatus();
      continue;
    } else {
      last_error = absl::StrCat(samples->size(), " 'up' series, latest scrape at ",
                                samples->empty() ? 0.0 : (*samples)[0].value);
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no scrape of job ", job, " after ", absl::FormatTime(after), " within ",
                   absl::FormatDuration(timeout), " (", last_error, ")"));
}

}  // namespace testing
}  // namespace teserve
