// The metrics catalogue (server/metrics.h) through the real server: sessions driven by
// the real client, /metrics scraped over HTTP and parsed, every value compared with what
// GetQuantizationState, GetSession and the RPC responses report; the detail levels,
// FP8 health sampling, kernel timing sampling, and the removal of a session's series on
// DeleteSession and on shutdown.
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 32;
constexpr int64_t kFeatures = 32;  // the demo model maps 32 -> 32

using Labels = std::map<std::string, std::string>;

struct Sample {
  std::string name;
  Labels labels;
  double value = 0.0;
};

// Parses the text exposition format: "name{k=\"v\",...} value" lines, comments skipped.
std::vector<Sample> ParseExposition(absl::string_view body) {
  std::vector<Sample> samples;
  for (absl::string_view line : absl::StrSplit(body, '\n', absl::SkipEmpty())) {
    if (line[0] == '#') continue;
    Sample sample;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    sample.name = std::string(line.substr(0, std::min(brace, space)));
    if (brace != absl::string_view::npos && brace < space) {
      size_t i = brace + 1;
      while (i < line.size() && line[i] != '}') {
        const size_t eq = line.find('=', i);
        std::string key(line.substr(i, eq - i));
        std::string value;
        size_t j = eq + 2;  // past the opening quote
        for (; line[j] != '"'; ++j) {
          if (line[j] == '\\') ++j;
          value.push_back(line[j]);
        }
        sample.labels[key] = value;
        i = j + 1;
        if (line[i] == ',') ++i;
      }
    }
    const std::string number(line.substr(space + 1));
    sample.value = std::strtod(number.c_str(), nullptr);  // also "NaN", "+Inf"
    samples.push_back(std::move(sample));
  }
  return samples;
}

std::vector<Sample> Scrape(int port) {
  absl::StatusOr<std::string> page = testing::HttpGet(port, "/metrics");
  EXPECT_TRUE(page.ok()) << page.status();
  if (!page.ok()) return {};
  const size_t body = page->find("\r\n\r\n");
  EXPECT_NE(body, std::string::npos);
  return ParseExposition(absl::string_view(*page).substr(body + 4));
}

bool Matches(const Sample& s, absl::string_view name, const Labels& labels) {
  if (s.name != name) return false;
  for (const auto& [key, value] : labels) {
    auto it = s.labels.find(key);
    if (it == s.labels.end() || it->second != value) return false;
  }
  return true;
}

std::vector<Sample> Find(const std::vector<Sample>& samples, absl::string_view name,
                         const Labels& labels = {}) {
  std::vector<Sample> out;
  for (const Sample& s : samples) {
    if (Matches(s, name, labels)) out.push_back(s);
  }
  return out;
}

// The value of the one series `name` with `labels`; nullopt (and a failure when
// `required`) if there is none or more than one.
std::optional<double> Value(const std::vector<Sample>& samples, absl::string_view name,
                            const Labels& labels) {
  const std::vector<Sample> found = Find(samples, name, labels);
  if (found.size() != 1) return std::nullopt;
  return found[0].value;
}

// Gauges hold FP32 values written as doubles: equal after the round trip.
void ExpectFloatSeries(const std::vector<Sample>& samples, absl::string_view name,
                       const Labels& labels, float want) {
  std::optional<double> got = Value(samples, name, labels);
  ASSERT_TRUE(got.has_value()) << name << " missing for " << ::testing::PrintToString(labels);
  EXPECT_EQ(static_cast<float>(*got), want) << name << " " << ::testing::PrintToString(labels);
}

bool AnySeriesOfSession(const std::vector<Sample>& samples, const std::string& id) {
  for (const Sample& s : samples) {
    auto it = s.labels.find("session");
    if (it != s.labels.end() && it->second == id) return true;
  }
  return false;
}

float WindowMax(const v1::QuantizedTensorState& t) {
  if (t.amax_history().empty()) return t.amax();
  return *std::max_element(t.amax_history().begin(), t.amax_history().end());
}

server::ServerOptions MetricsOptions(const std::string& detail, int64_t fp8_interval,
                                     int64_t kernel_interval) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.metrics_port = 0;
  // These tests match series by session id; the default label is a digest of it
  // (security_test checks that).
  options.metrics_session_ids = true;
  options.metrics_detail = detail;
  options.fp8_stats_interval = fp8_interval;
  options.kernel_timing_interval = kernel_interval;
  return options;
}

