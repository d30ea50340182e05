#include "server/metrics.h"

#include "absl/strings/escaping.h"
#include "server/auth.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/device_info.h"
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

// 1 us .. ~4 s in factors of 2: one small CPU cast up to a large CPU attention.
prometheus::Histogram::BucketBoundaries KernelBuckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (double b = 1e-6; b < 5.0; b *= 2.0) bounds.push_back(b);
  return bounds;
}

// log2(amax) from -24 to 24 in steps of 2 (FP8 E4M3 spans about 2^-9 .. 2^8.8).
prometheus::Histogram::BucketBoundaries AmaxLog2Buckets() {
  prometheus::Histogram::BucketBoundaries bounds;
  for (int b = -24; b <= 24; b += 2) bounds.push_back(b);
  return bounds;
}

template <typename Builder>
auto& Register(Builder builder, const char* name, const char* help,
               prometheus::Registry& registry) {
  return builder.Name(name).Help(help).Register(registry);
}

// Bytes of physical memory this process uses (resident set), or -1 when unknown.
double ProcessRssBytes() {
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr) return -1.0;
  long long total_pages = 0, resident_pages = 0;
  const int read = std::fscanf(statm, "%lld %lld", &total_pages, &resident_pages);
  std::fclose(statm);
  if (read != 2) return -1.0;
  return static_cast<double>(resident_pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return -1.0;
  return static_cast<double>(pages) * static_cast<double>(page_size);
}

}  // namespace

absl::StatusOr<MetricsDetail> ParseMetricsDetail(absl::string_view text) {
  if (text == "tensor") return MetricsDetail::kTensor;
  if (text == "layer") return MetricsDetail::kLayer;
  if (text == "session") return MetricsDetail::kSession;
  if (text == "off") return MetricsDetail::kOff;
  return absl::InvalidArgumentError(absl::StrCat(
      "--metrics_detail: expected tensor, layer, session or off, got '", text, "'"));
}

absl::string_view MetricsDetailName(MetricsDetail detail) {
  switch (detail) {
    case MetricsDetail::kTensor: return "tensor";
    case MetricsDetail::kLayer: return "layer";
    case MetricsDetail::kSession: return "session";
    case MetricsDetail::kOff: return "off";
  }
  return "unknown";
}

// Observes sampled kernel durations into teserve_kernel_duration_seconds. The CPU
// histograms are looked up once per op; other devices go through the family's map.
class Metrics::KernelTimings final : public kernels::KernelTimingSink {
 public:
  KernelTimings(int64_t interval, prometheus::Family<prometheus::Histogram>* family)
      : KernelTimingSink(interval), family_(family), buckets_(KernelBuckets()) {}

  void Record(kernels::KernelOp op, const Device& device, double seconds) override {
    if (!device.is_cpu()) {
      Add(op, device).Observe(seconds);
      return;
    }
    std::atomic<prometheus::Histogram*>& cached = cpu_[static_cast<int>(op)];
    prometheus::Histogram* histogram = cached.load(std::memory_order_acquire);
    if (histogram == nullptr) {
      histogram = &Add(op, device);  // Family::Add returns the same series every time
      cached.store(histogram, std::memory_order_release);
    }
    histogram->Observe(seconds);
  }

 private:
  prometheus::Histogram& Add(kernels::KernelOp op, const Device& device) {
    return family_->Add(
        {{"op", std::string(kernels::KernelOpName(op))}, {"device", device.ToString()}}, buckets_);
  }

  prometheus::Family<prometheus::Histogram>* const family_;
  const prometheus::Histogram::BucketBoundaries buckets_;
  std::array<std::atomic<prometheus::Histogram*>, kernels::kNumKernelOps> cpu_{};
};

struct Metrics::Fp8Values {
  bool seen = false;  // a quantizer contributed
  float amax = 0.0f;
  float window_max = 0.0f;
  float scale = 0.0f;
  float scale_inv = 0.0f;
  int64_t quantize_calls = 0;  // summed over a layer's quantizers
  bool health = false;         // valid health statistics contributed
  double underflow = 0.0;
  double overflow = 0.0;
  double mse = 0.0;

