// Limits, admission, deadlines and idle expiry against a real in-process server
// (issue 25, "Limits and failure handling"): each refusal comes before any work, with
// the code, the field and the flag in the message, and the server keeps serving.
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

v1::CreateSessionRequest LinearSession(int64_t in, int64_t out) {
  v1::CreateSessionRequest request;
  v1::LinearSpec* linear = request.mutable_model()->add_layers()->mutable_linear();
  linear->set_in_features(in);
  linear->set_out_features(out);
  request.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  return request;
}

v1::CreateSessionRequest AttentionSession(int64_t heads, int64_t channels) {
  v1::CreateSessionRequest request;
  v1::DotProductAttentionSpec* dpa = request.mutable_model()->add_layers()->mutable_dot_product_attention();
  dpa->set_num_attention_heads(heads);
  dpa->set_kv_channels(channels);
  dpa->set_attn_mask_type("no_mask");
  request.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  return request;
}

v1::ForwardRequest ForwardOf(const std::string& id, std::vector<int64_t> shape, int inputs = 1) {
  v1::ForwardRequest forward;
  forward.set_session_id(id);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  for (int i = 0; i < inputs; ++i) {
    *forward.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(count, 7 + i), shape);
  }
  return forward;
}

server::ServerOptions Options() {
  server::ServerOptions options = testing::LoopbackOptions();
  options.admission_tokens = 256;
  return options;
}

TEST(Limits, AHugeLinearSpecIsRefusedBeforeAllocationNamingEstimateAndAvailable) {
  server::ServerOptions options = Options();
  options.memory_budget_bytes = int64_t{8} << 30;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(LinearSession(65536, 65536));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));  // refused, not attempted
  ASSERT_EQ(created.status().code(), absl::StatusCode::kResourceExhausted) << created.status();
  const std::string message(created.status().message());
  EXPECT_THAT(message, HasSubstr("model: the session would need about"));
  EXPECT_THAT(message, HasSubstr("4295032832 parameters"));  // 65536^2 + 65536 bias
  EXPECT_THAT(message, HasSubstr("available: 8589934592 bytes"));
  EXPECT_THAT(message, HasSubstr("--memory_budget_bytes"));
  // The default budget (the host's memory) refuses it too.
  testing::LoopbackServer d = testing::StartLoopbackServer(Options());
  ASSERT_NE(d.server, nullptr);
  EXPECT_EQ(d.client->CreateSession(LinearSession(65536, 65536)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*s.client->Health(), "SERVING");
  EXPECT_TRUE(s.client->CreateSession(LinearSession(32, 32)).ok());
}

TEST(Limits, TheBudgetCountsLiveSessionsAndFreesOnDelete) {
  server::ServerOptions options = Options();
  // The demo model at 256 tokens: about 1.3 MB, mostly activations.
  options.memory_budget_bytes = 2'000'000;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> first = s.client->CreateSession(client::DemoSessionRequest(1, 0.05f, true, 1e-2f));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<v1::CreateSessionResponse> second = s.client->CreateSession(client::DemoSessionRequest(2, 0.05f, true, 1e-2f));
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("estimated for the live sessions"));
  ASSERT_TRUE(s.client->DeleteSession(first->session_id()).ok());
  EXPECT_TRUE(s.client->CreateSession(client::DemoSessionRequest(2, 0.05f, true, 1e-2f)).ok());
}