// A demo-architecture session (LayerNorm, Linear, RMSNorm, Linear) under `recipe`.
std::string CreateSession(client::Client& client, const std::string& recipe, uint64_t seed,
                          bool spec_health = false) {
  absl::StatusOr<v1::CreateSessionRequest> request =
      client::DemoSessionRequestFor(seed, 0.05f, recipe, 1e-2f);
  EXPECT_TRUE(request.ok()) << request.status();
  request->mutable_recipe()->set_fp8_health_stats(spec_health);
  absl::StatusOr<v1::CreateSessionResponse> created = client.CreateSession(*request);
  EXPECT_TRUE(created.ok()) << created.status();
  return created.ok() ? created->session_id() : "";
}

v1::ForwardBackwardRequest TrainingBatch(const std::string& id, uint64_t seed) {
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kFeatures, seed), {kRows, kFeatures});
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() = client::MakeFloatTensor(
      testing::PseudoRandomFloats(kRows * kFeatures, seed + 1000), {kRows, kFeatures});
  return request;
}

v1::ForwardBackwardResponse RunForwardBackward(client::Client& client, const std::string& id,
                                               uint64_t seed) {
  absl::StatusOr<v1::ForwardBackwardResponse> response =
      client.ForwardBackward(TrainingBatch(id, seed));
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? *response : v1::ForwardBackwardResponse();
}

v1::StepResponse RunStep(client::Client& client, const std::string& id) {
  absl::StatusOr<v1::StepResponse> response = client.Step(id, /*zero_grad=*/true);
  EXPECT_TRUE(response.ok()) << response.status();
  return response.ok() ? *response : v1::StepResponse();
}

v1::QuantizationState QuantState(client::Client& client, const std::string& id) {
  absl::StatusOr<v1::QuantizationState> state = client.GetQuantizationState(id);
  EXPECT_TRUE(state.ok()) << state.status();
  return state.ok() ? *state : v1::QuantizationState();
}

// The health gauges of every tensor equal the health stats of GetQuantizationState.
void ExpectHealthSeriesEqual(const std::vector<Sample>& samples, const std::string& id,
                             const v1::QuantizationState& state) {
  ASSERT_GT(state.tensors_size(), 0);
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    const Labels labels{{"session", id}, {"layer", t.layer()}, {"tensor", t.tensor()}};
    ASSERT_TRUE(t.has_health());
    ExpectFloatSeries(samples, "teserve_fp8_underflow_ratio", labels, t.health().underflow_ratio());
    ExpectFloatSeries(samples, "teserve_fp8_overflow_ratio", labels, t.health().overflow_ratio());
    ExpectFloatSeries(samples, "teserve_fp8_quantization_mse", labels, t.health().mse());
  }
}

// amax, window max, scale and scale_inv of every tensor equal GetQuantizationState; the
// health gauges equal its health stats when `health` (and are absent otherwise).
void ExpectFp8SeriesEqual(const std::vector<Sample>& samples, const std::string& id,
                          const v1::QuantizationState& state, bool health) {
  ASSERT_GT(state.tensors_size(), 0);
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    const Labels labels{{"session", id}, {"layer", t.layer()}, {"tensor", t.tensor()}};
    ExpectFloatSeries(samples, "teserve_fp8_amax", labels, t.amax());
    ExpectFloatSeries(samples, "teserve_fp8_amax_window_max", labels, WindowMax(t));
    ExpectFloatSeries(samples, "teserve_fp8_scale", labels, t.scale());
    ExpectFloatSeries(samples, "teserve_fp8_scale_inv", labels, t.scale_inv());
    if (!health) {
      EXPECT_TRUE(Find(samples, "teserve_fp8_underflow_ratio", labels).empty());
      EXPECT_TRUE(Find(samples, "teserve_fp8_quantization_mse", labels).empty());
    }
  }
  if (health) ExpectHealthSeriesEqual(samples, id, state);
}

