// deploy/ against a real Prometheus. The real teserve server (metrics on a free loopback
// port) trains the demo (client::RunDemo, FP8 delayed scaling, health sampled every
// kFp8StatsInterval steps) while /usr/bin/prometheus scrapes it every second and
// evaluates deploy/prometheus/teserve_rules.yml. The demo is held between two steps
// (StepGate) so that the session is alive and idle while the test compares what
// Prometheus stored with GetQuantizationState and runs every query of the Grafana
// dashboard. promtool checks the rules, their unit tests and the scrape config.
//
// The Debian/Ubuntu package `prometheus` provides both binaries (tools/install_deps.sh);
// without it every test here fails saying so.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <streambuf>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/demo.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/prometheus_server.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::google::protobuf::Struct;
using ::google::protobuf::Value;
using ::teserve::testing::CheckExecutable;
using ::teserve::testing::CommandResult;
using ::teserve::testing::kPrometheusBinary;
using ::teserve::testing::kPromtoolBinary;
using ::teserve::testing::PrometheusServer;
using ::teserve::testing::RunCommand;
using ::teserve::testing::Sample;

// The demo is held while the server is in step kHoldStep, after that step's Forward:
// kHoldStep - 1 steps are complete. kHoldStep is a health-sampling step, so the forward
// tensors' health was measured in the pass the test looks at.
constexpr int kFp8StatsInterval = 10;
constexpr int kHoldStep = 2 * kFp8StatsInterval;
constexpr int kStepsRun = kHoldStep - 1;
// The tensor the scale comparison names (the demo's first Linear).
constexpr char kLayer[] = "fc1";
constexpr char kTensor[] = "weight";
constexpr char kJob[] = "teserve";

std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir ? srcdir : ".", "/", workspace ? workspace : "teserve", "/", path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string TempDir() {
  const char* dir = std::getenv("TEST_TMPDIR");
  return dir != nullptr ? dir : "/tmp";
}

std::string Labels(const std::map<std::string, std::string>& labels) {
  std::vector<std::string> parts;
  for (const auto& [name, value] : labels) parts.push_back(absl::StrCat(name, "=\"", value, "\""));
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

// DemoOptions::log sink that holds the demo at its "step N loss X" line for N = hold
// step. RunDemo writes that line after step N's Forward and before its Backward, so
// while held the server has finished N - 1 steps plus one Forward and no RPC of the
// demo is in flight. The hold ends at Release() (or after a safety timeout).
class StepGate : public std::streambuf {
 public:
  explicit StepGate(int hold_step) : hold_step_(hold_step) {}

  // True once the demo is held; false after `timeout`.
  bool WaitHeld(absl::Duration timeout) { return held_.WaitForNotificationWithTimeout(timeout); }
  absl::Time held_at() const { return held_at_; }
  void Release() {
    if (!released_.HasBeenNotified()) released_.Notify();
  }

 protected:
  int overflow(int c) override {
    if (c == traits_type::eof()) return traits_type::not_eof(c);
    if (c != '\n') {
      line_ += static_cast<char>(c);
      return c;
    }
    int step = 0;
    if (std::sscanf(line_.c_str(), "step %d", &step) == 1 && step == hold_step_) {
      held_at_ = absl::Now();
      held_.Notify();
      released_.WaitForNotificationWithTimeout(absl::Minutes(2));
    }
    line_.clear();
    return c;
  }

 private:
  const int hold_step_;
  std::string line_;
  absl::Time held_at_;
  absl::Notification held_;
  absl::Notification released_;
};

// The Grafana dashboard's PromQL targets and variable queries.
struct DashboardQuery {
  std::string panel;
  std::string expr;
};
struct Dashboard {
  std::vector<DashboardQuery> targets;
  std::map<std::string, std::string> variables;  // name -> query (label_values(...))
};

void CollectTargets(const Value& panels, Dashboard* out) {
  for (const Value& panel : panels.list_value().values()) {
    const auto& fields = panel.struct_value().fields();
    const auto title = fields.find("title");
    const auto targets = fields.find("targets");
    if (targets != fields.end()) {
      for (const Value& target : targets->second.list_value().values()) {
        const auto expr = target.struct_value().fields().find("expr");
        if (expr != target.struct_value().fields().end()) {
          out->targets.push_back(
              {title == fields.end() ? "" : title->second.string_value(), expr->second.string_value()});
        }
      }
    }
    const auto nested = fields.find("panels");  // collapsed rows hold their panels
    if (nested != fields.end()) CollectTargets(nested->second, out);
  }
}

absl::StatusOr<Dashboard> LoadDashboard() {
  const std::string path = Runfile("deploy/grafana/teserve_dashboard.json");
  const std::string text = ReadFile(path);
  if (text.empty()) return absl::NotFoundError(absl::StrCat(path, ": missing or empty"));
  Struct json;
  const auto parsed = google::protobuf::util::JsonStringToMessage(text, &json);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not JSON: ", parsed.ToString()));
  }
  Dashboard dashboard;
  const auto panels = json.fields().find("panels");
  if (panels != json.fields().end()) CollectTargets(panels->second, &dashboard);
  const auto templating = json.fields().find("templating");
  if (templating != json.fields().end()) {
    const auto list = templating->second.struct_value().fields().find("list");
    if (list != templating->second.struct_value().fields().end()) {
      for (const Value& variable : list->second.list_value().values()) {
        const auto& fields = variable.struct_value().fields();
        const auto name = fields.find("name");
        const auto type = fields.find("type");
        const auto definition = fields.find("definition");
        if (name != fields.end() && type != fields.end() &&
            type->second.string_value() == "query" && definition != fields.end()) {
          dashboard.variables[name->second.string_value()] = definition->second.string_value();
        }
      }
    }
  }
  return dashboard;
}