TEST(Limits, TokensPerRequestAreBounded) {
  server::ServerOptions options = Options();
  options.max_tokens_per_request = 64;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(client::DemoSessionRequest(1, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(s.client->Forward(ForwardOf(created->session_id(), {64, 32})).ok());
  absl::StatusOr<v1::ForwardResponse> over = s.client->Forward(ForwardOf(created->session_id(), {5, 13, 32}));
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("inputs[0].shape: expected at most 64 tokens per request (--max_tokens_per_request), got 65"));
  v1::ForwardBackwardRequest fb;
  fb.set_session_id(created->session_id());
  fb.mutable_loss()->mutable_mse();
  *fb.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(65 * 32, 1), {65, 32});
  *fb.mutable_target() = client::MakeFloatTensor(testing::PseudoRandomFloats(65 * 32, 2), {65, 32});
  absl::StatusOr<v1::ForwardBackwardResponse> fb_over = s.client->ForwardBackward(fb);
  EXPECT_EQ(fb_over.status().code(), absl::StatusCode::kResourceExhausted) << fb_over.status();
  EXPECT_THAT(std::string(fb_over.status().message()), HasSubstr("(--max_tokens_per_request), got 65"));
  absl::StatusOr<v1::SessionInfo> info = s.client->GetSession(created->session_id());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->live_handles(), 1);  // only the accepted Forward's
}

// An empty tensor is no free pass: [0, 2^40, 32] carries no data, but the layers would
// loop over and allocate by its other dimensions (terabytes, found by
// tests/fuzz/request_fuzzer, corpus regression-zero-*). A 0 counts as 1 in the bounds.
TEST(Limits, EmptyTensorsWithHugeDimensionsAreBounded) {
  server::ServerOptions options = Options();
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  v1::CreateSessionRequest transformer;
  v1::TransformerLayerSpec* t = transformer.mutable_model()->add_layers()->mutable_transformer_layer();
  t->set_hidden_size(32);
  t->set_ffn_hidden_size(32);
  t->set_num_attention_heads(2);
  t->set_self_attn_mask_type("padding");
  transformer.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(transformer);
  ASSERT_TRUE(created.ok()) << created.status();
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{0, int64_t{1} << 40, 32},
                                                                             {int64_t{1} << 40, 0, 32}}) {
    v1::ForwardRequest forward;
    forward.set_session_id(created->session_id());
    v1::Tensor* x = forward.add_inputs();
    x->set_dtype(v1::FLOAT32);
    for (int64_t d : shape) x->add_shape(d);
    v1::NamedTensor* mask = forward.add_side_inputs();
    mask->set_name("attention_mask");
    mask->mutable_tensor()->set_dtype(v1::BOOL);
    for (int64_t d : {shape[1], int64_t{1}, int64_t{1}, shape[0]}) mask->mutable_tensor()->add_shape(d);
    absl::StatusOr<v1::ForwardResponse> over = s.client->Forward(forward);
    ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
    EXPECT_THAT(std::string(over.status().message()),
                HasSubstr("inputs[0].shape: expected at most 65536 tokens per request (--max_tokens_per_request), "
                          "got 1099511627776 (a dimension of 0 counted as 1)"));
  }
  // An empty request of ordinary size is still served.
  v1::ForwardRequest empty;
  empty.set_session_id(created->session_id());
  v1::Tensor* x = empty.add_inputs();
  x->set_dtype(v1::FLOAT32);
  for (int64_t d : {0, 2, 32}) x->add_shape(d);
  v1::NamedTensor* mask = empty.add_side_inputs();
  mask->set_name("attention_mask");
  mask->mutable_tensor()->set_dtype(v1::BOOL);
  for (int64_t d : {2, 1, 1, 0}) mask->mutable_tensor()->add_shape(d);
  empty.set_no_grad(true);
  absl::StatusOr<v1::ForwardResponse> served = s.client->Forward(empty);
  ASSERT_TRUE(served.ok()) << served.status();
  ASSERT_EQ(served->outputs_size(), 1);
  EXPECT_EQ(served->outputs(0).data().size(), 0u);
}