// Every series is written at the end of the call: scraped after each ForwardBackward and
// each Step, they equal GetQuantizationState, GetSession and the RPC responses.
TEST(Metrics, SeriesEqualTheSessionAfterEveryCall) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 1, 1));
  ASSERT_NE(s.server, nullptr);
  const int port = s.server->metrics_port();
  const std::string id = CreateSession(*s.client, "delayed", 3);
  const Labels of_session{{"session", id}};

  std::vector<Sample> samples = Scrape(port);
  EXPECT_EQ(Value(samples, "teserve_sessions", {}), 1.0);
  EXPECT_EQ(Value(samples, "teserve_train_steps_total", of_session), 0.0);
  EXPECT_EQ(Value(samples, "teserve_steps_skipped_total", of_session), 0.0);
  EXPECT_TRUE(Find(samples, "teserve_loss", of_session).empty());  // no ForwardBackward yet

  constexpr int kSteps = 3;
  double received_fb = 0.0, sent_fb = 0.0, sent_step = 0.0;
  std::map<std::string, double> log2_sums;  // layer.tensor -> sum of log2(amax) observed
  for (int step = 1; step <= kSteps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const v1::ForwardBackwardRequest batch = TrainingBatch(id, step);
    received_fb += static_cast<double>(batch.ByteSizeLong());
    const v1::ForwardBackwardResponse fb = RunForwardBackward(*s.client, id, step);
    sent_fb += static_cast<double>(fb.ByteSizeLong());
    const v1::QuantizationState after_fb = QuantState(*s.client, id);
    for (const v1::QuantizedTensorState& t : after_fb.tensors()) {
      log2_sums[t.layer() + "." + t.tensor()] += std::log2(static_cast<double>(t.amax()));
    }
    samples = Scrape(port);
    EXPECT_EQ(Value(samples, "teserve_train_steps_total", of_session), step - 1);
    ExpectFloatSeries(samples, "teserve_loss", of_session, fb.loss());
    ExpectFp8SeriesEqual(samples, id, after_fb, /*health=*/true);

    const v1::StepResponse stepped = RunStep(*s.client, id);
    sent_step += static_cast<double>(stepped.ByteSizeLong());
    ASSERT_EQ(stepped.step(), step);
    samples = Scrape(port);
    EXPECT_EQ(Value(samples, "teserve_train_steps_total", of_session), step);
    EXPECT_EQ(Value(samples, "teserve_steps_skipped_total", of_session), 0.0);
    ExpectFloatSeries(samples, "teserve_grad_norm", of_session, stepped.grad_norm());
    // Delayed scaling computed the next scales at the ends of the regions: still equal.
    ExpectFp8SeriesEqual(samples, id, QuantState(*s.client, id), /*health=*/true);
  }
  absl::StatusOr<v1::SessionInfo> info = s.client->GetSession(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(Value(samples, "teserve_train_steps_total", of_session), info->step());

  // One log2(amax) observation per ForwardBackward (the Steps quantize nothing).
  for (const auto& [name, sum] : log2_sums) {
    SCOPED_TRACE(name);
    const size_t dot = name.rfind('.');
    const Labels labels{{"session", id}, {"layer", name.substr(0, dot)}, {"tensor", name.substr(dot + 1)}};
    EXPECT_EQ(Value(samples, "teserve_amax_log2_count", labels), kSteps);
    const std::optional<double> got = Value(samples, "teserve_amax_log2_sum", labels);
    ASSERT_TRUE(got.has_value());
    EXPECT_NEAR(*got, sum, 1e-9 * std::max(1.0, std::fabs(sum)));
    // Buckets are -24..24 by 2, cumulative, ending in +Inf.
    EXPECT_EQ(Find(samples, "teserve_amax_log2_bucket", labels).size(), 26u);
    EXPECT_EQ(Value(samples, "teserve_amax_log2_bucket",
                    {{"session", id}, {"layer", name.substr(0, dot)}, {"le", "+Inf"}, {"tensor", name.substr(dot + 1)}}),
              kSteps);
  }

  // RPC counts and serialized sizes.
  const Labels fb_method{{"method", "ForwardBackward"}};
  EXPECT_EQ(Value(samples, "teserve_rpc_requests_total", {{"method", "ForwardBackward"}, {"code", "OK"}}), kSteps);
  EXPECT_EQ(Value(samples, "teserve_rpc_duration_seconds_count", fb_method), kSteps);
  EXPECT_EQ(Value(samples, "teserve_rpc_received_bytes_total", fb_method), received_fb);
  EXPECT_EQ(Value(samples, "teserve_rpc_sent_bytes_total", fb_method), sent_fb);
  v1::StepRequest step_request;
  step_request.set_session_id(id);
  step_request.set_zero_grad(true);
  const Labels step_method{{"method", "Step"}};
  EXPECT_EQ(Value(samples, "teserve_rpc_received_bytes_total", step_method),
            kSteps * static_cast<double>(step_request.ByteSizeLong()));
  EXPECT_EQ(Value(samples, "teserve_rpc_sent_bytes_total", step_method), sent_step);
  // A failed call is received and counted under its code, but sends no message.
  v1::StepRequest unknown;
  unknown.set_session_id("0123456789abcdef");
  EXPECT_EQ(s.client->Step(unknown.session_id()).status().code(), absl::StatusCode::kNotFound);
  samples = Scrape(port);
  EXPECT_EQ(Value(samples, "teserve_rpc_requests_total", {{"method", "Step"}, {"code", "NOT_FOUND"}}), 1.0);
  EXPECT_EQ(Value(samples, "teserve_rpc_received_bytes_total", step_method),
            kSteps * static_cast<double>(step_request.ByteSizeLong()) + unknown.ByteSizeLong());
  EXPECT_EQ(Value(samples, "teserve_rpc_sent_bytes_total", step_method), sent_step);

  // Kernels were timed on the CPU (interval 1: every call).
  const std::optional<double> gemms =
      Value(samples, "teserve_kernel_duration_seconds_count", {{"op", "gemm"}, {"device", "cpu"}});
  ASSERT_TRUE(gemms.has_value());
  EXPECT_GT(*gemms, 0.0);
  EXPECT_GT(Value(samples, "teserve_kernel_duration_seconds_sum", {{"op", "gemm"}, {"device", "cpu"}}).value_or(0), 0.0);
  EXPECT_GT(Value(samples, "teserve_kernel_duration_seconds_count", {{"op", "layernorm_forward"}, {"device", "cpu"}})
                .value_or(0),
            0.0);
  EXPECT_GT(Value(samples, "teserve_kernel_duration_seconds_count", {{"op", "mse_forward"}, {"device", "cpu"}})
                .value_or(0),
            0.0);

  // Device memory: this process's resident set (the server runs in it) and the machine.
  FILE* statm = std::fopen("/proc/self/statm", "r");
  ASSERT_NE(statm, nullptr);
  long long pages = 0, resident = 0;
  ASSERT_EQ(std::fscanf(statm, "%lld %lld", &pages, &resident), 2);
  std::fclose(statm);
  const double rss = static_cast<double>(resident) * sysconf(_SC_PAGESIZE);
  const std::optional<double> used = Value(samples, "teserve_device_memory_bytes", {{"device", "cpu"}, {"kind", "used"}});
  const std::optional<double> total = Value(samples, "teserve_device_memory_bytes", {{"device", "cpu"}, {"kind", "total"}});
  ASSERT_TRUE(used.has_value() && total.has_value());
  EXPECT_GT(*used, 0.5 * rss);
  EXPECT_LT(*used, 2.0 * rss);
  EXPECT_EQ(*total, static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE));
}

