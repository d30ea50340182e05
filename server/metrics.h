// Prometheus metrics of the server (the series are listed in README.md, "Metrics and
// dashboards"): prometheus-cpp's metric types and text format, served by
// MetricsHttpServer (metrics_http.h says why not prometheus-cpp's Exposer).
//
// Catalogue (labels: session = SessionMetricsLabel(id): a digest of the session id, or
// the id with --metrics_session_ids; layer = quantizer layer name, tensor =
// "input" | "weight" | "grad_output", or "all" at --metrics_detail=layer):
//   teserve_rpc_requests_total{method,code}         counter
//   teserve_rpc_duration_seconds{method}            histogram
//   teserve_rpc_received_bytes_total{method}        counter, serialized request sizes
//   teserve_rpc_sent_bytes_total{method}            counter, serialized response sizes (OK calls)
//   teserve_sessions                                gauge
//   teserve_compute_queued_calls                    gauge, training calls waiting for a
//                                                   compute thread (--compute_threads)
//   teserve_train_steps_total{session}              counter = SessionInfo.step
//   teserve_steps_skipped_total{session}            counter, steps with non-finite gradients
//   teserve_loss{session}                           gauge, latest ForwardBackward loss
//   teserve_grad_norm{session}                      gauge, latest Step's norm before clipping
//   teserve_fp8_amax{session,layer,tensor}          gauge, latest quantization's amax
//   teserve_fp8_amax_window_max{...}                gauge, max of the amax history (delayed)
//                                                   or the amax (other recipes)
//   teserve_fp8_scale{...}, teserve_fp8_scale_inv{...}  gauges
//   teserve_amax_log2{...}                          histogram of log2(amax), buckets -24..24
//                                                   by 2; one observation per update in which
//                                                   the tensor was quantized (amax 0 skipped)
//   teserve_fp8_underflow_ratio{...}, teserve_fp8_overflow_ratio{...},
//   teserve_fp8_quantization_mse{...}               gauges, sampled (below)
//   teserve_kernel_duration_seconds{op,device}      histogram, sampled (kernels/timing.h)
//   teserve_device_memory_bytes{device,kind}        gauge, kind "used" | "total", read at
//                                                   scrape time (CPU: process RSS as used);
//                                                   a GPU adds "pool_reserved" | "pool_used"
//                                                   (teserve's stream-ordered pool)
// The values come from a snapshot of the session (train::SessionSnapshot, taken by the
// trainer service with Session::Snapshot) at the end of every Forward, Backward,
// ForwardBackward and Step, so they equal what GetSession and GetQuantizationState
// report at that moment. Metrics never call into train::Session.
//
// FP8 health sampling: the passes of every fp8_stats_interval-th training step (steps
// interval, 2*interval, ... counting from 1) run with the session's health sampling on
// (UpdateSession says which switch the caller sets with Session::SetHealthSampling);
// the health gauges are written from those passes only and hold the latest sample in
// between. Other steps measure nothing. 0 disables sampling.
//
// Cardinality: MetricsDetail picks the series (see below); every series labelled with a
// session is removed when the session is (RemoveSession). A server that exposes no
// endpoint (port -1) keeps the cheap series but switches on neither health sampling nor
// kernel timing, since nothing could read them.
//
// Thread-safety: every method may be called concurrently. Snapshots are taken before
// the metrics lock is, so a long computation on one session never delays another
// session's updates.
#ifndef TESERVE_SERVER_METRICS_H_
#define TESERVE_SERVER_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/support/status.h"
#include "kernels/timing.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/metrics_http.h"
#include "train/session_snapshot.h"

