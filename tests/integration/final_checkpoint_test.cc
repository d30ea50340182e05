// Final checkpoints against the real server binary: a session created with
// checkpoint_every_steps > 0 ("configured to checkpoint") is saved as
// "<prefix>-step-<N>-final" when it expires idle and when the server stops on SIGTERM,
// unless its latest checkpoint already holds its state. Under load, SIGTERM lets calls
// finish or answers UNAVAILABLE, saves every such session and exits 0 within the grace
// period; each final checkpoint equals a replay of exactly the calls its client saw
// succeed.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/checkpoint_training.h"
#include "tests/integration/server_process.h"
#include "tests/integration/transformer_stack.h"

namespace teserve {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;
using testing::CheckpointedRunRequest;
using testing::kCkptBatch;
using testing::kCkptHidden;
using testing::kCkptSeq;

std::string FreshDir(const std::string& leaf) {
  const std::string dir = testing::TempPath(leaf);
  std::filesystem::remove_all(dir);
  return dir;
}

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.push_back(e.path().filename().string());
  return names;
}

v1::CreateSessionRequest Configured(const std::string& prefix, int64_t every_steps) {
  v1::CreateSessionRequest request = CheckpointedRunRequest();
  request.set_checkpoint_every_steps(every_steps);
  request.set_checkpoint_prefix(prefix);
  return request;
}

// ForwardBackward on the data of step `k` of tests/integration/checkpoint_training.h.
absl::Status ForwardBackward(client::Client& c, const std::string& id, int k) {
  const int64_t n = kCkptSeq * kCkptBatch * kCkptHidden;
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(n, 1000 + k), {kCkptSeq, kCkptBatch, kCkptHidden});
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(n, 2000 + k), {kCkptSeq, kCkptBatch, kCkptHidden});
  return c.ForwardBackward(request).status();
}

// Every parameter and gradient, by name, as bytes.
std::vector<std::pair<std::string, std::string>> StateBytes(client::Client& c, const std::string& id) {
  v1::GetParametersRequest request;
  request.set_session_id(id);
  request.set_include_grads(true);
  absl::StatusOr<v1::GetParametersResponse> response = c.GetParameters(request);
  EXPECT_TRUE(response.ok()) << response.status();
  std::vector<std::pair<std::string, std::string>> out;
  if (!response.ok()) return out;
  for (const v1::NamedTensor& p : response->parameters()) out.emplace_back(p.name(), p.tensor().data());
  for (const v1::NamedTensor& g : response->grads()) out.emplace_back("grad:" + g.name(), g.tensor().data());
  return out;
}

absl::StatusOr<std::string> Resume(client::Client& c, const std::string& name, v1::SessionInfo* info = nullptr) {
  v1::CreateSessionRequest request;
  request.set_from_checkpoint(name);
  ASSIGN_OR_RETURN(v1::CreateSessionResponse created, c.CreateSession(request));
  if (info != nullptr) *info = created.info();
  return created.session_id();
}

