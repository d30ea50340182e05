// CreateSession's path from a parsed request to a session (server/trainer_service.cc):
// unknown fields, the checkpoint policy fields, the server's memory admission
// (EstimateSessionMemory + AdmitSession, tests/fuzz/fuzz_support.h), then
// train::Session::Create, which parses the recipe and optimizer and builds the layer
// stack from the ModelSpec (layers/spec.cc and the *_spec.cc parsers, each layer's
// Create and parameter initialization).
//
// The input is a serialized teserve.v1.CreateSessionRequest. Invariants besides "no
// crash, no sanitizer report":
//   - a refused spec gets INVALID_ARGUMENT, RESOURCE_EXHAUSTED or UNIMPLEMENTED, never
//     INTERNAL or anything else;
//   - what Create allocates (AddressSanitizer's heap counter) stays within the
//     admission estimate, so admission bounds what a session can take;
//   - the specs survive the protobuf JSON a checkpoint stores them in (model.json,
//     ...) unchanged, as LoadCheckpoint's spec comparison needs;
//   - the session's state captures and restores into itself (CaptureState /
//     RestoreState, what SaveCheckpoint and LoadCheckpoint do).
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "server/limits.h"
#include "server/unknown_fields.h"
#include "teserve/v1/service.pb.h"
#include "tests/fuzz/fuzz_support.h"
#include "train/checkpoint.h"
#include "train/session.h"

namespace teserve {
namespace {

bool Refusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument || status.code() == absl::StatusCode::kResourceExhausted ||
         status.code() == absl::StatusCode::kUnimplemented;
}

// The spec as a checkpoint writes it (train/checkpoint.cc, SpecJson) and reads it back.
template <typename Spec>
void CheckJsonRoundTrip(const Spec& spec) {
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.preserve_proto_field_names = true;
  std::string json;
  FUZZ_CHECK(google::protobuf::util::MessageToJsonString(spec, &json, print).ok(), "spec does not print as JSON");
  Spec back;
  const auto parsed = google::protobuf::util::JsonStringToMessage(json, &back, google::protobuf::util::JsonParseOptions());
  FUZZ_CHECK(parsed.ok(), absl::StrCat("spec JSON does not parse back: ", std::string(parsed.message()), "\n", json));
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(spec, back),
             absl::StrCat("spec changes in its checkpoint JSON:\n", json));
}

void Run(const v1::CreateSessionRequest& request) {
  // The request checks CreateSession makes before admission.
  if (!server::RejectUnknownFields(request.model(), "model").ok()) return;
  if (!server::RejectUnknownFields(request.recipe(), "recipe").ok()) return;
  if (!server::RejectUnknownFields(request.optimizer(), "optimizer").ok()) return;
  if (!request.from_checkpoint().empty() &&
      !train::ValidateCheckpointName(request.from_checkpoint(), "from_checkpoint").ok()) {
    return;
  }
  if (!request.checkpoint_prefix().empty() &&
      !train::ValidateCheckpointName(request.checkpoint_prefix(), "checkpoint_prefix").ok()) {
    return;
  }

  const server::MemoryEstimate estimate = fuzz::EstimateLikeTheServer(request.model(), request.optimizer());
  const absl::Status admitted = fuzz::AdmitLikeTheServer(estimate);
  if (!admitted.ok()) {
    FUZZ_CHECK(admitted.code() == absl::StatusCode::kResourceExhausted, admitted.ToString());
    return;
  }

  const int64_t heap_before = fuzz::HeapBytes();
  absl::StatusOr<std::unique_ptr<train::Session>> session =
      train::Session::Create(request.model(), request.recipe(), request.optimizer(), Context::Cpu());
  if (!session.ok()) {
    FUZZ_CHECK(Refusal(session.status()), session.status().ToString());
    return;
  }
  const int64_t heap_after = fuzz::HeapBytes();
  if (heap_before >= 0) {
    // 1 MiB of slack for the stack's objects, names and small tables.
    const double held = static_cast<double>(heap_after - heap_before);
    FUZZ_CHECK(held <= estimate.total() + (1 << 20),
               absl::StrCat("the session holds ", held, " bytes after Create, over the admission estimate ",
                            estimate.ToString()));
  }
  const train::SessionSummary summary = (*session)->Summary();
  FUZZ_CHECK(static_cast<double>(summary.num_parameters) <= estimate.parameters,
             absl::StrCat(summary.num_parameters, " parameters, the estimate counts ", estimate.parameters));

  CheckJsonRoundTrip((*session)->model_spec());
  CheckJsonRoundTrip((*session)->recipe_spec());
  CheckJsonRoundTrip((*session)->optimizer_spec());

  absl::StatusOr<train::SessionState> state = (*session)->CaptureState();
  FUZZ_CHECK(state.ok(), state.status().ToString());
  const absl::Status restored = (*session)->RestoreState(*state);
  FUZZ_CHECK(restored.ok(), restored.ToString());
}

}  // namespace
}  // namespace teserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  teserve::v1::CreateSessionRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  teserve::Run(request);
  return 0;
}
