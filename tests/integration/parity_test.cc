// Forward / Backward / Step through gRPC equal the same computation done in-process
// with train::Session, bit for bit: the wire must add nothing and lose nothing.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "client/demo.h"
#include "core/context.h"
#include "core/tensor.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"
#include "train/session.h"

namespace teserve {
namespace {

// Wire bytes equal the in-process tensor's bytes, shape and (FP32) dtype.
void ExpectSameBits(const v1::Tensor& wire, const Tensor& local, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(wire.dtype(), v1::FLOAT32);
  ASSERT_EQ(local.dtype(), DType::kFloat32);
  ASSERT_EQ(std::vector<int64_t>(wire.shape().begin(), wire.shape().end()), local.shape());
  ASSERT_EQ(static_cast<int64_t>(wire.data().size()), local.nbytes());
  EXPECT_EQ(std::memcmp(wire.data().data(), local.raw_data(), wire.data().size()), 0)
      << "bytes differ";
}

void ExpectSameNamed(const google::protobuf::RepeatedPtrField<v1::NamedTensor>& wire,
                     const std::vector<train::NamedTensor>& local, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(wire.size()), local.size()) << what;
  for (size_t i = 0; i < local.size(); ++i) {
    EXPECT_EQ(wire[i].name(), local[i].name);
    ExpectSameBits(wire[i].tensor(), local[i].tensor, what + " " + local[i].name);
  }
}

class Parity : public ::testing::TestWithParam<bool> {};

TEST_P(Parity, ForwardBackwardStepMatchInProcessBitForBit) {
  const bool fp8 = GetParam();
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  const v1::CreateSessionRequest spec = client::DemoSessionRequest(42, 0.05f, fp8, 1e-2f);

  absl::StatusOr<v1::CreateSessionResponse> remote = s.client->CreateSession(spec);
  ASSERT_TRUE(remote.ok()) << remote.status();
  const std::string id = remote->session_id();
  auto local_or = train::Session::Create(spec.model(), spec.recipe(), spec.optimizer(),
                                         Context::Cpu());
  ASSERT_TRUE(local_or.ok()) << local_or.status();
  std::unique_ptr<train::Session> local = std::move(*local_or);

  // Several steps, so delayed scaling's history and AdamW's moments come into play, and
  // a batch shape with leading dims that must survive the wire ([3, 5, 32]).
  const std::vector<int64_t> in_shape = {3, 5, 32};
  const std::vector<int64_t> out_shape = {3, 5, 32};
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(step);
    const std::vector<float> x = testing::PseudoRandomFloats(3 * 5 * 32, 100 + step);
    const std::vector<float> dy = testing::PseudoRandomFloats(3 * 5 * 32, 200 + step);

    v1::ForwardRequest forward;
    forward.set_session_id(id);
    *forward.add_inputs() = client::MakeFloatTensor(x, in_shape);
    absl::StatusOr<v1::ForwardResponse> y_remote = s.client->Forward(forward);
    ASSERT_TRUE(y_remote.ok()) << y_remote.status();
    auto x_local = Tensor::FromFloats(x, in_shape);
    ASSERT_TRUE(x_local.ok());
    auto y_local = local->Forward({*x_local}, /*save_for_backward=*/true);
    ASSERT_TRUE(y_local.ok()) << y_local.status();
    ASSERT_EQ(y_remote->outputs_size(), 1);
    ExpectSameBits(y_remote->outputs(0), y_local->outputs[0], "forward output");

    v1::BackwardRequest backward;
    backward.set_session_id(id);
    backward.set_handle(y_remote->handle());
    *backward.add_grad_outputs() = client::MakeFloatTensor(dy, out_shape);
    absl::StatusOr<v1::BackwardResponse> dx_remote = s.client->Backward(backward);
    ASSERT_TRUE(dx_remote.ok()) << dx_remote.status();
    auto dy_local = Tensor::FromFloats(dy, out_shape);
    ASSERT_TRUE(dy_local.ok());
    auto dx_local = local->Backward(y_local->handle, {*dy_local});
    ASSERT_TRUE(dx_local.ok()) << dx_local.status();
    ASSERT_EQ(dx_remote->grad_inputs_size(), 1);
    ExpectSameBits(dx_remote->grad_inputs(0), (*dx_local)[0], "input gradient");

    v1::GetParametersRequest get;
    get.set_session_id(id);
    get.set_include_grads(true);
    absl::StatusOr<v1::GetParametersResponse> remote_params = s.client->GetParameters(get);
    ASSERT_TRUE(remote_params.ok()) << remote_params.status();
    auto local_grads = local->GetGradients({});
    ASSERT_TRUE(local_grads.ok()) << local_grads.status();
    ExpectSameNamed(remote_params->grads(), *local_grads, "parameter gradient");

    absl::StatusOr<v1::StepResponse> step_remote = s.client->Step(id, /*zero_grad=*/true);
    ASSERT_TRUE(step_remote.ok()) << step_remote.status();
    auto step_local = local->Step();
    ASSERT_TRUE(step_local.ok()) << step_local.status();
    ASSERT_TRUE(local->ZeroGrad().ok());
    EXPECT_EQ(step_remote->step(), step_local->step);
    const float remote_norm = step_remote->grad_norm();
    EXPECT_EQ(std::memcmp(&remote_norm, &step_local->grad_norm, sizeof(float)), 0);

    get.set_include_grads(false);
    remote_params = s.client->GetParameters(get);
    ASSERT_TRUE(remote_params.ok()) << remote_params.status();
    auto local_params = local->GetParameters({});
    ASSERT_TRUE(local_params.ok()) << local_params.status();
    ExpectSameNamed(remote_params->parameters(), *local_params, "parameter after step");
  }

  // The scaling state went through the same history.
  absl::StatusOr<v1::QuantizationState> remote_state = s.client->GetQuantizationState(id);
  ASSERT_TRUE(remote_state.ok()) << remote_state.status();
  const std::vector<train::QuantizerReport> local_state = local->QuantizationState();
  ASSERT_EQ(static_cast<size_t>(remote_state->tensors_size()), local_state.size());
  EXPECT_EQ(local_state.empty(), !fp8);
  for (size_t i = 0; i < local_state.size(); ++i) {
    const v1::QuantizedTensorState& r = remote_state->tensors(static_cast<int>(i));
    EXPECT_EQ(r.layer(), local_state[i].layer);
    EXPECT_EQ(r.tensor(), local_state[i].tensor);
    EXPECT_EQ(r.amax(), local_state[i].amax);
    EXPECT_EQ(r.scale(), local_state[i].scale);
    EXPECT_EQ(r.scale_inv(), local_state[i].scale_inv);
    EXPECT_EQ(std::vector<float>(r.amax_history().begin(), r.amax_history().end()),
              local_state[i].amax_history);
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, Parity, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("DelayedScalingFp8")
                                             : std::string("HighPrecision");
                         });

}  // namespace
}  // namespace teserve
