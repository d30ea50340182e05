// Prometheus metrics of the server: prometheus-cpp's metric types and text format,
// served by MetricsHttpServer (metrics_http.h says why not prometheus-cpp's Exposer).
//
// This is the seam the full catalogue of DESIGN.md section 9 grows from; for now it
// holds the RPC and session series. Families are created once; label sets are added on
// first use (prometheus-cpp makes Family::Add thread-safe).
#ifndef TESERVE_SERVER_METRICS_H_
#define TESERVE_SERVER_METRICS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics_http.h"

namespace teserve {
namespace server {

class Metrics {
 public:
  // Serves /metrics on host:port (host numeric); port 0 picks a free port, -1 exposes
  // nothing (the series are still kept, so callers need no special case).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const std::string& host, int port);
  ~Metrics();

  void RecordRpc(absl::string_view method, grpc::StatusCode code, double seconds);
  void SetSessions(int64_t live);

  // The bound HTTP port, or -1 when not exposed.
  int port() const { return http_ == nullptr ? -1 : http_->port(); }

 private:
  Metrics();

  const prometheus::Histogram::BucketBoundaries duration_buckets_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* rpc_requests_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Gauge* sessions_;
  std::unique_ptr<MetricsHttpServer> http_;  // null when not exposed
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_METRICS_H_
