// teserve.v1.Trainer on gRPC's callback API: the protocol layer over SessionRegistry
// and train::Session.
//
// Each handler validates the request, calls into the session and finishes its reactor
// before returning (the CPU reference backend computes inline on the gRPC callback
// thread; the per-device executor of docs/ARCHITECTURE.md, "Device model", replaces
// that when the CUDA layers land). absl::Status is converted to grpc::Status only here; the codes line up.
// Nothing on these paths throws, aborts or exits on client input.
#ifndef TESERVE_SERVER_TRAINER_SERVICE_H_
#define TESERVE_SERVER_TRAINER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "grpcpp/grpcpp.h"
#include "kernels/device_info.h"
#include "server/auth.h"
#include "server/compute_executor.h"
#include "server/limits.h"
#include "server/metrics.h"
#include "server/session_registry.h"
#include "server/tensor_codec.h"
#include "teserve/v1/service.grpc.pb.h"

namespace teserve {
namespace server {

inline constexpr char kTeserveVersion[] = "0.1.0";

struct TrainerConfig {
  // The device chosen by --device ("cpu", "cuda:0"), and whether it is a GPU (sessions
  // are created there).
  std::string selected_device = "cpu";
  bool gpu_selected = false;
  kernels::DeviceInfo device_info;
  int64_t max_sessions = 64;
  int64_t max_message_bytes = int64_t{1} << 30;
  // Security and limits (server/auth.h, server/limits.h; README lists the flags).
  // Bearer-token authentication; null: every call is tenant "" (no authentication).
  const TokenAuthenticator* auth = nullptr;
  int64_t max_sessions_per_tenant = 0;   // 0: max_sessions
  RequestLimits request_limits;          // its max_message_bytes is max_message_bytes
  int64_t memory_budget_bytes = -1;      // admission budget; -1: none (MemAvailable only)
  int64_t admission_tokens = 8192;       // tokens per request the admission estimate assumes
  // --checkpoint_dir: where SaveCheckpoint / LoadCheckpoint / from_checkpoint and
  // checkpoint_every_steps read and write (created at startup); empty: checkpoints off.
  std::string checkpoint_dir;
  absl::Duration session_idle_timeout = absl::ZeroDuration();  // reported; the server expires
  int compute_threads = 4;  // --compute_threads (ComputeExecutor)
};

grpc::Status ToGrpcStatus(const absl::Status& status);

class TrainerService final : public v1::Trainer::CallbackService {
 public:
  // `metrics` must outlive the service.
  TrainerService(TrainerConfig config, Metrics* metrics);