// Forward and Backward with the loss computed by the client: the FP8 series follow each
// call; the loss stays unknown.
TEST(Metrics, ForwardAndBackwardUpdateTheTensorsTheyQuantize) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 1, 16));
  ASSERT_NE(s.server, nullptr);
  const int port = s.server->metrics_port();
  const std::string id = CreateSession(*s.client, "current", 4);

  v1::ForwardRequest forward;
  forward.set_session_id(id);
  *forward.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kFeatures, 5), {kRows, kFeatures});
  absl::StatusOr<v1::ForwardResponse> y = s.client->Forward(forward);
  ASSERT_TRUE(y.ok()) << y.status();
  std::vector<Sample> samples = Scrape(port);
  v1::QuantizationState state = QuantState(*s.client, id);
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    SCOPED_TRACE(t.layer() + "." + t.tensor());
    const Labels labels{{"session", id}, {"layer", t.layer()}, {"tensor", t.tensor()}};
    ExpectFloatSeries(samples, "teserve_fp8_amax", labels, t.amax());
    ExpectFloatSeries(samples, "teserve_fp8_scale", labels, t.scale());
    // Only the forward operands were quantized (and observed) so far.
    const bool forward_operand = t.tensor() != "grad_output";
    EXPECT_EQ(t.amax() > 0.0f, forward_operand);
    EXPECT_EQ(Value(samples, "teserve_amax_log2_count", labels), forward_operand ? 1.0 : 0.0);
  }

  v1::BackwardRequest backward;
  backward.set_session_id(id);
  backward.set_handle(y->handle());
  *backward.add_grad_outputs() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kFeatures, 6), {kRows, kFeatures});
  ASSERT_TRUE(s.client->Backward(backward).ok());
  samples = Scrape(port);
  state = QuantState(*s.client, id);
  ExpectFp8SeriesEqual(samples, id, state, /*health=*/true);
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    EXPECT_EQ(Value(samples, "teserve_amax_log2_count", {{"session", id}, {"layer", t.layer()}, {"tensor", t.tensor()}}),
              1.0);
  }
  EXPECT_TRUE(Find(samples, "teserve_loss", {{"session", id}}).empty());
  EXPECT_TRUE(Find(samples, "teserve_grad_norm", {{"session", id}}).empty());
}

