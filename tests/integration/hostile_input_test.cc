// A table of hostile requests against a real server with bearer tokens and tight
// limits (issue 25, "Proof"): every RPC, malformed tensors, specs, recipes, handles,
// sizes at and over the limits, dims whose products overflow int64, wrong and missing
// tokens, another tenant's session. Each case gets its exact code and a message naming
// the field; afterwards the server still serves and the session's parameters,
// gradients, step and handles are unchanged.
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

constexpr char kAlice[] = "alice-hostile-token-0123456789";
constexpr char kBob[] = "bob-hostile-token-0123456789ab";

struct Case {
  std::string name;
  std::function<absl::Status()> call;
  absl::StatusCode code;
  std::string fragment;  // the message must contain it
};

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}
absl::Status StatusOf(const absl::Status& status) { return status; }

v1::Tensor Floats(std::vector<int64_t> shape) {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return client::MakeFloatTensor(testing::PseudoRandomFloats(count, 5), shape);
}

v1::CreateSessionRequest Linear(int64_t in, int64_t out) {
  v1::CreateSessionRequest request;
  v1::LinearSpec* linear = request.mutable_model()->add_layers()->mutable_linear();
  linear->set_in_features(in);
  linear->set_out_features(out);
  request.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  return request;
}

// A raw call with exactly the authorization metadata given (nullptr: none).
absl::Status RawListSessions(client::Client& c, const char* authorization) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (authorization != nullptr) context.AddMetadata("authorization", authorization);
  v1::ListSessionsResponse response;
  return client::FromGrpcStatus(c.stub().ListSessions(&context, v1::ListSessionsRequest(), &response));
}

