// Bad input over gRPC: each case gets its exact status code and a message that names the
// field and says expected vs got; afterwards the server still serves and the session's
// parameters (and gradients) are bitwise unchanged.
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRows = 4;
constexpr int64_t kIn = 32;
constexpr int64_t kOut = 32;

class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = testing::StartLoopbackServer();
    ASSERT_NE(s_.server, nullptr);
    auto created = s_.client->CreateSession(client::DemoSessionRequest(7, 0.05f, true, 1e-2f));
    ASSERT_TRUE(created.ok()) << created.status();
    id_ = created->session_id();
    // One full step so parameters, gradients and scaling state are not at their defaults.
    auto forward = s_.client->Forward(GoodForward());
    ASSERT_TRUE(forward.ok()) << forward.status();
    auto backward = s_.client->Backward(GoodBackward(forward->handle()));
    ASSERT_TRUE(backward.ok()) << backward.status();
    ASSERT_TRUE(s_.client->Step(id_).ok());
    before_ = Snapshot();
  }

  // Every bad call ends here: the server answers health checks and a good Forward, and
  // neither parameters nor gradients moved.
  void TearDown() override {
    if (s_.server == nullptr || HasFatalFailure()) return;
    absl::StatusOr<std::string> health = s_.client->Health();
    ASSERT_TRUE(health.ok()) << health.status();
    EXPECT_EQ(*health, "SERVING");
    v1::ForwardRequest forward = GoodForward();
    forward.set_no_grad(true);
    EXPECT_TRUE(s_.client->Forward(forward).ok());
    const v1::GetParametersResponse after = Snapshot();
    ASSERT_EQ(after.parameters_size(), before_.parameters_size());
    for (int i = 0; i < after.parameters_size(); ++i) {
      EXPECT_EQ(after.parameters(i).SerializeAsString(),
                before_.parameters(i).SerializeAsString())
          << "parameter " << after.parameters(i).name() << " changed";
      EXPECT_EQ(after.grads(i).SerializeAsString(), before_.grads(i).SerializeAsString())
          << "gradient " << after.grads(i).name() << " changed";
    }
    auto sessions = s_.client->ListSessions();
    ASSERT_TRUE(sessions.ok());
    EXPECT_EQ(sessions->sessions_size(), 1);
  }

  v1::ForwardRequest GoodForward() const {
    v1::ForwardRequest request;
    request.set_session_id(id_);
    *request.add_inputs() =
        client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kIn, 1), {kRows, kIn});
    return request;
  }
  v1::BackwardRequest GoodBackward(uint64_t handle) const {
    v1::BackwardRequest request;
    request.set_session_id(id_);
    request.set_handle(handle);
    *request.add_grad_outputs() =
        client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * kOut, 2), {kRows, kOut});
    return request;
  }
  v1::GetParametersResponse Snapshot() {
    v1::GetParametersRequest request;
    request.set_session_id(id_);
    request.set_include_grads(true);
    auto response = s_.client->GetParameters(request);
    EXPECT_TRUE(response.ok()) << response.status();
    return response.ok() ? *response : v1::GetParametersResponse();
  }
  v1::Tensor& FirstInput(v1::ForwardRequest& request) { return *request.mutable_inputs(0); }

  testing::LoopbackServer s_;
  std::string id_;
  v1::GetParametersResponse before_;
};

template <typename T>
absl::Status StatusOf(const absl::StatusOr<T>& result) {
  return result.status();
}
absl::Status StatusOf(const absl::Status& status) { return status; }

#define EXPECT_REJECTED(call, expected_code, ...)                                      \
  do {                                                                                 \
    const absl::Status status_ = StatusOf(call);                                       \
    EXPECT_EQ(status_.code(), absl::StatusCode::expected_code) << status_;             \
    for (const char* fragment_ : {__VA_ARGS__}) {                                      \
      EXPECT_THAT(std::string(status_.message()), HasSubstr(fragment_));               \
    }                                                                                  \
  } while (0)

TEST_F(BadInput, WrongDtype) {
  v1::ForwardRequest request = GoodForward();
  FirstInput(request).set_dtype(v1::INT32);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, got INT32");
  FirstInput(request).set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, "
                  "got DTYPE_UNSPECIFIED");
  FirstInput(request).set_dtype(static_cast<v1::DType>(42));  // from a newer client
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument, "inputs[0].dtype: expected",
                  "got 42 (not a teserve.v1.DType)");
  v1::BackwardRequest backward = GoodBackward(12345);
  backward.mutable_grad_outputs(0)->set_dtype(v1::FLOAT8_E4M3);
  EXPECT_REJECTED(s_.client->Backward(backward), kInvalidArgument,
                  "grad_outputs[0].dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, got "
                  "FLOAT8_E4M3");
}