  // The max over the contributions (a single one at --metrics_detail=tensor).
  void Add(const train::QuantizerSample& q) {
    amax = seen ? std::max(amax, q.amax) : q.amax;
    window_max = seen ? std::max(window_max, q.window_max) : q.window_max;
    scale = seen ? std::max(scale, q.scale) : q.scale;
    scale_inv = seen ? std::max(scale_inv, q.scale_inv) : q.scale_inv;
    quantize_calls += q.quantize_calls;
    seen = true;
    if (!q.health.valid) return;
    underflow = health ? std::max(underflow, q.health.underflow_ratio) : q.health.underflow_ratio;
    overflow = health ? std::max(overflow, q.health.overflow_ratio) : q.health.overflow_ratio;
    mse = health ? std::max(mse, q.health.mse) : q.health.mse;
    health = true;
  }
};

Metrics::Metrics(const MetricsOptions& options)
    : options_(options),
      duration_buckets_(DurationBuckets()),
      amax_log2_buckets_(AmaxLog2Buckets()),
      registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;
  rpc_requests_ = &Register(BuildCounter(), "teserve_rpc_requests_total",
                            "RPCs finished, by method and gRPC status code", r);
  rpc_duration_ = &Register(BuildHistogram(), "teserve_rpc_duration_seconds",
                            "Time from receiving an RPC to finishing it, by method", r);
  rpc_received_bytes_ = &Register(BuildCounter(), "teserve_rpc_received_bytes_total",
                                  "Serialized size of the requests received, by method", r);
  rpc_sent_bytes_ = &Register(BuildCounter(), "teserve_rpc_sent_bytes_total",
                              "Serialized size of the responses sent (successful calls), by method",
                              r);
  sessions_ = &Register(BuildGauge(), "teserve_sessions", "Live training sessions", r).Add({});
  compute_queued_ = &Register(BuildGauge(), "teserve_compute_queued_calls",
                              "Training calls waiting for a compute thread (--compute_threads)", r)
                         .Add({});
  train_steps_ = &Register(BuildCounter(), "teserve_train_steps_total",
                           "Optimizer steps that updated the parameters (SessionInfo.step)", r);
  steps_skipped_ = &Register(BuildCounter(), "teserve_steps_skipped_total",
                             "Optimizer steps skipped because the gradients were not finite", r);
  checkpoint_saves_ = &Register(BuildCounter(), "teserve_checkpoint_saves_total",
                                "Checkpoint saves, by result (ok, error)", r);
  checkpoint_duration_ = &Register(BuildHistogram(), "teserve_checkpoint_save_duration_seconds",
                                   "Time to capture and write a checkpoint (saved ones)", r)
                              .Add({}, duration_buckets_);
  checkpoint_bytes_ = &Register(BuildCounter(), "teserve_checkpoint_bytes_total",
                                "Bytes of the checkpoints saved", r)
                           .Add({});
  loss_ = &Register(BuildGauge(), "teserve_loss", "Loss of the latest ForwardBackward", r);
  grad_norm_ = &Register(BuildGauge(), "teserve_grad_norm",
                         "Global L2 gradient norm of the latest Step, before clipping", r);
  fp8_amax_ = &Register(BuildGauge(), "teserve_fp8_amax",
                        "amax of the latest quantization of the tensor", r);
  fp8_amax_window_max_ = &Register(
      BuildGauge(), "teserve_fp8_amax_window_max",
      "Max of the amax history (delayed scaling); the latest amax for other recipes", r);
  fp8_scale_ = &Register(BuildGauge(), "teserve_fp8_scale",
                         "Per-tensor scale (q = cast(x * scale)); 1 for block recipes", r);
  fp8_scale_inv_ = &Register(BuildGauge(), "teserve_fp8_scale_inv",
                             "Per-tensor scale_inv (x ~= q * scale_inv); 1 for block recipes", r);
  amax_log2_ = &Register(BuildHistogram(), "teserve_amax_log2",
                         "log2(amax) of the tensor at each update in which it was quantized "
                         "(amax 0 skipped)",
                         r);
  fp8_underflow_ = &Register(BuildGauge(), "teserve_fp8_underflow_ratio",
                             "Non-zero values that quantized to zero (sampled)", r);
  fp8_overflow_ = &Register(BuildGauge(), "teserve_fp8_overflow_ratio",
                            "Values beyond the format's range at the scale in use (sampled)", r);
  fp8_mse_ = &Register(BuildGauge(), "teserve_fp8_quantization_mse",
                       "Mean squared quantization error (sampled)", r);
  kernel_duration_ = &Register(BuildHistogram(), "teserve_kernel_duration_seconds",
                               "Kernel durations, sampled every --kernel_timing_interval calls "
                               "per op",
                               r);
  device_memory_ = &Register(BuildGauge(), "teserve_device_memory_bytes",
                             "Device memory in bytes (CPU: process RSS as used)", r);
}