// Grafana's substitutions for one selection: the held session, kLayer, every tensor,
// and intervals that span the whole (short) run.
std::string SubstituteVariables(const std::string& expr, const std::string& session) {
  return absl::StrReplaceAll(expr, {{"$__rate_interval", "1m"},
                                    {"$__interval", "5s"},
                                    {"$__range", "1m"},
                                    {"$session", session},
                                    {"$layer", kLayer},
                                    {"$tensor", ".*"}});
}

bool IsFp8Query(const std::string& expr) {
  return absl::StrContains(expr, "teserve_fp8_") || absl::StrContains(expr, "teserve_amax_log2");
}

// ---------------------------------------------------------------------------------------
// The shared run: server, Prometheus and the held demo, started once for the suite.

struct HeldRun {
  testing::LoopbackServer server;
  std::unique_ptr<client::Client> client;  // the test's own client, not the demo's
  std::unique_ptr<PrometheusServer> prometheus;
  std::unique_ptr<StepGate> gate;
  std::unique_ptr<std::ostream> log;
  std::thread demo;
  absl::StatusOr<client::DemoResult> demo_result = absl::UnknownError("not run");
  std::string student_id;
  std::string teacher_id;
  v1::QuantizationState state;  // GetQuantizationState of the student while held
};

class PrometheusTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    run_ = new HeldRun();
    setup_status_ = new absl::Status(Start(*run_));
  }

  static void TearDownTestSuite() {
    if (run_->gate != nullptr) run_->gate->Release();
    if (run_->demo.joinable()) {
      run_->demo.join();
      // Released, the demo finishes its last step and deletes its sessions.
      EXPECT_TRUE(run_->demo_result.ok()) << run_->demo_result.status();
    }
    delete run_;
    run_ = nullptr;
    delete setup_status_;
    setup_status_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(setup_status_->ok()) << *setup_status_;
  }

  static absl::Status Start(HeldRun& run) {
    if (absl::Status s = CheckExecutable(kPrometheusBinary); !s.ok()) return s;
    server::ServerOptions options = testing::LoopbackOptions();
    options.metrics_port = 0;
    options.metrics_session_ids = true;  // the dashboard's session variable is matched by id
    options.fp8_stats_interval = kFp8StatsInterval;
    run.server = testing::StartLoopbackServer(options);
    if (run.server.server == nullptr) return absl::InternalError("teserve did not start");
    const int metrics_port = run.server.server->metrics_port();
    run.client = std::make_unique<client::Client>(run.server.address);

    const std::string dir = absl::StrCat(TempDir(), "/prometheus");
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    const std::string config = absl::StrCat(
        "global:\n"
        "  scrape_interval: 1s\n"
        "  evaluation_interval: 1s\n"
        "rule_files:\n"
        "  - ", Runfile("deploy/prometheus/teserve_rules.yml"), "\n"
        "scrape_configs:\n"
        "  - job_name: ", kJob, "\n"
        "    static_configs:\n"
        "      - targets: ['127.0.0.1:", metrics_port, "']\n");
    absl::StatusOr<std::unique_ptr<PrometheusServer>> prometheus =
        PrometheusServer::Start(dir, config);
    if (!prometheus.ok()) return prometheus.status();
    run.prometheus = *std::move(prometheus);

    // A failed RPC, so the dashboard's failed-RPC rate has a series to show.
    if (run.client->GetSession("no-such-session").ok()) {
      return absl::InternalError("GetSession of an unknown id succeeded");
    }

    run.gate = std::make_unique<StepGate>(kHoldStep);
    run.log = std::make_unique<std::ostream>(run.gate.get());
    run.demo = std::thread([&run] {
      client::Client demo_client(run.server.address);
      client::DemoOptions demo;
      demo.steps = kHoldStep;
      demo.log = run.log.get();
      run.demo_result = client::RunDemo(demo_client, demo);
    });
    if (!run.gate->WaitHeld(absl::Seconds(60))) {
      return absl::DeadlineExceededError(
          absl::StrCat("the demo did not reach step ", kHoldStep, " within 60 s"));
    }

    absl::StatusOr<v1::ListSessionsResponse> sessions = run.client->ListSessions();
    if (!sessions.ok()) return sessions.status();
    for (const v1::SessionInfo& info : sessions->sessions()) {
      (info.recipe_name() == "none" ? run.teacher_id : run.student_id) = info.session_id();
    }
    if (run.student_id.empty() || run.teacher_id.empty()) {
      return absl::InternalError(absl::StrCat("expected the demo's teacher and student, got ",
                                              sessions->DebugString()));
    }
    absl::StatusOr<v1::QuantizationState> state =
        run.client->GetQuantizationState(run.student_id);
    if (!state.ok()) return state.status();
    run.state = *std::move(state);

    // Two scrapes that started after the hold: the latest values, and two samples of
    // every series of the held state for the rate() queries.
    return run.prometheus->WaitForScrapeAfter(kJob, run.gate->held_at(), 1, absl::Seconds(20));
  }

  // The single sample of `promql`, failing the test otherwise.
  static absl::StatusOr<double> OneValue(const std::string& promql) {
    absl::StatusOr<std::vector<Sample>> samples = run_->prometheus->QueryVector(promql);
    if (!samples.ok()) return samples.status();
    if (samples->size() != 1) {
      return absl::NotFoundError(
          absl::StrCat(promql, ": expected 1 series, got ", samples->size()));
    }
    return (*samples)[0].value;
  }

  static std::string TensorSelector(const std::string& metric, const v1::QuantizedTensorState& t) {
    return absl::StrCat(metric, Labels({{"session", run_->student_id},
                                        {"layer", t.layer()},
                                        {"tensor", t.tensor()}}));
  }

  static HeldRun* run_;
  static absl::Status* setup_status_;
};

