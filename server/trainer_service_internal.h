// What server/trainer_service.cc, trainer_service_training.cc and
// trainer_service_checkpoints.cc share: the checkpoint naming rules, the log line, how a
// session is reported (SessionInfo, metrics) and how tensors go into a reply, and Serve.
// Only those files include it.
#ifndef TESERVE_SERVER_TRAINER_SERVICE_INTERNAL_H_
#define TESERVE_SERVER_TRAINER_SERVICE_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "server/metrics.h"
#include "server/trainer_service.h"
#include "teserve/v1/service.pb.h"
#include "train/session.h"

namespace teserve {
namespace server {
namespace service_internal {

// A tenant's checkpoint directory under --checkpoint_dir: "@<tenant>"
// (TrainerService::CheckpointDirOf).
inline constexpr char kTenantDirPrefix[] = "@";
// Auto-checkpoint names: "<prefix>-step-<9 digits>".
inline constexpr char kAutoStepInfix[] = "-step-";
inline constexpr size_t kAutoStepDigits = 9;
// A session's final checkpoint (idle expiry, server stop): "<prefix>-step-<9 digits>-final",
// which sorts right after the periodic one of the same step. Keep-last pruning leaves it.
inline constexpr char kFinalSuffix[] = "-final";

// A checkpoint as the log names it: "<name>", or "@<tenant>/<name>" for a tenant's.
std::string LoggedName(absl::string_view tenant, absl::string_view name);
// CANCELLED when the client cancelled the call (or went away), DEADLINE_EXCEEDED when
// its deadline has passed; `when` says at which point the server noticed.
absl::Status CallAbandoned(const grpc::CallbackServerContext& context, absl::string_view method,
                           absl::string_view when);
// One "[teserve] ..." line on stderr, flushed.
void LogLine(const std::string& line);
// status with "checkpoint '<name>': " before its message (OK stays OK).
absl::Status InCheckpoint(const absl::Status& status, const std::string& name);
void FillSessionInfo(const std::string& id, const train::Session& session, v1::SessionInfo* info);
// The metrics read a session only through snapshots (train/session_snapshot.h); the
// health-sampling switch they ask for is set on the session here.
void PublishToMetrics(Metrics& metrics, const std::string& id, train::Session& session, bool quantized);
// The tensors into a reply's repeated field (server/tensor_codec.h's EncodeTensor each).
absl::Status EncodeTensors(const std::vector<Tensor>& tensors, google::protobuf::RepeatedPtrField<v1::Tensor>* wire);
absl::Status EncodeNamed(const std::vector<train::NamedTensor>& tensors,
                         google::protobuf::RepeatedPtrField<v1::NamedTensor>* wire);

}  // namespace service_internal

// Every RPC's frame (trainer_service.h), here so that both source files instantiate it.
template <typename Handler>
grpc::ServerUnaryReactor* TrainerService::Serve(grpc::CallbackServerContext* context,
                                                absl::string_view method,
                                                const google::protobuf::Message& request,
                                                const google::protobuf::Message& response,
                                                Handler&& handler, Lane lane) {
  const absl::Time start = absl::Now();
  {
    absl::MutexLock lock(&calls_mu_);
    ++calls_in_flight_;
    last_call_ = start;
  }
  // A stopping server takes no new work (Drain). Then authentication (health and
  // reflection are other services and stay open), then the call's own state: a call
  // whose client has gone or whose deadline has passed does no work.
  absl::Status status;
  if (stopping_.load()) {
    status = absl::UnavailableError(
        absl::StrCat(method, ": the server is shutting down; retry on another server or after the restart"));
  }
  if (status.ok()) status = TenantOf(*context).status();
  if (status.ok()) status = service_internal::CallAbandoned(*context, method, "before it started");
  // Our code returns Status; this only catches what a library might still throw (an
  // allocation failure on a huge request), so that it fails one call, not the server.
  auto run = [method](auto& body) -> absl::Status {
    try {
      return body();
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(absl::StrCat(method, ": out of memory"));
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat(method, ": unexpected exception: ", e.what()));
    }
  };
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!status.ok() || lane == Lane::kCallback) {
    if (status.ok()) status = run(handler);
    FinishCall(reactor, method, std::move(status), request, response, start);
    return reactor;
  }
  // method names a string literal of the handler (static storage); request and response
  // live until the reactor is finished.
  compute_->Submit([this, context, reactor, method, &request, &response, start, run,
                    body = std::forward<Handler>(handler)]() mutable {
    absl::Status status = service_internal::CallAbandoned(*context, method, "while it waited for a compute thread");
    if (status.ok()) status = run(body);
    FinishCall(reactor, method, std::move(status), request, response, start);
  });
  return reactor;
}

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_TRAINER_SERVICE_INTERNAL_H_
