// ForwardBackward through the real server and the real client: MSE and cross-entropy
// losses and gradients against FP64 closed forms of a Linear model with known
// parameters; a GroupedLinear model fed m_splits as a side input, bit-identical to the
// in-process session; bad targets, labels and loss specs rejected with INVALID_ARGUMENT
// naming the field, leaving the session's gradients untouched.
#include <cmath>
#include <cstring>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "client/client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_server.h"
#include "train/session.h"

namespace teserve {
namespace {

constexpr int64_t kRows = 6;
constexpr int64_t kIn = 8;
constexpr int64_t kOut = 5;

std::vector<double> Floats(const v1::Tensor& t) {
  auto values = client::FloatsOf(t);
  EXPECT_TRUE(values.ok()) << values.status();
  return std::vector<double>(values->begin(), values->end());
}

void ExpectClose(const std::vector<double>& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], 1e-5 + 1e-5 * std::fabs(want[i])) << what << "[" << i << "]";
  }
}

class ForwardBackwardRpc : public ::testing::Test {
 protected:
  void SetUp() override {
    s_ = testing::StartLoopbackServer();
    ASSERT_NE(s_.server, nullptr);
    v1::CreateSessionRequest create;
    auto* fc = create.mutable_model()->add_layers();
    fc->set_name("fc");
    fc->mutable_linear()->set_in_features(kIn);
    fc->mutable_linear()->set_out_features(kOut);
    create.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
    auto created = s_.client->CreateSession(create);
    ASSERT_TRUE(created.ok()) << created.status();
    id_ = created->session_id();
    // Known parameters: W = 0.3 * noise, b = 0.1 * noise.
    w_ = testing::PseudoRandomFloats(kOut * kIn, 11);
    for (float& v : w_) v *= 0.3f;
    b_ = testing::PseudoRandomFloats(kOut, 12);
    for (float& v : b_) v *= 0.1f;
    v1::SetParametersRequest set;
    set.set_session_id(id_);
    auto* w = set.add_parameters();
    w->set_name("fc.weight");
    *w->mutable_tensor() = client::MakeFloatTensor(w_, {kOut, kIn});
    auto* b = set.add_parameters();
    b->set_name("fc.bias");
    *b->mutable_tensor() = client::MakeFloatTensor(b_, {kOut});
    ASSERT_TRUE(s_.client->SetParameters(set).ok());
    x_ = testing::PseudoRandomFloats(kRows * kIn, 13);
  }

  v1::ForwardBackwardRequest Request() const {
    v1::ForwardBackwardRequest request;
    request.set_session_id(id_);
    *request.add_inputs() = client::MakeFloatTensor(x_, {kRows, kIn});
    request.set_return_input_grad(true);
    request.set_return_outputs(true);
    return request;
  }

  // y = x W^T + b in FP64.
  std::vector<double> Logits() const {
    std::vector<double> y(kRows * kOut);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        double acc = b_[o];
        for (int64_t i = 0; i < kIn; ++i) acc += double(x_[r * kIn + i]) * w_[o * kIn + i];
        y[r * kOut + o] = acc;
      }
    }
    return y;
  }

  // Given dy, the closed-form dx = dy W, dW = dy^T x, db = column sums of dy.
  void ExpectGradients(const v1::ForwardBackwardResponse& response, const std::vector<double>& dy) {
    std::vector<double> dx(kRows * kIn, 0.0), dw(kOut * kIn, 0.0), db(kOut, 0.0);
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t o = 0; o < kOut; ++o) {
        db[o] += dy[r * kOut + o];
        for (int64_t i = 0; i < kIn; ++i) {
          dx[r * kIn + i] += dy[r * kOut + o] * w_[o * kIn + i];
          dw[o * kIn + i] += dy[r * kOut + o] * x_[r * kIn + i];
        }
      }
    }
    ASSERT_EQ(response.grad_inputs_size(), 1);
    ExpectClose(Floats(response.grad_inputs(0)), dx, "dx");
    v1::GetParametersRequest get;
    get.set_session_id(id_);
    get.set_include_grads(true);
    auto params = s_.client->GetParameters(get);
    ASSERT_TRUE(params.ok()) << params.status();
    ExpectClose(Floats(params->grads(0).tensor()), dw, "dW");
    ExpectClose(Floats(params->grads(1).tensor()), db, "db");
  }

  void ExpectGradientsZero() {
    v1::GetParametersRequest get;
    get.set_session_id(id_);
    get.set_include_grads(true);
    auto params = s_.client->GetParameters(get);
    ASSERT_TRUE(params.ok()) << params.status();
    for (const v1::NamedTensor& g : params->grads()) {
      for (double v : Floats(g.tensor())) ASSERT_EQ(v, 0.0) << g.name();
    }
  }

  testing::LoopbackServer s_;
  std::string id_;
  std::vector<float> w_, b_, x_;
};

