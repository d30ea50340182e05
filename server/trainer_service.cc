#include "server/trainer_service.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/wire_format_lite.h"
#include "absl/time/time.h"
#include "core/context.h"
#include "core/status.h"
#include "server/recipe_availability.h"
#include "server/tensor_codec.h"
#include "server/trainer_service_internal.h"
#include "server/unknown_fields.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/message_differencer.h"
#include "train/checkpoint.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace server {
namespace service_internal {

// A checkpoint as the log names it: "<name>", or "@<tenant>/<name>" for a tenant's.
std::string LoggedName(absl::string_view tenant, absl::string_view name) {
  return tenant.empty() ? std::string(name) : absl::StrCat(kTenantDirPrefix, tenant, "/", name);
}

void LogLine(const std::string& line) {
  absl::FPrintF(stderr, "[teserve] %s\n", line);
  std::fflush(stderr);
}

absl::Status InCheckpoint(const absl::Status& status, const std::string& name) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("checkpoint ", Quoted(name), ": ", status.message()));
}

void FillSessionInfo(const std::string& id, const train::Session& session,
                     v1::SessionInfo* info) {
  const train::SessionSummary summary = session.Summary();
  info->set_session_id(id);
  *info->mutable_model() = session.model_spec();
  *info->mutable_recipe() = session.recipe_spec();
  *info->mutable_optimizer() = session.optimizer_spec();
  info->set_step(summary.step);
  info->set_num_parameters(summary.num_parameters);
  info->set_device(summary.device);
  info->set_device_note(summary.device_note);
  info->set_state_bytes(summary.state_bytes);
  info->set_live_handles(summary.live_handles);
  info->set_recipe_name(summary.recipe_name);
  for (const layers::AttentionPathInfo& a : summary.attention) {
    v1::AttentionPath* path = info->add_attention();
    path->set_layer(a.layer);
    path->set_path(a.path);
    path->set_reason(a.reason);
  }
  for (const train::LayerSummary& layer : summary.layers) {
    v1::LayerInfo* out = info->add_layers();
    out->set_name(layer.name);
    out->set_kind(layer.kind);
    for (const std::string& p : layer.parameters) out->add_parameters(p);
  }
}

void PublishToMetrics(Metrics& metrics, const std::string& id, train::Session& session,
                      bool quantized) {
  if (!metrics.TracksSessions()) return;
  // One session lock; taken before the metrics lock, since the session may be held by a
  // long computation.
  const train::SessionSnapshot snapshot = session.Snapshot(metrics.WantsQuantizers(quantized));
  const std::optional<bool> sample_health = metrics.UpdateSession(id, snapshot);
  if (sample_health.has_value() && *sample_health != snapshot.stats.health_sampling) {
    session.SetHealthSampling(*sample_health);
  }
}

absl::Status CallAbandoned(const grpc::CallbackServerContext& context, absl::string_view method,
                           absl::string_view when) {
  if (const_cast<grpc::CallbackServerContext&>(context).IsCancelled()) {
    return absl::CancelledError(absl::StrCat(method, ": the call was cancelled ", when));
  }
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(absl::StrCat(method, ": the client's deadline passed ", when));
  }
  return absl::OkStatus();
}


absl::Status EncodeTensors(const std::vector<Tensor>& tensors,
                           google::protobuf::RepeatedPtrField<v1::Tensor>* wire) {
  for (const Tensor& t : tensors) RETURN_IF_ERROR(EncodeTensor(t, wire->Add()));
  return absl::OkStatus();
}

absl::Status EncodeNamed(const std::vector<train::NamedTensor>& tensors,
                         google::protobuf::RepeatedPtrField<v1::NamedTensor>* wire) {
  for (const train::NamedTensor& t : tensors) {
    v1::NamedTensor* out = wire->Add();
    out->set_name(t.name);
    RETURN_IF_ERROR(EncodeTensor(t.tensor, out->mutable_tensor()));
  }
  return absl::OkStatus();
}

}  // namespace service_internal