HeldRun* PrometheusTest::run_ = nullptr;
absl::Status* PrometheusTest::setup_status_ = nullptr;

TEST_F(PrometheusTest, ScrapesTeserve) {
  absl::StatusOr<double> up = OneValue(absl::StrCat("up{job=\"", kJob, "\"}"));
  ASSERT_TRUE(up.ok()) << up.status();
  EXPECT_EQ(*up, 1.0);
}

TEST_F(PrometheusTest, Fp8ScaleOfNamedTensorEqualsQuantizationState) {
  const v1::QuantizedTensorState* named = nullptr;
  for (const v1::QuantizedTensorState& t : run_->state.tensors()) {
    if (t.layer() == kLayer && t.tensor() == kTensor) named = &t;
  }
  ASSERT_NE(named, nullptr) << "no " << kLayer << "/" << kTensor << " in "
                            << run_->state.DebugString();
  ASSERT_GT(named->scale(), 0.0f);
  const std::string query = TensorSelector("teserve_fp8_scale", *named);
  absl::StatusOr<double> scale = OneValue(query);
  ASSERT_TRUE(scale.ok()) << scale.status();
  // The gauge holds the FP32 scale widened to double; the exposition format and the
  // API carry it exactly.
  EXPECT_EQ(static_cast<float>(*scale), named->scale()) << query;
}

