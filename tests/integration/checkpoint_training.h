// The training run the checkpoint integration tests resume: a TransformerLayer with
// attention and hidden dropout and a Linear head under delayed scaling and AdamW with
// clipping, trained with ForwardBackward (MSE) + Step(zero_grad) on data that depends
// only on the step number, so an interrupted run can replay any step.
#ifndef TESERVE_TESTS_INTEGRATION_CHECKPOINT_TRAINING_H_
#define TESERVE_TESTS_INTEGRATION_CHECKPOINT_TRAINING_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/client.h"
#include "core/status.h"
#include "teserve/v1/service.pb.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace testing {

inline constexpr int64_t kCkptSeq = 16, kCkptBatch = 2, kCkptHidden = 32;

inline v1::CreateSessionRequest CheckpointedRunRequest() {
  v1::CreateSessionRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_seed(11);
  v1::LayerSpec* block = model->add_layers();
  block->set_name("block");
  v1::TransformerLayerSpec* t = block->mutable_transformer_layer();
  t->set_hidden_size(kCkptHidden);
  t->set_ffn_hidden_size(64);
  t->set_num_attention_heads(2);
  t->set_hidden_dropout(0.1f);
  t->set_attention_dropout(0.1f);
  v1::LayerSpec* head = model->add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(kCkptHidden);
  head->mutable_linear()->set_out_features(kCkptHidden);
  request.mutable_recipe()->mutable_delayed()->set_amax_history_len(8);
  request.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
  request.mutable_optimizer()->set_max_grad_norm(1.0f);
  return request;
}

// Training step `step` (1-based): ForwardBackward on step-`step` data, then Step with
// zero_grad. Returns the loss's bits (and the StepResponse when asked).
inline absl::StatusOr<uint32_t> CheckpointedRunStep(client::Client& client, const std::string& id, int step,
                                                   v1::StepResponse* step_response = nullptr) {
  const int64_t n = kCkptSeq * kCkptBatch * kCkptHidden;
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = client::MakeFloatTensor(PseudoRandomFloats(n, 1000 + step), {kCkptSeq, kCkptBatch, kCkptHidden});
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() =
      client::MakeFloatTensor(PseudoRandomFloats(n, 2000 + step), {kCkptSeq, kCkptBatch, kCkptHidden});
  ASSIGN_OR_RETURN(v1::ForwardBackwardResponse fb, client.ForwardBackward(request));
  ASSIGN_OR_RETURN(v1::StepResponse stepped, client.Step(id, /*zero_grad=*/true));
  if (step_response != nullptr) *step_response = stepped;
  uint32_t bits = 0;
  const float loss = fb.loss();
  std::memcpy(&bits, &loss, sizeof(bits));
  return bits;
}

// Every parameter's name and bytes.
inline absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParameterBytes(client::Client& client,
                                                                                       const std::string& id) {
  v1::GetParametersRequest request;
  request.set_session_id(id);
  ASSIGN_OR_RETURN(v1::GetParametersResponse response, client.GetParameters(request));
  std::vector<std::pair<std::string, std::string>> out;
  for (const v1::NamedTensor& p : response.parameters()) out.emplace_back(p.name(), p.tensor().data());
  return out;
}

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_CHECKPOINT_TRAINING_H_
