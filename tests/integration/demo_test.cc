// The demo end to end over gRPC: the FP8 (DelayedScaling) student must learn.
#include "client/demo.h"

#include <algorithm>
#include <numeric>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

TEST(Demo, LossFallsTenfoldWithin200Steps) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  std::ostringstream log;
  client::DemoOptions options;
  options.steps = 200;
  options.log = &log;
  absl::StatusOr<client::DemoResult> result = client::RunDemo(*s.client, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->losses.size(), 200u);

  // The last ten steps' mean, so one noisy batch can neither pass nor fail the test.
  const float first = result->losses.front();
  const float tail =
      std::accumulate(result->losses.end() - 10, result->losses.end(), 0.0f) / 10.0f;
  EXPECT_LE(tail * 10.0f, first) << "first " << first << ", last-10 mean " << tail;
  EXPECT_THAT(log.str(), HasSubstr("step 1 loss "));
  EXPECT_THAT(log.str(), HasSubstr("step 200 loss "));

  // Every GEMM operand of both Linear layers, with a live scale.
  ASSERT_EQ(result->quantization.tensors_size(), 6);
  for (const v1::QuantizedTensorState& t : result->quantization.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    EXPECT_GT(t.amax(), 0.0f);
    EXPECT_GT(t.scale(), 0.0f);
    EXPECT_EQ(t.format(), t.tensor() == "grad_output" ? v1::FLOAT8_E5M2 : v1::FLOAT8_E4M3);
    EXPECT_EQ(t.amax_history_size(), 16);
  }
  const std::string table = client::FormatQuantizationTable(result->quantization);
  EXPECT_THAT(table, HasSubstr("scale_inv"));
  EXPECT_THAT(table, HasSubstr("fc1"));

  // Both demo sessions are gone.
  absl::StatusOr<v1::ListSessionsResponse> sessions = s.client->ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(sessions->sessions_size(), 0);
}

// With a BF16 params_dtype the student computes its Linear layers and norms in BF16 and
// still learns; its session's layers carry the dtype.
TEST(Demo, Bf16StudentLearnsToo) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::DemoOptions options;
  options.steps = 200;
  options.params_dtype = v1::BFLOAT16;
  absl::StatusOr<client::DemoResult> result = client::RunDemo(*s.client, options);
  ASSERT_TRUE(result.ok()) << result.status();
  const float first = result->losses.front();
  const float tail =
      std::accumulate(result->losses.end() - 10, result->losses.end(), 0.0f) / 10.0f;
  EXPECT_LE(tail * 10.0f, first) << "first " << first << ", last-10 mean " << tail;
  EXPECT_EQ(result->quantization.tensors_size(), 6);
}

TEST(Demo, ParamsDTypeNamesAcceptedAndRejected) {
  EXPECT_EQ(*client::ParseParamsDType("bf16"), v1::BFLOAT16);
  EXPECT_EQ(*client::ParseParamsDType("float16"), v1::FLOAT16);
  EXPECT_EQ(*client::ParseParamsDType("float32"), v1::FLOAT32);
  const absl::StatusOr<v1::DType> bad = client::ParseParamsDType("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("--params_dtype: expected float32, bfloat16 or float16, got 'int8'"));
  v1::ModelSpec model;
  model.add_layers()->mutable_linear();
  model.add_layers()->mutable_layer_norm();
  client::SetParamsDType(&model, v1::FLOAT16);
  for (const v1::LayerSpec& layer : model.layers()) EXPECT_EQ(layer.params_dtype(), v1::FLOAT16);
}

TEST(Demo, DeletesItsSessionsWhenTheServerRejectsThem) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.max_sessions = 1;  // the teacher fits, the student does not
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  client::DemoOptions demo;
  demo.steps = 3;
  absl::StatusOr<client::DemoResult> result = client::RunDemo(*s.client, demo);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(result.status().message()), HasSubstr("creating the student session"));
  absl::StatusOr<v1::ListSessionsResponse> sessions = s.client->ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(sessions->sessions_size(), 0);
}

}  // namespace
}  // namespace teserve
