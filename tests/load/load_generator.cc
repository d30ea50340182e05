#include "tests/load/load_generator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "client/client.h"
#include "client/demo.h"

namespace teserve {
namespace load {
namespace {

using Clock = std::chrono::steady_clock;

// The methods in the report, in this order; a method never called is left out.
constexpr const char* kMethods[] = {"Forward", "Backward", "ForwardBackward", "Step", "CreateSession",
                                    "DeleteSession"};
// The clients' recipes, in turn: every recipe the demo model takes, and none.
constexpr const char* kRecipes[] = {"", "delayed", "current", "mxfp8", "block", "nvfp4"};
// The demo model (client/demo.h): LayerNorm(32) -> Linear(32, 64) -> RMSNorm(64) -> Linear(64, 32).
constexpr int64_t kFeatures = 32;
constexpr size_t kErrorsKept = 10;

std::vector<float> RandomFloats(int64_t count, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  return values;
}

// What every client thread records; merged under `mu`.
struct Shared {
  // The end of the warm-up and of the run (set when the clients start; calls before
  // count as warm-up).
  Clock::time_point warm = Clock::time_point::max();
  Clock::time_point end = Clock::time_point::max();
  absl::Mutex mu;
  std::map<std::string, std::vector<double>> latencies_ms ABSL_GUARDED_BY(mu);
  std::vector<std::string> errors ABSL_GUARDED_BY(mu);
  int64_t error_count ABSL_GUARDED_BY(mu) = 0;
  int64_t iterations ABSL_GUARDED_BY(mu) = 0;
};

class Worker {
 public:
  Worker(int index, const std::string& address, const LoadOptions& options, Shared* shared)
      : index_(index), options_(options), shared_(shared), client_(address, ClientOptionsOf(options)) {
    const int64_t rows = options.batch;
    const uint64_t seed = 1000 + static_cast<uint64_t>(index);
    x_ = client::MakeFloatTensor(RandomFloats(rows * kFeatures, seed, 1.0f), {rows, kFeatures});
    grad_ = client::MakeFloatTensor(RandomFloats(rows * kFeatures, seed + 1, 0.01f), {rows, kFeatures});
    target_ = client::MakeFloatTensor(RandomFloats(rows * kFeatures, seed + 2, 1.0f), {rows, kFeatures});
  }

  // Creates the first session; the error says why when it can't.
  absl::Status Setup() { return NewSession(); }

  void Run() {
    int64_t iteration = 0;
    while (Clock::now() < shared_->end) {
      if (session_id_.empty() ||
          (options_.recreate_every > 0 && iteration > 0 && iteration % options_.recreate_every == 0)) {
        if (!session_id_.empty()) {
          const std::string id = std::move(session_id_);
          session_id_.clear();
          Timed("DeleteSession", [&] { return client_.DeleteSession(id); });
        }
        if (!NewSession().ok()) continue;  // counted; the next iteration tries again
      }
      if (iteration % 2 == 0) {
        ForwardBackwardStep();
      } else {
        FusedStep();
      }
      ++iteration;
    }
    if (!session_id_.empty()) Timed("DeleteSession", [&] { return client_.DeleteSession(session_id_); });
    absl::MutexLock lock(&shared_->mu);
    shared_->iterations += iteration;
    for (auto& [method, values] : latencies_ms_) {
      std::vector<double>& all = shared_->latencies_ms[method];
      all.insert(all.end(), values.begin(), values.end());
    }
  }

 private:
  static client::ClientOptions ClientOptionsOf(const LoadOptions& options) {
    client::ClientOptions out;
    out.rpc_timeout = options.rpc_timeout;
    return out;
  }

  absl::Status NewSession() {
    const char* recipe = kRecipes[index_ % (sizeof(kRecipes) / sizeof(kRecipes[0]))];
    absl::StatusOr<v1::CreateSessionRequest> request =
        client::DemoSessionRequestFor(/*seed=*/1 + static_cast<uint64_t>(index_), /*init_std=*/0.05f, recipe,
                                      /*lr=*/1e-3f);
    if (!request.ok()) return request.status();
    absl::StatusOr<v1::CreateSessionResponse> created;
    if (!Timed("CreateSession", [&] {
          created = client_.CreateSession(*request);
          return created.status();
        })) {
      return created.status();
    }
    session_id_ = created->session_id();
    return absl::OkStatus();
  }

