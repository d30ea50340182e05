#include "layers/spec.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace teserve {
namespace layers {
namespace {

v1::ModelSpec ValidModel() {
  v1::ModelSpec spec;
  spec.add_layers()->mutable_layer_norm()->set_hidden_size(16);
  auto* fc = spec.add_layers();
  fc->set_name("fc");
  fc->mutable_linear()->set_in_features(16);
  fc->mutable_linear()->set_out_features(8);
  spec.add_layers()->mutable_rms_norm()->set_hidden_size(8);
  return spec;
}

TEST(BuildStack, BuildsNamedLayersAndParameters) {
  auto stack = BuildStack(ValidModel(), recipes::Recipe());
  ASSERT_TRUE(stack.ok()) << stack.status();
  ASSERT_EQ((*stack)->modules().size(), 3u);
  EXPECT_EQ((*stack)->modules()[0]->name(), "layers.0");
  EXPECT_EQ((*stack)->modules()[1]->name(), "fc");
  std::vector<std::string> names;
  for (Parameter* p : (*stack)->Parameters()) names.push_back(p->name);
  EXPECT_THAT(names, testing::ElementsAre("layers.0.weight", "layers.0.bias", "fc.weight", "fc.bias",
                                          "layers.2.weight"));
}

TEST(BuildStack, SameSeedSameParameters) {
  auto a = BuildStack(ValidModel(), recipes::Recipe()).value();
  auto b = BuildStack(ValidModel(), recipes::Recipe()).value();
  EXPECT_TRUE(BitwiseEqual(a->Parameters()[2]->value, b->Parameters()[2]->value));
  v1::ModelSpec other = ValidModel();
  other.set_seed(1);
  auto c = BuildStack(other, recipes::Recipe()).value();
  EXPECT_FALSE(BitwiseEqual(a->Parameters()[2]->value, c->Parameters()[2]->value));
}

struct BadSpec {
  std::string name;
  std::function<void(v1::ModelSpec*)> mutate;
  absl::StatusCode code;
  std::string message;
};

class BuildStackErrors : public testing::TestWithParam<BadSpec> {};

TEST_P(BuildStackErrors, NamesTheField) {
  v1::ModelSpec spec = ValidModel();
  GetParam().mutate(&spec);
  auto stack = BuildStack(spec, recipes::Recipe());
  EXPECT_EQ(stack.status().code(), GetParam().code);
  EXPECT_THAT(std::string(stack.status().message()), testing::HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BuildStackErrors,
    testing::Values(
        BadSpec{"Empty", [](v1::ModelSpec* s) { s->clear_layers(); }, absl::StatusCode::kInvalidArgument,
                "model.layers: expected at least one layer, got none"},
        BadSpec{"NoKind", [](v1::ModelSpec* s) { s->add_layers(); }, absl::StatusCode::kInvalidArgument,
                "model.layers[3]: expected one of linear, layer_norm, rms_norm, layer_norm_linear, "
                "layer_norm_mlp, dot_product_attention, multihead_attention, transformer_layer, grouped_linear, "
                "got no layer kind set"},
        BadSpec{"ZeroInFeatures",
                [](v1::ModelSpec* s) { s->mutable_layers(1)->mutable_linear()->set_in_features(0); },
                absl::StatusCode::kInvalidArgument,
                "model.layers[1].linear.in_features: expected a size in 1..16777216, got 0"},
        BadSpec{"ZeroHidden", [](v1::ModelSpec* s) { s->mutable_layers(0)->mutable_layer_norm()->set_hidden_size(0); },
                absl::StatusCode::kInvalidArgument,
                "model.layers[0].layer_norm.hidden_size: expected a size in 1..16777216, got 0"},
        BadSpec{"NegativeOut",
                [](v1::ModelSpec* s) { s->mutable_layers(1)->mutable_linear()->set_out_features(-5); },
                absl::StatusCode::kInvalidArgument, "model.layers[1].linear.out_features: expected a size"},
        BadSpec{"WidthMismatch",
                [](v1::ModelSpec* s) { s->mutable_layers(2)->mutable_rms_norm()->set_hidden_size(9); },
                absl::StatusCode::kInvalidArgument,
                "model.layers[2].rms_norm.hidden_size: expected 8 (the output width of layer 'fc'), got 9"},
        BadSpec{"DuplicateName", [](v1::ModelSpec* s) { s->mutable_layers(0)->set_name("fc"); },
                absl::StatusCode::kInvalidArgument, "model.layers[1].name: expected a name unique within the model"},
        BadSpec{"BadEps", [](v1::ModelSpec* s) { s->mutable_layers(0)->mutable_layer_norm()->set_eps(-1); },
                absl::StatusCode::kInvalidArgument, "model.layers[0].layer_norm.eps: expected a finite value > 0"},
        BadSpec{"ReturnBiasNotLast", [](v1::ModelSpec* s) { s->mutable_layers(1)->mutable_linear()->set_return_bias(true); },
                absl::StatusCode::kInvalidArgument, "model.layers[1].linear.return_bias"},
        BadSpec{"TooManyParameters",
                [](v1::ModelSpec* s) {
                  s->clear_layers();
                  for (int i = 0; i < 2; ++i) {
                    auto* l = s->add_layers()->mutable_linear();
                    l->set_in_features(1 << 16);
                    l->set_out_features(1 << 16);
                  }
                },
                absl::StatusCode::kResourceExhausted, "model: expected at most 4294967296 parameters"}),
    [](const testing::TestParamInfo<BadSpec>& info) { return info.param.name; });

}  // namespace
}  // namespace layers
}  // namespace teserve
