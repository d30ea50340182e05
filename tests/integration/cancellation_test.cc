// Calls abandoned mid-computation against the real server binary: a Forward,
// ForwardBackward or Backward whose deadline passes (or that the client cancels) while a
// deep stack computes stops between layers and leaves its session as if the call had
// never come. Two sessions of one spec on one server: A sees the abandoned calls, B
// does not; after the same normal training that follows, their parameters, gradients
// and scaling state are equal bit for bit.
#include <signal.h>

#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

// Long enough sequences that one Forward takes a good fraction of a second on the CPU
// backend, in four TransformerLayers (nine check points per pass).
constexpr int64_t kSeq = 256, kBatch = 2, kHidden = 64, kLayers = 4;

std::vector<float> Floats(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = normal(rng);
  return values;
}

v1::Tensor Activations(uint64_t seed) {
  return client::MakeFloatTensor(Floats(kSeq * kBatch * kHidden, seed), {kSeq, kBatch, kHidden});
}

v1::CreateSessionRequest Spec() {
  v1::CreateSessionRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_seed(3);
  for (int i = 0; i < kLayers; ++i) {
    v1::LayerSpec* layer = model->add_layers();
    layer->set_name(absl::StrCat("block", i));
    v1::TransformerLayerSpec* t = layer->mutable_transformer_layer();
    t->set_hidden_size(kHidden);
    t->set_ffn_hidden_size(4 * kHidden);
    t->set_num_attention_heads(4);
    t->set_hidden_dropout(0.1f);     // random-stream counters are part of the state
    t->set_attention_dropout(0.1f);
  }
  v1::LayerSpec* head = model->add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(kHidden);
  head->mutable_linear()->set_out_features(kHidden);
  request.mutable_recipe()->mutable_delayed()->set_amax_history_len(4);
  request.mutable_optimizer()->mutable_adamw()->set_lr(1e-3f);
  return request;
}

v1::ForwardRequest ForwardOf(const std::string& id, uint64_t seed) {
  v1::ForwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = Activations(seed);
  return request;
}

v1::ForwardBackwardRequest ForwardBackwardOf(const std::string& id, uint64_t seed) {
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() = Activations(seed);
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() = Activations(seed + 1000);
  return request;
}

v1::BackwardRequest BackwardOf(const std::string& id, uint64_t handle, uint64_t seed) {
  v1::BackwardRequest request;
  request.set_session_id(id);
  request.set_handle(handle);
  *request.add_grad_outputs() = Activations(seed);
  return request;
}

// Parameters and gradients of both sessions, equal byte for byte.
void ExpectSameParametersAndGradients(client::Client& c, const std::string& a, const std::string& b) {
  v1::GetParametersRequest request;
  request.set_include_grads(true);
  request.set_session_id(a);
  absl::StatusOr<v1::GetParametersResponse> pa = c.GetParameters(request);
  request.set_session_id(b);
  absl::StatusOr<v1::GetParametersResponse> pb = c.GetParameters(request);
  ASSERT_TRUE(pa.ok() && pb.ok()) << pa.status() << " " << pb.status();
  ASSERT_EQ(pa->parameters_size(), pb->parameters_size());
  ASSERT_GT(pa->parameters_size(), 0);
  for (int i = 0; i < pa->parameters_size(); ++i) {
    EXPECT_EQ(pa->parameters(i).name(), pb->parameters(i).name());
    EXPECT_TRUE(pa->parameters(i).tensor().data() == pb->parameters(i).tensor().data()) << pa->parameters(i).name();
    EXPECT_TRUE(pa->grads(i).tensor().data() == pb->grads(i).tensor().data()) << "grad of " << pa->grads(i).name();
  }
}

void ExpectSameScaling(client::Client& c, const std::string& a, const std::string& b) {
  absl::StatusOr<v1::QuantizationState> qa = c.GetQuantizationState(a);
  absl::StatusOr<v1::QuantizationState> qb = c.GetQuantizationState(b);
  ASSERT_TRUE(qa.ok() && qb.ok());
  ASSERT_EQ(qa->tensors_size(), qb->tensors_size());
  for (int i = 0; i < qa->tensors_size(); ++i) {
    const std::string what = absl::StrCat(qa->tensors(i).layer(), ".", qa->tensors(i).tensor());
    EXPECT_EQ(qa->tensors(i).scale(), qb->tensors(i).scale()) << what;
    EXPECT_EQ(qa->tensors(i).quantize_calls(), qb->tensors(i).quantize_calls()) << what;
    ASSERT_EQ(qa->tensors(i).amax_history_size(), qb->tensors(i).amax_history_size());
    for (int j = 0; j < qa->tensors(i).amax_history_size(); ++j) {
      EXPECT_EQ(qa->tensors(i).amax_history(j), qb->tensors(i).amax_history(j)) << what << " slot " << j;
    }
  }
}

int64_t LiveHandles(client::Client& c, const std::string& id) {
  absl::StatusOr<v1::SessionInfo> info = c.GetSession(id);  // waits for the session's lock
  EXPECT_TRUE(info.ok()) << info.status();
  return info.ok() ? info->live_handles() : -1;
}

