#include "server/metrics_http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace teserve {
namespace server {
namespace {

// A scraper that connects and then stalls must not hold the (only) serving thread.
constexpr int kIoTimeoutMs = 2000;
constexpr size_t kMaxRequestBytes = 8192;

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat("metrics: ", what, ": ", std::strerror(errno)));
}

// Writes all of `data` or gives up on the first error/timeout.
void WriteAll(int fd, absl::string_view data) {
  while (!data.empty()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, kIoTimeoutMs) <= 0) return;
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

std::string Response(absl::string_view status, absl::string_view content_type,
                     absl::string_view body) {
  return absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
}

// The value of header `name` (lowercase) in the request head, or "".
std::string HeaderValue(absl::string_view head, absl::string_view name) {
  head = head.substr(0, head.find("\r\n\r\n"));
  size_t start = head.find("\r\n");
  while (start != absl::string_view::npos) {
    start += 2;
    const size_t end = head.find("\r\n", start);
    const absl::string_view line = head.substr(start, end == absl::string_view::npos ? absl::string_view::npos : end - start);
    const size_t colon = line.find(':');
    if (colon != absl::string_view::npos && absl::EqualsIgnoreCase(line.substr(0, colon), name)) {
      return std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    }
    start = end;
  }
  return "";
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& host, int port, Render render, Authorize authorize) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.c_str(), service.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host: expected a numeric IPv4 or IPv6 address, got '", host, "'"));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    freeaddrinfo(found);
    return Errno("socket");
  }
  const int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound = bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 16) == 0;
  freeaddrinfo(found);
  if (!bound) {
    absl::Status status = Errno(absl::StrCat("cannot listen on ", host, ":", port));
    close(fd);
    return status;
  }
  sockaddr_storage local{};
  socklen_t length = sizeof(local);
  getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length);
  const int bound_port = local.ss_family == AF_INET6
                             ? ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port)
                             : ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
  int wake[2];
  if (pipe2(wake, O_CLOEXEC) != 0) {
    absl::Status status = Errno("pipe");
    close(fd);
    return status;
  }
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(fd, wake[0], wake[1], bound_port, std::move(render),
                            std::move(authorize)));
  try {
    server->thread_ = std::thread([raw = server.get()] { raw->Serve(); });
  } catch (const std::system_error& e) {  // startup only; no thread means no endpoint
    return absl::ResourceExhaustedError(absl::StrCat("metrics: cannot start thread: ", e.what()));
  }
  return server;
}

MetricsHttpServer::MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd,
                                     int port, Render render, Authorize authorize)
    : listen_fd_(listen_fd),
      wake_read_fd_(wake_read_fd),
      wake_write_fd_(wake_write_fd),
      port_(port),
      render_(std::move(render)),
      authorize_(std::move(authorize)) {}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const char byte = 0;
    while (write(wake_write_fd_, &byte, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  close(listen_fd_);
  close(wake_read_fd_);
  close(wake_write_fd_);
}

void MetricsHttpServer::Serve() {
  for (;;) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_read_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    HandleConnection(fd);
    close(fd);
  }
}

void MetricsHttpServer::HandleConnection(int fd) {
  std::string request;
  char buffer[1024];
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, kIoTimeoutMs) <= 0) return;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), 0);
    if (n <= 0) return;
    request.append(buffer, static_cast<size_t>(n));
  }
  const absl::string_view line = absl::string_view(request).substr(0, request.find("\r\n"));
  if (!absl::StartsWith(line, "GET ")) {
    WriteAll(fd, Response("405 Method Not Allowed", "text/plain", "only GET\n"));
    return;
  }
  absl::string_view target = line.substr(4);
  target = target.substr(0, target.find(' '));
  target = target.substr(0, target.find('?'));
  if (target != "/metrics") {
    WriteAll(fd, Response("404 Not Found", "text/plain", "metrics are at /metrics\n"));
    return;
  }
  if (authorize_ != nullptr && !authorize_(HeaderValue(request, "authorization"))) {
    WriteAll(fd, absl::StrCat("HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"teserve metrics\"\r\n"
                              "Content-Type: text/plain\r\nContent-Length: 23\r\nConnection: close\r\n\r\n"
                              "authentication needed\r\n"));
    return;
  }
  WriteAll(fd, Response("200 OK", "text/plain; version=0.0.4; charset=utf-8", render_()));
}

}  // namespace server
}  // namespace teserve