namespace teserve {
namespace server {

enum class MetricsDetail {
  kTensor,   // per (session, layer, tensor) FP8 series
  kLayer,    // per (session, layer): max over the layer's tensors, tensor="all"
  kSession,  // no FP8 series; session, kernel and memory series
  kOff,      // RPC and session-count series only
};

// "tensor" | "layer" | "session" | "off"; INVALID_ARGUMENT naming --metrics_detail.
absl::StatusOr<MetricsDetail> ParseMetricsDetail(absl::string_view text);
absl::string_view MetricsDetailName(MetricsDetail detail);

struct MetricsOptions {
  std::string host = "0.0.0.0";  // numeric
  int port = 9464;               // 0: any free port; -1: no endpoint
  MetricsDetail detail = MetricsDetail::kTensor;
  int64_t fp8_stats_interval = 10;      // steps; 0: no health sampling
  int64_t kernel_timing_interval = 16;  // calls per op; 0: no kernel timing
  int gpu_index = -1;                   // the selected GPU, -1 for none
  // Whether the session label carries the session id (--metrics_session_ids). Off by
  // default: the label is then SessionMetricsLabel's digest, so /metrics never shows an
  // id that could address a session.
  bool session_ids_in_labels = false;
  // Scrape authorization (--metrics_basic_auth_file); null: open.
  MetricsHttpServer::Authorize authorize;
};

// The value of the `session` label for session `id`: the id itself when
// `session_ids_in_labels`, else 16 hex digits of SHA-256("teserve-metrics-label:" + id).
std::string SessionMetricsLabel(const std::string& id, bool session_ids_in_labels);

// INVALID_ARGUMENT naming the flag (--metrics_port, --fp8_stats_interval,
// --kernel_timing_interval) for values out of range.
absl::Status ValidateMetricsOptions(const MetricsOptions& options);

class Metrics {
 public:
  // Validates the options (INVALID_ARGUMENT naming the flag) and serves /metrics.
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options);
  ~Metrics();

  void RecordRpc(absl::string_view method, grpc::StatusCode code, double seconds,
                 int64_t received_bytes, int64_t sent_bytes);
  void SetSessions(int64_t live);
  void SetComputeQueued(int64_t calls);
  // One checkpoint save (SaveCheckpoint or a session's checkpoint_every_steps):
  // teserve_checkpoint_saves_total{result="ok"|"error"}, and for a saved one
  // teserve_checkpoint_save_duration_seconds and teserve_checkpoint_bytes_total.
  void RecordCheckpointSave(bool ok, double seconds, int64_t bytes);

  // Whether sessions have series at all (false at --metrics_detail=off: AddSession and
  // UpdateSession then do nothing, and no snapshot need be taken).
  bool TracksSessions() const { return options_.detail != MetricsDetail::kOff; }
  // Whether the snapshot for UpdateSession should carry the quantizers' values, after a
  // Forward, Backward, ForwardBackward (`quantized`: the call may have changed quantizer
  // state) or Step (not `quantized`). With `quantized`, also whether AddSession needs
  // the quantizer names.
  bool WantsQuantizers(bool quantized) const { return quantized && fp8_series(); }

  // Starts the series of a new session; `quantizers` are the (layer, tensor) names of
  // its quantizers in SessionSnapshot::quantizers order (Session::QuantizerNames()),
  // empty unless WantsQuantizers(true). false when nothing was added (metrics off, or
  // `id` already present); else the caller follows with UpdateSession. Updates of ids
  // never added (or already removed) are ignored, so a late update racing DeleteSession
  // cannot bring a deleted session's series back.
  bool AddSession(const std::string& id,
                  const std::vector<std::pair<std::string, std::string>>& quantizers);
  // Copies `snapshot` of session `id` into its series. Returns the health-sampling
  // switch the session should have for the step it is now in (snapshot.stats.step + 1),
  // for the caller to set when it differs from snapshot.stats.health_sampling; nullopt
  // (leave the switch as it is) when metrics are off or `id` has no series.
  std::optional<bool> UpdateSession(const std::string& id, const train::SessionSnapshot& snapshot);
  // Removes every series labelled with `id`; those left when `until` passes stay (the
  // server's stop: prometheus-cpp removes a series by scanning its family, seconds for a
  // deep model's, and the process is about to end). No later update reaches them.
  void RemoveSession(const std::string& id, absl::Time until = absl::InfiniteFuture());

  // The sink sessions' Contexts carry (Context::kernel_timing); null when kernel timing
  // is off.
  kernels::KernelTimingSink* kernel_timing() { return kernel_timing_.get(); }
  // Whether the passes of training step `step` (1-based) measure FP8 health.
  bool SamplesHealthInStep(int64_t step) const;