// Non-finite gradients: the step is skipped and counted, the step counter stays.
TEST(Metrics, SkippedStepsAreCounted) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("session", 10, 16));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 7);
  RunForwardBackward(*s.client, id, 1);
  RunStep(*s.client, id);
  v1::ForwardBackwardRequest poisoned = TrainingBatch(id, 2);
  std::vector<float> x = testing::PseudoRandomFloats(kRows * kFeatures, 2);
  x[5] = std::numeric_limits<float>::infinity();
  *poisoned.mutable_inputs(0) = client::MakeFloatTensor(x, {kRows, kFeatures});
  ASSERT_TRUE(s.client->ForwardBackward(poisoned).ok());
  const v1::StepResponse skipped = RunStep(*s.client, id);
  ASSERT_TRUE(skipped.skipped());

  const std::vector<Sample> samples = Scrape(s.server->metrics_port());
  const Labels of_session{{"session", id}};
  EXPECT_EQ(Value(samples, "teserve_train_steps_total", of_session), 1.0);
  EXPECT_EQ(Value(samples, "teserve_steps_skipped_total", of_session), 1.0);
  const std::optional<double> norm = Value(samples, "teserve_grad_norm", of_session);
  ASSERT_TRUE(norm.has_value());
  EXPECT_FALSE(std::isfinite(*norm));
}

// Health is measured only in every Nth step (N, 2N, ... counting from 1): the other
// steps' quantizations compute nothing, so GetQuantizationState keeps the last sample.
TEST(Metrics, Fp8HealthIsMeasuredOnlyInSampledSteps) {
  constexpr int kInterval = 3;
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", kInterval, 16));
  ASSERT_NE(s.server, nullptr);
  const int port = s.server->metrics_port();
  const std::string id = CreateSession(*s.client, "mxfp8", 8);

  v1::QuantizationState sampled;
  for (int step = 1; step <= 2 * kInterval; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    RunForwardBackward(*s.client, id, 100 + step);
    const v1::QuantizationState state = QuantState(*s.client, id);
    const std::vector<Sample> samples = Scrape(port);
    if (step < kInterval) {
      for (const v1::QuantizedTensorState& t : state.tensors()) EXPECT_FALSE(t.has_health());
      EXPECT_TRUE(Find(samples, "teserve_fp8_underflow_ratio").empty());
      EXPECT_TRUE(Find(samples, "teserve_fp8_overflow_ratio").empty());
      EXPECT_TRUE(Find(samples, "teserve_fp8_quantization_mse").empty());
    } else if (step % kInterval == 0) {
      ExpectFp8SeriesEqual(samples, id, state, /*health=*/true);
      if (step > kInterval) {  // a fresh measurement on a new batch
        for (int i = 0; i < state.tensors_size(); ++i) {
          EXPECT_NE(state.tensors(i).health().mse(), sampled.tensors(i).health().mse());
        }
      }
      sampled = state;
    } else {
      // Not measured again: the previous sample, in the session and in the gauges.
      for (int i = 0; i < state.tensors_size(); ++i) {
        ASSERT_TRUE(state.tensors(i).has_health());
        EXPECT_EQ(state.tensors(i).health().mse(), sampled.tensors(i).health().mse());
        EXPECT_EQ(state.tensors(i).health().underflow_ratio(), sampled.tensors(i).health().underflow_ratio());
      }
      ExpectFp8SeriesEqual(samples, id, state, /*health=*/true);
    }
    RunStep(*s.client, id);
  }
}