Metrics::~Metrics() = default;

absl::Status ValidateMetricsOptions(const MetricsOptions& options) {
  if (options.port < -1 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_port: expected -1 (off) or 0..65535, got ", options.port));
  }
  if (options.fp8_stats_interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--fp8_stats_interval: expected 0 (off) or a step count >= 1, got ",
        options.fp8_stats_interval));
  }
  if (options.kernel_timing_interval < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kernel_timing_interval: expected 0 (off) or a call count >= 1, got ",
        options.kernel_timing_interval));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options) {
  absl::Status valid = ValidateMetricsOptions(options);
  if (!valid.ok()) return valid;
  std::unique_ptr<Metrics> metrics(new Metrics(options));
  if (options.port < 0) return metrics;
  if (options.detail != MetricsDetail::kOff && options.kernel_timing_interval > 0) {
    metrics->kernel_timing_ =
        std::make_unique<KernelTimings>(options.kernel_timing_interval, metrics->kernel_duration_);
  }
  Metrics* raw = metrics.get();
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> http =
      MetricsHttpServer::Start(options.host, options.port, [raw] { return raw->Render(); },
                               options.authorize);
  if (!http.ok()) return http.status();
  metrics->http_ = std::move(*http);
  return metrics;
}

std::string Metrics::Render() {
  RefreshDeviceMemory();
  // GPU kernel timings whose events have completed since the last sampled call.
  if (kernel_timing_ != nullptr) kernel_timing_->Drain();
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

void Metrics::RecordRpc(absl::string_view method, grpc::StatusCode code, double seconds,
                        int64_t received_bytes, int64_t sent_bytes) {
  // The codes line up with absl's, which can name them ("INVALID_ARGUMENT").
  const std::string code_name = absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
  const prometheus::Labels by_method{{"method", std::string(method)}};
  rpc_requests_->Add({{"method", std::string(method)}, {"code", code_name}}).Increment();
  rpc_duration_->Add(by_method, duration_buckets_).Observe(seconds);
  rpc_received_bytes_->Add(by_method).Increment(static_cast<double>(received_bytes));
  rpc_sent_bytes_->Add(by_method).Increment(static_cast<double>(sent_bytes));
}

std::string SessionMetricsLabel(const std::string& id, bool session_ids_in_labels) {
  if (session_ids_in_labels) return id;
  // 64 bits of SHA-256: stable for the session's life, distinct in practice, and no
  // use to anyone who wants to address the session.
  return absl::BytesToHexString(absl::string_view(Sha256(absl::StrCat("teserve-metrics-label:", id))).substr(0, 8));
}

void Metrics::SetSessions(int64_t live) { sessions_->Set(static_cast<double>(live)); }
void Metrics::SetComputeQueued(int64_t calls) { compute_queued_->Set(static_cast<double>(calls)); }

void Metrics::RecordCheckpointSave(bool ok, double seconds, int64_t bytes) {
  checkpoint_saves_->Add({{"result", ok ? "ok" : "error"}}).Increment();
  if (!ok) return;
  checkpoint_duration_->Observe(seconds);
  checkpoint_bytes_->Increment(static_cast<double>(bytes));
}

bool Metrics::fp8_series() const {
  return options_.detail == MetricsDetail::kTensor || options_.detail == MetricsDetail::kLayer;
}

bool Metrics::SamplesHealthInStep(int64_t step) const {
  return fp8_series() && http_ != nullptr && options_.fp8_stats_interval > 0 &&
         step % options_.fp8_stats_interval == 0;
}

void Metrics::AddRows(const std::string& id,
                      const std::vector<std::pair<std::string, std::string>>& quantizers,
                      SessionSeries& series) {
  std::map<std::string, size_t> layer_rows;  // --metrics_detail=layer
  for (const auto& [layer, tensor] : quantizers) {
    if (options_.detail == MetricsDetail::kLayer) {
      const auto [it, first] = layer_rows.emplace(layer, series.rows.size());
      series.row_of_quantizer.push_back(it->second);
      if (!first) continue;
    } else {
      series.row_of_quantizer.push_back(series.rows.size());
    }
    TensorSeries row;
    row.labels = {{"session", SessionMetricsLabel(id, options_.session_ids_in_labels)},
                  {"layer", layer},
                  {"tensor", options_.detail == MetricsDetail::kLayer ? "all" : tensor}};
    row.amax = &fp8_amax_->Add(row.labels);
    row.window_max = &fp8_amax_window_max_->Add(row.labels);
    row.scale = &fp8_scale_->Add(row.labels);
    row.scale_inv = &fp8_scale_inv_->Add(row.labels);
    row.amax_log2 = &amax_log2_->Add(row.labels, amax_log2_buckets_);
    series.rows.push_back(std::move(row));
  }
}

bool Metrics::AddSession(const std::string& id,
                         const std::vector<std::pair<std::string, std::string>>& quantizers) {
  if (options_.detail == MetricsDetail::kOff) return false;
  absl::MutexLock lock(&mu_);
  if (sessions_series_.count(id) != 0) return false;
  SessionSeries& series = sessions_series_[id];
  series.steps = &train_steps_->Add({{"session", SessionMetricsLabel(id, options_.session_ids_in_labels)}});
  series.skipped = &steps_skipped_->Add({{"session", SessionMetricsLabel(id, options_.session_ids_in_labels)}});
  if (fp8_series()) AddRows(id, quantizers, series);
  return true;
}

void Metrics::UpdateRow(const Fp8Values& values, bool health_sampled, TensorSeries& row) {
  row.amax->Set(values.amax);
  row.window_max->Set(values.window_max);
  row.scale->Set(values.scale);
  row.scale_inv->Set(values.scale_inv);
  if (values.quantize_calls > row.quantize_calls && values.amax > 0.0f && std::isfinite(values.amax)) {
    row.amax_log2->Observe(std::log2(static_cast<double>(values.amax)));
  }
  row.quantize_calls = values.quantize_calls;
  if (!health_sampled || !values.health) return;
  if (row.underflow == nullptr) {
    row.underflow = &fp8_underflow_->Add(row.labels);
    row.overflow = &fp8_overflow_->Add(row.labels);
    row.mse = &fp8_mse_->Add(row.labels);
  }
  row.underflow->Set(values.underflow);
  row.overflow->Set(values.overflow);
  row.mse->Set(values.mse);
}

std::optional<bool> Metrics::UpdateSession(const std::string& id,
                                           const train::SessionSnapshot& snapshot) {
  if (options_.detail == MetricsDetail::kOff) return std::nullopt;
  const train::TrainingStats& stats = snapshot.stats;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_series_.find(id);
    if (it == sessions_series_.end()) return std::nullopt;  // removed meanwhile
    SessionSeries& series = it->second;
    const double steps = static_cast<double>(stats.step);
    if (steps > series.steps->Value()) series.steps->Increment(steps - series.steps->Value());
    const double skipped = static_cast<double>(stats.skipped_steps);
    if (skipped > series.skipped->Value()) {
      series.skipped->Increment(skipped - series.skipped->Value());
    }
    if (stats.has_loss) {
      if (series.loss == nullptr) series.loss = &loss_->Add({{"session", SessionMetricsLabel(id, options_.session_ids_in_labels)}});
      series.loss->Set(stats.loss);
    }
    if (stats.has_grad_norm) {
      if (series.grad_norm == nullptr) series.grad_norm = &grad_norm_->Add({{"session", SessionMetricsLabel(id, options_.session_ids_in_labels)}});
      series.grad_norm->Set(stats.grad_norm);
    }
    if (!snapshot.quantizers.empty() &&
        snapshot.quantizers.size() == series.row_of_quantizer.size()) {
      std::vector<Fp8Values> values(series.rows.size());
      for (size_t i = 0; i < snapshot.quantizers.size(); ++i) {
        values[series.row_of_quantizer[i]].Add(snapshot.quantizers[i]);
      }
      for (size_t r = 0; r < series.rows.size(); ++r) {
        UpdateRow(values[r], stats.health_sampling, series.rows[r]);
      }
    }
  }
  // The passes that follow belong to step stats.step + 1.
  return SamplesHealthInStep(stats.step + 1);
}