  // Forward (saving activations), Backward with a fixed output gradient, Step.
  void ForwardBackwardStep() {
    v1::ForwardRequest forward;
    forward.set_session_id(session_id_);
    *forward.add_inputs() = x_;
    absl::StatusOr<v1::ForwardResponse> out;
    if (!Timed("Forward", [&] {
          out = client_.Forward(forward);
          return out.status();
        })) {
      return;
    }
    v1::BackwardRequest backward;
    backward.set_session_id(session_id_);
    backward.set_handle(out->handle());
    *backward.add_grad_outputs() = grad_;
    if (!Timed("Backward", [&] { return client_.Backward(backward).status(); })) return;
    Timed("Step", [&] { return client_.Step(session_id_, /*zero_grad=*/true).status(); });
  }

  // ForwardBackward with MSE against a fixed target, Step.
  void FusedStep() {
    v1::ForwardBackwardRequest request;
    request.set_session_id(session_id_);
    *request.add_inputs() = x_;
    request.mutable_loss()->mutable_mse();
    *request.mutable_target() = target_;
    if (!Timed("ForwardBackward", [&] { return client_.ForwardBackward(request).status(); })) return;
    Timed("Step", [&] { return client_.Step(session_id_, /*zero_grad=*/true).status(); });
  }

  // Runs `call` (returning absl::Status), keeps its latency when it started after the
  // warm-up and succeeded, and records its error otherwise. Returns whether it succeeded.
  template <typename Call>
  bool Timed(const char* method, Call&& call) {
    const Clock::time_point start = Clock::now();
    const absl::Status status = call();
    const Clock::time_point end = Clock::now();
    if (status.ok()) {
      if (start >= shared_->warm) {
        latencies_ms_[method].push_back(std::chrono::duration<double, std::milli>(end - start).count());
      }
      return true;
    }
    absl::MutexLock lock(&shared_->mu);
    ++shared_->error_count;
    if (shared_->errors.size() < kErrorsKept) {
      shared_->errors.push_back(absl::StrCat("client ", index_, " ", method, ": ", status.ToString()));
    }
    return false;
  }

  const int index_;
  const LoadOptions options_;
  Shared* const shared_;
  client::Client client_;
  v1::Tensor x_, grad_, target_;
  std::string session_id_;
  std::map<std::string, std::vector<double>> latencies_ms_;
};

// The nearest-rank percentile of sorted `values`.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0.0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

absl::StatusOr<int64_t> ReadRssKb(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open (is the process running?)"));
  std::string line;
  while (std::getline(in, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "VmRSS:")) continue;
    rest = absl::StripAsciiWhitespace(rest);
    absl::ConsumeSuffix(&rest, "kB");
    int64_t kb = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &kb)) {
      return absl::InternalError(absl::StrCat(path, ": VmRSS: expected a number of kB, got '", line, "'"));
    }
    return kb;
  }
  return absl::NotFoundError(absl::StrCat(path, ": no VmRSS line"));
}

