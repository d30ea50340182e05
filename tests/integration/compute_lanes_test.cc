// Training calls compute on the server's compute threads, never on gRPC's: against the
// real binary with --compute_threads=1, while one session's long ForwardBackward
// computes, a second session's ForwardBackward waits in the queue
// (teserve_compute_queued_calls reads 1 on /metrics) and GetSession / GetServerInfo
// answer at once; then both training calls succeed, and the queued one started only
// after the first had finished. A call whose deadline passes in the queue answers
// DEADLINE_EXCEEDED and leaves its session untouched.
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/server_process.h"
#include "tests/integration/transformer_stack.h"

namespace teserve {
namespace {

// A ForwardBackward of this model takes a good fraction of a second: on the CPU, eight
// TransformerLayers over 256 x 2 tokens; on a GPU, a narrow model hundreds of layers deep
// (a GPU call's time is mostly its launches).
using Workload = testing::StackWorkload;

Workload WorkloadFor(const std::string& device) {
  if (device == "cpu") return {256, 2, 64, 256, 4, 8};
  return {256, 2, 32, 64, 2, 768};
}

v1::Tensor Activations(const Workload& w, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(w.seq * w.batch * w.hidden));
  for (float& v : values) v = normal(rng);
  return client::MakeFloatTensor(values, {w.seq, w.batch, w.hidden});
}

v1::CreateSessionRequest Spec(const Workload& w) {
  v1::CreateSessionRequest request;
  testing::AddTransformerStack(w, /*seed=*/5, /*dropout=*/0.1f, request.mutable_model());
  request.mutable_optimizer()->mutable_sgd()->set_lr(1e-3f);
  return request;
}

v1::ForwardBackwardRequest ForwardBackwardOf(const Workload& w, const std::string& id) {
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = Activations(w, 1);
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() = Activations(w, 2);
  return request;
}

// teserve_compute_queued_calls on /metrics, or -1 when the scrape fails.
double QueuedCalls(int metrics_port) {
  absl::StatusOr<std::string> page = testing::HttpGet(metrics_port, "/metrics");
  if (!page.ok()) return -1;
  for (absl::string_view line : absl::StrSplit(*page, '\n')) {
    if (absl::StartsWith(line, "teserve_compute_queued_calls ")) {
      double value = -1;
      if (absl::SimpleAtod(line.substr(line.find(' ') + 1), &value)) return value;
    }
  }
  return -1;
}

struct TimedCall {
  absl::Status status;
  absl::Time done;
};

TEST(ComputeLanes, TrainingCallsQueueForComputeThreadsWhileOtherRpcsAnswer) {
  const std::string device = testing::TestDevice();
  const Workload w = WorkloadFor(device);
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({"--compute_threads=1", "--metrics_port=0",
                            absl::StrCat("--admission_tokens=", w.seq * w.batch)},
                           testing::TempPath("compute_lanes.log")))
      << server.Log();
  client::Client c(server.address());
  absl::StatusOr<v1::CreateSessionResponse> a = c.CreateSession(Spec(w));
  absl::StatusOr<v1::CreateSessionResponse> b = c.CreateSession(Spec(w));
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  // One call each first (allocations, GEMM plans), then time one.
  ASSERT_TRUE(c.ForwardBackward(ForwardBackwardOf(w, a->session_id())).ok());
  ASSERT_TRUE(c.ForwardBackward(ForwardBackwardOf(w, b->session_id())).ok());
  absl::Time start = absl::Now();
  ASSERT_TRUE(c.ForwardBackward(ForwardBackwardOf(w, a->session_id())).ok());
  const absl::Duration call = absl::Now() - start;
  std::printf("%s: ForwardBackward %s\n", device.c_str(), absl::FormatDuration(call).c_str());
  if (call < absl::Milliseconds(150)) GTEST_SKIP() << "a call takes " << call << ": too short to watch it queue";

  // A's call, then B's, from two clients; B's waits for the one compute thread.
  TimedCall first, second;
  std::thread ta([&] {
    client::Client ca(server.address());
    first.status = ca.ForwardBackward(ForwardBackwardOf(w, a->session_id())).status();
    first.done = absl::Now();
  });
  absl::SleepFor(call / 10);
  std::thread tb([&] {
    client::Client cb(server.address());
    second.status = cb.ForwardBackward(ForwardBackwardOf(w, b->session_id())).status();
    second.done = absl::Now();
  });
  // B queued while A computes; meanwhile the callback-thread RPCs answer.
  bool saw_queued = false;
  const absl::Time watch_until = absl::Now() + call;
  while (!saw_queued && absl::Now() < watch_until) {
    saw_queued = QueuedCalls(server.metrics_port()) == 1;
    if (!saw_queued) absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Time asked = absl::Now();
  absl::StatusOr<v1::SessionInfo> info = c.GetSession(b->session_id());
  absl::StatusOr<v1::ServerInfo> server_info = c.GetServerInfo();
  const absl::Time answered = absl::Now();
  ta.join();
  tb.join();
  EXPECT_TRUE(saw_queued) << "teserve_compute_queued_calls never read 1 while A computed";
  ASSERT_TRUE(info.ok()) << info.status();
  ASSERT_TRUE(server_info.ok()) << server_info.status();
  EXPECT_LT(answered, first.done) << "GetSession / GetServerInfo waited for the training call";
  EXPECT_LT(answered - asked, call / 2);
  EXPECT_TRUE(first.status.ok()) << first.status;
  EXPECT_TRUE(second.status.ok()) << second.status;
  // B ran after A: it finished at least most of a call's time after A did.
  EXPECT_GT(second.done - first.done, call / 2);
  EXPECT_EQ(QueuedCalls(server.metrics_port()), 0);

  // A call whose deadline passes while it waits behind A's: DEADLINE_EXCEEDED, and B's
  // gradients are what they were (the server drops it when a thread frees up).
  v1::GetParametersRequest grads_request;
  grads_request.set_session_id(b->session_id());
  grads_request.set_include_grads(true);
  absl::StatusOr<v1::GetParametersResponse> before = c.GetParameters(grads_request);
  ASSERT_TRUE(before.ok()) << before.status();
  std::thread tc([&] {
    client::Client ca(server.address());
    first.status = ca.ForwardBackward(ForwardBackwardOf(w, a->session_id())).status();
  });
  absl::SleepFor(call / 10);
  client::ClientOptions hasty_options;
  hasty_options.rpc_timeout = call / 4;
  client::Client hasty(server.address(), hasty_options);
  absl::StatusOr<v1::ForwardBackwardResponse> late = hasty.ForwardBackward(ForwardBackwardOf(w, b->session_id()));
  tc.join();
  EXPECT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(late.status().code(), absl::StatusCode::kDeadlineExceeded) << late.status();
  absl::StatusOr<v1::GetParametersResponse> after = c.GetParameters(grads_request);  // after B's call is done
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_EQ(after->grads_size(), before->grads_size());
  for (int i = 0; i < after->grads_size(); ++i) {
    EXPECT_TRUE(after->grads(i).tensor().data() == before->grads(i).tensor().data()) << after->grads(i).name();
  }
}

}  // namespace
}  // namespace teserve
