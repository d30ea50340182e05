// Interrupted training calls (train/session.h, "Interruption"): a Forward, Backward,
// ForwardBackward or Step stopped at any of its check points leaves the session bit for
// bit as a session that never saw the call (parameters, gradients, optimizer state,
// quantizer state, random-stream counters, handles), under every recipe (and BF16
// params_dtype), with gradients zero and mid-accumulation; and the call then runs normally (an interrupted Backward's
// handle included).
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/recipe_specs.h"
#include "layers/init.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSeq = 16, kBatch = 2, kHidden = 32;

Tensor Random(Shape shape, uint64_t seed) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, 1.0f, t.mutable_floats());
  return t;
}

// Stops at its `stop_at`-th check (1-based) and counts the checks it was asked.
class StopAt final : public Interruption {
 public:
  explicit StopAt(int stop_at) : stop_at_(stop_at) {}
  absl::Status Check(absl::string_view pass, absl::string_view next) const override {
    if (++checks_ != stop_at_) return absl::OkStatus();
    return absl::CancelledError(absl::StrCat("stopped at check ", checks_, ": ", pass, " / ", next));
  }
  int checks() const { return checks_; }

 private:
  const int stop_at_;
  mutable int checks_ = 0;
};

// Two TransformerLayers with attention and hidden dropout (random-stream counters) and
// a Linear head: check points between the layers and between each block's attention and
// MLP.
v1::ModelSpec Model() {
  v1::ModelSpec spec;
  spec.set_seed(11);
  for (const char* name : {"block0", "block1"}) {
    v1::LayerSpec* block = spec.add_layers();
    block->set_name(name);
    v1::TransformerLayerSpec* t = block->mutable_transformer_layer();
    t->set_hidden_size(kHidden);
    t->set_ffn_hidden_size(64);
    t->set_num_attention_heads(2);
    t->set_hidden_dropout(0.1f);
    t->set_attention_dropout(0.1f);
  }
  v1::LayerSpec* head = spec.add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(kHidden);
  head->mutable_linear()->set_out_features(kHidden);
  return spec;
}

v1::RecipeSpec Recipe(const std::string& name) { return testing_util::RecipeSpecNamed(name); }

// `param`: a recipe name, with "/bf16" for params_dtype BFLOAT16 on every layer.
std::unique_ptr<Session> Make(const std::string& param) {
  const bool bf16 = absl::EndsWith(param, "/bf16");
  const std::string recipe = bf16 ? param.substr(0, param.size() - 5) : param;
  v1::ModelSpec model = Model();
  if (bf16) {
    for (v1::LayerSpec& layer : *model.mutable_layers()) layer.set_params_dtype(v1::BFLOAT16);
  }
  v1::OptimizerSpec optimizer;
  optimizer.mutable_adamw()->set_lr(0.01f);
  optimizer.set_max_grad_norm(1.0f);
  auto s = Session::Create(model, Recipe(recipe), optimizer, Context::Cpu());
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

Tensor Input(int step) { return Random({kSeq, kBatch, kHidden}, 100 + step); }
Tensor Target(int step) { return Random({kSeq, kBatch, kHidden}, 200 + step); }

absl::Status Accumulate(Session& s, int step, const Interruption* interruption = nullptr) {
  return s.ForwardBackward({Input(step)}, layers::SideInputs(), LossOptions(), Target(step), false, false,
                           interruption)
      .status();
}

// Every tensor of the two sessions' states is bitwise equal, and so are their handles.
void ExpectSameState(const Session& a, const Session& b, const std::string& where) {
  const SessionState sa = a.CaptureState().value();
  const SessionState sb = b.CaptureState().value();
  EXPECT_EQ(sa.step, sb.step) << where;
  const std::pair<const std::vector<NamedTensor>*, const std::vector<NamedTensor>*> groups[] = {
      {&sa.parameters, &sb.parameters}, {&sa.gradients, &sb.gradients},
      {&sa.optimizer, &sb.optimizer}, {&sa.state, &sb.state}};
  for (const auto& [ga, gb] : groups) {
    ASSERT_EQ(ga->size(), gb->size()) << where;
    for (size_t i = 0; i < ga->size(); ++i) {
      ASSERT_EQ((*ga)[i].name, (*gb)[i].name) << where;
      EXPECT_TRUE(BitwiseEqual((*ga)[i].tensor, (*gb)[i].tensor)) << where << ": " << (*ga)[i].name;
    }
  }
  EXPECT_EQ(a.Summary().live_handles, b.Summary().live_handles) << where;
}

// `call` on `a` with StopAt(1), StopAt(2), ... until it runs through: each stopped
// attempt must leave `a` equal to `b`, which never sees it. Then `call` on `b` without
// an interruption: both equal again. Returns how many check points the call has.
int InterruptEverywhere(Session& a, Session& b,
                        const std::function<absl::Status(Session&, const Interruption*)>& call,
                        const std::string& what) {
  int points = 0;
  for (int n = 1; n < 100; ++n) {
    StopAt stop(n);
    const absl::Status status = call(a, &stop);
    if (status.ok()) {
      points = n - 1;
      break;
    }
    EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(absl::StrCat("stopped at check ", n)));
    ExpectSameState(a, b, absl::StrCat(what, " stopped at check ", n));
  }
  const absl::Status reference = call(b, nullptr);
  EXPECT_TRUE(reference.ok()) << what << ": " << reference;
  ExpectSameState(a, b, absl::StrCat(what, " after it ran"));
  return points;
}

class InterruptionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InterruptionTest, EveryCallStoppedAnywhereLeavesTheSessionAsBefore) {
  auto a = Make(GetParam());
  auto b = Make(GetParam());
  // A first step, so that optimizer state and scaling history exist.
  for (Session* s : {a.get(), b.get()}) {
    ASSERT_TRUE(Accumulate(*s, 0).ok());
    ASSERT_TRUE(s->Step(/*zero_grad=*/true).ok());
  }
  ExpectSameState(*a, *b, "after the first step");

  // ForwardBackward into zero gradients, then mid-accumulation (undone from a copy).
  int points = InterruptEverywhere(
      *a, *b, [](Session& s, const Interruption* i) { return Accumulate(s, 1, i); }, "ForwardBackward (zero grads)");
  EXPECT_GE(points, 6) << "pre-check, 2 between layers, 2 in blocks, after forward, ..., after backward";
  InterruptEverywhere(
      *a, *b, [](Session& s, const Interruption* i) { return Accumulate(s, 2, i); }, "ForwardBackward (accumulating)");

  // Forward saving activations: no handle appears until one runs through.
  uint64_t handle_a = 0, handle_b = 0;
  InterruptEverywhere(
      *a, *b,
      [&](Session& s, const Interruption* i) -> absl::Status {
        auto r = s.Forward({Input(3)}, /*save_for_backward=*/true, layers::SideInputs(), i);
        if (!r.ok()) return r.status();
        (&s == a.get() ? handle_a : handle_b) = r->handle;
        return absl::OkStatus();
      },
      "Forward");
  ASSERT_EQ(a->Summary().live_handles, 1);
  // Backward, accumulating onto the gradients of step 2: an interrupted one leaves its
  // handle pending, and running it again gives the uninterrupted gradients.
  const Tensor grad = Random({kSeq, kBatch, kHidden}, 300);
  InterruptEverywhere(
      *a, *b,
      [&](Session& s, const Interruption* i) {
        return s.Backward(&s == a.get() ? handle_a : handle_b, {grad}, nullptr, i).status();
      },
      "Backward");
  EXPECT_EQ(a->Summary().live_handles, 0);

  // Step with zero_grad: stopped before the update, nothing changes; else all of it.
  points = InterruptEverywhere(
      *a, *b, [](Session& s, const Interruption* i) { return s.Step(/*zero_grad=*/true, i).status(); }, "Step");
  EXPECT_EQ(points, 2) << "after the wait for the session lock, after the gradient norm";
  EXPECT_EQ(a->Summary().step, 2);

  // And they train on alike.
  for (Session* s : {a.get(), b.get()}) {
    ASSERT_TRUE(Accumulate(*s, 4).ok());
    ASSERT_TRUE(s->Step(/*zero_grad=*/true).ok());
  }
  ExpectSameState(*a, *b, "after the last step");
}

INSTANTIATE_TEST_SUITE_P(Recipes, InterruptionTest,
                         ::testing::Values("none", "delayed", "current", "mxfp8", "block", "nvfp4", "none/bf16",
                                           "delayed/bf16"));

// Without an Interruption nothing is asked and the results are the same as with one
// that never stops.
TEST(Interruption, AbsentOrSilentGiveTheSameResults) {
  auto a = Make("delayed");
  auto b = Make("delayed");
  StopAt never(0);
  for (int step = 0; step < 3; ++step) {
    ASSERT_TRUE(Accumulate(*a, step).ok());
    ASSERT_TRUE(Accumulate(*b, step, &never).ok());
    ASSERT_TRUE(a->Step(true).ok());
    ASSERT_TRUE(b->Step(true, &never).ok());
  }
  EXPECT_GT(never.checks(), 0);
  ExpectSameState(*a, *b, "after three steps");
}

}  // namespace
}  // namespace train
}  // namespace teserve