  // Closes every session (server shutdown, once no RPC runs) and, while
  // `checkpoint_deadline` has not passed, removes their metric series.
  // First, until `checkpoint_deadline`, each session configured to checkpoint
  // (checkpoint_every_steps > 0) whose state changed since its last checkpoint is saved
  // as its final checkpoint (FinalCheckpointName); the ones left when the deadline passes
  // are logged, not saved. Returns the closed sessions, which are destroyed with the last
  // reference: a server about to exit may keep them, since freeing a deep model's device
  // state tensor by tensor takes longer than the process's exit does.
  std::vector<std::shared_ptr<train::Session>> CloseSessions(absl::Time checkpoint_deadline);
  // Deletes the sessions idle for `idle` or longer (no RPC named them) and not in use
  // right now, with their metric series, saving the final checkpoint of each one
  // configured to checkpoint first (as CloseSessions); returns how many. ListCheckpoints,
  // LoadCheckpoint and CreateSession(from_checkpoint) wait while this runs, so a client
  // that finds its session gone finds its final checkpoint listed.
  int64_t ExpireIdleSessions(absl::Duration idle);
  // Server stop, first part: from now on every Trainer call that arrives is answered
  // UNAVAILABLE ("the server is shutting down") without work; from `stop_calls_at` on,
  // Forward / Backward / ForwardBackward / Step still running stop at their next check
  // point with UNAVAILABLE, undone (train/session.h, "Interruption"). Returns once no
  // Trainer call runs and none arrived for 200 ms (clients have heard), or, with calls
  // still arriving, once none runs after 1 s (or `stop_calls_at`); at the latest at
  // `deadline`. Returns whether no call runs.
  bool Drain(absl::Time stop_calls_at, absl::Time deadline);

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::CreateSessionResponse* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::SessionInfo* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* context,
                                          const v1::DeleteSessionRequest* request,
                                          v1::DeleteSessionResponse* response) override;
  grpc::ServerUnaryReactor* Forward(grpc::CallbackServerContext* context,
                                    const v1::ForwardRequest* request,
                                    v1::ForwardResponse* response) override;
  grpc::ServerUnaryReactor* Backward(grpc::CallbackServerContext* context,
                                     const v1::BackwardRequest* request,
                                     v1::BackwardResponse* response) override;
  grpc::ServerUnaryReactor* ForwardBackward(grpc::CallbackServerContext* context,
                                            const v1::ForwardBackwardRequest* request,
                                            v1::ForwardBackwardResponse* response) override;
  grpc::ServerUnaryReactor* Step(grpc::CallbackServerContext* context,
                                 const v1::StepRequest* request,
                                 v1::StepResponse* response) override;
  grpc::ServerUnaryReactor* ZeroGrad(grpc::CallbackServerContext* context,
                                     const v1::ZeroGradRequest* request,
                                     v1::ZeroGradResponse* response) override;
  grpc::ServerUnaryReactor* GetParameters(grpc::CallbackServerContext* context,
                                          const v1::GetParametersRequest* request,
                                          v1::GetParametersResponse* response) override;
  grpc::ServerUnaryReactor* SetParameters(grpc::CallbackServerContext* context,
                                          const v1::SetParametersRequest* request,
                                          v1::SetParametersResponse* response) override;
  grpc::ServerUnaryReactor* GetQuantizationState(grpc::CallbackServerContext* context,
                                                 const v1::GetQuantizationStateRequest* request,
                                                 v1::QuantizationState* response) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::ServerInfo* response) override;
  grpc::ServerUnaryReactor* SaveCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::SaveCheckpointRequest* request,
                                           v1::SaveCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* LoadCheckpoint(grpc::CallbackServerContext* context,
                                           const v1::LoadCheckpointRequest* request,
                                           v1::LoadCheckpointResponse* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(grpc::CallbackServerContext* context,
                                            const v1::ListCheckpointsRequest* request,
                                            v1::ListCheckpointsResponse* response) override;

 private:
  // A session's checkpoint_every_steps policy, and the StateVersion its latest periodic
  // or final checkpoint holds (a session whose version is still that needs no final one).
  struct AutoCheckpoint {
    int64_t every_steps = 0;
    int32_t keep_last = 0;
    std::string prefix;
    std::string tenant;  // whose checkpoint directory they go to
    uint64_t saved_version = 0;
  };

  struct Saved {
    int64_t step = 0;
    int64_t bytes = 0;
    uint64_t version = 0;  // the session's StateVersion in the checkpoint
  };

  // FAILED_PRECONDITION when the server runs without --checkpoint_dir.
  absl::Status RequireCheckpointDir(absl::string_view field) const;
  // Tenants keep their checkpoints apart: tenant T's live in <checkpoint_dir>/@T ('@'
  // starts no checkpoint name, so the top level never lists those directories, and a
  // tenant name, [A-Za-z0-9._-]{1,64}, is one path component after it); without
  // tokens (tenant "") they live in <checkpoint_dir> itself. Every checkpoint RPC, the
  // periodic and the final checkpoints use the caller's (the session's) directory only.
  std::string CheckpointDirOf(absl::string_view tenant) const;
  // Captures the session's state and writes it as checkpoint `name` of `tenant`
  // (serialized with every other save of this server; a tenant's directory is created
  // and cleaned of interrupted writes at its first save), logging a line and recording
  // the metrics.
  absl::StatusOr<Saved> Save(const train::Session& session, absl::string_view tenant, const std::string& name,
                             bool overwrite);
  // After a Step: the session's periodic checkpoint, when due, and the pruning of its
  // older ones.
  void AutoSave(const std::string& id, const train::Session& session, int64_t step, v1::StepResponse* response);
  // A session leaving the server (idle expiry, shutdown; `why` says which, for the log):
  // its final checkpoint when it is configured to checkpoint and changed since its
  // latest one; forgets its policy either way.
  void FinalCheckpoint(const std::string& id, const train::Session& session, absl::string_view why);
  // Deletes the metric series and checkpoint policies of sessions removed from the
  // registry.
  // Drops the sessions' auto-checkpoint policies and metric series (the series only until
  // `series_until`, Metrics::RemoveSession).
  void Forget(const std::vector<std::pair<std::string, std::shared_ptr<train::Session>>>& removed,
              absl::Time series_until = absl::InfiniteFuture());

  // Where Serve runs a handler: on the gRPC callback thread (calls that only read or
  // write host state, or copy a little) or on a compute thread (the training calls, which
  // enqueue device work and wait for their results; the callback thread returns at once).
  enum class Lane { kCallback, kCompute };

  // Runs `handler` (returning absl::Status) in `lane`, records the RPC metrics (the
  // serialized sizes of `request` and, for a successful call, `response`) and finishes the
  // call. A kCompute handler runs after this returns: it must capture the call's pointers
  // by value ([=]), never the handler method's parameters by reference.
  template <typename Handler>
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context,
                                  absl::string_view method,
                                  const google::protobuf::Message& request,
                                  const google::protobuf::Message& response, Handler&& handler,
                                  Lane lane = Lane::kCallback);
  // Serve's end of a call: metrics, the reply-size backstop, Finish, the in-flight count.
  void FinishCall(grpc::ServerUnaryReactor* reactor, absl::string_view method, absl::Status status,
                  const google::protobuf::Message& request, const google::protobuf::Message& response,
                  absl::Time start);