absl::StatusOr<LoadReport> RunLoad(const std::string& address, pid_t server_pid, const LoadOptions& options) {
  if (options.clients < 1) {
    return absl::InvalidArgumentError(absl::StrCat("clients: expected at least 1, got ", options.clients));
  }
  if (options.duration <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("duration: expected > 0, got ", absl::FormatDuration(options.duration)));
  }
  if (!(options.warmup_fraction >= 0.0 && options.warmup_fraction < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("warmup_fraction: expected 0 <= f < 1, got ", options.warmup_fraction));
  }
  LoadReport report;
  auto rss = ReadRssKb(server_pid);
  if (!rss.ok()) return rss.status();
  report.rss_start_kb = *rss;

  Shared shared;
  std::vector<std::unique_ptr<Worker>> workers;
  for (int i = 0; i < options.clients; ++i) {
    workers.push_back(std::make_unique<Worker>(i, address, options, &shared));
    const absl::Status ready = workers.back()->Setup();
    if (!ready.ok()) {
      return absl::Status(ready.code(), absl::StrCat("client ", i, ": CreateSession: ", ready.message()));
    }
  }
  const Clock::time_point start = Clock::now();
  const auto duration = absl::ToChronoNanoseconds(options.duration);
  shared.warm = start + std::chrono::duration_cast<Clock::duration>(duration * options.warmup_fraction);
  shared.end = start + std::chrono::duration_cast<Clock::duration>(duration);

  std::vector<std::thread> threads;
  for (auto& worker : workers) threads.emplace_back([&worker] { worker->Run(); });

  // Memory samples until the clients stop.
  bool warm_taken = false;
  absl::Status sample_error;
  while (Clock::now() < shared.end) {
    absl::SleepFor(options.rss_interval);
    auto kb = ReadRssKb(server_pid);
    if (!kb.ok()) {
      sample_error = kb.status();
      break;
    }
    ++report.rss_samples;
    report.rss_final_kb = *kb;
    if (Clock::now() < shared.warm) continue;
    if (!warm_taken) {
      report.rss_warm_kb = *kb;
      report.rss_peak_kb = *kb;
      warm_taken = true;
    }
    report.rss_peak_kb = std::max(report.rss_peak_kb, *kb);
  }
  for (std::thread& t : threads) t.join();
  if (!sample_error.ok()) return sample_error;
  if (!warm_taken) {
    return absl::FailedPreconditionError(
        "rss: no memory sample after the warm-up (rss_interval longer than the measured window?)");
  }
  report.rss_growth =
      static_cast<double>(report.rss_peak_kb - report.rss_warm_kb) / static_cast<double>(report.rss_warm_kb);
  report.measured = absl::FromChrono(shared.end - shared.warm);

  absl::MutexLock lock(&shared.mu);
  report.iterations = shared.iterations;
  report.error_count = shared.error_count;
  report.errors = shared.errors;
  for (const char* method : kMethods) {
    auto it = shared.latencies_ms.find(method);
    if (it == shared.latencies_ms.end()) continue;
    std::vector<double>& values = it->second;
    std::sort(values.begin(), values.end());
    MethodStats stats;
    stats.method = method;
    stats.calls = static_cast<int64_t>(values.size());
    stats.p50_ms = Percentile(values, 50.0);
    stats.p99_ms = Percentile(values, 99.0);
    stats.max_ms = values.back();
    report.methods.push_back(std::move(stats));
  }
  return report;
}

std::string FormatReport(const LoadReport& report, const LoadOptions& options) {
  const double seconds = absl::ToDoubleSeconds(report.measured);
  std::string out = absl::StrFormat(
      "%d clients, %s (latencies after a %.0f%% warm-up, over %.1f s), batch %d x %d, "
      "a fresh session every %d iterations\n\n",
      options.clients, absl::FormatDuration(options.duration), options.warmup_fraction * 100.0, seconds,
      options.batch, kFeatures, options.recreate_every);
  absl::StrAppend(&out, "| RPC | calls | calls/s | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n");
  for (const MethodStats& m : report.methods) {
    absl::StrAppendFormat(&out, "| %s | %d | %.1f | %.2f | %.2f | %.2f |\n", m.method, m.calls,
                          seconds > 0 ? static_cast<double>(m.calls) / seconds : 0.0, m.p50_ms, m.p99_ms, m.max_ms);
  }
  absl::StrAppendFormat(&out,
                        "\nServer RSS: %.1f MiB at start, %.1f MiB after warm-up, peak %.1f MiB after it "
                        "(%+.1f%%), %.1f MiB at the end (%d samples). Iterations: %d. Errors: %d.\n",
                        report.rss_start_kb / 1024.0, report.rss_warm_kb / 1024.0, report.rss_peak_kb / 1024.0,
                        report.rss_growth * 100.0, report.rss_final_kb / 1024.0, report.rss_samples,
                        report.iterations, report.error_count);
  for (const std::string& e : report.errors) absl::StrAppend(&out, "- ", e, "\n");
  return out;
}

}  // namespace load
}  // namespace teserve