TEST(FinalCheckpoint, IdleExpirySavesTheSessionsConfiguredToCheckpoint) {
  const std::string dir = FreshDir("idle_checkpoints");
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({absl::StrCat("--checkpoint_dir=", dir), "--session_idle_timeout=1s"},
                           testing::TempPath("idle_final.log")))
      << server.Log();
  client::Client c(server.address());
  // dirty: three steps and a ForwardBackward more (mid-accumulation), never saved.
  // clean: saved by its periodic checkpoint after its only step. plain: not configured.
  auto dirty = c.CreateSession(Configured("dirty", 100));
  auto clean = c.CreateSession(Configured("clean", 1));
  auto plain = c.CreateSession(CheckpointedRunRequest());
  ASSERT_TRUE(dirty.ok() && clean.ok() && plain.ok());
  for (int step = 1; step <= 3; ++step) {
    ASSERT_TRUE(testing::CheckpointedRunStep(c, dirty->session_id(), step).ok());
  }
  ASSERT_TRUE(ForwardBackward(c, dirty->session_id(), 4).ok());
  const auto dirty_state = StateBytes(c, dirty->session_id());
  ASSERT_TRUE(testing::CheckpointedRunStep(c, clean->session_id(), 1).ok());
  ASSERT_TRUE(testing::CheckpointedRunStep(c, plain->session_id(), 1).ok());

  // ListSessions does not count as use; the sessions expire within about 1.25 s.
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (c.ListSessions()->sessions_size() > 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(100));
  ASSERT_EQ(c.ListSessions()->sessions_size(), 0);
  EXPECT_EQ(c.GetSession(dirty->session_id()).status().code(), absl::StatusCode::kNotFound);

  absl::StatusOr<v1::ListCheckpointsResponse> listing = c.ListCheckpoints();
  ASSERT_TRUE(listing.ok()) << listing.status();
  std::vector<std::string> names;
  for (const v1::CheckpointInfo& info : listing->checkpoints()) names.push_back(info.name());
  EXPECT_THAT(names, UnorderedElementsAre("clean-step-000000001", "dirty-step-000000003-final")) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr(absl::StrCat("session ", clean->session_id(),
                                                   " expired (idle): no final checkpoint needed")));

  // The final checkpoint is the session as it was, gradients mid-accumulation included.
  v1::SessionInfo info;
  absl::StatusOr<std::string> resumed = Resume(c, "dirty-step-000000003-final", &info);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(info.step(), 3);
  EXPECT_EQ(StateBytes(c, *resumed), dirty_state);

  // A session restored from a checkpoint and configured to checkpoint has nothing new to
  // save until it changes: SIGTERM writes no second final checkpoint.
  v1::CreateSessionRequest again = Configured("dirty", 100);
  again.clear_model();
  again.clear_recipe();
  again.clear_optimizer();
  again.set_from_checkpoint("dirty-step-000000003-final");
  ASSERT_TRUE(c.CreateSession(again).ok());
  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(20)), 0) << server.Log();
  EXPECT_THAT(Entries(dir), UnorderedElementsAre("clean-step-000000001", "dirty-step-000000003-final"));
}

// One client's calls: ForwardBackward on step-k data (fb_step = k) or Step (fb_step 0),
// the ones that succeeded, in order.
struct ClientRun {
  std::string id;
  std::string prefix;  // empty: not configured to checkpoint
  std::vector<int> succeeded;
  int steps = 0;
  std::vector<absl::Status> failures;
};

TEST(FinalCheckpoint, SigtermUnderLoadSavesEveryConfiguredSessionAndExitsZeroWithinTheGracePeriod) {
  const std::string dir = FreshDir("sigterm_checkpoints");
  constexpr int kGraceSeconds = 6;
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({absl::StrCat("--checkpoint_dir=", dir), absl::StrCat("--shutdown_grace_seconds=", kGraceSeconds)},
                           testing::TempPath("sigterm_final.log")))
      << server.Log();
  // Six sessions configured to checkpoint (never periodically within this run), two not.
  std::vector<ClientRun> runs(8);
  {
    client::Client c(server.address());
    for (size_t i = 0; i < runs.size(); ++i) {
      runs[i].prefix = i < 6 ? absl::StrCat("load", i) : "";
      auto created = c.CreateSession(i < 6 ? Configured(runs[i].prefix, 1000) : CheckpointedRunRequest());
      ASSERT_TRUE(created.ok()) << created.status();
      runs[i].id = created->session_id();
    }
  }
  std::vector<std::thread> threads;
  for (ClientRun& run : runs) {
    threads.emplace_back([&run, address = server.address()] {
      client::ClientOptions options;
      options.rpc_timeout = absl::Seconds(30);
      client::Client c(address, options);
      for (int k = 1;; ++k) {
        absl::Status status = ForwardBackward(c, run.id, k);
        if (!status.ok()) {
          run.failures.push_back(status);
          return;
        }
        run.succeeded.push_back(k);
        status = c.Step(run.id, /*zero_grad=*/true).status();
        if (!status.ok()) {
          run.failures.push_back(status);
          return;
        }
        run.succeeded.push_back(0);
        ++run.steps;
      }
    });
  }
  absl::SleepFor(absl::Milliseconds(1500));
  const absl::Time stop = absl::Now();
  server.Signal(SIGTERM);
  const int code = server.WaitExit(absl::Seconds(30));
  const absl::Duration took = absl::Now() - stop;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(code, 0) << server.Log();
  EXPECT_LT(took, absl::Seconds(kGraceSeconds)) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("shutdown complete"));
  for (const ClientRun& run : runs) {
    EXPECT_GT(run.steps, 0) << run.id;
    for (const absl::Status& status : run.failures) {
      EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
    }
  }

  // A second server on the directory: each configured session's final checkpoint holds
  // exactly the calls its client saw succeed.
  std::vector<std::string> expected;
  for (const ClientRun& run : runs) {
    if (!run.prefix.empty()) expected.push_back(absl::StrFormat("%s-step-%09d-final", run.prefix, run.steps));
  }
  EXPECT_THAT(Entries(dir), ::testing::UnorderedElementsAreArray(expected)) << server.Log();
  testing::ServerProcess second;
  ASSERT_TRUE(second.Start({absl::StrCat("--checkpoint_dir=", dir)}, testing::TempPath("sigterm_final_2.log")))
      << second.Log();
  client::Client c(second.address());
  for (const ClientRun& run : runs) {
    if (run.prefix.empty()) continue;
    v1::SessionInfo info;
    absl::StatusOr<std::string> resumed = Resume(c, absl::StrFormat("%s-step-%09d-final", run.prefix, run.steps), &info);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(info.step(), run.steps);
    auto replay = c.CreateSession(CheckpointedRunRequest());
    ASSERT_TRUE(replay.ok());
    for (int k : run.succeeded) {
      ASSERT_TRUE((k > 0 ? ForwardBackward(c, replay->session_id(), k)
                         : c.Step(replay->session_id(), /*zero_grad=*/true).status())
                      .ok());
    }
    EXPECT_EQ(StateBytes(c, *resumed), StateBytes(c, replay->session_id())) << run.prefix;
  }
  second.Signal(SIGTERM);
  EXPECT_EQ(second.WaitExit(absl::Seconds(20)), 0) << second.Log();
}