namespace {

using service_internal::kAutoStepInfix;
using service_internal::kAutoStepDigits;
using service_internal::kFinalSuffix;
using service_internal::CallAbandoned;
using service_internal::LogLine;
using service_internal::InCheckpoint;
using service_internal::FillSessionInfo;
using service_internal::PublishToMetrics;
using service_internal::EncodeNamed;

// How long a stopping server keeps answering UNAVAILABLE after the last call it saw
// (TrainerService::Drain).
constexpr absl::Duration kDrainQuiet = absl::Milliseconds(200);
constexpr absl::Duration kDrainQuietAtMost = absl::Seconds(1);

// Starts the series of a new session, then publishes its first snapshot (which sets its
// health-sampling switch for its first step).
void AddToMetrics(Metrics& metrics, const std::string& id, train::Session& session) {
  std::vector<std::pair<std::string, std::string>> quantizers;
  if (metrics.WantsQuantizers(/*quantized=*/true)) quantizers = session.QuantizerNames();
  if (metrics.AddSession(id, quantizers)) PublishToMetrics(metrics, id, session, /*quantized=*/true);
}

// The exact wire size of `layouts` encoded by EncodeNamed as repeated field `field_number`
// of a reply, computed without the data.
int64_t NamedTensorsWireBytes(const std::vector<train::TensorLayout>& layouts, int field_number) {
  using google::protobuf::internal::WireFormatLite;
  int64_t total = 0;
  for (const train::TensorLayout& layout : layouts) {
    v1::NamedTensor meta;
    meta.set_name(layout.name);
    v1::Tensor* tensor = meta.mutable_tensor();
    tensor->set_dtype(DTypeToWire(layout.dtype));
    for (int64_t d : layout.shape) tensor->add_shape(d);
    // data (field 3) as EncodeTensor adds it: tag, length, bytes (absent when empty).
    const size_t data = static_cast<size_t>(layout.nbytes);
    const size_t data_field = data == 0 ? 0 : 1 + WireFormatLite::UInt64Size(data) + data;
    const size_t tensor_bytes = tensor->ByteSizeLong() + data_field;
    meta.clear_tensor();
    const size_t named_bytes = meta.ByteSizeLong() + WireFormatLite::TagSize(2, WireFormatLite::TYPE_MESSAGE) +
                               WireFormatLite::UInt64Size(tensor_bytes) + tensor_bytes;
    total += static_cast<int64_t>(WireFormatLite::TagSize(field_number, WireFormatLite::TYPE_MESSAGE) +
                                  WireFormatLite::UInt64Size(named_bytes) + named_bytes);
  }
  return total;
}

// What a session created now would run. On a GPU, every recipe the GPU can run at all
// (native or emulated) runs there, for every model (train/session.cc); a recipe it
// cannot run keeps its sessions on the CPU reference, and the reason says why.
std::vector<v1::RecipeAvailability> ReportedAvailabilities(const TrainerConfig& config) {
  std::vector<v1::RecipeAvailability> cpu = RecipeAvailabilities(DeviceFacts{});
  if (!config.gpu_selected) return cpu;
  const kernels::DeviceInfo& info = config.device_info;
  DeviceFacts gpu_facts;
  gpu_facts.is_cuda = true;
  gpu_facts.cc_major = info.cc_major;
  gpu_facts.cc_minor = info.cc_minor;
  gpu_facts.cublaslt_version = info.cublaslt_version;
  const std::vector<v1::RecipeAvailability> gpu = RecipeAvailabilities(gpu_facts);
  std::vector<v1::RecipeAvailability> out;
  for (size_t i = 0; i < cpu.size() && i < gpu.size(); ++i) {
    if (gpu[i].availability() != v1::UNAVAILABLE) {
      v1::RecipeAvailability a = gpu[i];
      a.set_reason(absl::StrCat(gpu[i].reason(), "; sessions run on ", config.selected_device));
      out.push_back(std::move(a));
    } else {
      v1::RecipeAvailability a = cpu[i];
      a.set_reason(absl::StrCat(cpu[i].reason(), "; sessions under this recipe run on the CPU reference: ",
                                config.selected_device, " cannot run it (", gpu[i].reason(), ")"));
      out.push_back(std::move(a));
    }
  }
  return out;
}


}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // Messages quote client text truncated (Quoted); this bounds the rest, so that a
  // status always fits gRPC's metadata limit and the client sees the real code.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundedMessage(status.message()));
}