TEST_F(PrometheusTest, EveryTensorsAmaxAndScaleEqualQuantizationState) {
  ASSERT_GT(run_->state.tensors_size(), 0);
  for (const v1::QuantizedTensorState& t : run_->state.tensors()) {
    SCOPED_TRACE(absl::StrCat(t.layer(), "/", t.tensor()));
    absl::StatusOr<double> amax = OneValue(TensorSelector("teserve_fp8_amax", t));
    absl::StatusOr<double> scale = OneValue(TensorSelector("teserve_fp8_scale", t));
    absl::StatusOr<double> scale_inv = OneValue(TensorSelector("teserve_fp8_scale_inv", t));
    absl::StatusOr<double> window = OneValue(TensorSelector("teserve_fp8_amax_window_max", t));
    ASSERT_TRUE(amax.ok()) << amax.status();
    ASSERT_TRUE(scale.ok()) << scale.status();
    ASSERT_TRUE(scale_inv.ok()) << scale_inv.status();
    ASSERT_TRUE(window.ok()) << window.status();
    EXPECT_EQ(static_cast<float>(*amax), t.amax());
    EXPECT_EQ(static_cast<float>(*scale), t.scale());
    EXPECT_EQ(static_cast<float>(*scale_inv), t.scale_inv());
    float history_max = 0.0f;
    for (float a : t.amax_history()) history_max = std::max(history_max, a);
    EXPECT_EQ(static_cast<float>(*window), history_max);
  }
}

TEST_F(PrometheusTest, Fp8HealthGaugesEqualTheSampledHealth) {
  int compared = 0;
  for (const v1::QuantizedTensorState& t : run_->state.tensors()) {
    if (!t.has_health()) continue;
    SCOPED_TRACE(absl::StrCat(t.layer(), "/", t.tensor()));
    absl::StatusOr<double> underflow = OneValue(TensorSelector("teserve_fp8_underflow_ratio", t));
    absl::StatusOr<double> overflow = OneValue(TensorSelector("teserve_fp8_overflow_ratio", t));
    absl::StatusOr<double> mse = OneValue(TensorSelector("teserve_fp8_quantization_mse", t));
    ASSERT_TRUE(underflow.ok()) << underflow.status();
    ASSERT_TRUE(overflow.ok()) << overflow.status();
    ASSERT_TRUE(mse.ok()) << mse.status();
    EXPECT_EQ(static_cast<float>(*underflow), t.health().underflow_ratio());
    EXPECT_EQ(static_cast<float>(*overflow), t.health().overflow_ratio());
    EXPECT_EQ(static_cast<float>(*mse), t.health().mse());
    ++compared;
  }
  // Step kHoldStep samples health, and its Forward quantized fc1/fc2 input and weight.
  EXPECT_GE(compared, 4) << run_->state.DebugString();
}

TEST_F(PrometheusTest, TrainStepsTotalEqualsStepsRun) {
  absl::StatusOr<double> steps = OneValue(
      absl::StrCat("teserve_train_steps_total", Labels({{"session", run_->student_id}})));
  ASSERT_TRUE(steps.ok()) << steps.status();
  EXPECT_EQ(*steps, kStepsRun);
  absl::StatusOr<double> skipped = OneValue(
      absl::StrCat("teserve_steps_skipped_total", Labels({{"session", run_->student_id}})));
  ASSERT_TRUE(skipped.ok()) << skipped.status();
  EXPECT_EQ(*skipped, 0.0);
  EXPECT_EQ(run_->state.step(), kStepsRun);
}