// The long call's model and request, by device. On the CPU backend sixteen
// TransformerLayers over 512 x 2 positions make one ForwardBackward take seconds, with
// check points between the layers. On a GPU such a call takes milliseconds; its time
// goes mostly to launching each layer's kernels and reading back its amaxes, so there the
// model is narrow (a small final checkpoint) and hundreds of layers deep, and the test
// deepens it until a ForwardBackward outlasts the time calls get after SIGTERM.
using SlowWorkload = testing::StackWorkload;

SlowWorkload SlowWorkloadFor(const std::string& device) {
  if (device == "cpu") return {512, 2, 64, 256, 4, 16};
  return {256, 2, 32, 64, 2, 512};
}

constexpr int64_t kMaxGpuLayers = 4096;

v1::CreateSessionRequest SlowSession(const SlowWorkload& w) {
  v1::CreateSessionRequest request;
  testing::AddTransformerStack(w, /*seed=*/5, /*dropout=*/0.1f, request.mutable_model());
  request.mutable_recipe()->mutable_delayed()->set_amax_history_len(4);
  request.mutable_optimizer()->mutable_adamw()->set_lr(1e-3f);
  request.set_checkpoint_every_steps(1000);
  request.set_checkpoint_prefix("slow");
  return request;
}

v1::ForwardBackwardRequest SlowForwardBackward(const SlowWorkload& w, const std::string& id, uint64_t seed) {
  const int64_t n = w.tokens() * w.hidden;
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(n, seed), {w.seq, w.batch, w.hidden});
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(n, seed + 1), {w.seq, w.batch, w.hidden});
  return request;
}

