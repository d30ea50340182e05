// The transformer demo end to end over gRPC: 2 TransformerLayers learn to reverse token
// sequences under DelayedScaling, a short MXFP8 run matches high precision at the first
// step, and the session is gone afterwards, also when a call fails.
#include "client/transformer_demo.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

void ExpectNoSessions(client::Client& client) {
  absl::StatusOr<v1::ListSessionsResponse> sessions = client.ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(sessions->sessions_size(), 0);
}

// Quantized tensors per layer prefix ("block1", "block2", "head"): every GEMM with
// weights reports input, weight and grad_output.
std::map<std::string, int> TensorsPerPrefix(const v1::QuantizationState& state) {
  std::map<std::string, int> counts;
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    counts[t.layer().substr(0, t.layer().find('.'))]++;
  }
  return counts;
}

TEST(TransformerDemo, DelayedScalingLearnsToReverseSequences) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  std::ostringstream log;
  client::TransformerDemoOptions options;  // delayed, 400 steps
  options.log = &log;
  absl::StatusOr<client::TransformerDemoResult> result = client::RunTransformerDemo(*s.client, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->losses.size(), 400u);

  // Small initial weights make the first logits nearly uniform: loss ~ ln(vocab).
  const float first = result->losses.front();
  EXPECT_NEAR(first, std::log(32.0), 0.1);
  // The last ten steps' mean, so one noisy batch can neither pass nor fail the test.
  const float tail = std::accumulate(result->losses.end() - 10, result->losses.end(), 0.0f) / 10.0f;
  std::cout << absl::StrFormat("delayed: first loss %.6g, last-10 mean %.6g, token accuracy %.4f\n", first, tail,
                               result->accuracy);
  EXPECT_LE(tail * 10.0f, first) << "first " << first << ", last-10 mean " << tail;
  // Chance is 1/32; reversal needs every output position to attend to its mirror.
  EXPECT_EQ(result->eval_tokens, 4 * 16 * 8);
  EXPECT_GE(result->accuracy, 0.8);

  const std::string text = log.str();
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 400);
  EXPECT_THAT(text, HasSubstr(absl::StrFormat("step 1 loss %.6g\n", result->losses.front())));
  EXPECT_THAT(text, HasSubstr(absl::StrFormat("step 400 loss %.6g\n", result->losses.back())));

  // QKV, proj, fc1, fc2 per block and the head, each with three operands.
  EXPECT_EQ(TensorsPerPrefix(result->quantization),
            (std::map<std::string, int>{{"block1", 12}, {"block2", 12}, {"head", 3}}));
  for (const v1::QuantizedTensorState& t : result->quantization.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    EXPECT_EQ(t.recipe(), "delayed");
    EXPECT_EQ(t.format(), t.tensor() == "grad_output" ? v1::FLOAT8_E5M2 : v1::FLOAT8_E4M3);
    EXPECT_GT(t.amax(), 0.0f);
    EXPECT_GT(t.scale(), 0.0f);
    EXPECT_EQ(t.amax_history_size(), 16);
  }
  EXPECT_THAT(client::FormatQuantizationTable(result->quantization),
              ::testing::ContainsRegex("head +grad_output +delayed +FLOAT8_E5M2 +per_tensor"));
  ExpectNoSessions(*s.client);
}

