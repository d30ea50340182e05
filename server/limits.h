// Work and memory bounds checked before a request does any work (issue 25, "Limits").
//
// Request cost (Forward, ForwardBackward): the tokens of inputs[0] (every dimension but
// the feature dimensions), the attention score matrix of each attention layer
// (batch x heads x seq_q x seq_kv, what the unfused backend materialises) and the bytes
// of the outputs the reply will carry are computed from shapes alone and compared with
// the limits; a request over one is refused with RESOURCE_EXHAUSTED naming the field,
// the value and the flag.
//
// Session admission (CreateSession): EstimateSessionMemory sums parameters, gradients,
// optimizer state, working copies and the activations of one request of
// `admission_tokens` tokens; a session whose estimate exceeds what is available
// (the memory budget minus the estimates of live sessions, and the host's MemAvailable)
// is refused with RESOURCE_EXHAUSTED naming both numbers, before anything is allocated.
#ifndef TESERVE_SERVER_LIMITS_H_
#define TESERVE_SERVER_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "google/protobuf/repeated_ptr_field.h"
#include "teserve/v1/model.pb.h"
#include "teserve/v1/tensor.pb.h"

namespace teserve {
namespace server {

struct RequestLimits {
  int64_t max_tokens_per_request = 65536;         // --max_tokens_per_request
  int64_t max_attention_scores = int64_t{1} << 27;  // --max_attention_scores, per layer
  int64_t max_message_bytes = int64_t{1} << 30;   // --max_message_bytes (reply bound)
};

// Checks the cost of a Forward / ForwardBackward on `model` with `inputs` (and the
// encoder_output side input, if any) against `limits`. `outputs_in_reply`: whether the
// reply carries the outputs (Forward always; ForwardBackward with return_outputs).
// A dimension of 0 counts as 1 (an empty tensor's other dimensions still cost loops and
// side-tensor allocations); shapes that are malformed (empty, negative dims) pass: the
// decoder rejects them with its own message.
absl::Status CheckRequestCost(const v1::ModelSpec& model,
                              const google::protobuf::RepeatedPtrField<v1::Tensor>& inputs,
                              const google::protobuf::RepeatedPtrField<v1::NamedTensor>& side_inputs,
                              bool outputs_in_reply, const RequestLimits& limits);

struct MemoryEstimate {
  double parameters = 0;         // count
  double parameter_bytes = 0;    // FP32 master weights
  double gradient_bytes = 0;     // FP32 gradients
  double optimizer_bytes = 0;    // AdamW: 2 FP32 moments; SGD: momentum when > 0
  // Quantized / transposed copies, 4 B per parameter: what a weight keeps between calls
  // at most is a 16-bit compute copy (2 B) and its cached FP8 casts, rowwise and
  // columnwise (1 B each; Quantizer::QuantizeImmutable).
  double working_bytes = 0;
  double activation_bytes = 0;   // saved activations, outputs and gradients of one request
  double total() const {
    return parameter_bytes + gradient_bytes + optimizer_bytes + working_bytes + activation_bytes;
  }
  std::string ToString() const;  // "about 17.2 GB (parameters ... )"
};

// The admission estimate for a session of `model` and `optimizer` serving requests of up
// to `tokens` tokens (attention scores bounded by max_attention_scores per layer).
// Never fails and never overflows (doubles): a spec whose layers the session would reject
// gets whatever its numbers give, and Session::Create names the real error.
MemoryEstimate EstimateSessionMemory(const v1::ModelSpec& model, const v1::OptimizerSpec& optimizer,
                                     int64_t tokens, int64_t max_attention_scores);

// The host's MemAvailable (/proc/meminfo), or -1 when unknown.
int64_t HostAvailableMemoryBytes();
// The default memory budget: the cgroup v2 memory.max of this process if set, else
// MemTotal; -1 when unknown.
int64_t DefaultMemoryBudgetBytes();

// RESOURCE_EXHAUSTED "model: the session would need about ... bytes ..., over the ...
// bytes available ..." when `estimate` exceeds min(budget - committed, host available);
// budget or host available < 0 means unknown (not applied).
absl::Status AdmitSession(const MemoryEstimate& estimate, int64_t budget_bytes, int64_t committed_bytes,
                          int64_t host_available_bytes, int64_t admission_tokens);

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_LIMITS_H_