TEST(Metrics, Fp8StatsIntervalZeroNeverMeasures) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 0, 16));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 9);
  for (int step = 1; step <= 2; ++step) {
    RunForwardBackward(*s.client, id, step);
    RunStep(*s.client, id);
  }
  const v1::QuantizationState state = QuantState(*s.client, id);
  for (const v1::QuantizedTensorState& t : state.tensors()) EXPECT_FALSE(t.has_health());
  const std::vector<Sample> samples = Scrape(s.server->metrics_port());
  EXPECT_FALSE(Find(samples, "teserve_fp8_amax").empty());
  EXPECT_TRUE(Find(samples, "teserve_fp8_underflow_ratio").empty());
}

// RecipeSpec.fp8_health_stats still measures at every quantization; the gauges follow
// the sampled steps only.
TEST(Metrics, SpecHealthStatsKeepMeasuringEveryQuantization) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 2, 16));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "block", 10, /*spec_health=*/true);
  RunForwardBackward(*s.client, id, 1);  // step 1: measured, not exported
  v1::QuantizationState first = QuantState(*s.client, id);
  for (const v1::QuantizedTensorState& t : first.tensors()) EXPECT_TRUE(t.has_health());
  EXPECT_TRUE(Find(Scrape(s.server->metrics_port()), "teserve_fp8_quantization_mse").empty());
  RunStep(*s.client, id);
  RunForwardBackward(*s.client, id, 2);  // step 2: sampled
  const v1::QuantizationState second = QuantState(*s.client, id);
  ExpectFp8SeriesEqual(Scrape(s.server->metrics_port()), id, second, /*health=*/true);
  RunStep(*s.client, id);
  RunForwardBackward(*s.client, id, 3);  // step 3: measured again by the spec's switch
  const v1::QuantizationState third = QuantState(*s.client, id);
  EXPECT_NE(third.tensors(0).health().mse(), second.tensors(0).health().mse());
  const std::vector<Sample> samples = Scrape(s.server->metrics_port());
  ExpectHealthSeriesEqual(samples, id, second);
  ExpectFloatSeries(samples, "teserve_fp8_amax",
                    {{"session", id}, {"layer", third.tensors(0).layer()}, {"tensor", third.tensors(0).tensor()}},
                    third.tensors(0).amax());
}

// Without an endpoint nothing could read the samples, so none are taken.
TEST(Metrics, NoEndpointTakesNoHealthSamples) {
  server::ServerOptions options = MetricsOptions("tensor", 1, 1);
  options.metrics_port = -1;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 11);
  RunForwardBackward(*s.client, id, 1);
  const v1::QuantizationState state = QuantState(*s.client, id);
  for (const v1::QuantizedTensorState& t : state.tensors()) EXPECT_FALSE(t.has_health());
}

// Every --kernel_timing_interval-th call of each op is timed, the first included.
TEST(Metrics, KernelTimingSamplesEveryNthCallPerOp) {
  constexpr int kInterval = 5;
  std::map<std::string, double> counts[2];
  for (int run = 0; run < 2; ++run) {
    testing::LoopbackServer s =
        testing::StartLoopbackServer(MetricsOptions("session", 10, run == 0 ? 1 : kInterval));
    ASSERT_NE(s.server, nullptr);
    const std::string id = CreateSession(*s.client, "nvfp4", 12);
    for (int step = 1; step <= 3; ++step) {
      RunForwardBackward(*s.client, id, step);
      RunStep(*s.client, id);
    }
    for (const Sample& sample : Find(Scrape(s.server->metrics_port()), "teserve_kernel_duration_seconds_count")) {
      EXPECT_EQ(sample.labels.at("device"), "cpu");
      counts[run][sample.labels.at("op")] = sample.value;
    }
  }
  ASSERT_GE(counts[0].size(), 5u);  // gemm, quantize/dequantize nvfp4, norms, mse, ...
  for (const auto& [op, every_call] : counts[0]) {
    SCOPED_TRACE(op);
    EXPECT_EQ(counts[1][op], std::ceil(every_call / kInterval));
  }
}