TEST_F(PrometheusTest, KernelDurationHistogramsHaveCounts) {
  absl::StatusOr<std::vector<Sample>> counts =
      run_->prometheus->QueryVector("teserve_kernel_duration_seconds_count > 0");
  ASSERT_TRUE(counts.ok()) << counts.status();
  ASSERT_FALSE(counts->empty()) << "no kernel duration histogram has a count";
  std::set<std::string> ops;
  for (const Sample& s : *counts) {
    EXPECT_EQ(s.labels.count("device"), 1u) << Labels(s.labels);
    ops.insert(s.labels.count("op") ? s.labels.at("op") : "");
  }
  EXPECT_EQ(ops.count(""), 0u);
  // The demo's GEMMs run in every pass, so some op was timed many times; each histogram's
  // buckets end in +Inf holding its count.
  absl::StatusOr<std::vector<Sample>> inf =
      run_->prometheus->QueryVector("teserve_kernel_duration_seconds_bucket{le=\"+Inf\"}"
                                    " == on (op, device) teserve_kernel_duration_seconds_count");
  ASSERT_TRUE(inf.ok()) << inf.status();
  EXPECT_EQ(inf->size(), counts->size());
}

TEST_F(PrometheusTest, AlertRulesLoadAndEvaluateWithoutError) {
  const std::set<std::string> required = {"FP8OverflowHigh", "FP8UnderflowHigh",
                                          "TrainingStepsSkipped", "FP8AmaxStuckAtZero",
                                          "FP8ScalePinnedAtMax"};
  // Rules report health "unknown" until their first evaluation (every second here).
  const absl::Time deadline = absl::Now() + absl::Seconds(15);
  std::map<std::string, std::string> health;  // alert -> health (+ lastError)
  while (true) {
    absl::StatusOr<Struct> rules = run_->prometheus->ApiGet("/api/v1/rules");
    ASSERT_TRUE(rules.ok()) << rules.status();
    health.clear();
    const Value& groups =
        rules->fields().at("data").struct_value().fields().at("groups");
    for (const Value& group : groups.list_value().values()) {
      for (const Value& rule : group.struct_value().fields().at("rules").list_value().values()) {
        const auto& fields = rule.struct_value().fields();
        std::string state = fields.at("health").string_value();
        if (fields.count("lastError") && !fields.at("lastError").string_value().empty()) {
          absl::StrAppend(&state, ": ", fields.at("lastError").string_value());
        }
        health[fields.at("name").string_value()] = state;
      }
    }
    bool evaluated = !health.empty();
    for (const auto& [name, state] : health) evaluated &= state != "unknown";
    if (evaluated || absl::Now() > deadline) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  for (const std::string& name : required) {
    EXPECT_EQ(health.count(name), 1u) << "alert " << name << " not loaded";
  }
  for (const auto& [name, state] : health) EXPECT_EQ(state, "ok") << name;
}

TEST_F(PrometheusTest, DashboardQueriesEvaluateAndFp8PanelsHaveData) {
  absl::StatusOr<Dashboard> dashboard = LoadDashboard();
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  ASSERT_GE(dashboard->targets.size(), 10u);
  int fp8_queries = 0;
  for (const DashboardQuery& target : dashboard->targets) {
    const std::string expr = SubstituteVariables(target.expr, run_->student_id);
    SCOPED_TRACE(absl::StrCat("panel '", target.panel, "': ", expr));
    ASSERT_FALSE(absl::StrContains(expr, "$")) << "unknown dashboard variable";
    absl::StatusOr<Struct> data = run_->prometheus->QueryData(expr);
    ASSERT_TRUE(data.ok()) << data.status();
    const int series = data->fields().at("result").list_value().values_size();
    if (IsFp8Query(target.expr)) {
      ++fp8_queries;
      EXPECT_GT(series, 0) << "FP8 panel without data";
    } else if (!absl::StrContains(target.expr, "teserve_loss")) {
      // Everything else has data on this run too, except the loss: the demo computes it
      // on the client (plain Forward / Backward), so the server never learns it.
      EXPECT_GT(series, 0) << "panel without data";
    }
  }
  EXPECT_GE(fp8_queries, 7);  // amax, window max, scale, log2(amax), under/overflow, MSE
}

TEST_F(PrometheusTest, DashboardVariablesListTheHeldSession) {
  absl::StatusOr<Dashboard> dashboard = LoadDashboard();
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  ASSERT_EQ(dashboard->variables.count("session"), 1u);
  ASSERT_EQ(dashboard->variables.count("layer"), 1u);
  const std::map<std::string, std::string> expected = {{"session", run_->student_id},
                                                       {"layer", kLayer}};
  // label_values(<series selector>, <label>) is Grafana's; the selector is Prometheus's.
  const std::regex label_values(R"(^\s*label_values\((.*),\s*(\w+)\s*\)\s*$)");
  for (const auto& [name, query] : dashboard->variables) {
    SCOPED_TRACE(absl::StrCat("variable ", name, ": ", query));
    std::smatch match;
    ASSERT_TRUE(std::regex_match(query, match, label_values));
    const std::string selector = SubstituteVariables(match[1].str(), run_->student_id);
    const std::string label = match[2].str();
    absl::StatusOr<Struct> series = run_->prometheus->ApiGet(
        absl::StrCat("/api/v1/series?match[]=", testing::UrlEncode(selector)));
    ASSERT_TRUE(series.ok()) << series.status();
    std::set<std::string> values;
    for (const Value& s : series->fields().at("data").list_value().values()) {
      const auto& labels = s.struct_value().fields();
      if (labels.count(label)) values.insert(labels.at(label).string_value());
    }
    EXPECT_FALSE(values.empty()) << "no series with label " << label;
    if (expected.count(name)) {
      EXPECT_EQ(values.count(expected.at(name)), 1u)
          << "missing " << expected.at(name) << " among " << absl::StrJoin(values, ", ");
    }
  }
}

// Its own short demo run on the same server (held at its last step, then released): the
// series of both its sessions are on /metrics while they live, gone from /metrics once
// RunDemo has deleted them, and Prometheus's next scrape marks them stale.
TEST_F(PrometheusTest, DeletingSessionsRemovesTheirSeries) {
  constexpr int kSteps = 2;
  StepGate gate(kSteps);
  std::ostream log(&gate);
  absl::StatusOr<client::DemoResult> result = absl::UnknownError("not run");
  std::thread demo([&] {
    client::Client demo_client(run_->server.address);
    client::DemoOptions options;
    options.steps = kSteps;
    options.seed = 7;
    options.log = &log;
    result = client::RunDemo(demo_client, options);
  });
  absl::Cleanup join = [&] {
    gate.Release();
    demo.join();
  };
  ASSERT_TRUE(gate.WaitHeld(absl::Seconds(60)));
  absl::StatusOr<v1::ListSessionsResponse> sessions = run_->client->ListSessions();
  ASSERT_TRUE(sessions.ok()) << sessions.status();
  std::vector<std::string> ids;
  for (const v1::SessionInfo& info : sessions->sessions()) {
    if (info.session_id() != run_->student_id && info.session_id() != run_->teacher_id) {
      ids.push_back(info.session_id());
    }
  }
  ASSERT_EQ(ids.size(), 2u);
  const int metrics_port = run_->server.server->metrics_port();
  absl::StatusOr<std::string> live = testing::HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(live.ok()) << live.status();
  for (const std::string& id : ids) {
    EXPECT_TRUE(absl::StrContains(*live, absl::StrCat("session=\"", id, "\"")))
        << "no series of live session " << id;
  }
  ASSERT_TRUE(run_->prometheus
                  ->WaitForScrapeAfter(kJob, gate.held_at(), 0, absl::Seconds(20))
                  .ok());
  const std::string of_ids = absl::StrCat("{session=~\"", absl::StrJoin(ids, "|"), "\"}");
  absl::StatusOr<std::vector<Sample>> before = run_->prometheus->QueryVector(of_ids);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->empty());

  std::move(join).Invoke();
  ASSERT_TRUE(result.ok()) << result.status();
  const absl::Time deleted_at = absl::Now();
  absl::StatusOr<std::string> after = testing::HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(after.ok()) << after.status();
  for (const std::string& id : ids) {
    EXPECT_FALSE(absl::StrContains(*after, id)) << "series of deleted session " << id;
  }
  // The held run's series are untouched.
  EXPECT_TRUE(absl::StrContains(*after, absl::StrCat("session=\"", run_->student_id, "\"")));
  ASSERT_TRUE(
      run_->prometheus->WaitForScrapeAfter(kJob, deleted_at, 0, absl::Seconds(20)).ok());
  absl::StatusOr<std::vector<Sample>> stale = run_->prometheus->QueryVector(of_ids);
  ASSERT_TRUE(stale.ok()) << stale.status();
  EXPECT_TRUE(stale->empty()) << stale->size() << " series of deleted sessions, e.g. "
                              << Labels((*stale)[0].labels);
}