TEST(Cancellation, AbandonedCallsLeaveTheSessionAsIfTheyNeverCame) {
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start({}, testing::TempPath("cancellation.log"))) << server.Log();
  client::Client c(server.address());
  absl::StatusOr<v1::CreateSessionResponse> created_a = c.CreateSession(Spec());
  absl::StatusOr<v1::CreateSessionResponse> created_b = c.CreateSession(Spec());
  ASSERT_TRUE(created_a.ok() && created_b.ok()) << created_a.status() << " " << created_b.status();
  const std::string a = created_a->session_id(), b = created_b->session_id();

  // One step on both (optimizer state and scaling history exist), timing the calls.
  absl::Duration forward_took = absl::InfiniteDuration(), backward_took = absl::InfiniteDuration();
  for (const std::string& id : {a, b}) {
    absl::Time start = absl::Now();
    absl::StatusOr<v1::ForwardResponse> out = c.Forward(ForwardOf(id, 1));
    ASSERT_TRUE(out.ok()) << out.status();
    forward_took = std::min(forward_took, absl::Now() - start);
    start = absl::Now();
    ASSERT_TRUE(c.Backward(BackwardOf(id, out->handle(), 2)).ok());
    backward_took = std::min(backward_took, absl::Now() - start);
    ASSERT_TRUE(c.Step(id, /*zero_grad=*/true).ok());
  }
  ExpectSameParametersAndGradients(c, a, b);
  if (forward_took < absl::Milliseconds(100) || backward_took < absl::Milliseconds(100)) {
    GTEST_SKIP() << "a Forward takes only " << forward_took << " and a Backward " << backward_took
                 << " here; too fast to abandon one between layers";
  }
  std::printf("Forward %s, Backward %s\n", absl::FormatDuration(forward_took).c_str(),
              absl::FormatDuration(backward_took).c_str());

  // A client whose deadline passes a fifth of the way in: the server notices at the next
  // check point, stops and undoes the call.
  client::ClientOptions hasty_options;
  hasty_options.rpc_timeout = forward_took / 5;
  client::Client hasty(server.address(), hasty_options);

  absl::StatusOr<v1::ForwardResponse> abandoned_forward = hasty.Forward(ForwardOf(a, 3));
  EXPECT_EQ(abandoned_forward.status().code(), absl::StatusCode::kDeadlineExceeded) << abandoned_forward.status();
  EXPECT_EQ(LiveHandles(c, a), 0) << "an abandoned Forward leaves no handle";

  absl::StatusOr<v1::ForwardBackwardResponse> abandoned_fb = hasty.ForwardBackward(ForwardBackwardOf(a, 4));
  EXPECT_EQ(abandoned_fb.status().code(), absl::StatusCode::kDeadlineExceeded) << abandoned_fb.status();

  // A Forward the client cancels itself.
  {
    grpc::ClientContext context;
    v1::ForwardResponse response;
    std::thread canceller([&] {
      absl::SleepFor(forward_took / 5);
      context.TryCancel();
    });
    const grpc::Status status = c.stub().Forward(&context, ForwardOf(a, 5), &response);
    canceller.join();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::CANCELLED) << status.error_message();
  }
  EXPECT_EQ(LiveHandles(c, a), 0);

  // A Backward abandoned midway keeps its handle (the session is as before the call), so
  // the client can run it again.
  absl::StatusOr<v1::ForwardResponse> fa = c.Forward(ForwardOf(a, 6));
  absl::StatusOr<v1::ForwardResponse> fb = c.Forward(ForwardOf(b, 6));
  ASSERT_TRUE(fa.ok() && fb.ok());
  client::ClientOptions hasty_backward_options;
  hasty_backward_options.rpc_timeout = backward_took / 5;
  client::Client hasty_backward(server.address(), hasty_backward_options);
  absl::StatusOr<v1::BackwardResponse> abandoned_backward = hasty_backward.Backward(BackwardOf(a, fa->handle(), 7));
  EXPECT_EQ(abandoned_backward.status().code(), absl::StatusCode::kDeadlineExceeded) << abandoned_backward.status();
  EXPECT_EQ(LiveHandles(c, a), 1) << "the abandoned Backward's handle stays pending";
  ExpectSameParametersAndGradients(c, a, b);  // B has not run its Backward either
  ASSERT_TRUE(c.Backward(BackwardOf(a, fa->handle(), 7)).ok());
  ASSERT_TRUE(c.Backward(BackwardOf(b, fb->handle(), 7)).ok());
  EXPECT_EQ(LiveHandles(c, a), 0);

  // The same normal training on both from here: equal bit for bit.
  for (const std::string& id : {a, b}) ASSERT_TRUE(c.Step(id, /*zero_grad=*/true).ok());
  for (const std::string& id : {a, b}) ASSERT_TRUE(c.ForwardBackward(ForwardBackwardOf(id, 8)).ok());
  ExpectSameParametersAndGradients(c, a, b);
  for (const std::string& id : {a, b}) ASSERT_TRUE(c.Step(id, /*zero_grad=*/false).ok());
  ExpectSameParametersAndGradients(c, a, b);
  ExpectSameScaling(c, a, b);
  absl::StatusOr<v1::SessionInfo> info_a = c.GetSession(a);
  absl::StatusOr<v1::SessionInfo> info_b = c.GetSession(b);
  ASSERT_TRUE(info_a.ok() && info_b.ok());
  EXPECT_EQ(info_a->step(), 3);
  EXPECT_EQ(info_a->step(), info_b->step());

  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(20)), 0) << server.Log();
}

}  // namespace
}  // namespace teserve