TEST_F(ForwardBackwardRpc, MseLossAndGradientsMatchClosedForm) {
  const std::vector<float> target = testing::PseudoRandomFloats(kRows * kOut, 14);
  v1::ForwardBackwardRequest request = Request();
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() = client::MakeFloatTensor(target, {kRows, kOut});
  auto response = s_.client->ForwardBackward(request);
  ASSERT_TRUE(response.ok()) << response.status();

  const std::vector<double> y = Logits();
  const double n = kRows * kOut;
  double loss = 0.0;
  std::vector<double> dy(y.size());
  for (size_t k = 0; k < y.size(); ++k) {
    loss += (y[k] - target[k]) * (y[k] - target[k]) / n;
    dy[k] = 2.0 * (y[k] - target[k]) / n;
  }
  EXPECT_NEAR(response->loss(), loss, 1e-5 * loss);
  EXPECT_EQ(response->num_tokens(), kRows);
  ASSERT_EQ(response->outputs_size(), 1);
  ExpectClose(Floats(response->outputs(0)), y, "y");
  ExpectGradients(*response, dy);
}

TEST_F(ForwardBackwardRpc, CrossEntropyWithSmoothingAndIgnoredTokensMatchesClosedForm) {
  const std::vector<int64_t> labels{4, -100, 0, 2, -100, 1};
  const double s = 0.2;
  v1::ForwardBackwardRequest request = Request();
  request.mutable_loss()->mutable_cross_entropy()->set_label_smoothing(static_cast<float>(s));
  *request.mutable_target() = client::MakeInt64Tensor(labels, {kRows});
  request.set_return_outputs(false);
  auto response = s_.client->ForwardBackward(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->outputs_size(), 0);

  // -sum_j q_j log softmax_j with q = (1 - s) onehot + s / V, mean over the 4 kept tokens.
  const std::vector<double> y = Logits();
  const double valid = 4.0;
  double loss = 0.0;
  std::vector<double> dy(y.size(), 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    if (labels[r] == -100) continue;
    double z = 0.0;
    for (int64_t j = 0; j < kOut; ++j) z += std::exp(y[r * kOut + j]);
    for (int64_t j = 0; j < kOut; ++j) {
      const double p = std::exp(y[r * kOut + j]) / z;
      const double q = s / kOut + (j == labels[r] ? 1.0 - s : 0.0);
      loss -= q * std::log(p) / valid;
      dy[r * kOut + j] = (p - q) / valid;
    }
  }
  EXPECT_NEAR(response->loss(), loss, 1e-5 * loss);
  EXPECT_EQ(response->num_tokens(), 4);
  ExpectGradients(*response, dy);
}

TEST_F(ForwardBackwardRpc, Int32LabelsAndCustomIgnoreIndexAreAccepted) {
  v1::ForwardBackwardRequest request = Request();
  request.mutable_loss()->mutable_cross_entropy()->set_ignore_index(-1);
  std::vector<int32_t> labels{0, 1, -1, 3, 4, -1};
  request.mutable_target()->set_dtype(v1::INT32);
  request.mutable_target()->add_shape(kRows);
  request.mutable_target()->set_data(reinterpret_cast<const char*>(labels.data()), labels.size() * sizeof(int32_t));
  auto response = s_.client->ForwardBackward(request);
  ASSERT_TRUE(response.ok()) << response.status();
  EXPECT_EQ(response->num_tokens(), 4);
  EXPECT_GT(response->loss(), 0.0f);
}

struct BadRequest {
  std::string name;
  std::function<void(v1::ForwardBackwardRequest*)> mutate;
  std::string message;
};

class ForwardBackwardRpcBad : public ForwardBackwardRpc, public ::testing::WithParamInterface<BadRequest> {};

