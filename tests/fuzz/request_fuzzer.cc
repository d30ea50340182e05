// What the server does with a request before and during the work, on arbitrary bytes:
// the wire tensor codec (server/tensor_codec.h), the request cost bounds
// (server/limits.h, CheckRequestCost with the server's default limits), the loss spec,
// and the session's own validation of inputs, side inputs, handles, gradients and
// parameter names (train/session.h) in the order TrainerService's handlers run them
// (server/trainer_service.cc), then the work itself when everything passed.
//
// Input: byte 0 picks the RPC (Forward, Backward, ForwardBackward, SetParameters,
// GetParameters), byte 1 the session (tests/fuzz/fuzz_models.h: a fresh one per input),
// the rest is that RPC's serialized request message. Invariants besides "no crash, no
// sanitizer report, no hang":
//   - a refused request gets a client error (INVALID_ARGUMENT, RESOURCE_EXHAUSTED,
//     NOT_FOUND, FAILED_PRECONDITION, OUT_OF_RANGE), never INTERNAL or UNKNOWN;
//   - a Forward that succeeds returns CPU outputs the reply can encode, and its handle
//     takes a Backward with gradients of the outputs' shapes;
//   - a ForwardBackward that succeeds is followed by a Step that succeeds;
//   - SetParameters that succeeds is read back by GetParameters byte for byte;
//   - GetParameters returns exactly the layouts Layouts promised (the server sizes the
//     reply from them).
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "server/limits.h"
#include "server/tensor_codec.h"
#include "teserve/v1/service.pb.h"
#include "tests/fuzz/fuzz_models.h"
#include "tests/fuzz/fuzz_support.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace {

enum Rpc { kForward, kBackward, kForwardBackward, kSetParameters, kGetParameters, kNumRpcs };

// True when OK; false for a client error; aborts on any other code.
bool Accepted(const absl::Status& status) {
  if (status.ok()) return true;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
      return false;
    default:
      FUZZ_CHECK(false, absl::StrCat("not a client error: ", status.ToString()));
  }
  return false;
}

template <typename T>
bool Accepted(const absl::StatusOr<T>& value) {
  return Accepted(value.status());
}

void CheckEncodes(const std::vector<Tensor>& tensors) {
  for (const Tensor& t : tensors) {
    v1::Tensor wire;
    const absl::Status encoded = server::EncodeTensor(t, &wire);
    FUZZ_CHECK(encoded.ok(), encoded.ToString());
  }
}

void Forward(train::Session& session, const v1::ForwardRequest& r) {
  auto inputs = server::DecodeFloatTensors(r.inputs(), "inputs");
  if (!Accepted(inputs)) return;
  auto side = server::DecodeSideInputs(r.side_inputs());
  if (!Accepted(side)) return;
  if (!Accepted(server::CheckRequestCost(session.model_spec(), r.inputs(), r.side_inputs(),
                                         /*outputs_in_reply=*/true, server::RequestLimits()))) {
    return;
  }
  auto result = session.Forward(*inputs, /*save_for_backward=*/!r.no_grad(), *side);
  if (!Accepted(result)) return;
  CheckEncodes(result->outputs);
  if (result->handle == 0) return;
  std::vector<train::NamedTensor> side_grads;
  auto grads = session.Backward(result->handle, result->outputs, &side_grads);
  FUZZ_CHECK(grads.ok(), absl::StrCat("Backward after a successful Forward: ", grads.status().ToString()));
  CheckEncodes(*grads);
}

void Backward(train::Session& session, int model, const v1::BackwardRequest& r) {
  const v1::ForwardRequest valid = fuzz::ValidForward(model);
  auto inputs = server::DecodeFloatTensors(valid.inputs(), "inputs");
  auto side = server::DecodeSideInputs(valid.side_inputs());
  FUZZ_CHECK(inputs.ok() && side.ok(), "the model's valid Forward does not decode");
  auto forward = session.Forward(*inputs, /*save_for_backward=*/true, *side);
  FUZZ_CHECK(forward.ok(), absl::StrCat("the model's valid Forward fails: ", forward.status().ToString()));

  auto grads = server::DecodeFloatTensors(r.grad_outputs(), "grad_outputs");
  if (!Accepted(grads)) return;
  std::vector<train::NamedTensor> side_grads;
  auto grad_inputs = session.Backward(r.handle(), *grads, &side_grads);
  if (!Accepted(grad_inputs)) return;
  CheckEncodes(*grad_inputs);
}

