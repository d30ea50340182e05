#include "server/metrics.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"

namespace teserve {
namespace server {
namespace {

// 100 us .. ~26 s in factors of 2: covers a tiny ZeroGrad and a large CPU Forward.
prometheus::Histogram::BucketBoundaries DurationBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-4; b < 30.0; b *= 2.0) bounds.push_back(b);
  return bounds;
}

}  // namespace

Metrics::Metrics()
    : duration_buckets_(DurationBuckets()),
      registry_(std::make_shared<prometheus::Registry>()),
      rpc_requests_(&prometheus::BuildCounter()
                         .Name("teserve_rpc_requests_total")
                         .Help("RPCs finished, by method and gRPC status code")
                         .Register(*registry_)),
      rpc_duration_(&prometheus::BuildHistogram()
                         .Name("teserve_rpc_duration_seconds")
                         .Help("Time from receiving an RPC to finishing it, by method")
                         .Register(*registry_)),
      sessions_(&prometheus::BuildGauge()
                     .Name("teserve_sessions")
                     .Help("Live training sessions")
                     .Register(*registry_)
                     .Add({})) {}

Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const std::string& host, int port) {
  std::unique_ptr<Metrics> metrics(new Metrics());
  if (port < 0) return metrics;
  std::shared_ptr<prometheus::Registry> registry = metrics->registry_;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start(host, port, [registry] {
        return prometheus::TextSerializer().Serialize(registry->Collect());
      });
  if (!http.ok()) return http.status();
  metrics->http_ = std::move(*http);
  return metrics;
}

void Metrics::RecordRpc(absl::string_view method, grpc::StatusCode code, double seconds) {
  // The codes line up with absl's, which can name them ("INVALID_ARGUMENT").
  const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  const std::string method_name(method);
  rpc_requests_->Add({{"method", method_name}, {"code", code_name}}).Increment();
  rpc_duration_->Add({{"method", method_name}}, duration_buckets_).Observe(seconds);
}

void Metrics::SetSessions(int64_t live) { sessions_->Set(static_cast<double>(live)); }

}  // namespace server
}  // namespace teserve
