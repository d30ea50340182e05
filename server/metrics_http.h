// A minimal HTTP/1.1 endpoint that serves GET /metrics (Prometheus text format 0.0.4).
//
// Why not prometheus-cpp's Exposer: it runs civetweb, whose threads are created with a
// fixed 100 KiB stack. Once libcublas is linked (the kernels library does), the static
// TLS of the process no longer fits in such a stack, pthread_create fails with EINVAL
// and the Exposer cannot start at all. Scrapes are rare and tiny, so one thread that
// answers connections one at a time is enough; it also binds port 0 natively.
#ifndef TESERVE_SERVER_METRICS_HTTP_H_
#define TESERVE_SERVER_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace teserve {
namespace server {

class MetricsHttpServer {
 public:
  // Returns the exposition text for one scrape; called on the server's thread.
  using Render = std::function<std::string()>;
  // Given the value of the request's Authorization header (empty when absent), whether
  // the scrape may proceed; a refused scrape gets 401 with a Basic challenge. Null: open.
  using Authorize = std::function<bool(const std::string&)>;

  // Listens on host:port (numeric host; port 0 = any free port) and serves until
  // destroyed.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(const std::string& host,
                                                                  int port, Render render,
                                                                  Authorize authorize = nullptr);
  ~MetricsHttpServer();  // stops accepting and joins the thread

  int port() const { return port_; }

 private:
  MetricsHttpServer(int listen_fd, int wake_read_fd, int wake_write_fd, int port,
                    Render render, Authorize authorize);
  void Serve();
  void HandleConnection(int fd);

  const int listen_fd_;
  const int wake_read_fd_;   // a byte written here ends Serve()
  const int wake_write_fd_;
  const int port_;
  const Render render_;
  const Authorize authorize_;
  std::thread thread_;
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_METRICS_HTTP_H_