void ForwardBackward(train::Session& session, const v1::ForwardBackwardRequest& r) {
  auto inputs = server::DecodeFloatTensors(r.inputs(), "inputs");
  if (!Accepted(inputs)) return;
  auto side = server::DecodeSideInputs(r.side_inputs());
  if (!Accepted(side)) return;
  auto loss = train::LossFromProto(r.loss());
  if (!Accepted(loss)) return;
  if (!r.has_target()) return;  // INVALID_ARGUMENT "target: expected a tensor"
  auto target = server::DecodeTensor(r.target(), "target");
  if (!Accepted(target)) return;
  if (!Accepted(server::CheckRequestCost(session.model_spec(), r.inputs(), r.side_inputs(), r.return_outputs(),
                                         server::RequestLimits()))) {
    return;
  }
  auto result = session.ForwardBackward(*inputs, *side, *loss, *target, r.return_input_grad(), r.return_outputs());
  if (!Accepted(result)) return;
  CheckEncodes(result->grad_inputs);
  CheckEncodes(result->outputs);
  auto step = session.Step();
  FUZZ_CHECK(step.ok(), absl::StrCat("Step after a successful ForwardBackward: ", step.status().ToString()));
}

void SetParameters(train::Session& session, const v1::SetParametersRequest& r) {
  std::vector<train::NamedTensor> parameters;
  std::vector<std::string> names;
  for (int i = 0; i < r.parameters_size(); ++i) {
    auto tensor = server::DecodeFloatTensor(r.parameters(i).tensor(), absl::StrCat("parameters[", i, "].tensor"));
    if (!Accepted(tensor)) return;
    parameters.push_back(train::NamedTensor{r.parameters(i).name(), std::move(*tensor)});
    names.push_back(r.parameters(i).name());
  }
  if (!Accepted(session.SetParameters(parameters))) return;
  if (names.empty()) return;
  auto back = session.GetParameters(names);
  FUZZ_CHECK(back.ok() && back->size() == parameters.size(),
             absl::StrCat("GetParameters after SetParameters: ", back.status().ToString()));
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Tensor& a = parameters[i].tensor;
    const Tensor& b = (*back)[i].tensor;
    FUZZ_CHECK(a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0,
               absl::StrCat("parameter ", names[i], " reads back different values"));
  }
}

void GetParameters(train::Session& session, const v1::GetParametersRequest& r) {
  const std::vector<std::string> names(r.names().begin(), r.names().end());
  for (bool grads : {false, true}) {
    if (grads && !r.include_grads()) return;
    auto layouts = session.Layouts(names, grads);
    if (!Accepted(layouts)) return;
    auto tensors = grads ? session.GetGradients(names) : session.GetParameters(names);
    FUZZ_CHECK(tensors.ok() && tensors->size() == layouts->size(),
               absl::StrCat("Layouts passed, the copy did not: ", tensors.status().ToString()));
    for (size_t i = 0; i < layouts->size(); ++i) {
      const train::TensorLayout& l = (*layouts)[i];
      const Tensor& t = (*tensors)[i].tensor;
      FUZZ_CHECK(l.name == (*tensors)[i].name && l.dtype == t.dtype() && l.shape == t.shape() && l.nbytes == t.nbytes(),
                 absl::StrCat("layout of ", l.name, " differs from the copy"));
    }
  }
}

template <typename Message>
bool Parse(absl::string_view bytes, Message* message) {
  return message->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
}

}  // namespace
}  // namespace teserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace teserve;
  if (size < 2) return 0;
  const int rpc = data[0] % kNumRpcs;
  const int model = data[1] % fuzz::kNumModels;
  const absl::string_view bytes(reinterpret_cast<const char*>(data) + 2, size - 2);

  const v1::CreateSessionRequest spec = fuzz::ModelRequest(model);
  auto session = train::Session::Create(spec.model(), spec.recipe(), spec.optimizer(), Context::Cpu());
  FUZZ_CHECK(session.ok(), absl::StrCat("model ", model, ": ", session.status().ToString()));
  train::Session& s = **session;
  switch (rpc) {
    case kForward: {
      v1::ForwardRequest r;
      if (Parse(bytes, &r)) Forward(s, r);
      break;
    }
    case kBackward: {
      v1::BackwardRequest r;
      if (Parse(bytes, &r)) Backward(s, model, r);
      break;
    }
    case kForwardBackward: {
      v1::ForwardBackwardRequest r;
      if (Parse(bytes, &r)) ForwardBackward(s, r);
      break;
    }
    case kSetParameters: {
      v1::SetParametersRequest r;
      if (Parse(bytes, &r)) SetParameters(s, r);
      break;
    }
    default: {
      v1::GetParametersRequest r;
      if (Parse(bytes, &r)) GetParameters(s, r);
      break;
    }
  }
  return 0;
}