TEST(Metrics, KernelTimingIntervalZeroTimesNothing) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 10, 0));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 13);
  RunForwardBackward(*s.client, id, 1);
  EXPECT_TRUE(Find(Scrape(s.server->metrics_port()), "teserve_kernel_duration_seconds_count").empty());
}

// --metrics_detail: which series exist.
struct DetailCase {
  std::string detail;
  bool tensor_series;
  bool layer_series;
  bool session_series;  // steps, loss, kernel timing, device memory
};

class MetricsDetailLevel : public ::testing::TestWithParam<DetailCase> {};

TEST_P(MetricsDetailLevel, ExportsItsSeriesOnly) {
  const DetailCase& c = GetParam();
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions(c.detail, 1, 1));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 14);
  const v1::ForwardBackwardResponse fb = RunForwardBackward(*s.client, id, 1);
  const v1::QuantizationState state = QuantState(*s.client, id);
  const std::vector<Sample> samples = Scrape(s.server->metrics_port());

  // Always: RPCs and the session count.
  EXPECT_EQ(Value(samples, "teserve_rpc_requests_total", {{"method", "ForwardBackward"}, {"code", "OK"}}), 1.0);
  EXPECT_EQ(Value(samples, "teserve_sessions", {}), 1.0);

  const Labels of_session{{"session", id}};
  EXPECT_EQ(!Find(samples, "teserve_train_steps_total", of_session).empty(), c.session_series);
  EXPECT_EQ(!Find(samples, "teserve_loss", of_session).empty(), c.session_series);
  EXPECT_EQ(!Find(samples, "teserve_kernel_duration_seconds_count").empty(), c.session_series);
  EXPECT_EQ(!Find(samples, "teserve_device_memory_bytes").empty(), c.session_series);
  if (c.session_series) ExpectFloatSeries(samples, "teserve_loss", of_session, fb.loss());

  const bool fp8 = c.tensor_series || c.layer_series;
  for (const char* name : {"teserve_fp8_amax", "teserve_fp8_amax_window_max", "teserve_fp8_scale",
                           "teserve_fp8_scale_inv", "teserve_amax_log2_count", "teserve_fp8_underflow_ratio",
                           "teserve_fp8_overflow_ratio", "teserve_fp8_quantization_mse"}) {
    SCOPED_TRACE(name);
    const std::vector<Sample> found = Find(samples, name, of_session);
    EXPECT_EQ(!found.empty(), fp8);
    for (const Sample& sample : found) EXPECT_EQ(sample.labels.at("tensor") == "all", c.layer_series);
  }
  if (c.tensor_series) ExpectFp8SeriesEqual(samples, id, state, /*health=*/true);
  if (c.layer_series) {
    // The max over the layer's tensors.
    std::map<std::string, std::vector<const v1::QuantizedTensorState*>> by_layer;
    for (const v1::QuantizedTensorState& t : state.tensors()) by_layer[t.layer()].push_back(&t);
    ASSERT_EQ(Find(samples, "teserve_fp8_amax", of_session).size(), by_layer.size());
    for (const auto& [layer, tensors] : by_layer) {
      SCOPED_TRACE(layer);
      float amax = 0, window = 0, scale = 0, scale_inv = 0, mse = 0, underflow = 0;
      for (const v1::QuantizedTensorState* t : tensors) {
        amax = std::max(amax, t->amax());
        window = std::max(window, WindowMax(*t));
        scale = std::max(scale, t->scale());
        scale_inv = std::max(scale_inv, t->scale_inv());
        mse = std::max(mse, t->health().mse());
        underflow = std::max(underflow, t->health().underflow_ratio());
      }
      const Labels labels{{"session", id}, {"layer", layer}, {"tensor", "all"}};
      ExpectFloatSeries(samples, "teserve_fp8_amax", labels, amax);
      ExpectFloatSeries(samples, "teserve_fp8_amax_window_max", labels, window);
      ExpectFloatSeries(samples, "teserve_fp8_scale", labels, scale);
      ExpectFloatSeries(samples, "teserve_fp8_scale_inv", labels, scale_inv);
      ExpectFloatSeries(samples, "teserve_fp8_quantization_mse", labels, mse);
      ExpectFloatSeries(samples, "teserve_fp8_underflow_ratio", labels, underflow);
      EXPECT_EQ(Value(samples, "teserve_amax_log2_count", labels), 1.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Levels, MetricsDetailLevel,
                         ::testing::Values(DetailCase{"tensor", true, false, true},
                                           DetailCase{"layer", false, true, true},
                                           DetailCase{"session", false, false, true},
                                           DetailCase{"off", false, false, false}),
                         [](const ::testing::TestParamInfo<DetailCase>& info) {
                           std::string name = info.param.detail;
                           name[0] = static_cast<char>(std::toupper(name[0]));
                           return name;
                         });

TEST(Metrics, DeleteSessionRemovesEverySeriesOfIt) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 1, 16));
  ASSERT_NE(s.server, nullptr);
  const int port = s.server->metrics_port();
  const std::string gone = CreateSession(*s.client, "delayed", 15);
  const std::string kept = CreateSession(*s.client, "current", 16);
  for (const std::string& id : {gone, kept}) {
    RunForwardBackward(*s.client, id, 1);
    RunStep(*s.client, id);
  }
  std::vector<Sample> samples = Scrape(port);
  ASSERT_TRUE(AnySeriesOfSession(samples, gone));
  // Every per-session family had a series for it.
  std::set<std::string> names;
  for (const Sample& sample : samples) {
    if (sample.labels.count("session") && sample.labels.at("session") == gone) names.insert(sample.name);
  }
  EXPECT_THAT(names, ::testing::IsSupersetOf({"teserve_train_steps_total", "teserve_steps_skipped_total",
                                              "teserve_loss", "teserve_grad_norm", "teserve_fp8_amax",
                                              "teserve_fp8_amax_window_max", "teserve_fp8_scale",
                                              "teserve_fp8_scale_inv", "teserve_amax_log2_count",
                                              "teserve_fp8_underflow_ratio", "teserve_fp8_overflow_ratio",
                                              "teserve_fp8_quantization_mse"}));

  ASSERT_TRUE(s.client->DeleteSession(gone).ok());
  samples = Scrape(port);
  EXPECT_FALSE(AnySeriesOfSession(samples, gone));
  EXPECT_TRUE(AnySeriesOfSession(samples, kept));
  EXPECT_EQ(Value(samples, "teserve_sessions", {}), 1.0);
  // Later calls naming the deleted session fail and bring nothing back.
  EXPECT_FALSE(s.client->ForwardBackward(TrainingBatch(gone, 2)).ok());
  EXPECT_FALSE(AnySeriesOfSession(Scrape(port), gone));
}

