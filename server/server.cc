#include "server/server.h"

#include <algorithm>
#include <climits>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"
#include "server/limits.h"
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
  metrics.host = options.metrics_host;
  metrics.session_ids_in_labels = options.metrics_session_ids;
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
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert, --tls_key: expected both or neither, got one");
  }
  if (!options.tls_ca.empty() && options.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca: expected --tls_cert and --tls_key too (client certificates need TLS)");
  }
  if (options.max_sessions_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat("--max_sessions_per_tenant: expected >= 0 (0 = --max_sessions), got ",
                                                   options.max_sessions_per_tenant));
  }
  if (options.max_tokens_per_request < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_tokens_per_request: expected at least 1, got ", options.max_tokens_per_request));
  }
  if (options.max_attention_scores < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_attention_scores: expected at least 1, got ", options.max_attention_scores));
  }
  if (options.memory_budget_bytes < -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--memory_budget_bytes: expected bytes, 0 (auto) or -1 (no budget), got ", options.memory_budget_bytes));
  }
  if (options.compute_threads < 1 || options.compute_threads > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--compute_threads: expected 1 to 256, got ", options.compute_threads));
  }
  if (options.admission_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--admission_tokens: expected at least 1, got ", options.admission_tokens));
  }
  if (options.session_idle_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("--session_idle_timeout: expected >= 0 (0 = never), got ",
                                                   absl::FormatDuration(options.session_idle_timeout)));
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
        " detected; sessions compute on it (a recipe this GPU cannot run keeps its sessions on the "
        "CPU reference backend; SessionInfo.device_note says why)");
  }

  if (!options.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenAuthenticator>> auth = TokenAuthenticator::Load(options.auth_tokens_file);
    if (!auth.ok()) return auth.status();
    server->auth_ = std::move(*auth);
  }
  absl::StatusOr<MetricsOptions> metrics_options = MetricsOptionsOf(options);
  if (!metrics_options.ok()) return metrics_options.status();
  if (!options.metrics_basic_auth_file.empty()) {
    absl::StatusOr<std::unique_ptr<BasicAuthenticator>> basic =
        BasicAuthenticator::Load(options.metrics_basic_auth_file);
    if (!basic.ok()) return basic.status();
    server->metrics_auth_ = std::move(*basic);
    const BasicAuthenticator* raw = server->metrics_auth_.get();
    metrics_options->authorize = [raw](const std::string& header) { return raw->Check(header); };
  }
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
  config.auth = server->auth_.get();
  config.max_sessions_per_tenant = options.max_sessions_per_tenant;
  config.request_limits.max_tokens_per_request = options.max_tokens_per_request;
  config.request_limits.max_attention_scores = options.max_attention_scores;
  config.request_limits.max_message_bytes = options.max_message_bytes;
  config.memory_budget_bytes =
      options.memory_budget_bytes == 0 ? DefaultMemoryBudgetBytes() : options.memory_budget_bytes;
  config.admission_tokens = options.admission_tokens;
  config.compute_threads = options.compute_threads;
  if (!options.checkpoint_dir.empty()) {
    const absl::Status clean = train::CleanCheckpointDir(options.checkpoint_dir);
    if (!clean.ok()) return clean;
    // And each tenant's directory ("@<tenant>", TrainerService::CheckpointDirOf).
    std::error_code ec;
    for (const std::filesystem::directory_entry& entry :
         std::filesystem::directory_iterator(options.checkpoint_dir, ec)) {
      if (entry.path().filename().string().rfind('@', 0) != 0 || !entry.is_directory(ec)) continue;
      const absl::Status tenant_clean = train::CleanCheckpointDir(entry.path().string());
      if (!tenant_clean.ok()) return tenant_clean;
    }
  }
  config.checkpoint_dir = options.checkpoint_dir;
  config.session_idle_timeout = options.session_idle_timeout;
  server->checkpoints_ = !options.checkpoint_dir.empty();
  server->service_ = std::make_unique<TrainerService>(std::move(config), server->metrics_.get());

  // Both are process-wide switches read by ServerBuilder; setting them again for a
  // second server in the same process (tests) is harmless.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  const std::string address = HostPort(options.host, options.port);
  grpc::ServerBuilder builder;
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadSecretFile(options.tls_cert, "--tls_cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadSecretFile(options.tls_key, "--tls_key");
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    if (!options.tls_ca.empty()) {
      absl::StatusOr<std::string> ca = ReadSecretFile(options.tls_ca, "--tls_ca");
      if (!ca.ok()) return ca.status();
      ssl.pem_root_certs = *ca;
      ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
      server->mtls_ = true;
    }
    credentials = grpc::SslServerCredentials(ssl);
    server->tls_ = true;
  }
  builder.AddListeningPort(address, credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(static_cast<int>(options.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(options.max_message_bytes));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("gRPC: cannot listen on ", address,
                     server->tls_ ? " (port in use, bad host, or a bad TLS certificate/key?)"
                                  : " (port in use or bad host?)"));
  }
  if (options.session_idle_timeout > absl::ZeroDuration()) {
    TeserveServer* raw = server.get();
    const absl::Duration idle = options.session_idle_timeout;
    server->reaper_ = std::thread([raw, idle] { raw->ReapIdleSessions(idle); });
  }
  return server;
}

