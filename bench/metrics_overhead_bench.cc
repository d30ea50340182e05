// What the metrics cost: the CPU demo (client::RunDemo, or the transformer demo) against
// an in-process server on loopback, timed end to end with each metrics configuration:
//   off         --metrics_detail=off (RPC and session-count series only)
//   session     --metrics_detail=session (no FP8 series), default kernel sampling
//   unsampled   --metrics_detail=tensor without health sampling or kernel timing
//               (--fp8_stats_interval=0 --kernel_timing_interval=0)
//   tensor      --metrics_detail=tensor with the default sampling (FP8 health every 10
//               steps, kernels every 16 calls per op); what a server runs by default
//   every_call  --metrics_detail=tensor, health in every step, every kernel call timed
// The configurations are interleaved (their order rotates each round) so that drift of a
// shared machine hits all of them alike; the report gives, per configuration, the median
// and min wall time and the median CPU time of the process (server and client run in it;
// less sensitive than wall time to other processes on a shared machine), each median's
// overhead over "off", and the median over rounds of the same round's ratio to "off"
// (paired, so that slow phases of the machine cancel).
//
//   bazel run --config=cpu //bench:metrics_overhead_bench -- --rounds=7 --steps=200
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/client.h"
#include "client/demo.h"
#include "client/transformer_demo.h"
#include "server/server.h"

ABSL_FLAG(int, rounds, 7, "timed runs per configuration");
ABSL_FLAG(int, steps, 200, "demo steps per run");
ABSL_FLAG(std::string, model, "mlp", "mlp (client::RunDemo) or transformer");
ABSL_FLAG(std::string, recipe, "delayed", "the demo's recipe");

namespace {

struct Config {
  std::string name;
  std::string detail;
  int64_t fp8_stats_interval;
  int64_t kernel_timing_interval;
  std::vector<double> seconds;      // wall
  std::vector<double> cpu_seconds;  // process CPU time
};

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

struct Timing {
  double wall = -1.0;  // negative on failure
  double cpu = 0.0;
};

// One demo run against a fresh server.
Timing TimedRun(const Config& config, const std::string& model, const std::string& recipe, int steps) {
  teserve::server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = 0;
  options.device = "cpu";
  options.metrics_detail = config.detail;
  options.fp8_stats_interval = config.fp8_stats_interval;
  options.kernel_timing_interval = config.kernel_timing_interval;
  auto server = teserve::server::TeserveServer::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "server: %s\n", server.status().ToString().c_str());
    return Timing();
  }
  teserve::client::Client client(absl::StrCat("127.0.0.1:", (*server)->port()));
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ProcessCpuSeconds();
  absl::Status status;
  if (model == "transformer") {
    teserve::client::TransformerDemoOptions demo;
    demo.steps = steps;
    demo.recipe = recipe;
    status = teserve::client::RunTransformerDemo(client, demo).status();
  } else {
    teserve::client::DemoOptions demo;
    demo.steps = steps;
    demo.recipe = recipe;
    status = teserve::client::RunDemo(client, demo).status();
  }
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  const double cpu = ProcessCpuSeconds() - cpu_start;
  if (!status.ok()) {
    std::fprintf(stderr, "demo: %s\n", status.ToString().c_str());
    return Timing();
  }
  return Timing{elapsed.count(), cpu};
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median over rounds of a[r] / b[r] - 1, in percent.
double PairedOverhead(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> ratios;
  for (size_t r = 0; r < a.size() && r < b.size(); ++r) ratios.push_back(a[r] / b[r]);
  return 100.0 * (Median(ratios) - 1.0);
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  const int steps = absl::GetFlag(FLAGS_steps);
  const std::string model = absl::GetFlag(FLAGS_model);
  const std::string recipe = absl::GetFlag(FLAGS_recipe);
  std::vector<Config> configs = {
      {"off", "off", 10, 16, {}},
      {"session", "session", 10, 16, {}},
      {"unsampled", "tensor", 0, 0, {}},
      {"tensor", "tensor", 10, 16, {}},
      {"every_call", "tensor", 1, 1, {}},
  };
  // One untimed warm-up run (page faults, OpenBLAS threads, gRPC channel setup).
  if (TimedRun(configs[0], model, recipe, steps).wall < 0) return 1;
  for (int round = 0; round < rounds; ++round) {
    for (size_t i = 0; i < configs.size(); ++i) {
      Config& config = configs[(i + round) % configs.size()];
      const Timing timing = TimedRun(config, model, recipe, steps);
      if (timing.wall < 0) return 1;
      config.seconds.push_back(timing.wall);
      config.cpu_seconds.push_back(timing.cpu);
    }
  }
  const double base = Median(configs[0].seconds);
  const double cpu_base = Median(configs[0].cpu_seconds);
  std::printf("%s demo, recipe %s, %d steps, %d rounds\n", model.c_str(), recipe.c_str(), steps, rounds);
  std::printf("%-11s %10s %10s %10s %10s %10s %10s %10s\n", "metrics", "median_s", "min_s", "overhead",
              "paired", "cpu_s", "cpu_ovh", "cpu_paired");
  for (const Config& config : configs) {
    const double median = Median(config.seconds);
    const double min = *std::min_element(config.seconds.begin(), config.seconds.end());
    const double cpu = Median(config.cpu_seconds);
    std::printf("%-11s %10.4f %10.4f %+9.2f%% %+9.2f%% %10.4f %+9.2f%% %+9.2f%%\n", config.name.c_str(), median,
                min, 100.0 * (median / base - 1.0), PairedOverhead(config.seconds, configs[0].seconds), cpu,
                100.0 * (cpu / cpu_base - 1.0), PairedOverhead(config.cpu_seconds, configs[0].cpu_seconds));
  }
  std::printf("{\"model\": \"%s\", \"recipe\": \"%s\", \"steps\": %d, \"rounds\": %d", model.c_str(),
              recipe.c_str(), steps, rounds);
  for (const Config& config : configs) {
    std::printf(", \"%s_median_s\": %.6f, \"%s_median_cpu_s\": %.6f", config.name.c_str(),
                Median(config.seconds), config.name.c_str(), Median(config.cpu_seconds));
  }
  std::printf("}\n");
  return 0;
}