TEST_P(ForwardBackwardRpcBad, RejectedNamingTheFieldAndNothingChanges) {
  v1::ForwardBackwardRequest request = Request();
  request.mutable_loss()->mutable_cross_entropy();
  *request.mutable_target() = client::MakeInt64Tensor(std::vector<int64_t>{0, 1, 2, 3, 4, 0}, {kRows});
  GetParam().mutate(&request);
  auto response = s_.client->ForwardBackward(request);
  EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(response.status().message()), GetParam().message);
  ExpectGradientsZero();
  auto info = s_.client->GetSession(id_);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->live_handles(), 0);
}

void PrintTo(const BadRequest& c, std::ostream* os) { *os << c.name; }

INSTANTIATE_TEST_SUITE_P(
    Cases, ForwardBackwardRpcBad,
    ::testing::Values(
        BadRequest{"label_out_of_range",
                   [](v1::ForwardBackwardRequest* r) {
                     *r->mutable_target() = client::MakeInt64Tensor(std::vector<int64_t>{0, 1, 2, 5, 4, 0}, {kRows});
                   },
                   "target[3]: expected a class in [0, 5) or ignore_index -100, got 5"},
        BadRequest{"negative_label",
                   [](v1::ForwardBackwardRequest* r) {
                     *r->mutable_target() = client::MakeInt64Tensor(std::vector<int64_t>{0, 1, 2, 3, 4, -7}, {kRows});
                   },
                   "target[5]: expected a class in [0, 5) or ignore_index -100, got -7"},
        BadRequest{"label_shape",
                   [](v1::ForwardBackwardRequest* r) {
                     *r->mutable_target() = client::MakeInt64Tensor(std::vector<int64_t>{0, 1, 2}, {3});
                   },
                   "target.shape: expected [6] (the leading dimensions of the logits), got [3]"},
        BadRequest{"float_labels",
                   [](v1::ForwardBackwardRequest* r) {
                     *r->mutable_target() = client::MakeFloatTensor(std::vector<float>(kRows, 1.0f), {kRows});
                   },
                   "target.dtype: expected INT64 or INT32 (class labels), got FLOAT32"},
        BadRequest{"mse_target_shape",
                   [](v1::ForwardBackwardRequest* r) {
                     r->mutable_loss()->mutable_mse();
                     *r->mutable_target() = client::MakeFloatTensor(std::vector<float>(kRows * 4, 1.0f), {kRows, 4});
                   },
                   "target.shape: expected [6, 5] (the model output's shape), got [6, 4]"},
        BadRequest{"mse_int_target",
                   [](v1::ForwardBackwardRequest* r) { r->mutable_loss()->mutable_mse(); },
                   "target.dtype: expected FLOAT32 (an mse target; BFLOAT16 / FLOAT16 on the wire), got INT64"},
        BadRequest{"fp8_target",
                   [](v1::ForwardBackwardRequest* r) {
                     r->mutable_target()->set_dtype(v1::FLOAT8_E4M3);
                     r->mutable_target()->set_data(std::string(kRows, '\0'));
                   },
                   "target.dtype: expected one of FLOAT32, BFLOAT16, FLOAT16, INT32, INT64, BOOL, got FLOAT8_E4M3"},
        BadRequest{"target_data_length",
                   [](v1::ForwardBackwardRequest* r) { r->mutable_target()->set_data(std::string(7, '\0')); },
                   "target.data: expected 48 bytes (shape [6] x INT64), got 7"},
        BadRequest{"no_target", [](v1::ForwardBackwardRequest* r) { r->clear_target(); },
                   "target: expected a tensor, got none"},
        BadRequest{"no_loss", [](v1::ForwardBackwardRequest* r) { r->clear_loss(); },
                   "loss: expected one of mse, cross_entropy, got none"},
        BadRequest{"label_smoothing",
                   [](v1::ForwardBackwardRequest* r) {
                     r->mutable_loss()->mutable_cross_entropy()->set_label_smoothing(1.5f);
                   },
                   "loss.cross_entropy.label_smoothing: expected a value in [0, 1], got 1.5"},
        BadRequest{"input_width",
                   [](v1::ForwardBackwardRequest* r) {
                     *r->mutable_inputs(0) = client::MakeFloatTensor(std::vector<float>(kRows * 3, 0.0f), {kRows, 3});
                   },
                   "inputs[0].shape: expected last dimension 8 (in_features of layer 'fc'), got [6, 3]"}),
    [](const ::testing::TestParamInfo<BadRequest>& info) { return info.param.name; });