// ---------------------------------------------------------------------------------------
// promtool on the deploy files (no server needed).

TEST(PromtoolTest, AlertRulesPassCheckRules) {
  ASSERT_TRUE(CheckExecutable(kPromtoolBinary).ok()) << CheckExecutable(kPromtoolBinary);
  CommandResult result = RunCommand(
      {kPromtoolBinary, "check", "rules", Runfile("deploy/prometheus/teserve_rules.yml")});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(absl::StrContains(result.output, "SUCCESS")) << result.output;
}

TEST(PromtoolTest, AlertRuleUnitTestsPass) {
  ASSERT_TRUE(CheckExecutable(kPromtoolBinary).ok()) << CheckExecutable(kPromtoolBinary);
  CommandResult result = RunCommand(
      {kPromtoolBinary, "test", "rules", Runfile("deploy/prometheus/teserve_rules_test.yml")});
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST(PromtoolTest, ScrapeConfigPassesCheckConfig) {
  ASSERT_TRUE(CheckExecutable(kPromtoolBinary).ok()) << CheckExecutable(kPromtoolBinary);
  CommandResult result = RunCommand(
      {kPromtoolBinary, "check", "config", Runfile("deploy/prometheus/prometheus.yml")});
  EXPECT_EQ(result.exit_code, 0) << result.output;
}

TEST(DashboardTest, ChartsEveryMetricOfTheCatalogue) {
  absl::StatusOr<Dashboard> dashboard = LoadDashboard();
  ASSERT_TRUE(dashboard.ok()) << dashboard.status();
  std::string all;
  for (const DashboardQuery& target : dashboard->targets) absl::StrAppend(&all, target.expr, "\n");
  for (const char* metric :
       {"teserve_fp8_amax{", "teserve_fp8_amax_window_max", "teserve_fp8_scale{",
        "teserve_amax_log2_bucket", "teserve_fp8_underflow_ratio", "teserve_fp8_overflow_ratio",
        "teserve_fp8_quantization_mse", "teserve_steps_skipped_total", "teserve_train_steps_total",
        "teserve_loss", "teserve_grad_norm", "teserve_kernel_duration_seconds_bucket",
        "teserve_rpc_duration_seconds_bucket", "teserve_rpc_requests_total",
        "teserve_rpc_received_bytes_total", "teserve_rpc_sent_bytes_total", "teserve_sessions",
        "teserve_device_memory_bytes"}) {
    EXPECT_TRUE(absl::StrContains(all, metric)) << "no panel queries " << metric;
  }
  EXPECT_TRUE(absl::StrContains(all, "histogram_quantile(0.5, sum by (op, device, le)"));
  EXPECT_TRUE(absl::StrContains(all, "histogram_quantile(0.99, sum by (op, device, le)"));
}

}  // namespace
}  // namespace teserve