TEST(Limits, AttentionScoresAreBoundedBeforeWork) {
  server::ServerOptions options = Options();
  options.max_attention_scores = int64_t{1} << 20;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(AttentionSession(2, 16));
  ASSERT_TRUE(created.ok()) << created.status();
  // sbhd [S, B, H, D]: 1 x 2 x 512 x 512 = 524288 scores fit; 1024 gives 2097152.
  absl::StatusOr<v1::ForwardResponse> fits = s.client->Forward(ForwardOf(created->session_id(), {512, 1, 2, 16}, 3));
  EXPECT_TRUE(fits.ok()) << fits.status();
  const absl::Time start = absl::Now();
  absl::StatusOr<v1::ForwardResponse> over = s.client->Forward(ForwardOf(created->session_id(), {1024, 1, 2, 16}, 3));
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("inputs[0].shape: attention layer 'layers.0' would compute batch x heads x seq_q x seq_kv = "
                        "1 x 2 x 1024 x 1024 = 2097152 scores, over the limit of 1048576 (--max_attention_scores)"));
}

TEST(Limits, RepliesOverTheMessageLimitAreRefusedBeforeWork) {
  server::ServerOptions options = Options();
  options.max_message_bytes = 1 << 20;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(LinearSession(32, 4096));
  ASSERT_TRUE(created.ok()) << created.status();
  absl::StatusOr<v1::ForwardResponse> over = s.client->Forward(ForwardOf(created->session_id(), {128, 32}));
  ASSERT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(over.status().message()),
              HasSubstr("inputs[0].shape: the reply would carry 2097152 bytes (2.1 MB) of outputs (128 tokens x 4096 "
                        "FP32 features), over the server's message limit of 1048576 bytes (--max_message_bytes)"));
  absl::StatusOr<v1::SessionInfo> info = s.client->GetSession(created->session_id());
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->live_handles(), 0);
}

TEST(Limits, SessionQuotasPerServerAndPerTenant) {
  const std::string tokens = testing::TempPath("quota_tokens.txt");
  testing::WriteWholeFile(tokens, "tenant-a-token-0123456789 a\ntenant-b-token-0123456789 b\n");
  server::ServerOptions options = Options();
  options.auth_tokens_file = tokens;
  options.max_sessions = 3;
  options.max_sessions_per_tenant = 2;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  client::ClientOptions a_options, b_options;
  a_options.token = "tenant-a-token-0123456789";
  b_options.token = "tenant-b-token-0123456789";
  client::Client a(s.address, a_options), b(s.address, b_options);
  ASSERT_TRUE(a.CreateSession(LinearSession(8, 8)).ok());
  ASSERT_TRUE(a.CreateSession(LinearSession(8, 8)).ok());
  absl::StatusOr<v1::CreateSessionResponse> third = a.CreateSession(LinearSession(8, 8));
  ASSERT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("expected at most 2 live sessions per tenant (--max_sessions_per_tenant), got 2"));
  ASSERT_TRUE(b.CreateSession(LinearSession(8, 8)).ok());
  absl::StatusOr<v1::CreateSessionResponse> fourth = b.CreateSession(LinearSession(8, 8));
  ASSERT_EQ(fourth.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(fourth.status().message()), HasSubstr("(--max_sessions)"));
  EXPECT_EQ(a.ListSessions()->sessions_size(), 2);
  EXPECT_EQ(b.ListSessions()->sessions_size(), 1);
}