TEST(ForwardBackwardRpcGrouped, MSplitsSideInputAndParityWithTheInProcessSession) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  v1::CreateSessionRequest create;
  create.mutable_model()->set_seed(3);
  auto* moe = create.mutable_model()->add_layers();
  moe->set_name("experts");
  moe->mutable_grouped_linear()->set_num_gemms(3);
  moe->mutable_grouped_linear()->set_in_features(kIn);
  moe->mutable_grouped_linear()->set_out_features(kOut);
  create.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  auto created = s.client->CreateSession(create);
  ASSERT_TRUE(created.ok()) << created.status();
  ASSERT_EQ(created->info().layers(0).kind(), "GroupedLinear");
  EXPECT_EQ(created->info().layers(0).parameters(2), "experts.weight2");

  const std::vector<float> x = testing::PseudoRandomFloats(kRows * kIn, 21);
  const std::vector<int64_t> labels{1, 2, 3, 4, 0, 1};
  const std::vector<int64_t> splits{2, 0, 4};
  v1::ForwardBackwardRequest request;
  request.set_session_id(created->session_id());
  *request.add_inputs() = client::MakeFloatTensor(x, {kRows, kIn});
  request.mutable_loss()->mutable_cross_entropy()->set_label_smoothing(0.1f);
  *request.mutable_target() = client::MakeInt64Tensor(labels, {kRows});
  request.set_return_input_grad(true);

  auto missing = s.client->ForwardBackward(request);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(missing.status().message()),
            "side_inputs.m_splits: expected an INT64 tensor [3] (the group sizes of GroupedLinear layer 'experts'), "
            "got none");

  auto* side = request.add_side_inputs();
  side->set_name("m_splits");
  *side->mutable_tensor() = client::MakeInt64Tensor(std::vector<int64_t>{2, 0, 3}, {3});
  auto bad_sum = s.client->ForwardBackward(request);
  EXPECT_EQ(std::string(bad_sum.status().message()),
            "side_inputs.m_splits: expected group sizes summing to 6 (the token count of the input to layer "
            "'experts'), got 5");

  *side->mutable_tensor() = client::MakeInt64Tensor(splits, {3});
  auto response = s.client->ForwardBackward(request);
  ASSERT_TRUE(response.ok()) << response.status();

  // The same call in process gives the same bits.
  auto local = train::Session::Create(create.model(), create.recipe(), create.optimizer(), Context()).value();
  Tensor x_local = Tensor::FromFloats(x, {kRows, kIn}).value();
  Tensor labels_local = Tensor::Zeros(DType::kInt64, {kRows}).value();
  std::memcpy(labels_local.raw_data(), labels.data(), labels.size() * sizeof(int64_t));
  layers::SideInputs side_local;
  Tensor splits_local = Tensor::Zeros(DType::kInt64, {3}).value();
  std::memcpy(splits_local.raw_data(), splits.data(), splits.size() * sizeof(int64_t));
  side_local.Set("m_splits", splits_local);
  train::LossOptions loss;
  loss.kind = train::LossOptions::Kind::kCrossEntropy;
  loss.label_smoothing = 0.1f;
  auto want = local->ForwardBackward({x_local}, side_local, loss, labels_local, true, false).value();
  EXPECT_EQ(response->loss(), want.loss);
  EXPECT_EQ(response->num_tokens(), 6);
  ASSERT_EQ(response->grad_inputs_size(), 1);
  EXPECT_EQ(response->grad_inputs(0).data(),
            std::string(static_cast<const char*>(want.grad_inputs[0].raw_data()), want.grad_inputs[0].nbytes()));
  v1::GetParametersRequest get;
  get.set_session_id(created->session_id());
  get.set_include_grads(true);
  auto remote_grads = s.client->GetParameters(get);
  ASSERT_TRUE(remote_grads.ok());
  const std::vector<train::NamedTensor> local_grads = local->GetGradients({}).value();
  ASSERT_EQ(remote_grads->grads_size(), static_cast<int>(local_grads.size()));
  for (size_t i = 0; i < local_grads.size(); ++i) {
    EXPECT_EQ(remote_grads->grads(i).name(), local_grads[i].name);
    EXPECT_EQ(remote_grads->grads(i).tensor().data(),
              std::string(static_cast<const char*>(local_grads[i].tensor.raw_data()), local_grads[i].tensor.nbytes()))
        << local_grads[i].name;
  }
}

}  // namespace
}  // namespace teserve
