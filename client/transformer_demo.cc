#include "client/transformer_demo.h"

#include <cmath>
#include <random>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/demo.h"

namespace teserve {
namespace client {
namespace {

constexpr int64_t kHidden = 64;
constexpr int64_t kHeads = 4;
constexpr int64_t kFfn = 256;
constexpr int kBlocks = 2;
// The token vectors and the data stream must not share a random stream.
constexpr uint64_t kEmbeddingSeedOffset = 0xe3bedd1;

absl::Status Annotated(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

// One batch of the reversal task: the embedded inputs and the INT64 targets.
struct Batch {
  std::vector<int64_t> tokens;   // [S, B]
  std::vector<int64_t> targets;  // [S, B]: tokens reversed along S
  std::vector<float> inputs;     // [S, B, hidden]
};

Batch MakeBatch(std::mt19937_64& rng, const TransformerDemoOptions& options,
                const std::vector<float>& token_vectors) {
  const int64_t s_len = options.seq_len;
  const int64_t b_len = options.batch;
  std::uniform_int_distribution<int64_t> token(0, options.vocab - 1);
  Batch batch;
  batch.tokens.resize(static_cast<size_t>(s_len * b_len));
  for (int64_t& t : batch.tokens) t = token(rng);
  batch.targets.resize(batch.tokens.size());
  for (int64_t s = 0; s < s_len; ++s) {
    for (int64_t b = 0; b < b_len; ++b) {
      batch.targets[static_cast<size_t>(s * b_len + b)] =
          batch.tokens[static_cast<size_t>((s_len - 1 - s) * b_len + b)];
    }
  }
  batch.inputs = EmbedSequences(batch.tokens, s_len, b_len, token_vectors, kHidden);
  return batch;
}

absl::Status CheckOptions(const TransformerDemoOptions& o) {
  if (o.steps < 1 || o.batch < 1 || o.seq_len < 2 || o.vocab < 2 || o.eval_batches < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "transformer demo: expected steps >= 1, batch >= 1, seq_len >= 2, vocab >= 2 and eval_batches >= 0, got ",
        o.steps, ", ", o.batch, ", ", o.seq_len, ", ", o.vocab, " and ", o.eval_batches));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::CreateSessionRequest> TransformerDemoSessionRequest(const TransformerDemoOptions& options) {
  if (absl::Status status = CheckOptions(options); !status.ok()) return status;
  // The MLP demo's request carries the recipe and optimizer settings the two demos
  // share; only its model is replaced.
  absl::StatusOr<v1::CreateSessionRequest> request =
      DemoSessionRequestFor(options.seed, /*init_std=*/0.023f, options.recipe, options.lr);
  if (!request.ok()) return request.status();
  v1::ModelSpec* model = request->mutable_model();
  model->Clear();
  model->set_seed(options.seed);
  for (int i = 1; i <= kBlocks; ++i) {
    v1::LayerSpec* layer = model->add_layers();
    layer->set_name(absl::StrCat("block", i));
    v1::TransformerLayerSpec* block = layer->mutable_transformer_layer();
    block->set_hidden_size(kHidden);
    block->set_ffn_hidden_size(kFfn);
    block->set_num_attention_heads(kHeads);
    block->set_hidden_dropout(0.0f);
    block->set_attention_dropout(0.0f);
    block->set_self_attn_mask_type("no_mask");
    block->set_attn_input_format("sbhd");
  }
  v1::LayerSpec* norm = model->add_layers();
  norm->set_name("final_norm");
  norm->mutable_layer_norm()->set_hidden_size(kHidden);
  v1::LayerSpec* head = model->add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(kHidden);
  head->mutable_linear()->set_out_features(options.vocab);
  SetParamsDType(model, options.params_dtype);
  return request;
}

std::vector<float> EmbedSequences(const std::vector<int64_t>& tokens, int64_t seq_len, int64_t batch,
                                  const std::vector<float>& token_vectors, int64_t hidden) {
  std::vector<float> out(static_cast<size_t>(seq_len * batch * hidden));
  for (int64_t s = 0; s < seq_len; ++s) {
    for (int64_t b = 0; b < batch; ++b) {
      const float* vec = token_vectors.data() + tokens[static_cast<size_t>(s * batch + b)] * hidden;
      float* row = out.data() + (s * batch + b) * hidden;
      for (int64_t i = 0; i < hidden; ++i) {
        const int64_t pair = i / 2;
        const double angle = static_cast<double>(s) / std::pow(10000.0, 2.0 * pair / hidden);
        row[i] = vec[i] + static_cast<float>(i % 2 == 0 ? std::sin(angle) : std::cos(angle));
      }
    }
  }
  return out;
}

absl::StatusOr<TransformerDemoResult> RunTransformerDemo(Client& client, const TransformerDemoOptions& options) {
  absl::StatusOr<v1::CreateSessionRequest> request = TransformerDemoSessionRequest(options);
  if (!request.ok()) return Annotated(request.status(), "transformer demo");

  absl::StatusOr<v1::CreateSessionResponse> session = client.CreateSession(*request);
  if (!session.ok()) return Annotated(session.status(), "creating the transformer session");
  const std::string id = session->session_id();
  absl::Cleanup delete_session = [&client, &id] { client.DeleteSession(id).IgnoreError(); };

  std::mt19937_64 embedding_rng(options.seed + kEmbeddingSeedOffset);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> token_vectors(static_cast<size_t>(options.vocab * kHidden));
  for (float& v : token_vectors) v = normal(embedding_rng);

  std::mt19937_64 data_rng(options.seed);
  const std::vector<int64_t> input_shape = {options.seq_len, options.batch, kHidden};
  const std::vector<int64_t> target_shape = {options.seq_len, options.batch};
  const int64_t tokens_per_batch = int64_t{options.seq_len} * options.batch;

  TransformerDemoResult result;
  for (int step = 1; step <= options.steps; ++step) {
    const Batch batch = MakeBatch(data_rng, options, token_vectors);
    v1::ForwardBackwardRequest fb;
    fb.set_session_id(id);
    *fb.add_inputs() = MakeFloatTensor(batch.inputs, input_shape);
    fb.mutable_loss()->mutable_cross_entropy();
    *fb.mutable_target() = MakeInt64Tensor(batch.targets, target_shape);
    absl::StatusOr<v1::ForwardBackwardResponse> response = client.ForwardBackward(fb);
    if (!response.ok()) return Annotated(response.status(), absl::StrCat("ForwardBackward at step ", step));
    if (response->num_tokens() != tokens_per_batch) {
      return absl::InternalError(absl::StrCat("ForwardBackward at step ", step, ": expected ", tokens_per_batch,
                                              " tokens in the loss, got ", response->num_tokens()));
    }
    result.losses.push_back(response->loss());
    if (options.log != nullptr) {
      *options.log << absl::StrFormat("step %d loss %.6g\n", step, response->loss()) << std::flush;
    }
    absl::StatusOr<v1::StepResponse> stepped = client.Step(id, /*zero_grad=*/true);
    if (!stepped.ok()) return Annotated(stepped.status(), absl::StrCat("Step at step ", step));
  }

  // Accuracy on fresh sequences: argmax over the vocab per target position.
  int64_t correct = 0;
  for (int e = 0; e < options.eval_batches; ++e) {
    const Batch batch = MakeBatch(data_rng, options, token_vectors);
    v1::ForwardRequest forward;
    forward.set_session_id(id);
    forward.set_no_grad(true);
    *forward.add_inputs() = MakeFloatTensor(batch.inputs, input_shape);
    absl::StatusOr<v1::ForwardResponse> response = client.Forward(forward);
    if (!response.ok()) return Annotated(response.status(), "evaluation Forward");
    if (response->outputs_size() != 1) {
      return absl::InternalError(
          absl::StrCat("evaluation Forward: expected 1 output, got ", response->outputs_size()));
    }
    absl::StatusOr<std::vector<float>> logits = FloatsOf(response->outputs(0));
    if (!logits.ok()) return Annotated(logits.status(), "evaluation logits");
    if (static_cast<int64_t>(logits->size()) != tokens_per_batch * options.vocab) {
      return absl::InternalError(absl::StrCat("evaluation logits: expected ", tokens_per_batch * options.vocab,
                                              " values, got ", logits->size()));
    }
    for (int64_t t = 0; t < tokens_per_batch; ++t) {
      const float* row = logits->data() + t * options.vocab;
      int64_t best = 0;
      for (int64_t v = 1; v < options.vocab; ++v) {
        if (row[v] > row[best]) best = v;
      }
      correct += best == batch.targets[static_cast<size_t>(t)] ? 1 : 0;
    }
    result.eval_tokens += tokens_per_batch;
  }
  if (result.eval_tokens > 0) result.accuracy = static_cast<double>(correct) / result.eval_tokens;

  absl::StatusOr<v1::QuantizationState> state = client.GetQuantizationState(id);
  if (!state.ok()) return Annotated(state.status(), "GetQuantizationState");
  result.quantization = *std::move(state);
  return result;
}

}  // namespace client
}  // namespace teserve
