// The training RPCs (Forward, Backward, ForwardBackward, Step, ZeroGrad): each checks its
// call on the gRPC callback thread and computes on a compute thread (Serve's
// Lane::kCompute, server/compute_executor.h), stopping between layers when its client
// goes away or the server stops (CallInterruption).
#include <atomic>
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/context.h"
#include "core/status.h"
#include "kernels/run_ahead.h"
#include "server/limits.h"
#include "server/tensor_codec.h"
#include "server/trainer_service.h"
#include "server/trainer_service_internal.h"
#include "train/loss.h"
#include "train/session.h"

namespace teserve {
namespace server {
namespace {

using service_internal::CallAbandoned;
using service_internal::EncodeNamed;
using service_internal::EncodeTensors;
using service_internal::PublishToMetrics;

// What train::Session asks between layers: whether this call's client is still waiting.
// Cheap when it is (a flag and a clock read); the message is built only when not.
// While the server stops, also whether the time for calls is over (StopCallsAt): then
// UNAVAILABLE, so the client retries where the session is resumed.
class CallInterruption final : public Interruption {
 public:
  CallInterruption(const grpc::CallbackServerContext& context, absl::string_view method,
                   const std::atomic<int64_t>& stop_calls_at_ns)
      : context_(context), method_(method), stop_calls_at_ns_(stop_calls_at_ns) {}

  // At most kRunAhead parts of a pass queued ahead of the GPU, so that a stop lands
  // within them (kernels/run_ahead.h).
  void Pace(const Context& ctx) const override { run_ahead_.Mark(ctx); }

  absl::Status Check(absl::string_view pass, absl::string_view next) const override {
    const bool abandoned = const_cast<grpc::CallbackServerContext&>(context_).IsCancelled() ||
                           context_.deadline() <= std::chrono::system_clock::now();
    const bool stopping = absl::GetCurrentTimeNanos() >= stop_calls_at_ns_.load(std::memory_order_relaxed);
    if (!abandoned && !stopping) return absl::OkStatus();
    const std::string where = next.empty() ? absl::StrCat("after the ", pass)
                                           : absl::StrCat("in the ", pass, " before ", Quoted(next));
    if (abandoned) {
      return CallAbandoned(context_, method_, absl::StrCat(where, "; the session is as it was before the call"));
    }
    return absl::UnavailableError(absl::StrCat(method_, ": the server is shutting down; the call stopped ", where,
                                               "; the session is as it was before the call (and so is its final "
                                               "checkpoint, if it has one)"));
  }

 private:
  const grpc::CallbackServerContext& context_;
  const std::string method_;
  const std::atomic<int64_t>& stop_calls_at_ns_;
  static constexpr int kRunAhead = 4;
  mutable kernels::RunAheadLimit run_ahead_{kRunAhead};
};

}  // namespace

grpc::ServerUnaryReactor* TrainerService::Forward(grpc::CallbackServerContext* context,
                                                  const v1::ForwardRequest* request,
                                                  v1::ForwardResponse* response) {
  // The training calls (this, Backward, ForwardBackward, Step, ZeroGrad) compute on a
  // compute thread (Lane::kCompute); their handlers capture the call's pointers by value.
  return Serve(context, "Forward", *request, *response, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    ASSIGN_OR_RETURN(std::vector<Tensor> inputs, DecodeFloatTensors(request->inputs(), "inputs", RequestMemory()));
    ASSIGN_OR_RETURN(layers::SideInputs side, DecodeSideInputs(request->side_inputs()));
    // Cost bounds, on shapes the decoder has just validated, before any computation.
    RETURN_IF_ERROR(CheckRequestCost(session->model_spec(), request->inputs(), request->side_inputs(),
                                     /*outputs_in_reply=*/true, config_.request_limits));
    const CallInterruption interruption(*context, "Forward", stop_calls_at_ns_);
    ASSIGN_OR_RETURN(train::ForwardResult result,
                     session->Forward(inputs, /*save_for_backward=*/!request->no_grad(), side, &interruption));
    // The session checked the call up to its end; a client that gave up since will not
    // Backward the handle either: drop it.
    absl::Status abandoned = CallAbandoned(*context, "Forward", "while it ran; its activations were released");
    if (!abandoned.ok()) {
      if (result.handle != 0) session->ReleaseHandle(result.handle).IgnoreError();
      return abandoned;
    }
    PublishToMetrics(*metrics_, request->session_id(), *session, /*quantized=*/true);
    RETURN_IF_ERROR(EncodeTensors(result.outputs, response->mutable_outputs()));
    response->set_handle(result.handle);
    return absl::OkStatus();
  }, Lane::kCompute);
}

grpc::ServerUnaryReactor* TrainerService::Backward(grpc::CallbackServerContext* context,
                                                   const v1::BackwardRequest* request,
                                                   v1::BackwardResponse* response) {
  return Serve(context, "Backward", *request, *response, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    ASSIGN_OR_RETURN(std::vector<Tensor> grads,
                     DecodeFloatTensors(request->grad_outputs(), "grad_outputs", RequestMemory()));
    std::vector<train::NamedTensor> side_grads;
    const CallInterruption interruption(*context, "Backward", stop_calls_at_ns_);
    ASSIGN_OR_RETURN(std::vector<Tensor> grad_inputs,
                     session->Backward(request->handle(), grads, &side_grads, &interruption));
    PublishToMetrics(*metrics_, request->session_id(), *session, /*quantized=*/true);
    for (const train::NamedTensor& g : side_grads) {
      v1::NamedTensor* wire = response->add_side_grads();
      wire->set_name(g.name);
      RETURN_IF_ERROR(EncodeTensor(g.tensor, wire->mutable_tensor()));
    }
    return EncodeTensors(grad_inputs, response->mutable_grad_inputs());
  }, Lane::kCompute);
}

