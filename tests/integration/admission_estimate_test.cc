// The CreateSession memory admission counts every parameter a session creates
// (server/limits.h, EstimateSessionMemory), for every layer kind and the options that
// add parameters: the q / k norms (qk_norm_type RMSNorm, LayerNorm) and the learnable
// softmax offset of attention blocks were once left out (found by
// tests/fuzz/spec_fuzzer). Its refusal message prints any estimate, also the negative
// ones of specs with negative sizes, which admission sees before the session rejects
// them (a cast of such a double to int64 was undefined behaviour, also found by
// spec_fuzzer).
#include <cstdint>
#include <string>
#include <vector>

#include "core/context.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/limits.h"
#include "teserve/v1/model.pb.h"
#include "train/session.h"

namespace teserve {
namespace {

struct Case {
  std::string name;
  v1::ModelSpec model;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* qk_norm : {"", "RMSNorm", "LayerNorm", "L2Normalization"}) {
    for (const char* softmax : {"vanilla", "learnable"}) {
      Case mha{std::string("mha_") + qk_norm + "_" + softmax, {}};
      auto* a = mha.model.add_layers()->mutable_multihead_attention();
      a->set_hidden_size(32);
      a->set_num_attention_heads(4);
      a->set_input_layernorm(true);
      a->set_qk_norm_type(qk_norm);
      a->set_softmax_type(softmax);
      cases.push_back(mha);
      for (const char* type : {"encoder", "decoder"}) {
        Case tl{std::string("transformer_") + type + "_" + qk_norm + "_" + softmax, {}};
        auto* t = tl.model.add_layers()->mutable_transformer_layer();
        t->set_hidden_size(32);
        t->set_ffn_hidden_size(64);
        t->set_num_attention_heads(4);
        t->set_num_gqa_groups(2);
        t->set_layer_type(type);
        t->set_qk_norm_type(qk_norm);
        t->set_softmax_type(softmax);
        cases.push_back(tl);
      }
    }
  }
  Case dpa{"dot_product_attention_learnable", {}};
  auto* d = dpa.model.add_layers()->mutable_dot_product_attention();
  d->set_num_attention_heads(4);
  d->set_kv_channels(8);
  d->set_softmax_type("learnable");
  cases.push_back(dpa);
  Case mlp{"layernorm_mlp_swiglu", {}};
  mlp.model.add_layers()->mutable_layer_norm_mlp()->set_hidden_size(32);
  mlp.model.mutable_layers(0)->mutable_layer_norm_mlp()->set_ffn_hidden_size(64);
  mlp.model.mutable_layers(0)->mutable_layer_norm_mlp()->set_activation("swiglu");
  cases.push_back(mlp);
  Case grouped{"grouped_linear", {}};
  auto* g = grouped.model.add_layers()->mutable_grouped_linear();
  g->set_num_gemms(3);
  g->set_in_features(32);
  g->set_out_features(16);
  cases.push_back(grouped);
  return cases;
}

TEST(AdmissionEstimate, CountsEveryParameterTheSessionCreates) {
  v1::OptimizerSpec optimizer;
  optimizer.mutable_adamw()->set_lr(0.01f);
  for (const Case& c : Cases()) {
    auto session = train::Session::Create(c.model, v1::RecipeSpec(), optimizer, Context::Cpu());
    ASSERT_TRUE(session.ok()) << c.name << ": " << session.status();
    const server::MemoryEstimate estimate = server::EstimateSessionMemory(c.model, optimizer, 256, 1 << 20);
    const int64_t actual = (*session)->Summary().num_parameters;
    EXPECT_GE(estimate.parameters, static_cast<double>(actual)) << c.name;
    EXPECT_GE(estimate.parameter_bytes + estimate.gradient_bytes, 8.0 * actual) << c.name;
  }
}

TEST(AdmissionEstimate, RefusalsPrintEstimatesOutsideInt64) {
  v1::ModelSpec model;
  v1::LinearSpec* linear = model.add_layers()->mutable_linear();
  linear->set_in_features(int64_t{1} << 62);
  linear->set_out_features(-3);
  v1::OptimizerSpec optimizer;
  optimizer.mutable_sgd()->set_lr(0.1f);
  const server::MemoryEstimate estimate = server::EstimateSessionMemory(model, optimizer, 256, 1 << 20);
  ASSERT_LT(estimate.parameters, -9.3e18);
  const absl::Status refused = server::AdmitSession(estimate, int64_t{64} << 20, 0, -1, 256);
  ASSERT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("-1.38e+19 parameters"));
}

}  // namespace
}  // namespace teserve