TEST(Deadlines, AnAbandonedForwardLeavesNoHandle) {
  testing::LoopbackServer s = testing::StartLoopbackServer(Options());
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> created = s.client->CreateSession(LinearSession(1024, 1024));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->session_id();
  const v1::ForwardRequest forward = ForwardOf(id, {8192, 1024});
  // How long one Forward takes here; the abandoned one gets a quarter of that.
  absl::Time start = absl::Now();
  absl::StatusOr<v1::ForwardResponse> timed = s.client->Forward(forward);
  ASSERT_TRUE(timed.ok()) << timed.status();
  const absl::Duration took = absl::Now() - start;
  if (took < absl::Milliseconds(40)) GTEST_SKIP() << "a Forward takes only " << took << "; can't abandon one midway";
  v1::BackwardRequest backward;
  backward.set_session_id(id);
  backward.set_handle(timed->handle());
  *backward.add_grad_outputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(8192 * 1024, 3), {8192, 1024});
  ASSERT_TRUE(s.client->Backward(backward).ok());

  client::ClientOptions hasty;
  hasty.rpc_timeout = took / 4;
  client::Client impatient(s.address, hasty);
  absl::StatusOr<v1::ForwardResponse> abandoned = impatient.Forward(forward);
  EXPECT_EQ(abandoned.status().code(), absl::StatusCode::kDeadlineExceeded) << abandoned.status();
  // GetSession waits for the session lock, i.e. for the abandoned Forward to end; the
  // server then drops its handle.
  bool released = false;
  for (int i = 0; i < 100 && !released; ++i) {
    absl::SleepFor(took / 4);
    absl::StatusOr<v1::SessionInfo> info = s.client->GetSession(id);
    ASSERT_TRUE(info.ok()) << info.status();
    released = info->live_handles() == 0;
  }
  EXPECT_TRUE(released);
  // The session still works.
  EXPECT_TRUE(s.client->Forward(forward).ok());
  EXPECT_TRUE(s.client->Step(id).ok());
}

TEST(IdleExpiry, IdleSessionsExpireAndBusyOnesStay) {
  server::ServerOptions options = Options();
  options.session_idle_timeout = absl::Seconds(1);
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::CreateSessionResponse> idle = s.client->CreateSession(LinearSession(8, 8));
  absl::StatusOr<v1::CreateSessionResponse> busy = s.client->CreateSession(LinearSession(8, 8));
  ASSERT_TRUE(idle.ok() && busy.ok());
  // 3 s: the idle one expires within 1.25 s; the busy one, used every 200 ms, stays.
  for (int i = 0; i < 15; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    ASSERT_TRUE(s.client->GetSession(busy->session_id()).ok()) << "after " << (i + 1) * 200 << " ms";
  }
  EXPECT_EQ(s.client->GetSession(idle->session_id()).status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<v1::ListSessionsResponse> listed = s.client->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->sessions_size(), 1);
  EXPECT_EQ(listed->sessions(0).session_id(), busy->session_id());
}

TEST(Drain, SigtermLetsInFlightCallsEndAndExitsZeroWithinTheGracePeriod) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({"--shutdown_grace_seconds=2", "--admission_tokens=256"}, testing::TempPath("drain.log")))
      << server.Log();
  client::ClientOptions options;
  options.rpc_timeout = absl::Seconds(60);
  client::Client c(server.address(), options);
  absl::StatusOr<v1::CreateSessionResponse> created = c.CreateSession(LinearSession(1024, 1024));
  ASSERT_TRUE(created.ok()) << created.status();
  const v1::ForwardRequest forward = ForwardOf(created->session_id(), {8192, 1024});
  // Several calls in flight while SIGTERM arrives.
  std::vector<absl::Status> results(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < results.size(); ++i) {
    threads.emplace_back([&, i] { results[i] = c.Forward(forward).status(); });
  }
  absl::SleepFor(absl::Milliseconds(100));
  const absl::Time stop = absl::Now();
  server.Signal(SIGTERM);
  const int code = server.WaitExit(absl::Seconds(10));
  const absl::Duration took = absl::Now() - stop;
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(code, 0) << server.Log();
  EXPECT_LT(took, absl::Seconds(2 + 3)) << server.Log();  // grace + the unwind margin + slack
  for (const absl::Status& status : results) {
    EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kUnavailable ||
                status.code() == absl::StatusCode::kCancelled)
        << status;
  }
  // After the stop nothing answers: new calls are UNAVAILABLE.
  EXPECT_EQ(c.GetServerInfo().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(server.Log(), HasSubstr("received SIGTERM"));
}

}  // namespace
}  // namespace teserve
