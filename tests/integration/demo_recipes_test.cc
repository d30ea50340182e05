// The demo under every recipe, end to end over gRPC: each student must learn (loss down
// at least tenfold within 200 steps) and GetQuantizationState must describe each GEMM
// operand with that recipe's format, scaling mode and scales.
#include <numeric>
#include <ostream>
#include <sstream>
#include <string>

#include "absl/strings/str_format.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

struct RecipeCase {
  std::string recipe;
  int steps;
};

void PrintTo(const RecipeCase& c, std::ostream* os) { *os << c.recipe << ", " << c.steps << " steps"; }

std::string CaseName(const ::testing::TestParamInfo<RecipeCase>& info) {
  return info.param.recipe;
}

class DemoRecipe : public ::testing::TestWithParam<RecipeCase> {};

// The operand's expected format: E4M3 except HYBRID's E5M2 gradients (delayed and
// current); E2M1 throughout under NVFP4.
v1::DType ExpectedFormat(const std::string& recipe, const std::string& tensor) {
  if (recipe == "nvfp4") return v1::FLOAT4_E2M1;
  if ((recipe == "delayed" || recipe == "current") && tensor == "grad_output") {
    return v1::FLOAT8_E5M2;
  }
  return v1::FLOAT8_E4M3;
}

std::string ExpectedMode(const std::string& recipe, const std::string& tensor) {
  if (recipe == "mxfp8") return "mxfp8_1d";
  if (recipe == "block") return tensor == "weight" ? "block_2d" : "block_1d";
  if (recipe == "nvfp4") return tensor == "weight" ? "nvfp4_2d" : "nvfp4_1d";
  return "per_tensor";
}

TEST_P(DemoRecipe, LossFallsTenfoldAndStateMatchesTheRecipe) {
  const RecipeCase& c = GetParam();
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::DemoOptions options;
  options.steps = c.steps;
  options.recipe = c.recipe;
  absl::StatusOr<client::DemoResult> result = client::RunDemo(*s.client, options);
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->losses.size(), static_cast<size_t>(c.steps));

  // The last ten steps' mean, so one noisy batch can neither pass nor fail the test.
  const float first = result->losses.front();
  const float tail =
      std::accumulate(result->losses.end() - 10, result->losses.end(), 0.0f) / 10.0f;
  std::cout << absl::StrFormat("recipe %s: first loss %.6g, last-10 mean %.6g (%.1fx) in %d steps\n",
                               c.recipe, first, tail, first / tail, c.steps);
  EXPECT_LE(tail * 10.0f, first) << c.recipe << ": first " << first << ", last-10 mean " << tail;

  // Every GEMM operand of both Linear layers.
  ASSERT_EQ(result->quantization.tensors_size(), 6);
  for (const v1::QuantizedTensorState& t : result->quantization.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    EXPECT_EQ(t.recipe(), c.recipe);
    EXPECT_EQ(t.format(), ExpectedFormat(c.recipe, t.tensor())) << v1::DType_Name(t.format());
    EXPECT_EQ(t.scaling_mode(), ExpectedMode(c.recipe, t.tensor()));
    // The loopback server runs on the CPU: never native. The session reports "emulated"
    // (reference GEMMs through dequantization); service.proto's comment says "reference".
    EXPECT_THAT(t.execution(), ::testing::AnyOf("emulated", "reference"));
    EXPECT_GT(t.amax(), 0.0f);
    EXPECT_GT(t.quantize_calls(), 0);
    const bool per_tensor = c.recipe == "delayed" || c.recipe == "current";
    if (per_tensor) {
      EXPECT_GT(t.scale(), 0.0f);
      EXPECT_FALSE(t.has_block_scale_inv());
    } else {
      ASSERT_TRUE(t.has_block_scale_inv());
      const v1::BlockScaleSummary& b = t.block_scale_inv();
      EXPECT_GT(b.min(), 0.0f);
      EXPECT_LE(b.min(), b.mean());
      EXPECT_LE(b.mean(), b.max());
    }
    EXPECT_EQ(t.amax_history_size(), c.recipe == "delayed" ? 16 : 0);
    EXPECT_FALSE(t.has_health());  // fp8_health_stats is off in the demo
  }
  const std::string table = client::FormatQuantizationTable(result->quantization);
  EXPECT_THAT(table, HasSubstr("bsi_mean"));
  EXPECT_THAT(table, HasSubstr(ExpectedMode(c.recipe, "weight")));

  // Both demo sessions are gone.
  absl::StatusOr<v1::ListSessionsResponse> sessions = s.client->ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(sessions->sessions_size(), 0);
}

INSTANTIATE_TEST_SUITE_P(AllRecipes, DemoRecipe,
                         ::testing::Values(RecipeCase{"delayed", 200}, RecipeCase{"current", 200},
                                           RecipeCase{"mxfp8", 200}, RecipeCase{"block", 200},
                                           RecipeCase{"nvfp4", 200}),
                         CaseName);

TEST(DemoRecipeNames, UnknownRecipeIsRejectedBeforeAnySessionExists) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  client::DemoOptions options;
  options.recipe = "fp16";
  absl::StatusOr<client::DemoResult> result = client::RunDemo(*s.client, options);
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(result.status().message()),
              HasSubstr("expected one of delayed, current, mxfp8, block, nvfp4, got 'fp16'"));
  absl::StatusOr<v1::ListSessionsResponse> sessions = s.client->ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  EXPECT_EQ(sessions->sessions_size(), 0);
}

// quant-state's table (FormatQuantizationTable) shows the FP8 health columns when the
// session measures them.
TEST(DemoRecipeNames, QuantStateTableShowsHealthStats) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionRequest> request =
      client::DemoSessionRequestFor(5, 0.05f, "mxfp8", 1e-2f);
  ASSERT_TRUE(request.ok()) << request.status();
  request->mutable_recipe()->set_fp8_health_stats(true);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(*request);
  ASSERT_TRUE(created.ok()) << created.status();
  v1::ForwardRequest forward;
  forward.set_session_id(created->session_id());
  *forward.add_inputs() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(32 * 32, 9), {32, 32});
  absl::StatusOr<v1::ForwardResponse> y = s.client->Forward(forward);
  ASSERT_TRUE(y.ok()) << y.status();
  absl::StatusOr<v1::QuantizationState> state =
      s.client->GetQuantizationState(created->session_id());
  ASSERT_TRUE(state.ok()) << state.status();
  bool any_health = false;
  for (const v1::QuantizedTensorState& t : state->tensors()) any_health |= t.has_health();
  EXPECT_TRUE(any_health);
  const std::string table = client::FormatQuantizationTable(*state);
  EXPECT_THAT(table, ::testing::ContainsRegex("bsi_mean +underflow +overflow +mse +dyn_range"));
  EXPECT_THAT(table, ::testing::ContainsRegex("fc1 +input +mxfp8 +FLOAT8_E4M3 +mxfp8_1d"));
}

}  // namespace
}  // namespace teserve