void Metrics::RemoveSeries(SessionSeries& series, absl::Time until) {
  if (series.steps != nullptr) train_steps_->Remove(series.steps);
  if (series.skipped != nullptr) steps_skipped_->Remove(series.skipped);
  if (series.loss != nullptr) loss_->Remove(series.loss);
  if (series.grad_norm != nullptr) grad_norm_->Remove(series.grad_norm);
  for (TensorSeries& t : series.rows) {
    if (absl::Now() >= until) return;
    fp8_amax_->Remove(t.amax);
    fp8_amax_window_max_->Remove(t.window_max);
    fp8_scale_->Remove(t.scale);
    fp8_scale_inv_->Remove(t.scale_inv);
    amax_log2_->Remove(t.amax_log2);
    if (t.underflow != nullptr) {
      fp8_underflow_->Remove(t.underflow);
      fp8_overflow_->Remove(t.overflow);
      fp8_mse_->Remove(t.mse);
    }
  }
}

void Metrics::RemoveSession(const std::string& id, absl::Time until) {
  SessionSeries series;
  {
    absl::MutexLock lock(&mu_);
    auto it = sessions_series_.find(id);
    if (it == sessions_series_.end()) return;
    series = std::move(it->second);
    sessions_series_.erase(it);
  }
  // Outside mu_: the families lock themselves, and a deep model's removal takes long
  // enough (prometheus-cpp scans a family per series) that the other sessions' updates
  // should not wait for it. No update reaches these series any more.
  RemoveSeries(series, until);
}

