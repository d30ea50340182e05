// TeserveServer: the gRPC server (Trainer, health, reflection) plus the metrics
// endpoint, as one object that main and the integration tests start the same way.
//
// Lifetime: Start() binds and serves; Shutdown(grace) stops accepting, lets in-flight
// RPCs finish (with --checkpoint_dir, training calls for the first kCallShareOfGrace of
// `grace`, then they stop at a layer boundary with UNAVAILABLE) and cancels what is left at the end of
// `grace`; Wait() blocks until the server is stopped, then, until the end of `grace`,
// writes the final checkpoint of each session configured to checkpoint, and deletes the
// sessions. The destructor shuts down (with no grace period: no final checkpoints) if
// nobody did.
#ifndef TESERVE_SERVER_SERVER_H_
#define TESERVE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "core/tensor.h"
#include "grpcpp/grpcpp.h"
#include "kernels/device_info.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/trainer_service.h"

namespace teserve {
namespace server {

// With --checkpoint_dir, the share of the shutdown grace period that training calls get
// before they stop; the rest is for the final checkpoints. Checkpoints get the larger
// share: a stopped call costs its client a retry, a missed final checkpoint every step
// since the last one.
inline constexpr double kCallShareOfGrace = 0.4;

struct ServerOptions {
  std::string host = "0.0.0.0";
  int port = 50051;           // 0: any free port (see TeserveServer::port())
  int metrics_port = 9464;    // 0: any free port; -1: no metrics endpoint
  std::string device = "auto";  // auto | cpu | cuda | cuda:N
  int64_t max_sessions = 64;
  int64_t max_message_bytes = int64_t{1} << 30;  // send and receive
  // Metrics (server/metrics.h): tensor | layer | session | off, FP8 health sampled every
  // fp8_stats_interval steps, kernels timed every kernel_timing_interval calls per op
  // (0 turns either off).
  std::string metrics_detail = "tensor";
  int64_t fp8_stats_interval = 10;
  int64_t kernel_timing_interval = 16;

  // Security (docs/operations.md, "Security"). Empty paths: off.
  std::string metrics_host = "127.0.0.1";  // numeric; the metrics endpoint's bind address
  bool metrics_session_ids = false;        // session ids in metric labels (else a digest)
  std::string metrics_basic_auth_file;     // "user:password" lines; scrapes need one
  std::string tls_cert;                    // PEM certificate chain; with tls_key: TLS
  std::string tls_key;                     // PEM private key
  std::string tls_ca;                      // PEM CA bundle; set: clients need a cert it signed (mTLS)
  std::string auth_tokens_file;            // "<token> <tenant>" lines; set: bearer tokens required

  // Limits (server/limits.h).
  int64_t max_sessions_per_tenant = 0;                // 0: max_sessions
  int64_t max_tokens_per_request = 65536;
  int64_t max_attention_scores = int64_t{1} << 27;    // per attention layer and request
  int64_t memory_budget_bytes = 0;                    // 0: cgroup memory.max or MemTotal; -1: none
  int64_t admission_tokens = 8192;                    // tokens per request assumed at admission
  // Training calls (Forward, Backward, ForwardBackward, Step, ZeroGrad) computing at once on
  // the device (server/compute_executor.h); more wait in arrival order.
  int compute_threads = 4;
  absl::Duration session_idle_timeout = absl::ZeroDuration();  // 0: sessions never expire
  // Where checkpoints live (created when missing; leftovers of interrupted writes are
  // cleaned at startup). Empty: the checkpoint RPCs answer FAILED_PRECONDITION.
  std::string checkpoint_dir;
};

struct DeviceSelection {
  Device device;
  // "cpu", or "cuda:0 (NVIDIA H200, sm_90)".
  std::string description;
};

// --device resolution: auto picks cuda:0 when a GPU is visible, else cpu. Asking for a
// GPU that is not there is FAILED_PRECONDITION naming the flag and what the machine has.
absl::StatusOr<DeviceSelection> SelectDevice(absl::string_view flag,
                                             const kernels::DeviceInfo& info);

class TeserveServer {
 public:
  static absl::StatusOr<std::unique_ptr<TeserveServer>> Start(const ServerOptions& options);
  ~TeserveServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_->port(); }  // -1 when off
  const DeviceSelection& device() const { return device_; }
  // A sentence for the log when the selected device is not where sessions compute, or
  // empty. Never claims more than the server does.
  const std::string& device_note() const { return device_note_; }

  void Shutdown(absl::Duration grace);
  // Re-reads --auth_tokens_file and --metrics_basic_auth_file (SIGHUP). On error the
  // credentials already loaded stay in force; the error names the file and line.
  absl::Status ReloadCredentials();
  // Whether bearer tokens / TLS are on (for the startup log).
  bool auth_enabled() const { return auth_ != nullptr; }
  bool tls_enabled() const { return tls_; }
  bool mtls_enabled() const { return mtls_; }
  // Returns once the server has stopped; then closes the sessions left (final
  // checkpoints, metric series); their memory is freed when the server is destroyed.
  void Wait();

 private:
  TeserveServer() = default;

  void ReapIdleSessions(absl::Duration idle);

  DeviceSelection device_;
  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<BasicAuthenticator> metrics_auth_;
  bool tls_ = false;
  bool mtls_ = false;
  std::string device_note_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<TrainerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool checkpoints_ = false;  // --checkpoint_dir set
  absl::Mutex shutdown_mu_;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  // Set by Shutdown: when running training calls stop, and until when Wait() writes
  // final checkpoints.
  absl::Time stop_calls_at_ = absl::InfiniteFuture();
  absl::Time checkpoint_deadline_ ABSL_GUARDED_BY(shutdown_mu_) = absl::InfinitePast();
  // The sessions Wait closed: freed with the server, or never when the process exits
  // without destroying it (server/main.cc).
  std::vector<std::shared_ptr<train::Session>> closed_sessions_ ABSL_GUARDED_BY(shutdown_mu_);
  std::thread reaper_;  // idle-session expiry; joinable only with --session_idle_timeout
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_SERVER_H_