TEST(HostileInput, FortyPlusCasesAcrossAllRpcs) {
  const std::string tokens = testing::TempPath("hostile_tokens.txt");
  testing::WriteWholeFile(tokens, absl::StrCat(kAlice, " alice\n", kBob, " bob\n"));
  server::ServerOptions options = testing::LoopbackOptions();
  options.auth_tokens_file = tokens;
  options.max_tokens_per_request = 4096;
  options.max_attention_scores = int64_t{1} << 20;
  options.max_message_bytes = 4 << 20;
  options.memory_budget_bytes = int64_t{4} << 30;
  options.admission_tokens = 256;
  options.max_sessions_per_tenant = 3;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  client::ClientOptions alice_options, bob_options, wrong_options;
  alice_options.token = kAlice;
  bob_options.token = kBob;
  wrong_options.token = "not-a-token-but-long-enough";
  client::Client alice(s.address, alice_options), bob(s.address, bob_options), wrong(s.address, wrong_options);
  client::Client& anonymous = *s.client;

  absl::StatusOr<v1::CreateSessionResponse> created = alice.CreateSession(client::DemoSessionRequest(7, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->session_id();
  const auto forward_of = [&](v1::Tensor input) {
    v1::ForwardRequest request;
    request.set_session_id(id);
    *request.add_inputs() = std::move(input);
    return request;
  };
  // One pending handle, and one step so that state is not at its defaults.
  absl::StatusOr<v1::ForwardResponse> first = alice.Forward(forward_of(Floats({4, 32})));
  ASSERT_TRUE(first.ok()) << first.status();
  v1::BackwardRequest good_backward;
  good_backward.set_session_id(id);
  good_backward.set_handle(first->handle());
  *good_backward.add_grad_outputs() = Floats({4, 32});
  ASSERT_TRUE(alice.Backward(good_backward).ok());
  ASSERT_TRUE(alice.Step(id).ok());
  absl::StatusOr<v1::ForwardResponse> pending = alice.Forward(forward_of(Floats({4, 32})));
  ASSERT_TRUE(pending.ok());
  v1::GetParametersRequest all;
  all.set_session_id(id);
  all.set_include_grads(true);
  absl::StatusOr<v1::GetParametersResponse> before = alice.GetParameters(all);
  ASSERT_TRUE(before.ok());
  absl::StatusOr<v1::SessionInfo> info_before = alice.GetSession(id);
  ASSERT_TRUE(info_before.ok());

  const std::string huge_id(200000, 'f');
  std::vector<Case> cases;
  const auto add = [&](std::string name, std::function<absl::Status()> call, absl::StatusCode code,
                       std::string fragment) {
    cases.push_back({std::move(name), std::move(call), code, std::move(fragment)});
  };
  using C = absl::StatusCode;

  // Authentication.
  add("no token", [&] { return StatusOf(anonymous.ListSessions()); }, C::kUnauthenticated, "authorization: expected \"Bearer <token>\"");
  add("wrong token", [&] { return StatusOf(wrong.GetSession(id)); }, C::kUnauthenticated, "authorization: the bearer token is not valid");
  add("basic scheme", [&] { return RawListSessions(anonymous, "Basic YWxpY2U6eA=="); }, C::kUnauthenticated, "got another scheme");
  add("empty bearer", [&] { return RawListSessions(anonymous, "Bearer "); }, C::kUnauthenticated, "not valid");
  add("token as raw value", [&] { return RawListSessions(anonymous, kAlice); }, C::kUnauthenticated, "authorization");
  add("no token, CreateSession", [&] { return StatusOf(anonymous.CreateSession(Linear(8, 8))); }, C::kUnauthenticated, "authorization");
  add("no token, GetServerInfo", [&] { return StatusOf(anonymous.GetServerInfo()); }, C::kUnauthenticated, "authorization");

  // Another tenant's session: NOT_FOUND on every RPC.
  add("bob GetSession", [&] { return StatusOf(bob.GetSession(id)); }, C::kNotFound, "session_id: no session '");
  add("bob Forward", [&] { return StatusOf(bob.Forward(forward_of(Floats({4, 32})))); }, C::kNotFound, "session_id: no session");
  add("bob Backward", [&] {
    v1::BackwardRequest r = good_backward;
    r.set_handle(pending->handle());
    return StatusOf(bob.Backward(r));
  }, C::kNotFound, "session_id: no session");
  add("bob Step", [&] { return StatusOf(bob.Step(id)); }, C::kNotFound, "session_id: no session");
  add("bob ZeroGrad", [&] { return bob.ZeroGrad(id); }, C::kNotFound, "session_id: no session");
  add("bob GetParameters", [&] { return StatusOf(bob.GetParameters(all)); }, C::kNotFound, "session_id: no session");
  add("bob SetParameters", [&] {
    v1::SetParametersRequest r;
    r.set_session_id(id);
    v1::NamedTensor* p = r.add_parameters();
    *p = before->parameters(0);
    return bob.SetParameters(r);
  }, C::kNotFound, "session_id: no session");
  add("bob GetQuantizationState", [&] { return StatusOf(bob.GetQuantizationState(id)); }, C::kNotFound, "session_id: no session");
  add("bob DeleteSession", [&] { return bob.DeleteSession(id); }, C::kNotFound, "session_id: no session");
  add("bob ForwardBackward", [&] {
    v1::ForwardBackwardRequest r;
    r.set_session_id(id);
    return StatusOf(bob.ForwardBackward(r));
  }, C::kNotFound, "session_id: no session");

  // Session ids.
  add("empty id", [&] { return StatusOf(alice.GetSession("")); }, C::kInvalidArgument, "session_id: expected the id CreateSession returned");
  add("200000-byte id", [&] { return StatusOf(alice.GetSession(huge_id)); }, C::kNotFound, "...' (200000 bytes)");
  add("unknown id Step", [&] { return StatusOf(alice.Step("0123456789abcdef0123456789abcdef")); }, C::kNotFound, "session_id: no session");
  add("empty id ZeroGrad", [&] { return alice.ZeroGrad(""); }, C::kInvalidArgument, "session_id");
  add("unknown id Delete", [&] { return alice.DeleteSession(huge_id); }, C::kNotFound, "(200000 bytes)");

  // Specs.
  add("empty model", [&] {
    v1::CreateSessionRequest r = Linear(8, 8);
    r.mutable_model()->clear_layers();
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "model");
  add("in_features 0", [&] { return StatusOf(alice.CreateSession(Linear(0, 8))); }, C::kInvalidArgument, "in_features");
  add("out_features negative", [&] { return StatusOf(alice.CreateSession(Linear(8, -3))); }, C::kInvalidArgument, "out_features");
  add("Linear 65536 x 65536", [&] { return StatusOf(alice.CreateSession(Linear(65536, 65536))); }, C::kResourceExhausted,
      "model: the session would need about");
  add("Linear 2^40 x 2^40 (product overflows int64)", [&] {
    return StatusOf(alice.CreateSession(Linear(int64_t{1} << 40, int64_t{1} << 40)));
  }, C::kResourceExhausted, "available:");
  add("Linear max int64", [&] {
    return StatusOf(alice.CreateSession(Linear(std::numeric_limits<int64_t>::max(), 2)));
  }, C::kResourceExhausted, "(--admission_tokens)");
  add("no optimizer", [&] {
    v1::CreateSessionRequest r = Linear(8, 8);
    r.clear_optimizer();
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "optimizer");
  add("sgd lr negative", [&] {
    v1::CreateSessionRequest r = Linear(8, 8);
    r.mutable_optimizer()->mutable_sgd()->set_lr(-1.0f);
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "optimizer.sgd.lr");
  add("adamw beta1 1.5", [&] {
    v1::CreateSessionRequest r = Linear(8, 8);
    r.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
    r.mutable_optimizer()->mutable_adamw()->set_beta1(1.5f);
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "optimizer.adamw.beta1");
  add("unknown field in model", [&] {
    v1::CreateSessionRequest r = Linear(8, 8);
    r.mutable_model()->GetReflection()->MutableUnknownFields(r.mutable_model())->AddVarint(999, 1);
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "model");
  add("attention heads 0", [&] {
    v1::CreateSessionRequest r;
    r.mutable_model()->add_layers()->mutable_dot_product_attention()->set_kv_channels(16);
    r.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "num_attention_heads");
  add("delayed amax_history_len -1", [&] {
    v1::CreateSessionRequest r = Linear(16, 16);
    r.mutable_recipe()->mutable_delayed()->set_amax_history_len(-1);
    return StatusOf(alice.CreateSession(r));
  }, C::kInvalidArgument, "amax_history_len");

  // Forward tensors.
  add("no inputs", [&] {
    v1::ForwardRequest r = forward_of(Floats({4, 32}));
    r.clear_inputs();
    return StatusOf(alice.Forward(r));
  }, C::kInvalidArgument, "inputs");
  add("wrong last dim", [&] { return StatusOf(alice.Forward(forward_of(Floats({4, 16})))); }, C::kInvalidArgument, "inputs[0].shape");
  add("data shorter than shape", [&] {
    v1::Tensor t = Floats({4, 32});
    t.mutable_data()->resize(100);
    return StatusOf(alice.Forward(forward_of(t)));
  }, C::kInvalidArgument, "inputs[0]");
  add("negative dim", [&] {
    v1::Tensor t = Floats({4, 32});
    t.set_shape(0, -4);
    return StatusOf(alice.Forward(forward_of(t)));
  }, C::kInvalidArgument, "inputs[0].shape");
  add("dims overflow int64", [&] {
    v1::Tensor t = Floats({4, 32});
    t.set_shape(0, int64_t{1} << 40);
    t.set_shape(1, int64_t{1} << 40);
    return StatusOf(alice.Forward(forward_of(t)));
  }, C::kInvalidArgument, "inputs[0].shape: expected an element count that fits in int64");
  add("unknown dtype", [&] {
    v1::Tensor t = Floats({4, 32});
    t.set_dtype(static_cast<v1::DType>(999));
    return StatusOf(alice.Forward(forward_of(t)));
  }, C::kInvalidArgument, "inputs[0].dtype");
  add("two inputs for a one-input stack", [&] {
    v1::ForwardRequest r = forward_of(Floats({4, 32}));
    *r.add_inputs() = Floats({4, 32});
    return StatusOf(alice.Forward(r));
  }, C::kInvalidArgument, "inputs");
  add("unknown side input", [&] {
    v1::ForwardRequest r = forward_of(Floats({4, 32}));
    v1::NamedTensor* side = r.add_side_inputs();
    side->set_name("bogus");
    *side->mutable_tensor() = Floats({4});
    return StatusOf(alice.Forward(r));
  }, C::kInvalidArgument, "side_inputs");
  add("tokens at the limit + 1", [&] { return StatusOf(alice.Forward(forward_of(Floats({4097, 32})))); },
      C::kResourceExhausted, "inputs[0].shape: expected at most 4096 tokens per request (--max_tokens_per_request), got 4097");
  add("request over the message limit", [&] { return StatusOf(alice.Forward(forward_of(Floats({40000, 32})))); },
      C::kResourceExhausted, "");

  // Backward.
  add("unknown handle", [&] {
    v1::BackwardRequest r = good_backward;
    r.set_handle(987654321);
    return StatusOf(alice.Backward(r));
  }, C::kNotFound, "handle: no activation handle 987654321");
  add("consumed handle", [&] { return StatusOf(alice.Backward(good_backward)); }, C::kNotFound, "already used");
  add("grad of the wrong shape", [&] {
    v1::BackwardRequest r = good_backward;
    r.set_handle(pending->handle());
    *r.mutable_grad_outputs(0) = Floats({4, 31});
    return StatusOf(alice.Backward(r));
  }, C::kInvalidArgument, "grad_outputs[0]");
  add("no grads", [&] {
    v1::BackwardRequest r = good_backward;
    r.set_handle(pending->handle());
    r.clear_grad_outputs();
    return StatusOf(alice.Backward(r));
  }, C::kInvalidArgument, "grad_outputs");

  // ForwardBackward.
  add("no loss", [&] {
    v1::ForwardBackwardRequest r;
    r.set_session_id(id);
    *r.add_inputs() = Floats({4, 32});
    *r.mutable_target() = Floats({4, 32});
    return StatusOf(alice.ForwardBackward(r));
  }, C::kInvalidArgument, "loss");
  add("no target", [&] {
    v1::ForwardBackwardRequest r;
    r.set_session_id(id);
    r.mutable_loss()->mutable_mse();
    *r.add_inputs() = Floats({4, 32});
    return StatusOf(alice.ForwardBackward(r));
  }, C::kInvalidArgument, "target");
  add("target of the wrong shape", [&] {
    v1::ForwardBackwardRequest r;
    r.set_session_id(id);
    r.mutable_loss()->mutable_mse();
    *r.add_inputs() = Floats({4, 32});
    *r.mutable_target() = Floats({5, 32});
    return StatusOf(alice.ForwardBackward(r));
  }, C::kInvalidArgument, "target");

  // Parameters.
  add("unknown parameter", [&] {
    v1::GetParametersRequest r;
    r.set_session_id(id);
    r.add_names("nope.weight");
    return StatusOf(alice.GetParameters(r));
  }, C::kNotFound, "no parameter named 'nope.weight'");
  add("parameter named twice", [&] {
    v1::GetParametersRequest r;
    r.set_session_id(id);
    r.add_names(before->parameters(0).name());
    r.add_names(before->parameters(0).name());
    return StatusOf(alice.GetParameters(r));
  }, C::kInvalidArgument, "names[1]");
  add("200000-byte parameter name", [&] {
    v1::GetParametersRequest r;
    r.set_session_id(id);
    r.add_names(std::string(200000, 'p'));
    return StatusOf(alice.GetParameters(r));
  }, C::kNotFound, "(200000 bytes)");
  add("SetParameters wrong shape", [&] {
    v1::SetParametersRequest r;
    r.set_session_id(id);
    v1::NamedTensor* p = r.add_parameters();
    p->set_name(before->parameters(0).name());
    *p->mutable_tensor() = Floats({3});
    return alice.SetParameters(r);
  }, C::kInvalidArgument, "parameters");
  add("SetParameters INT64", [&] {
    v1::SetParametersRequest r;
    r.set_session_id(id);
    v1::NamedTensor* p = r.add_parameters();
    p->set_name(before->parameters(0).name());
    *p->mutable_tensor() = client::MakeInt64Tensor({1, 2}, {2});
    return alice.SetParameters(r);
  }, C::kInvalidArgument, "parameters[0].tensor");
  add("SetParameters unknown name", [&] {
    v1::SetParametersRequest r;
    r.set_session_id(id);
    v1::NamedTensor* p = r.add_parameters();
    p->set_name("ghost");
    *p->mutable_tensor() = Floats({2});
    return alice.SetParameters(r);
  }, C::kNotFound, "ghost");

  ASSERT_GE(cases.size(), 40u);
  for (const Case& c : cases) {
    const absl::Status status = c.call();
    EXPECT_EQ(status.code(), c.code) << c.name << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(c.fragment)) << c.name;
    EXPECT_LE(status.message().size(), 4096u) << c.name;
    for (const char* token : {kAlice, kBob}) {
      EXPECT_THAT(std::string(status.message()), ::testing::Not(HasSubstr(token))) << c.name;
    }
  }

  // The server still serves, and Alice's session is exactly as it was.
  EXPECT_EQ(*anonymous.Health(), "SERVING");
  absl::StatusOr<v1::GetParametersResponse> after = alice.GetParameters(all);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->SerializeAsString(), before->SerializeAsString());
  absl::StatusOr<v1::SessionInfo> info_after = alice.GetSession(id);
  ASSERT_TRUE(info_after.ok());
  EXPECT_EQ(info_after->step(), info_before->step());
  EXPECT_EQ(info_after->live_handles(), info_before->live_handles());
  absl::StatusOr<v1::ListSessionsResponse> listed = alice.ListSessions();
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->sessions_size(), 1);
  EXPECT_TRUE(alice.Forward(forward_of(Floats({4, 32}))).ok());
}

}  // namespace
}  // namespace teserve