void Metrics::RefreshDeviceMemory() {
  if (options_.detail == MetricsDetail::kOff) return;
  const double rss = ProcessRssBytes();
  if (rss >= 0) device_memory_->Add({{"device", "cpu"}, {"kind", "used"}}).Set(rss);
  const double total = PhysicalMemoryBytes();
  if (total >= 0) device_memory_->Add({{"device", "cpu"}, {"kind", "total"}}).Set(total);
  if (options_.gpu_index < 0) return;
  absl::StatusOr<kernels::DeviceMemory> gpu = kernels::QueryDeviceMemory(options_.gpu_index);
  if (!gpu.ok()) return;  // no sample this scrape; the series keep their last value
  const std::string device = Device::Cuda(options_.gpu_index).ToString();
  device_memory_->Add({{"device", device}, {"kind", "used"}})
      .Set(static_cast<double>(gpu->used_bytes));
  device_memory_->Add({{"device", device}, {"kind", "total"}})
      .Set(static_cast<double>(gpu->total_bytes));
  device_memory_->Add({{"device", device}, {"kind", "pool_reserved"}})
      .Set(static_cast<double>(gpu->pool_reserved_bytes));
  device_memory_->Add({{"device", device}, {"kind", "pool_used"}})
      .Set(static_cast<double>(gpu->pool_used_bytes));
}

}  // namespace server
}  // namespace teserve
