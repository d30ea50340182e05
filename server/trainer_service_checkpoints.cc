// TrainerService's checkpoints: SaveCheckpoint, LoadCheckpoint, ListCheckpoints, the
// periodic checkpoints of Step (AutoSave) and the final ones (idle expiry, server stop).
#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/trainer_service.h"
#include "server/trainer_service_internal.h"
#include "train/checkpoint.h"

namespace teserve {
namespace server {
namespace {

using service_internal::kTenantDirPrefix;
using service_internal::kAutoStepInfix;
using service_internal::kAutoStepDigits;
using service_internal::kFinalSuffix;
using service_internal::LoggedName;
using service_internal::LogLine;
using service_internal::InCheckpoint;
using service_internal::FillSessionInfo;
using service_internal::PublishToMetrics;

std::string AutoCheckpointName(absl::string_view prefix, int64_t step) {
  return absl::StrFormat("%s%s%09d", prefix, kAutoStepInfix, step);
}

std::string FinalCheckpointName(absl::string_view prefix, int64_t step) {
  return absl::StrCat(AutoCheckpointName(prefix, step), kFinalSuffix);
}

// The checkpoint's specs equal the session's, or FAILED_PRECONDITION naming the first
// that differs.
absl::Status CheckSameSpecs(const std::string& name, const train::CheckpointContents& c,
                            const train::Session& session) {
  using google::protobuf::util::MessageDifferencer;
  const struct {
    const char* file;
    const char* what;
    const google::protobuf::Message& saved;
    const google::protobuf::Message& live;
  } specs[] = {{"model.json", "model", c.model, session.model_spec()},
               {"recipe.json", "recipe", c.recipe, session.recipe_spec()},
               {"optimizer.json", "optimizer", c.optimizer, session.optimizer_spec()}};
  for (const auto& s : specs) {
    if (!MessageDifferencer::Equals(s.saved, s.live)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "checkpoint ", Quoted(name), ": ", s.file, ": the checkpoint's ", s.what,
          " differs from this session's (create a session from it with CreateSession.from_checkpoint instead)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

void TrainerService::FinalCheckpoint(const std::string& id, const train::Session& session, absl::string_view why) {
  AutoCheckpoint policy;
  {
    absl::MutexLock lock(&auto_mu_);
    auto it = auto_checkpoints_.find(id);
    if (it == auto_checkpoints_.end()) return;
    policy = it->second;
  }
  // The session is out of the registry (or the server has stopped): nothing changes it
  // between these reads and the save.
  if (session.StateVersion() == policy.saved_version) {
    LogLine(absl::StrFormat("session %s %s: no final checkpoint needed (its latest checkpoint holds its state)",
                            id, why));
    return;
  }
  const std::string name = FinalCheckpointName(policy.prefix, session.Summary().step);
  absl::StatusOr<Saved> saved = Save(session, policy.tenant, name, /*overwrite=*/true);  // logs either way
  if (saved.ok()) {
    absl::MutexLock lock(&auto_mu_);
    auto it = auto_checkpoints_.find(id);
    if (it != auto_checkpoints_.end()) it->second.saved_version = saved->version;
  }
}

absl::Status TrainerService::RequireCheckpointDir(absl::string_view field) const {
  if (config_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": this server keeps no checkpoints (start it with --checkpoint_dir)"));
  }
  return absl::OkStatus();
}

std::string TrainerService::CheckpointDirOf(absl::string_view tenant) const {
  if (tenant.empty()) return config_.checkpoint_dir;
  return absl::StrCat(config_.checkpoint_dir, "/", kTenantDirPrefix, tenant);
}

absl::StatusOr<TrainerService::Saved> TrainerService::Save(const train::Session& session, absl::string_view tenant,
                                                          const std::string& name, bool overwrite) {
  const std::string dir = CheckpointDirOf(tenant);
  const absl::Time start = absl::Now();
  absl::Time captured = start;
  absl::Status status;
  Saved saved;
  {
    train::CheckpointContents contents;
    contents.model = session.model_spec();
    contents.recipe = session.recipe_spec();
    contents.optimizer = session.optimizer_spec();
    absl::StatusOr<train::SessionState> state = session.CaptureState(&saved.version);
    captured = absl::Now();
    status = state.status();
    if (status.ok()) {
      contents.state = std::move(*state);
      saved.step = contents.state.step;
      absl::MutexLock lock(&checkpoint_mu_);
      if (!prepared_dirs_.contains(dir)) {
        status = train::CleanCheckpointDir(dir);  // creates it
        if (status.ok()) prepared_dirs_.insert(dir);
      }
      if (status.ok()) {
        absl::StatusOr<train::CheckpointWriteResult> written =
            train::WriteCheckpoint(dir, name, contents, overwrite, kTeserveVersion);
        status = written.status();
        if (written.ok()) saved.bytes = written->bytes;
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  metrics_->RecordCheckpointSave(status.ok(), seconds, saved.bytes);
  if (!status.ok()) {
    LogLine(absl::StrFormat("checkpoint '%s' not saved: %s", LoggedName(tenant, name), status.ToString()));
    return status;
  }
  // The state's capture (device tensors to the host, quantizer states) and the write
  // (encode, hash, fsync, rename) apart: which one a slow save spends its time in.
  LogLine(absl::StrFormat("checkpoint '%s' saved: step %d, %d bytes in %.3f s (state captured in %.3f s)",
                          LoggedName(tenant, name), saved.step, saved.bytes, seconds,
                          absl::ToDoubleSeconds(captured - start)));
  return saved;
}

void TrainerService::AutoSave(const std::string& id, const train::Session& session, int64_t step,
                              v1::StepResponse* response) {
  AutoCheckpoint policy;
  {
    absl::MutexLock lock(&auto_mu_);
    auto it = auto_checkpoints_.find(id);
    if (it == auto_checkpoints_.end()) return;
    policy = it->second;
  }
  if (step % policy.every_steps != 0) return;
  const std::string name = AutoCheckpointName(policy.prefix, step);
  // A session resumed from an earlier checkpoint saves the same step names again.
  absl::StatusOr<Saved> saved = Save(session, policy.tenant, name, /*overwrite=*/true);
  if (!saved.ok()) {
    response->set_checkpoint_error(BoundedMessage(saved.status().ToString()));
    return;
  }
  response->set_checkpoint(name);
  {
    absl::MutexLock lock(&auto_mu_);
    auto it = auto_checkpoints_.find(id);
    if (it != auto_checkpoints_.end()) it->second.saved_version = saved->version;
  }
  if (policy.keep_last <= 0) return;
  absl::MutexLock lock(&checkpoint_mu_);
  const std::string dir = CheckpointDirOf(policy.tenant);
  absl::StatusOr<std::vector<train::CheckpointListing>> listing = train::ListCheckpoints(dir);
  if (!listing.ok()) return;
  const std::string stem = absl::StrCat(policy.prefix, kAutoStepInfix);
  std::vector<std::pair<int64_t, std::string>> mine;
  for (const train::CheckpointListing& c : *listing) {
    int64_t n = 0;
    const absl::string_view digits = absl::string_view(c.name).substr(std::min(stem.size(), c.name.size()));
    if (absl::StartsWith(c.name, stem) && digits.size() == kAutoStepDigits && absl::SimpleAtoi(digits, &n)) {
      mine.emplace_back(n, c.name);
    }
  }
  std::sort(mine.begin(), mine.end());
  for (size_t i = 0; i + policy.keep_last < mine.size(); ++i) {
    const absl::Status deleted = train::DeleteCheckpoint(dir, mine[i].second);
    const std::string logged = LoggedName(policy.tenant, mine[i].second);
    LogLine(deleted.ok()
                ? absl::StrFormat("checkpoint '%s' deleted (keep_last_checkpoints %d)", logged, policy.keep_last)
                : absl::StrFormat("checkpoint '%s' not deleted: %s", logged, deleted.ToString()));
  }
}

grpc::ServerUnaryReactor* TrainerService::SaveCheckpoint(grpc::CallbackServerContext* context,
                                                         const v1::SaveCheckpointRequest* request,
                                                         v1::SaveCheckpointResponse* response) {
  return Serve(context, "SaveCheckpoint", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    RETURN_IF_ERROR(RequireCheckpointDir("name"));
    RETURN_IF_ERROR(train::ValidateCheckpointName(request->name(), "name"));
    ASSIGN_OR_RETURN(const Saved saved, Save(*session, tenant, request->name(), request->overwrite()));
    response->set_name(request->name());
    response->set_step(saved.step);
    response->set_bytes(saved.bytes);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::LoadCheckpoint(grpc::CallbackServerContext* context,
                                                         const v1::LoadCheckpointRequest* request,
                                                         v1::LoadCheckpointResponse* response) {
  return Serve(context, "LoadCheckpoint", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    RETURN_IF_ERROR(RequireCheckpointDir("name"));
    RETURN_IF_ERROR(train::ValidateCheckpointName(request->name(), "name"));
    absl::ReaderMutexLock expiry(&expiry_mu_);  // a final checkpoint being written is there once this returns
    absl::StatusOr<train::CheckpointContents> read;
    {
      absl::ReaderMutexLock writes(&checkpoint_mu_);  // not mid-write (an overwrite is between its renames)
      read = train::ReadCheckpoint(CheckpointDirOf(tenant), request->name());
    }
    ASSIGN_OR_RETURN(train::CheckpointContents contents, std::move(read));
    RETURN_IF_ERROR(CheckSameSpecs(request->name(), contents, *session));
    RETURN_IF_ERROR(InCheckpoint(session->RestoreState(contents.state), request->name()));
    LogLine(absl::StrFormat("checkpoint '%s' loaded: step %d", LoggedName(tenant, request->name()),
                            contents.state.step));
    PublishToMetrics(*metrics_, request->session_id(), *session, /*quantized=*/true);
    FillSessionInfo(request->session_id(), *session, response->mutable_info());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* TrainerService::ListCheckpoints(grpc::CallbackServerContext* context,
                                                          const v1::ListCheckpointsRequest* request,
                                                          v1::ListCheckpointsResponse* response) {
  return Serve(context, "ListCheckpoints", *request, *response, [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::string tenant, TenantOf(*context));
    RETURN_IF_ERROR(RequireCheckpointDir("ListCheckpoints"));
    const std::string dir = CheckpointDirOf(tenant);
    absl::ReaderMutexLock expiry(&expiry_mu_);  // final checkpoints of expiring sessions are listed
    absl::ReaderMutexLock writes(&checkpoint_mu_);  // not mid-write (an overwrite is between its renames)
    // A tenant that never saved has no directory yet: nothing to list.
    if (!tenant.empty() && !std::filesystem::is_directory(dir)) return absl::OkStatus();
    ASSIGN_OR_RETURN(std::vector<train::CheckpointListing> listing, train::ListCheckpoints(dir));
    for (const train::CheckpointListing& c : listing) {
      v1::CheckpointInfo* info = response->add_checkpoints();
      info->set_name(c.name);
      info->set_step(c.step);
      info->set_bytes(c.bytes);
      info->set_created(c.created);
      info->set_error(c.error);
    }
    return absl::OkStatus();
  });
}

}  // namespace server
}  // namespace teserve