  MetricsDetail detail() const { return options_.detail; }
  // The bound HTTP port, or -1 when not exposed.
  int port() const { return http_ == nullptr ? -1 : http_->port(); }

 private:
  class KernelTimings;
  // The FP8 series of one quantized tensor, or of a layer's aggregate.
  struct TensorSeries {
    prometheus::Labels labels;
    prometheus::Gauge* amax = nullptr;
    prometheus::Gauge* window_max = nullptr;
    prometheus::Gauge* scale = nullptr;
    prometheus::Gauge* scale_inv = nullptr;
    prometheus::Histogram* amax_log2 = nullptr;
    // Created at the first health sample.
    prometheus::Gauge* underflow = nullptr;
    prometheus::Gauge* overflow = nullptr;
    prometheus::Gauge* mse = nullptr;
    int64_t quantize_calls = 0;  // at the previous update
  };
  struct SessionSeries {
    prometheus::Counter* steps = nullptr;
    prometheus::Counter* skipped = nullptr;
    prometheus::Gauge* loss = nullptr;       // once a ForwardBackward ran
    prometheus::Gauge* grad_norm = nullptr;  // once a Step ran
    std::vector<TensorSeries> rows;          // per tensor, or per layer
    std::vector<size_t> row_of_quantizer;    // SessionSnapshot::quantizers index -> row
  };
  // The values of one row: a quantizer's, or the max over a layer's quantizers.
  struct Fp8Values;

  explicit Metrics(const MetricsOptions& options);
  bool fp8_series() const;
  // The FP8 rows of the quantizers (AddSession's names) of session `id`.
  void AddRows(const std::string& id,
               const std::vector<std::pair<std::string, std::string>>& quantizers,
               SessionSeries& series) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void UpdateRow(const Fp8Values& values, bool health_sampled, TensorSeries& row)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `series` is no longer in sessions_series_ (no update reaches it); mu_ not held.
  void RemoveSeries(SessionSeries& series, absl::Time until);
  void RefreshDeviceMemory();
  std::string Render();

  const MetricsOptions options_;
  const prometheus::Histogram::BucketBoundaries duration_buckets_;
  const prometheus::Histogram::BucketBoundaries amax_log2_buckets_;
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* rpc_requests_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  prometheus::Family<prometheus::Counter>* rpc_received_bytes_;
  prometheus::Family<prometheus::Counter>* rpc_sent_bytes_;
  prometheus::Gauge* sessions_;
  prometheus::Gauge* compute_queued_;
  prometheus::Family<prometheus::Counter>* train_steps_;
  prometheus::Family<prometheus::Counter>* steps_skipped_;
  prometheus::Family<prometheus::Counter>* checkpoint_saves_;
  prometheus::Histogram* checkpoint_duration_;
  prometheus::Counter* checkpoint_bytes_;
  prometheus::Family<prometheus::Gauge>* loss_;
  prometheus::Family<prometheus::Gauge>* grad_norm_;
  prometheus::Family<prometheus::Gauge>* fp8_amax_;
  prometheus::Family<prometheus::Gauge>* fp8_amax_window_max_;
  prometheus::Family<prometheus::Gauge>* fp8_scale_;
  prometheus::Family<prometheus::Gauge>* fp8_scale_inv_;
  prometheus::Family<prometheus::Histogram>* amax_log2_;
  prometheus::Family<prometheus::Gauge>* fp8_underflow_;
  prometheus::Family<prometheus::Gauge>* fp8_overflow_;
  prometheus::Family<prometheus::Gauge>* fp8_mse_;
  prometheus::Family<prometheus::Histogram>* kernel_duration_;
  prometheus::Family<prometheus::Gauge>* device_memory_;

  absl::Mutex mu_;
  std::map<std::string, SessionSeries> sessions_series_ ABSL_GUARDED_BY(mu_);

  std::unique_ptr<kernels::KernelTimingSink> kernel_timing_;  // null when off
  std::unique_ptr<MetricsHttpServer> http_;  // null when not exposed; destroyed first
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_METRICS_H_