  // Where request tensors are decoded: page-locked host memory on a GPU server (their copy
  // to the device runs at full bus speed), ordinary memory otherwise.
  HostMemory RequestMemory() const { return config_.gpu_selected ? HostMemory::kPinned : HostMemory::kPageable; }

  // The caller's tenant: "" without authentication, else the tenant of its bearer token
  // (UNAUTHENTICATED otherwise).
  absl::StatusOr<std::string> TenantOf(const grpc::CallbackServerContext& context) const;
  // The session `id` of the caller's tenant (another tenant's reads as NOT_FOUND).
  absl::StatusOr<std::shared_ptr<train::Session>> Find(const grpc::CallbackServerContext& context,
                                                       absl::string_view id) const;

  const TrainerConfig config_;
  Metrics* const metrics_;
  SessionRegistry registry_;
  // Held (writer) by each checkpoint write (and the pruning) and (reader) by the RPCs that
  // read checkpoints, so that a read never meets a write half done: an overwrite between
  // its two renames (the name missing) or a checkpoint half swapped. Taken after expiry_mu_.
  absl::Mutex checkpoint_mu_;
  absl::flat_hash_set<std::string> prepared_dirs_ ABSL_GUARDED_BY(checkpoint_mu_);  // tenant directories
  absl::Mutex auto_mu_;
  absl::flat_hash_map<std::string, AutoCheckpoint> auto_checkpoints_ ABSL_GUARDED_BY(auto_mu_);
  // Held (writer) while idle sessions are removed and their final checkpoints written;
  // the RPCs that read checkpoints take it as readers. Taken before checkpoint_mu_.
  absl::Mutex expiry_mu_;
  // Drain: whether new calls are refused, and when running ones stop (absl::ToUnixNanos;
  // INT64_MAX until the server stops).
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> stop_began_ns_{0};  // when Drain began (the stop's log lines count from it)
  std::atomic<int64_t> stop_calls_at_ns_{std::numeric_limits<int64_t>::max()};
  absl::Mutex calls_mu_;
  int64_t calls_in_flight_ ABSL_GUARDED_BY(calls_mu_) = 0;
  absl::Time last_call_ ABSL_GUARDED_BY(calls_mu_) = absl::InfinitePast();  // the latest call's arrival
  // Last: destroyed first, running what it still holds while everything its tasks use lives.
  std::unique_ptr<ComputeExecutor> compute_;
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_TRAINER_SERVICE_H_