TrainerService::TrainerService(TrainerConfig config, Metrics* metrics)
    : config_(std::move(config)),
      metrics_(metrics),
      registry_(RegistryLimits{config_.max_sessions, config_.max_sessions_per_tenant}),
      compute_(std::make_unique<ComputeExecutor>(config_.compute_threads,
                                                 [metrics](int64_t queued) { metrics->SetComputeQueued(queued); })) {}

void TrainerService::FinishCall(grpc::ServerUnaryReactor* reactor, absl::string_view method, absl::Status status,
                                const google::protobuf::Message& request, const google::protobuf::Message& response,
                                absl::Time start) {
  // The handlers that can build large replies size them first (GetParameters); this is
  // the backstop, so a reply over the limit fails with a message naming both sizes
  // rather than gRPC's own.
  int64_t sent = status.ok() ? static_cast<int64_t>(response.ByteSizeLong()) : 0;
  if (sent > config_.max_message_bytes) {
    status = absl::ResourceExhaustedError(absl::StrCat(method, ": the reply would be ", sent,
                                                       " bytes, over the server's message limit of ",
                                                       config_.max_message_bytes, " bytes (--max_message_bytes)"));
    sent = 0;
  }
  const grpc::Status grpc_status = ToGrpcStatus(status);
  // A failed call sends no message, only its status.
  metrics_->RecordRpc(method, grpc_status.error_code(), absl::ToDoubleSeconds(absl::Now() - start),
                      static_cast<int64_t>(request.ByteSizeLong()), sent);
  reactor->Finish(grpc_status);
  absl::MutexLock lock(&calls_mu_);
  --calls_in_flight_;
}

absl::StatusOr<std::string> TrainerService::TenantOf(const grpc::CallbackServerContext& context) const {
  if (config_.auth == nullptr) return std::string();
  const std::multimap<grpc::string_ref, grpc::string_ref>& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return config_.auth->Authenticate(nullptr);
  const std::string value(it->second.data(), it->second.size());
  return config_.auth->Authenticate(&value);
}

absl::StatusOr<std::shared_ptr<train::Session>> TrainerService::Find(const grpc::CallbackServerContext& context,
                                                                     absl::string_view id) const {
  ASSIGN_OR_RETURN(std::string tenant, TenantOf(context));
  return registry_.Get(id, tenant);
}