TEST_F(BadInput, BadSideInputs) {
  v1::ForwardRequest request = GoodForward();
  v1::NamedTensor* side = request.add_side_inputs();
  side->set_name("attention_mask_typo");
  *side->mutable_tensor() = client::MakeFloatTensor({1.0f}, {1});
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "side_inputs.attention_mask_typo: expected a side input name, one of attention_mask,",
                  "got 'attention_mask_typo'");
  side->set_name("encoder_output");
  side->mutable_tensor()->set_dtype(v1::FLOAT8_E4M3);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "side_inputs.encoder_output.dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, INT32, INT64, "
                  "BOOL, got FLOAT8_E4M3");
  side->mutable_tensor()->set_dtype(v1::INT64);  // 4 bytes of data for one INT64
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "side_inputs.encoder_output.data: expected 8 bytes (shape [1] x INT64), got 4");
  side->mutable_tensor()->set_dtype(v1::FLOAT32);
  *request.add_side_inputs() = *side;
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "side_inputs.encoder_output: expected each name once, got a repeated name");
}

TEST_F(BadInput, WrongShape) {
  v1::ForwardRequest request = GoodForward();
  *request.mutable_inputs(0) =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * 31, 3), {kRows, 31});
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument, "inputs[0]", "expected",
                  "32", "got", "31");
  // A second input where the model takes one.
  request = GoodForward();
  *request.add_inputs() = request.inputs(0);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument, "inputs", "expected 1",
                  "got 2");
  // Backward with a gradient that does not match the forward output.
  auto forward = s_.client->Forward(GoodForward());
  ASSERT_TRUE(forward.ok()) << forward.status();
  v1::BackwardRequest backward = GoodBackward(forward->handle());
  *backward.mutable_grad_outputs(0) =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kRows * 15, 4), {kRows, 15});
  EXPECT_REJECTED(s_.client->Backward(backward), kInvalidArgument, "grad_outputs[0]",
                  "expected", "got");
}

TEST_F(BadInput, DataLengthNotShapeTimesDtypeSize) {
  v1::ForwardRequest request = GoodForward();
  FirstInput(request).mutable_data()->resize(kRows * kIn * 4 - 4);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].data: expected 512 bytes (shape [4, 32] x FLOAT32), got 508");
  // The same bytes declared as BF16 are twice too many.
  request = GoodForward();
  FirstInput(request).set_dtype(v1::BFLOAT16);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].data: expected 256 bytes (shape [4, 32] x BFLOAT16), got 512");
}

TEST_F(BadInput, NegativeOrOverflowingDims) {
  v1::ForwardRequest request = GoodForward();
  FirstInput(request).set_shape(0, -4);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].shape[0]: expected a non-negative dimension, got -4");
  FirstInput(request).set_shape(0, int64_t{1} << 40);
  FirstInput(request).set_shape(1, int64_t{1} << 40);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].shape: expected an element count that fits in int64, got "
                  "[1099511627776, 1099511627776]");
  // The count fits, the byte size does not.
  FirstInput(request).set_shape(0, int64_t{1} << 62);
  FirstInput(request).set_shape(1, 1);
  EXPECT_REJECTED(s_.client->Forward(request), kInvalidArgument,
                  "inputs[0].shape: expected a size that fits in int64 bytes of FLOAT32, got "
                  "[4611686018427387904, 1]");
}

TEST_F(BadInput, UnknownSession) {
  const std::string ghost = "0123456789abcdef";
  v1::ForwardRequest forward = GoodForward();
  forward.set_session_id(ghost);
  const char* message = "session_id: no session '0123456789abcdef'";
  EXPECT_REJECTED(s_.client->Forward(forward), kNotFound, message);
  v1::BackwardRequest backward = GoodBackward(1);
  backward.set_session_id(ghost);
  EXPECT_REJECTED(s_.client->Backward(backward), kNotFound, message);
  EXPECT_REJECTED(s_.client->Step(ghost), kNotFound, message);
  EXPECT_REJECTED(s_.client->ZeroGrad(ghost), kNotFound, message);
  EXPECT_REJECTED(s_.client->GetSession(ghost), kNotFound, message);
  EXPECT_REJECTED(s_.client->GetQuantizationState(ghost), kNotFound, message);
  EXPECT_REJECTED(s_.client->DeleteSession(ghost), kNotFound, message);
  EXPECT_REJECTED(s_.client->GetSession(""), kInvalidArgument,
                  "session_id: expected the id CreateSession returned, got an empty string");
}