grpc::ServerUnaryReactor* TrainerService::ForwardBackward(grpc::CallbackServerContext* context,
                                                          const v1::ForwardBackwardRequest* request,
                                                          v1::ForwardBackwardResponse* response) {
  return Serve(context, "ForwardBackward", *request, *response, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    ASSIGN_OR_RETURN(std::vector<Tensor> inputs, DecodeFloatTensors(request->inputs(), "inputs", RequestMemory()));
    ASSIGN_OR_RETURN(layers::SideInputs side, DecodeSideInputs(request->side_inputs()));
    ASSIGN_OR_RETURN(train::LossOptions loss, train::LossFromProto(request->loss()));
    if (!request->has_target()) return InvalidField("target", "a tensor", "none");
    ASSIGN_OR_RETURN(Tensor target, DecodeTensor(request->target(), "target"));
    RETURN_IF_ERROR(CheckRequestCost(session->model_spec(), request->inputs(), request->side_inputs(),
                                     request->return_outputs(), config_.request_limits));
    const CallInterruption interruption(*context, "ForwardBackward", stop_calls_at_ns_);
    ASSIGN_OR_RETURN(train::ForwardBackwardResult result,
                     session->ForwardBackward(inputs, side, loss, target, request->return_input_grad(),
                                              request->return_outputs(), &interruption));
    PublishToMetrics(*metrics_, request->session_id(), *session, /*quantized=*/true);
    response->set_loss(result.loss);
    response->set_num_tokens(result.num_tokens);
    RETURN_IF_ERROR(EncodeTensors(result.grad_inputs, response->mutable_grad_inputs()));
    RETURN_IF_ERROR(EncodeNamed(result.side_grads, response->mutable_side_grads()));
    return EncodeTensors(result.outputs, response->mutable_outputs());
  }, Lane::kCompute);
}

grpc::ServerUnaryReactor* TrainerService::Step(grpc::CallbackServerContext* context,
                                               const v1::StepRequest* request,
                                               v1::StepResponse* response) {
  return Serve(context, "Step", *request, *response, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    const CallInterruption interruption(*context, "Step", stop_calls_at_ns_);
    ASSIGN_OR_RETURN(train::StepResult result, session->Step(request->zero_grad(), &interruption));
    PublishToMetrics(*metrics_, request->session_id(), *session, /*quantized=*/false);
    response->set_step(result.step);
    response->set_grad_norm(result.grad_norm);
    response->set_skipped(result.skipped);
    if (!result.skipped) AutoSave(request->session_id(), *session, result.step, response);
    return absl::OkStatus();
  }, Lane::kCompute);
}

grpc::ServerUnaryReactor* TrainerService::ZeroGrad(grpc::CallbackServerContext* context,
                                                   const v1::ZeroGradRequest* request,
                                                   v1::ZeroGradResponse* response) {
  return Serve(context, "ZeroGrad", *request, *response, [=]() -> absl::Status {
    ASSIGN_OR_RETURN(auto session, Find(*context, request->session_id()));
    RETURN_IF_ERROR(session->ZeroGrad());
    return absl::OkStatus();
  }, Lane::kCompute);
}

}  // namespace server
}  // namespace teserve