void TeserveServer::ReapIdleSessions(absl::Duration idle) {
  // Checks a few times per timeout (at most every 30 s, at least every 10 ms), so a
  // session expires between `idle` and about 1.25 x `idle` after its last call.
  const absl::Duration period = std::min(std::max(idle / 4, absl::Milliseconds(10)), absl::Seconds(30));
  absl::MutexLock lock(&shutdown_mu_);
  while (!shut_down_) {
    shutdown_mu_.AwaitWithTimeout(absl::Condition(&shut_down_), period);
    if (shut_down_) break;
    shutdown_mu_.Unlock();
    service_->ExpireIdleSessions(idle);
    shutdown_mu_.Lock();
  }
}

absl::Status TeserveServer::ReloadCredentials() {
  absl::Status status;
  if (auth_ != nullptr) status.Update(auth_->Reload());
  if (metrics_auth_ != nullptr) status.Update(metrics_auth_->Reload());
  return status;
}

void TeserveServer::Shutdown(absl::Duration grace) {
  const absl::Time start = absl::Now();
  const absl::Time end = start + std::max(grace, absl::ZeroDuration());
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
    // With checkpoints, the end of the grace period is for the final checkpoints:
    // training calls still running after kCallShareOfGrace of it stop at their next
    // layer boundary with UNAVAILABLE (undone, so the final checkpoint holds the state
    // the client last saw succeed).
    stop_calls_at_ = checkpoints_ ? start + (end - start) * kCallShareOfGrace : end;
    checkpoint_deadline_ = end;
  }
  if (reaper_.joinable()) reaper_.join();
  // Health NOT_SERVING first, so load balancers stop routing here; calls that still
  // arrive get UNAVAILABLE from the service while the running ones finish (or stop,
  // see above).
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(false);
  }
  const bool drained = service_->Drain(stop_calls_at_, end);
  // Closes the listener and the connections (clients still sending see UNAVAILABLE, or
  // CANCELLED for a call that reaches the transport in this very instant); cancels what
  // is left at `end`, or kFlushAtMost from now when no call of ours is running any more:
  // time for the answers just finished to reach their clients (cancelled at once, a
  // finished call's client would see CANCELLED instead of its status), while gRPC would
  // otherwise hold the stop until `end` for transport-level work that is no call's (seen
  // after a long call answered UNAVAILABLE), time the final checkpoints need.
  constexpr absl::Duration kFlushAtMost = absl::Milliseconds(100);
  server_->Shutdown(absl::ToChronoTime(drained ? std::min(end, absl::Now() + kFlushAtMost) : end));
}

void TeserveServer::Wait() {
  server_->Wait();
  absl::Time checkpoint_deadline;
  {
    absl::MutexLock lock(&shutdown_mu_);
    checkpoint_deadline = checkpoint_deadline_;
  }
  std::vector<std::shared_ptr<train::Session>> closed = service_->CloseSessions(checkpoint_deadline);
  absl::MutexLock lock(&shutdown_mu_);
  for (std::shared_ptr<train::Session>& session : closed) closed_sessions_.push_back(std::move(session));
}

TeserveServer::~TeserveServer() {
  if (server_ == nullptr) return;
  Shutdown(absl::ZeroDuration());
  Wait();
}

}  // namespace server
}  // namespace teserve