// A 200,000-character id: the real code with a short message (the id quoted truncated),
// not gRPC's metadata-limit RESOURCE_EXHAUSTED; the server keeps serving (TearDown).
TEST_F(BadInput, HugeUnknownSessionId) {
  const std::string ghost(200000, 'f');
  for (absl::Status status :
       {StatusOf(s_.client->GetSession(ghost)), StatusOf(s_.client->Step(ghost)),
        StatusOf(s_.client->DeleteSession(ghost)), StatusOf(s_.client->GetQuantizationState(ghost))}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status.message().substr(0, 300);
    EXPECT_LT(status.message().size(), 1024u);
    EXPECT_THAT(std::string(status.message()), HasSubstr("session_id: no session 'ffff"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("...' (200000 bytes)"));
  }
  v1::ForwardRequest forward = GoodForward();
  forward.set_session_id(ghost);
  const absl::Status status = StatusOf(s_.client->Forward(forward));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(status.message().size(), 1024u);
}

TEST_F(BadInput, HugeParameterName) {
  v1::GetParametersRequest request;
  request.set_session_id(id_);
  request.add_names(std::string(200000, 'p'));
  const absl::Status status = StatusOf(s_.client->GetParameters(request));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_LT(status.message().size(), 1024u);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no parameter named 'ppp"));
}

TEST_F(BadInput, RepeatedParameterNames) {
  const std::string name = before_.parameters(0).name();
  v1::GetParametersRequest request;
  request.set_session_id(id_);
  for (int i = 0; i < 3; ++i) request.add_names(before_.parameters(i % before_.parameters_size()).name());
  request.add_names(name);
  const std::string expected =
      absl::StrCat("names[3]: expected each parameter at most once, got '", name, "' again");
  EXPECT_REJECTED(s_.client->GetParameters(request), kInvalidArgument, expected.c_str());
  // The attack from issue 25: one name 60,000 times is refused at the second.
  request.clear_names();
  for (int i = 0; i < 60000; ++i) request.add_names(name);
  request.set_include_grads(true);
  EXPECT_REJECTED(s_.client->GetParameters(request), kInvalidArgument, "names[1]: expected each parameter");
}

TEST_F(BadInput, BackwardWithUnknownHandle) {
  EXPECT_REJECTED(s_.client->Backward(GoodBackward(999)), kNotFound,
                  "handle: no activation handle 999");
  EXPECT_REJECTED(s_.client->Backward(GoodBackward(0)), kNotFound, "handle");
}

TEST_F(BadInput, BackwardWithUsedHandle) {
  // The first Backward of this handle is good and accumulates gradients; the snapshot
  // is retaken so that only the second, rejected one is checked.
  auto forward = s_.client->Forward(GoodForward());
  ASSERT_TRUE(forward.ok()) << forward.status();
  ASSERT_TRUE(s_.client->Backward(GoodBackward(forward->handle())).ok());
  before_ = Snapshot();
  EXPECT_REJECTED(s_.client->Backward(GoodBackward(forward->handle())), kNotFound, "handle",
                  "already used");
}

TEST_F(BadInput, EmptyModelSpec) {
  v1::CreateSessionRequest request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  request.mutable_model()->clear_layers();
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "model.layers: expected at least one layer, got none");
}

TEST_F(BadInput, ZeroSizedLayers) {
  v1::CreateSessionRequest request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  request.mutable_model()->mutable_layers(1)->mutable_linear()->set_out_features(0);
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "model.layers[1].linear.out_features", "expected", "got 0");
  request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  request.mutable_model()->mutable_layers(0)->mutable_layer_norm()->set_hidden_size(0);
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "model.layers[0].layer_norm.hidden_size", "expected", "got 0");
}

TEST_F(BadInput, UnknownRecipeFields) {
  v1::CreateSessionRequest request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  request.mutable_recipe()->GetReflection()->MutableUnknownFields(request.mutable_recipe())
      ->AddVarint(99, 1);
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "recipe: unknown field number 99 (not in teserve.v1.RecipeSpec; is the "
                  "client newer than the server?)");
  // A recipe message from a newer schema, alone in the oneof.
  request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  request.mutable_recipe()->clear_delayed();
  request.mutable_recipe()->GetReflection()->MutableUnknownFields(request.mutable_recipe())
      ->AddLengthDelimited(20, "");
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "recipe: unknown field number 20");
  // Nested: a field inside DelayedScaling, and one inside a layer of the model.
  request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  v1::DelayedScaling* delayed = request.mutable_recipe()->mutable_delayed();
  delayed->GetReflection()->MutableUnknownFields(delayed)->AddFixed32(7, 0);
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "recipe.delayed: unknown field number 7 (not in teserve.v1.DelayedScaling");
  request = client::DemoSessionRequest(1, 0.05f, true, 1e-2f);
  v1::LinearSpec* linear = request.mutable_model()->mutable_layers(3)->mutable_linear();
  linear->GetReflection()->MutableUnknownFields(linear)->AddVarint(30, 1);
  EXPECT_REJECTED(s_.client->CreateSession(request), kInvalidArgument,
                  "model.layers[3].linear: unknown field number 30 (not in "
                  "teserve.v1.LinearSpec");
}