bool TrainerService::Drain(absl::Time stop_calls_at, absl::Time deadline) {
  stop_began_ns_.store(absl::GetCurrentTimeNanos());
  stop_calls_at_ns_.store(absl::ToUnixNanos(stop_calls_at), std::memory_order_relaxed);
  stopping_.store(true);
  // Quiet: no call running and none arriving, so that the clients that were sending have
  // heard UNAVAILABLE before the transport closes (a call that reaches a closing
  // transport is cancelled instead). Clients that keep sending hold this only for
  // kDrainQuietAtMost (and never past stop_calls_at).
  const absl::Time quiet_until = std::min({stop_calls_at, deadline, absl::Now() + kDrainQuietAtMost});
  while (absl::Now() < quiet_until) {
    {
      absl::MutexLock lock(&calls_mu_);
      if (calls_in_flight_ == 0 && absl::Now() - last_call_ >= kDrainQuiet) break;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  absl::MutexLock lock(&calls_mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(calls_mu_) { return calls_in_flight_ == 0; };
  return calls_mu_.AwaitWithDeadline(absl::Condition(&idle), deadline);
}

void TrainerService::Forget(const std::vector<std::pair<std::string, std::shared_ptr<train::Session>>>& removed,
                            absl::Time series_until) {
  for (const auto& [id, session] : removed) {
    metrics_->RemoveSession(id, series_until);
    absl::MutexLock lock(&auto_mu_);
    auto_checkpoints_.erase(id);
  }
  metrics_->SetSessions(registry_.size());
}

int64_t TrainerService::ExpireIdleSessions(absl::Duration idle) {
  absl::MutexLock expiry(&expiry_mu_);
  const auto expired = registry_.RemoveIdle(idle, absl::Now());
  for (const auto& [id, session] : expired) FinalCheckpoint(id, *session, "expired (idle)");
  if (!expired.empty()) Forget(expired);
  return static_cast<int64_t>(expired.size());
}


std::vector<std::shared_ptr<train::Session>> TrainerService::CloseSessions(absl::Time checkpoint_deadline) {
  absl::MutexLock expiry(&expiry_mu_);
  // Sessions a call still uses (one that outlived the grace period) stay; the process
  // exits around them.
  const auto closed = registry_.RemoveIdle(absl::ZeroDuration(), absl::InfiniteFuture());
  // How the stop's time went, for an operator sizing --shutdown_grace_seconds: until the
  // calls were done, then the final checkpoints.
  const int64_t began = stop_began_ns_.load();
  auto since_stop = [began] { return began == 0 ? 0.0 : (absl::GetCurrentTimeNanos() - began) * 1e-9; };
  LogLine(absl::StrFormat("stop: calls done %.2fs after the stop began; closing %d sessions", since_stop(),
                          closed.size()));
  for (const auto& [id, session] : closed) {
    if (absl::Now() < checkpoint_deadline) {
      FinalCheckpoint(id, *session, "closed (server stop)");
      continue;
    }
    bool configured = false;
    {
      absl::MutexLock lock(&auto_mu_);
      configured = auto_checkpoints_.contains(id);
    }
    if (configured && session->StateVersion() != 0) {
      LogLine(absl::StrFormat("session %s closed (server stop): final checkpoint not saved, the grace period is over",
                              id));
    }
  }
  // The metric series go while the grace period lasts (a scrape during the stop shows no
  // closed session); past it they stay, since removing a deep model's series one by one
  // takes seconds (prometheus-cpp's Family::Remove scans the family) and the process is
  // about to end.
  Forget(closed, /*series_until=*/checkpoint_deadline);
  if (!closed.empty()) LogLine(absl::StrFormat("stop: sessions closed %.2fs after the stop began", since_stop()));
  std::vector<std::shared_ptr<train::Session>> sessions;
  sessions.reserve(closed.size());
  for (const auto& entry : closed) sessions.push_back(entry.second);
  return sessions;
}

grpc::ServerUnaryReactor* TrainerService::CreateSession(grpc::CallbackServerContext* context,
                                                        const v1::CreateSessionRequest* request,
                                                        v1::CreateSessionResponse* response) {
  return Serve(context, "CreateSession", *request, *response, [&]() -> absl::Status {
    RETURN_IF_ERROR(RejectUnknownFields(request->model(), "model"));
    RETURN_IF_ERROR(RejectUnknownFields(request->recipe(), "recipe"));
    RETURN_IF_ERROR(RejectUnknownFields(request->optimizer(), "optimizer"));
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    const std::string& from = request->from_checkpoint();
    if (!from.empty()) {
      if (request->has_model() || request->has_recipe() || request->has_optimizer()) {
        return InvalidField("from_checkpoint", "model, recipe and optimizer unset (they come from the checkpoint)",
                            "a checkpoint and a spec");
      }
      RETURN_IF_ERROR(RequireCheckpointDir("from_checkpoint"));
      RETURN_IF_ERROR(train::ValidateCheckpointName(from, "from_checkpoint"));
    }
    AutoCheckpoint policy;
    policy.every_steps = request->checkpoint_every_steps();
    policy.keep_last = request->keep_last_checkpoints();
    policy.prefix = request->checkpoint_prefix();
    if (policy.every_steps < 0) {
      return InvalidField("checkpoint_every_steps", "a count >= 0 (0: no periodic checkpoints)", policy.every_steps);
    }
    if (policy.keep_last < 0) {
      return InvalidField("keep_last_checkpoints", "a count >= 0 (0: keep all)", policy.keep_last);
    }
    if (!policy.prefix.empty()) {
      RETURN_IF_ERROR(train::ValidateCheckpointName(policy.prefix, "checkpoint_prefix"));
      const size_t longest =
          train::kMaxCheckpointNameLength - strlen(kAutoStepInfix) - kAutoStepDigits - strlen(kFinalSuffix);
      if (policy.prefix.size() > longest) {
        return InvalidField("checkpoint_prefix", absl::StrCat("at most ", longest, " characters"),
                            policy.prefix.size());
      }
    }
    if (policy.every_steps > 0) RETURN_IF_ERROR(RequireCheckpointDir("checkpoint_every_steps"));
    RETURN_IF_ERROR(registry_.CheckCapacity(tenant));
    std::optional<train::CheckpointContents> checkpoint;
    if (!from.empty()) {
      absl::ReaderMutexLock expiry(&expiry_mu_);  // a final checkpoint being written is there once this returns
      absl::ReaderMutexLock writes(&checkpoint_mu_);  // not mid-write (an overwrite is between its renames)
      ASSIGN_OR_RETURN(checkpoint, train::ReadCheckpoint(CheckpointDirOf(tenant), from));
    }
    // Admission: refuse a spec that can't fit before allocating any of it.
    const MemoryEstimate estimate = EstimateSessionMemory(checkpoint.has_value() ? checkpoint->model : request->model(),
                                                          checkpoint.has_value() ? checkpoint->optimizer
                                                                                 : request->optimizer(),
                                                          config_.admission_tokens,
                                                          config_.request_limits.max_attention_scores);
    RETURN_IF_ERROR(AdmitSession(estimate, config_.memory_budget_bytes, registry_.committed_bytes(),
                                 HostAvailableMemoryBytes(), config_.admission_tokens));
    // Sessions live on the server's device; Session::Create gives a GPU session its own
    // stream, or keeps a model without a GPU path on the CPU and says why.
    Context ctx = Context::Cpu();
    if (config_.gpu_selected) {
      ASSIGN_OR_RETURN(ctx.device, ParseDevice(config_.selected_device));
    }
    ctx.kernel_timing = metrics_->kernel_timing();
    absl::StatusOr<std::unique_ptr<train::Session>> session =
        checkpoint.has_value()
            ? train::Session::Create(checkpoint->model, checkpoint->recipe, checkpoint->optimizer, ctx)
            : train::Session::Create(request->model(), request->recipe(), request->optimizer(), ctx);
    if (checkpoint.has_value()) {
      RETURN_IF_ERROR(InCheckpoint(session.status(), from));
      RETURN_IF_ERROR(InCheckpoint((*session)->RestoreState(checkpoint->state), from));
      checkpoint.reset();  // the host copy of the state is no longer needed
    }
    RETURN_IF_ERROR(session.status());
    std::shared_ptr<train::Session> shared = std::move(*session);
    ASSIGN_OR_RETURN(std::string id, registry_.Add(shared, tenant, static_cast<int64_t>(estimate.total())));
    if (policy.every_steps > 0) {
      if (policy.prefix.empty()) policy.prefix = id;
      policy.tenant = tenant;
      // A session restored from a checkpoint holds that checkpoint's state: until it
      // changes, it needs no final checkpoint.
      if (!from.empty()) policy.saved_version = shared->StateVersion();
      absl::MutexLock lock(&auto_mu_);
      auto_checkpoints_[id] = policy;
    }
    AddToMetrics(*metrics_, id, *shared);
    metrics_->SetSessions(registry_.size());
    response->set_session_id(id);
    FillSessionInfo(id, *shared, response->mutable_info());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::GetSession(grpc::CallbackServerContext* context,
                                                     const v1::GetSessionRequest* request,
                                                     v1::SessionInfo* response) {
  return Serve(context, "GetSession", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    FillSessionInfo(request->session_id(), *session, response);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::ListSessions(grpc::CallbackServerContext* context,
                                                       const v1::ListSessionsRequest* request,
                                                       v1::ListSessionsResponse* response) {
  return Serve(context, "ListSessions", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    for (const auto& [id, session] : registry_.List(tenant)) {
      FillSessionInfo(id, *session, response->add_sessions());
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::DeleteSession(grpc::CallbackServerContext* context,
                                                        const v1::DeleteSessionRequest* request,
                                                        v1::DeleteSessionResponse* response) {
  return Serve(context, "DeleteSession", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    RETURN_IF_ERROR(registry_.Remove(request->session_id(), tenant));
    {
      absl::MutexLock lock(&auto_mu_);
      auto_checkpoints_.erase(request->session_id());
    }
    metrics_->RemoveSession(request->session_id());
    metrics_->SetSessions(registry_.size());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::GetParameters(grpc::CallbackServerContext* context,
                                                        const v1::GetParametersRequest* request,
                                                        v1::GetParametersResponse* response) {
  return Serve(context, "GetParameters", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    const std::vector<std::string> names(request->names().begin(), request->names().end());
    // Sized before anything is copied: unknown or repeated names are rejected here, and a
    // reply over the message limit is refused instead of built.
    ASSIGN_OR_RETURN(std::vector<train::TensorLayout> layouts, session->Layouts(names, /*grads=*/false));
    int64_t reply_bytes = NamedTensorsWireBytes(layouts, v1::GetParametersResponse::kParametersFieldNumber);
    if (request->include_grads()) {
      ASSIGN_OR_RETURN(layouts, session->Layouts(names, /*grads=*/true));
      reply_bytes += NamedTensorsWireBytes(layouts, v1::GetParametersResponse::kGradsFieldNumber);
    }
    if (reply_bytes > config_.max_message_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "names: the reply would be ", reply_bytes, " bytes, over the server's message limit of ",
          config_.max_message_bytes, " bytes (--max_message_bytes); ask for fewer parameters per call",
          request->include_grads() ? " or without include_grads" : ""));
    }
    ASSIGN_OR_RETURN(std::vector<train::NamedTensor> parameters, session->GetParameters(names));
    RETURN_IF_ERROR(EncodeNamed(parameters, response->mutable_parameters()));
    if (request->include_grads()) {
      ASSIGN_OR_RETURN(std::vector<train::NamedTensor> grads, session->GetGradients(names));
      RETURN_IF_ERROR(EncodeNamed(grads, response->mutable_grads()));
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::SetParameters(grpc::CallbackServerContext* context,
                                                        const v1::SetParametersRequest* request,
                                                        v1::SetParametersResponse* response) {
  return Serve(context, "SetParameters", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    std::vector<train::NamedTensor> parameters;
    parameters.reserve(request->parameters_size());
    for (int i = 0; i < request->parameters_size(); ++i) {
      const v1::NamedTensor& wire = request->parameters(i);
      ASSIGN_OR_RETURN(Tensor tensor,
                       DecodeFloatTensor(wire.tensor(), absl::StrCat("parameters[", i,
                                                                     "].tensor")));
      parameters.push_back(train::NamedTensor{wire.name(), std::move(tensor)});
    }
    return session->SetParameters(parameters);
  });
}

grpc::ServerUnaryReactor* TrainerService::GetQuantizationState(
    grpc::CallbackServerContext* context, const v1::GetQuantizationStateRequest* request,
    v1::QuantizationState* response) {
  return Serve(context, "GetQuantizationState", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    response->set_session_id(request->session_id());
    response->set_step(session->Summary().step);
    for (const train::QuantizerReport& report : session->QuantizationState()) {
      v1::QuantizedTensorState* out = response->add_tensors();
      out->set_layer(report.layer);
      out->set_tensor(report.tensor);
      out->set_recipe(report.recipe);
      out->set_format(DTypeToWire(report.format));
      out->set_scaling_mode(report.scaling_mode);
      out->set_execution(report.execution);
      out->set_amax(report.amax);
      out->set_scale(report.scale);
      out->set_scale_inv(report.scale_inv);
      for (float a : report.amax_history) out->add_amax_history(a);
      out->set_quantize_calls(report.quantize_calls);
      if (report.block_scales.valid) {
        out->mutable_block_scale_inv()->set_min(static_cast<float>(report.block_scales.min));
        out->mutable_block_scale_inv()->set_max(static_cast<float>(report.block_scales.max));
        out->mutable_block_scale_inv()->set_mean(static_cast<float>(report.block_scales.mean));
      }
      if (report.health.valid) {
        v1::Fp8HealthStats* health = out->mutable_health();
        health->set_underflow_ratio(static_cast<float>(report.health.underflow_ratio));
        health->set_overflow_ratio(static_cast<float>(report.health.overflow_ratio));
        health->set_mse(static_cast<float>(report.health.mse));
        health->set_dynamic_range(static_cast<float>(report.health.dynamic_range));
      }
    }
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::GetServerInfo(grpc::CallbackServerContext* context,
                                                        const v1::GetServerInfoRequest* request,
                                                        v1::ServerInfo* response) {
  return Serve(context, "GetServerInfo", *request, *response, [&]() -> absl::Status {
    const kernels::DeviceInfo& info = config_.device_info;
    response->set_version(kTeserveVersion);
    response->set_device(config_.selected_device);
    if (config_.gpu_selected) {
      response->set_device_name(info.device_name);
      response->set_compute_capability(absl::StrCat(info.cc_major, ".", info.cc_minor));
    } else {
      response->set_device_name("CPU reference backend");
    }
    response->set_cuda_runtime_version(info.cuda_runtime_version);
    response->set_cublaslt_version(info.cublaslt_version);
    response->set_cudnn_version(info.cudnn_version);
    response->set_nccl_version(info.nccl_version);
    for (v1::RecipeAvailability& entry : ReportedAvailabilities(config_)) {
      *response->add_recipes() = std::move(entry);
    }
    response->set_default_recipe(kDefaultRecipe);
    response->set_max_sessions(config_.max_sessions);
    response->set_max_message_bytes(config_.max_message_bytes);
    response->set_cuda_compiled(info.cuda_compiled);
    response->set_gpu_count(info.gpu_count);
    response->set_max_sessions_per_tenant(registry_.max_sessions_per_tenant());
    response->set_max_tokens_per_request(config_.request_limits.max_tokens_per_request);
    response->set_max_attention_scores(config_.request_limits.max_attention_scores);
    response->set_max_live_handles(static_cast<int64_t>(train::kMaxLiveHandles));
    response->set_memory_budget_bytes(config_.memory_budget_bytes);
    response->set_admission_tokens(config_.admission_tokens);
    response->set_session_idle_timeout_seconds(absl::ToDoubleSeconds(config_.session_idle_timeout));
    response->set_checkpoints_enabled(!config_.checkpoint_dir.empty());
    return absl::OkStatus();
  });
}

}  // namespace server
}  // namespace teserve