TEST(TransformerDemo, ShortMxfp8RunMatchesHighPrecisionAtTheFirstStep) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::TransformerDemoOptions options;
  options.steps = 30;
  options.recipe = "mxfp8";
  absl::StatusOr<client::TransformerDemoResult> mxfp8 = client::RunTransformerDemo(*s.client, options);
  ASSERT_TRUE(mxfp8.ok()) << mxfp8.status();
  ASSERT_EQ(mxfp8->losses.size(), 30u);
  for (float loss : mxfp8->losses) EXPECT_TRUE(std::isfinite(loss)) << loss;
  EXPECT_EQ(mxfp8->eval_tokens, 512);
  EXPECT_GE(mxfp8->accuracy, 0.0);
  EXPECT_LE(mxfp8->accuracy, 1.0);

  // Same seed, same parameters and data: the first loss differs only by MXFP8 rounding.
  options.steps = 1;
  options.recipe = "";
  options.eval_batches = 0;
  absl::StatusOr<client::TransformerDemoResult> fp32 = client::RunTransformerDemo(*s.client, options);
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_NE(mxfp8->losses.front(), fp32->losses.front());
  EXPECT_NEAR(mxfp8->losses.front(), fp32->losses.front(), 0.02);
  EXPECT_EQ(fp32->quantization.tensors_size(), 0);

  EXPECT_EQ(TensorsPerPrefix(mxfp8->quantization),
            (std::map<std::string, int>{{"block1", 12}, {"block2", 12}, {"head", 3}}));
  for (const v1::QuantizedTensorState& t : mxfp8->quantization.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    EXPECT_EQ(t.recipe(), "mxfp8");
    EXPECT_EQ(t.format(), v1::FLOAT8_E4M3);
    EXPECT_EQ(t.scaling_mode(), "mxfp8_1d");
    ASSERT_TRUE(t.has_block_scale_inv());
    EXPECT_GT(t.block_scale_inv().min(), 0.0f);
    EXPECT_LE(t.block_scale_inv().min(), t.block_scale_inv().max());
  }
  ExpectNoSessions(*s.client);
}

TEST(TransformerDemo, EmbeddingIsTokenVectorPlusSinusoidalPosition) {
  constexpr int64_t kSeq = 3, kBatch = 2, kHidden = 8, kVocab = 4;
  std::vector<float> token_vectors(kVocab * kHidden);
  for (size_t i = 0; i < token_vectors.size(); ++i) token_vectors[i] = 0.25f * static_cast<float>(i);
  const std::vector<int64_t> tokens = {3, 0, 1, 1, 2, 3};  // [S, B]
  const std::vector<float> x = client::EmbedSequences(tokens, kSeq, kBatch, token_vectors, kHidden);
  ASSERT_EQ(x.size(), static_cast<size_t>(kSeq * kBatch * kHidden));
  for (int64_t s = 0; s < kSeq; ++s) {
    for (int64_t b = 0; b < kBatch; ++b) {
      for (int64_t i = 0; i < kHidden; ++i) {
        // Frequency of dimension pair i / 2: exp(-ln(10000) * (i - i % 2) / hidden).
        const double w = std::exp(-std::log(10000.0) * static_cast<double>(i - i % 2) / kHidden);
        const double pe = i % 2 == 0 ? std::sin(w * s) : std::cos(w * s);
        const double expected = token_vectors[tokens[s * kBatch + b] * kHidden + i] + pe;
        EXPECT_NEAR(x[(s * kBatch + b) * kHidden + i], expected, 1e-6) << "s " << s << " b " << b << " i " << i;
      }
    }
  }
}

TEST(TransformerDemo, RejectsBadOptionsBeforeCreatingASession) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::TransformerDemoOptions options;
  options.recipe = "fp16";
  absl::StatusOr<client::TransformerDemoResult> result = client::RunTransformerDemo(*s.client, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("expected one of delayed, current, mxfp8, block, nvfp4, got 'fp16'"));

  options.recipe = "delayed";
  options.seq_len = 1;
  result = client::RunTransformerDemo(*s.client, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("seq_len >= 2"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("got 400, 8, 1, 32 and 4"));
  ExpectNoSessions(*s.client);
}

// The server's own checks surface with the demo's context: a vocabulary MXFP8 blocks do
// not tile fails CreateSession, a token count they do not tile fails the first
// ForwardBackward, after which the session must still be deleted.
TEST(TransformerDemo, ServerRejectionsNameTheCallAndLeaveNoSession) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::TransformerDemoOptions options;
  options.recipe = "mxfp8";
  options.vocab = 16;
  absl::StatusOr<client::TransformerDemoResult> result = client::RunTransformerDemo(*s.client, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("creating the transformer session"));
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("model.layers[3].linear.out_features"));
  ExpectNoSessions(*s.client);

  options.vocab = 32;
  options.batch = 3;  // 48 tokens
  result = client::RunTransformerDemo(*s.client, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("ForwardBackward at step 1"));
  ExpectNoSessions(*s.client);
}

}  // namespace
}  // namespace teserve
