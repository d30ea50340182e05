// The transformer demo: a 2-layer TransformerLayer stack learns to reverse random token
// sequences remotely, under one low-precision recipe, and reports the loss per step, the
// token accuracy and the final quantization state. A library so tests run exactly what
// `teserve_cli demo --model=transformer` runs.
//
// Model (one session, attn_input_format sbhd): TransformerLayer x2 (hidden 64, 4 heads,
// ffn 256, gelu, self_attn_mask_type no_mask, hidden and attention dropout 0) ->
// LayerNorm(64) -> Linear(64, vocab) logits [S, B, vocab]. Every GEMM width (64, 192,
// 256, vocab 32) and the default token count S * B = 128 are multiples of 32, so MXFP8
// (32) and NVFP4 (16) blocks tile them. Recipes and AdamW as the MLP demo (client/demo.h).
//
// Task: targets[s, b] = tokens[S - 1 - s, b] for uniform random tokens in [0, vocab);
// output position s must find input position S - 1 - s, which only attention can do.
// The embedding lives on the client, not in the session: the input at [s, b, :] is a
// fixed random N(0, 1) vector of the token (drawn from the seed, never trained) plus the
// sinusoidal position code pe[s, 2i] = sin(s / 10000^(2i / hidden)), pe[s, 2i + 1] =
// cos(s / 10000^(2i / hidden)). Each step is one ForwardBackward with cross entropy on the
// INT64 [S, B] targets, then Step.
#ifndef TESERVE_CLIENT_TRANSFORMER_DEMO_H_
#define TESERVE_CLIENT_TRANSFORMER_DEMO_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace client {

struct TransformerDemoOptions {
  int steps = 400;
  uint64_t seed = 1;
  int batch = 8;     // B
  int seq_len = 16;  // S
  int vocab = 32;
  float lr = 3e-3f;
  // One of DemoRecipeNames() (client/demo.h), or "" for high precision (FP32) everywhere.
  std::string recipe = "delayed";
  // LayerSpec.params_dtype of every layer (FLOAT32, BFLOAT16 or FLOAT16).
  v1::DType params_dtype = v1::FLOAT32;
  // Sequences scored after training (fresh batches, no_grad forwards).
  int eval_batches = 4;
  // Receives "step N loss X" per step when set.
  std::ostream* log = nullptr;
};

struct TransformerDemoResult {
  std::vector<float> losses;  // mean cross entropy per step, before that step's update
  // Fraction of target tokens whose argmax logit is right, over eval_batches fresh
  // batches after the last step. Chance is 1 / vocab.
  double accuracy = 0.0;
  int64_t eval_tokens = 0;
  v1::QuantizationState quantization;  // after the last step
};

// The session above under options.recipe; INVALID_ARGUMENT naming the accepted values
// for any other recipe, or naming the options out of range.
absl::StatusOr<v1::CreateSessionRequest> TransformerDemoSessionRequest(const TransformerDemoOptions& options);

// The client-side embedding of `tokens` ([S, B] row-major, values in [0, vocab)) as
// [S, B, hidden]: token_vectors[token] ([vocab, hidden] row-major) plus the sinusoidal
// position code of s.
std::vector<float> EmbedSequences(const std::vector<int64_t>& tokens, int64_t seq_len, int64_t batch,
                                  const std::vector<float>& token_vectors, int64_t hidden);

// Runs the demo. The session is deleted before returning, also on error.
absl::StatusOr<TransformerDemoResult> RunTransformerDemo(Client& client, const TransformerDemoOptions& options);

}  // namespace client
}  // namespace teserve

#endif  // TESERVE_CLIENT_TRANSFORMER_DEMO_H_