TEST(FinalCheckpoint, SigtermStopsALongCallWithUnavailableAndTheFinalCheckpointIsTheStateBeforeIt) {
  const std::string dir = FreshDir("long_call_checkpoints");
  constexpr int kGraceSeconds = 2;  // training calls get 0.8 s (40%), final checkpoints the rest
  // The long call starts 50 ms before SIGTERM and must still be running 0.8 s after it
  // (0.85 s, and a margin).
  const absl::Duration needed = absl::Seconds(kGraceSeconds) * 0.6;
  // On a GPU the long call runs faster than the timed ones: it follows a Step that zeroed
  // the gradients, so its weight-gradient GEMMs write them fresh instead of adding to
  // them (one run's long call took 1.07 s where the timed call took 1.36 s and finished
  // before the calls' deadline). So the timed call aims well past `needed`. The final
  // checkpoint's time grows with the depth as well (about half of the call's), so the
  // model is made no deeper than that: a margin, not more.
  const absl::Duration gpu_goal = absl::Seconds(kGraceSeconds) * 0.75;
  const std::string device = testing::TestDevice();
  const bool on_cpu = device == "cpu";
  SlowWorkload w = SlowWorkloadFor(device);
  // Sessions are admitted for requests of this test's size: the default (8192 tokens)
  // would count ~1 GB of attention scores per layer of the deep GPU model.
  const std::string admission = absl::StrCat("--admission_tokens=", w.tokens());
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({absl::StrCat("--checkpoint_dir=", dir), absl::StrCat("--shutdown_grace_seconds=", kGraceSeconds),
                            admission},
                           testing::TempPath("long_call.log")))
      << server.Log();
  client::Client c(server.address());
  // The session and its first ForwardBackward, timed. On a GPU, while that is shorter
  // than gpu_goal, the session goes (a deleted session leaves no checkpoint) and one of a
  // deeper model takes its place.
  std::string id;
  absl::Duration took;
  for (;;) {
    auto created = c.CreateSession(SlowSession(w));
    ASSERT_TRUE(created.ok()) << created.status();
    id = created->session_id();
    if (!on_cpu) {
      EXPECT_EQ(created->info().device(), device) << created->info().device_note();
    }
    // A session's first call also pays for its allocations and the GEMM heuristics of
    // new shapes, so on a GPU the second call is the one timed (the long call below is a
    // warm one too).
    const int calls = on_cpu ? 1 : 2;
    for (int call = 0; call < calls; ++call) {
      const absl::Time start = absl::Now();
      ASSERT_TRUE(c.ForwardBackward(SlowForwardBackward(w, id, 1)).ok());
      took = absl::Now() - start;
    }
    std::printf("%s, %lld layers: ForwardBackward %s\n", device.c_str(), static_cast<long long>(w.layers),
                absl::FormatDuration(took).c_str());
    if (on_cpu || took >= gpu_goal || w.layers >= kMaxGpuLayers) break;
    ASSERT_TRUE(c.DeleteSession(id).ok());
    // The time per layer is about constant at these depths: aim a tenth past the goal.
    const double factor = std::max(1.1, 1.1 * absl::FDivDuration(gpu_goal, took));
    w.layers = std::min<int64_t>(kMaxGpuLayers, static_cast<int64_t>(std::ceil(w.layers * factor)));
  }
  ASSERT_TRUE(c.Step(id, /*zero_grad=*/true).ok());
  const auto before = StateBytes(c, id);
  if (took < needed) {
    server.Signal(SIGKILL);
    const std::string why = absl::StrCat("a ForwardBackward takes only ", absl::FormatDuration(took), " on ", device,
                                         " (", w.layers, " layers); it would end before the calls' time is up");
    // On the CPU a fast machine skips; a GPU run exists to run this case, so it fails.
    if (on_cpu) GTEST_SKIP() << why;
    FAIL() << why << "; deepen SlowWorkloadFor's model";
  }

  absl::Status long_call;
  absl::Time long_call_end;
  std::thread in_flight([&] {
    long_call = c.ForwardBackward(SlowForwardBackward(w, id, 2)).status();
    long_call_end = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(50));
  const absl::Time stop = absl::Now();
  server.Signal(SIGTERM);
  const int code = server.WaitExit(absl::Seconds(20));
  const absl::Duration stop_took = absl::Now() - stop;
  in_flight.join();
  EXPECT_EQ(code, 0) << server.Log();
  EXPECT_LT(stop_took, absl::Seconds(kGraceSeconds) + absl::Milliseconds(500)) << server.Log();
  EXPECT_EQ(long_call.code(), absl::StatusCode::kUnavailable) << long_call;
  EXPECT_THAT(std::string(long_call.message()), HasSubstr("the server is shutting down"));
  // Mid-call: inside a pass, or between the forward and the backward.
  EXPECT_THAT(std::string(long_call.message()), ContainsRegex("the call stopped (in the |after the forward;)"))
      << "stopped mid-call";
  std::printf("SIGTERM to exit: %s (the long call answered after %s)\n", absl::FormatDuration(stop_took).c_str(),
              absl::FormatDuration(long_call_end - stop).c_str());
  EXPECT_THAT(server.Log(), HasSubstr("checkpoint 'slow-step-000000001-final' saved: step 1"));

  testing::ServerProcess second;
  ASSERT_TRUE(second.Start({absl::StrCat("--checkpoint_dir=", dir), admission}, testing::TempPath("long_call_2.log")))
      << second.Log();
  client::Client c2(second.address());
  absl::StatusOr<std::string> resumed = Resume(c2, "slow-step-000000001-final");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(StateBytes(c2, *resumed), before) << "the stopped call left no trace";
  second.Signal(SIGTERM);
  EXPECT_EQ(second.WaitExit(absl::Seconds(20)), 0) << second.Log();
}

}  // namespace
}  // namespace teserve
