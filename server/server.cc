#include "server/server.h"

#include <climits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "train/checkpoint.h"

namespace teserve {
namespace server {
namespace {

std::string HostPort(const std::string& host, int port) {
  // IPv6 literals ("::") need brackets.
  if (host.find(':') != std::string::npos) return absl::StrCat("[", host, "]:", port);
  return absl::StrCat(host, ":", port);
}

absl::StatusOr<MetricsOptions> MetricsOptionsOf(const ServerOptions& options) {
  MetricsOptions metrics;
  metrics.host = options.host;
  metrics.port = options.metrics_port;
  absl::StatusOr<MetricsDetail> detail = ParseMetricsDetail(options.metrics_detail);
  if (!detail.ok()) return detail.status();
  metrics.detail = *detail;
  metrics.fp8_stats_interval = options.fp8_stats_interval;
  metrics.kernel_timing_interval = options.kernel_timing_interval;
  absl::Status valid = ValidateMetricsOptions(metrics);
  if (!valid.ok()) return valid;
  return metrics;
}

absl::Status ValidateOptions(const ServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port: expected 0..65535, got ", options.port));
  }
  absl::StatusOr<MetricsOptions> metrics = MetricsOptionsOf(options);
  if (!metrics.ok()) return metrics.status();
  if (options.max_sessions < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_sessions: expected at least 1, got ", options.max_sessions));
  }
  // gRPC takes the limit as an int.
  if (options.max_message_bytes < 1 || options.max_message_bytes > INT_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("--max_message_bytes: expected 1..", INT_MAX,
                                                   ", got ", options.max_message_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceSelection> SelectDevice(absl::string_view flag,
                                             const kernels::DeviceInfo& info) {
  Device device = Device::Cpu();
  if (flag == "auto") {
    if (info.gpu_count > 0) device = Device::Cuda(0);
  } else {
    absl::StatusOr<Device> parsed = ParseDevice(flag);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device: expected auto, cpu, cuda or cuda:N, got '", flag, "'"));
    }
    device = *parsed;
  }
  if (device.is_cpu()) {
    if (flag != "auto") return DeviceSelection{device, "cpu"};
    return DeviceSelection{
        device, absl::StrCat("cpu (--device=auto found no GPU",
                             info.no_gpu_reason.empty() ? "" : ": ", info.no_gpu_reason, ")")};
  }
  if (device.index >= info.gpu_count) {
    std::string why = info.cuda_compiled ? info.no_gpu_reason
                                         : std::string("built without the CUDA backend");
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=", flag, ": expected a visible GPU, got ", info.gpu_count, " GPU(s)",
        why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  // DeviceInfo describes device 0; other indices share its name only on uniform hosts,
  // so name the device only when it is the one described.
  std::string description = device.ToString();
  if (device.index == 0) {
    absl::StrAppend(&description, " (", info.device_name, ", sm_", info.cc_major, info.cc_minor,
                    ")");
  }
  return DeviceSelection{device, description};
}

absl::StatusOr<std::unique_ptr<TeserveServer>> TeserveServer::Start(
    const ServerOptions& options) {
  absl::Status valid = ValidateOptions(options);
  if (!valid.ok()) return valid;

  std::unique_ptr<TeserveServer> server(new TeserveServer());
  const kernels::DeviceInfo info = kernels::QueryDeviceInfo();
  absl::StatusOr<DeviceSelection> device = SelectDevice(options.device, info);
  if (!device.ok()) return device.status();
  server->device_ = *device;
  const bool gpu_selected = !device->device.is_cpu();
  if (gpu_selected) {
    server->device_note_ = absl::StrCat(
        "device ", device->description,
        " detected; sessions of Linear / LayerNorm / RMSNorm models under no recipe, delayed or "
        "current scaling compute on it, other models on the CPU reference backend "
        "(SessionInfo.device_note says why)");
  }

  absl::StatusOr<MetricsOptions> metrics_options = MetricsOptionsOf(options);
  if (!metrics_options.ok()) return metrics_options.status();
  metrics_options->gpu_index = gpu_selected ? device->device.index : -1;
  absl::StatusOr<std::unique_ptr<Metrics>> metrics = Metrics::Create(*metrics_options);
  if (!metrics.ok()) return metrics.status();
  server->metrics_ = std::move(*metrics);

  TrainerConfig config;
  config.selected_device = device->device.ToString();
  config.gpu_selected = gpu_selected;
  config.device_info = info;
  config.max_sessions = options.max_sessions;
  config.max_message_bytes = options.max_message_bytes;
  if (!options.checkpoint_dir.empty()) {
    const absl::Status clean = train::CleanCheckpointDir(options.checkpoint_dir);
    if (!clean.ok()) return clean;
  }
  config.checkpoint_dir = options.checkpoint_dir;
  server->service_ = std::make_unique<TrainerService>(std::move(config), server->metrics_.get());

  // Both are process-wide switches read by ServerBuilder; setting them again for a
  // second server in the same process (tests) is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const std::string address = HostPort(options.host, options.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("gRPC: cannot listen on ", address, " (port in use or bad host?)"));
  }
  return server;
}

void TeserveServer::Shutdown(absl::Duration grace) {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  // Also flips the health service to NOT_SERVING, so load balancers stop routing here.
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
}

void TeserveServer::Wait() {
  server_->Wait();
  service_->CloseSessions();
}

TeserveServer::~TeserveServer() {
  if (server_ == nullptr) return;
  Shutdown(absl::ZeroDuration());
  Wait();
}

}  // namespace server
}  // namespace teserve