TEST(Metrics, ShutdownRemovesTheSessionsSeries) {
  testing::LoopbackServer s = testing::StartLoopbackServer(MetricsOptions("tensor", 1, 16));
  ASSERT_NE(s.server, nullptr);
  const std::string id = CreateSession(*s.client, "delayed", 17);
  RunForwardBackward(*s.client, id, 1);
  ASSERT_TRUE(AnySeriesOfSession(Scrape(s.server->metrics_port()), id));
  s.server->Shutdown(absl::Seconds(1));
  s.server->Wait();
  // The endpoint lives until the server object is destroyed.
  const std::vector<Sample> samples = Scrape(s.server->metrics_port());
  EXPECT_FALSE(AnySeriesOfSession(samples, id));
  EXPECT_EQ(Value(samples, "teserve_sessions", {}), 0.0);
}

TEST(Metrics, BadFlagsAreRejectedNamingTheFlag) {
  struct Bad {
    server::ServerOptions options;
    std::string message;
  };
  std::vector<Bad> cases;
  cases.push_back({MetricsOptions("verbose", 10, 16),
                   "--metrics_detail: expected tensor, layer, session or off, got 'verbose'"});
  cases.push_back({MetricsOptions("tensor", -1, 16), "--fp8_stats_interval: expected 0 (off) or a step count >= 1, got -1"});
  cases.push_back({MetricsOptions("tensor", 10, -2), "--kernel_timing_interval: expected 0 (off) or a call count >= 1, got -2"});
  for (const Bad& bad : cases) {
    auto started = server::TeserveServer::Start(bad.options);
    ASSERT_FALSE(started.ok());
    EXPECT_EQ(started.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(started.status().message()), HasSubstr(bad.message));
  }
}

}  // namespace
}  // namespace teserve