TEST_F(BadInput, SetParametersIsAllOrNothing) {
  v1::SetParametersRequest request;
  request.set_session_id(id_);
  // A valid first tensor, then one with a short buffer: nothing may be written.
  const v1::NamedTensor& first = before_.parameters(0);
  v1::NamedTensor* good = request.add_parameters();
  good->set_name(first.name());
  std::vector<float> values(first.tensor().data().size() / 4, 0.5f);
  *good->mutable_tensor() = client::MakeFloatTensor(
      values, {first.tensor().shape().begin(), first.tensor().shape().end()});
  v1::NamedTensor* bad = request.add_parameters();
  *bad = before_.parameters(1);
  bad->mutable_tensor()->mutable_data()->pop_back();
  EXPECT_REJECTED(s_.client->SetParameters(request), kInvalidArgument,
                  "parameters[1].tensor.data: expected");
  bad->mutable_tensor()->set_dtype(v1::INT64);
  EXPECT_REJECTED(s_.client->SetParameters(request), kInvalidArgument,
                  "parameters[1].tensor.dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, "
                  "got INT64");
  bad->set_name("no.such.parameter");
  *bad->mutable_tensor() = before_.parameters(1).tensor();
  EXPECT_REJECTED(s_.client->SetParameters(request), kNotFound, "no.such.parameter");
}

}  // namespace
}  // namespace teserve

namespace teserve {
namespace {

// A reply can't exceed the server's --max_message_bytes: GetParameters sizes it first and
// refuses with RESOURCE_EXHAUSTED naming both numbers; a reply of exactly the limit goes.
TEST(ReplyLimit, GetParametersIsSizedBeforeItIsBuilt) {
  v1::GetParametersRequest all;
  int64_t reply_bytes = 0;
  {
    testing::LoopbackServer big = testing::StartLoopbackServer();
    ASSERT_NE(big.server, nullptr);
    auto created = big.client->CreateSession(client::DemoSessionRequest(7, 0.05f, true, 1e-2f));
    ASSERT_TRUE(created.ok()) << created.status();
    all.set_session_id(created->session_id());
    all.set_include_grads(true);
    auto reply = big.client->GetParameters(all);
    ASSERT_TRUE(reply.ok()) << reply.status();
    reply_bytes = static_cast<int64_t>(reply->ByteSizeLong());
    ASSERT_GT(reply_bytes, 4096);
  }
  for (const int64_t limit : {reply_bytes, reply_bytes - 1}) {
    server::ServerOptions options = testing::LoopbackOptions();
    options.max_message_bytes = limit;
    testing::LoopbackServer s = testing::StartLoopbackServer(options);
    ASSERT_NE(s.server, nullptr);
    auto created = s.client->CreateSession(client::DemoSessionRequest(7, 0.05f, true, 1e-2f));
    ASSERT_TRUE(created.ok()) << created.status();
    all.set_session_id(created->session_id());
    auto reply = s.client->GetParameters(all);
    if (limit == reply_bytes) {
      ASSERT_TRUE(reply.ok()) << "a reply of exactly the limit is sent: " << reply.status();
      EXPECT_EQ(static_cast<int64_t>(reply->ByteSizeLong()), reply_bytes);
    } else {
      EXPECT_EQ(reply.status().code(), absl::StatusCode::kResourceExhausted) << reply.status();
      EXPECT_THAT(std::string(reply.status().message()),
                  HasSubstr(absl::StrCat("the reply would be ", reply_bytes,
                                         " bytes, over the server's message limit of ", limit,
                                         " bytes (--max_message_bytes)")));
      // Without the gradients it fits, and the server keeps serving.
      all.set_include_grads(false);
      EXPECT_TRUE(s.client->GetParameters(all).ok());
      all.set_include_grads(true);
      absl::StatusOr<std::string> health = s.client->Health();
      ASSERT_TRUE(health.ok()) << health.status();
    }
  }
}

}  // namespace
}  // namespace teserve
