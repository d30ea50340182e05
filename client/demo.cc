#include "client/demo.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace teserve {
namespace client {
namespace {

constexpr int64_t kIn = 32;
constexpr int64_t kHidden = 64;
constexpr int64_t kOut = 32;
// The teacher's Linear init; large enough that the targets are O(1) while the student
// starts from TE's 0.023, so the loss starts high and has far to fall.
constexpr float kTeacherInitStd = 0.3f;
// Student and teacher must never share parameter seeds.
constexpr uint64_t kTeacherSeedOffset = 0x7eac4e5;

absl::Status Annotated(const absl::Status& status, absl::string_view what) {
  return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
}

struct Batch {
  v1::Tensor inputs;
  std::vector<float> targets;
};

}  // namespace

const std::vector<std::string>& DemoRecipeNames() {
  static const auto* names =
      new std::vector<std::string>{"delayed", "current", "mxfp8", "block", "nvfp4"};
  return *names;
}

void SetParamsDType(v1::ModelSpec* model, v1::DType params_dtype) {
  if (params_dtype == v1::FLOAT32) return;
  for (v1::LayerSpec& layer : *model->mutable_layers()) layer.set_params_dtype(params_dtype);
}

absl::StatusOr<v1::DType> ParseParamsDType(absl::string_view text) {
  if (text == "float32" || text == "fp32") return v1::FLOAT32;
  if (text == "bfloat16" || text == "bf16") return v1::BFLOAT16;
  if (text == "float16" || text == "fp16") return v1::FLOAT16;
  return absl::InvalidArgumentError(
      absl::StrCat("--params_dtype: expected float32, bfloat16 or float16, got '", text, "'"));
}

absl::StatusOr<v1::CreateSessionRequest> DemoSessionRequestFor(uint64_t seed, float init_std,
                                                               absl::string_view recipe,
                                                               float lr) {
  v1::CreateSessionRequest request;
  v1::ModelSpec* model = request.mutable_model();
  model->set_seed(seed);
  auto add = [model](const char* name) {
    v1::LayerSpec* layer = model->add_layers();
    layer->set_name(name);
    return layer;
  };
  add("norm1")->mutable_layer_norm()->set_hidden_size(kIn);
  v1::LinearSpec* fc1 = add("fc1")->mutable_linear();
  fc1->set_in_features(kIn);
  fc1->set_out_features(kHidden);
  fc1->set_init_std(init_std);
  add("norm2")->mutable_rms_norm()->set_hidden_size(kHidden);
  v1::LinearSpec* fc2 = add("fc2")->mutable_linear();
  fc2->set_in_features(kHidden);
  fc2->set_out_features(kOut);
  fc2->set_init_std(init_std);

  v1::RecipeSpec* spec = request.mutable_recipe();
  if (recipe == "delayed") {
    v1::DelayedScaling* delayed = spec->mutable_delayed();
    delayed->set_fp8_format(v1::HYBRID);
    delayed->set_amax_history_len(16);
    delayed->set_amax_compute_algo("max");
  } else if (recipe == "current") {
    spec->mutable_current()->set_fp8_format(v1::HYBRID);
  } else if (recipe == "mxfp8") {
    spec->mutable_mxfp8();  // E4M3 everywhere (TE's default)
  } else if (recipe == "block") {
    spec->mutable_block();  // 1x128 activations/gradients, 128x128 weights, E4M3
  } else if (recipe == "nvfp4") {
    spec->mutable_nvfp4();  // RHT, stochastic rounding and 16x16 weight blocks on
  } else if (recipe.empty()) {
    request.clear_recipe();  // high precision (FP32) everywhere
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("recipe: expected one of ", absl::StrJoin(DemoRecipeNames(), ", "),
                     ", got '", recipe, "'"));
  }
  v1::AdamW* adamw = request.mutable_optimizer()->mutable_adamw();
  adamw->set_lr(lr);
  adamw->set_weight_decay(0.0f);
  return request;
}

v1::CreateSessionRequest DemoSessionRequest(uint64_t seed, float init_std, bool fp8, float lr) {
  return *DemoSessionRequestFor(seed, init_std, fp8 ? "delayed" : "", lr);
}

absl::StatusOr<DemoResult> RunDemo(Client& client, const DemoOptions& options) {
  if (options.steps < 1 || options.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("demo: expected steps >= 1 and batch >= 1, got ",
                                                   options.steps, " and ", options.batch));
  }
  absl::StatusOr<v1::CreateSessionRequest> student_request =
      DemoSessionRequestFor(options.seed, 0.023f, options.recipe, options.lr);
  if (!student_request.ok()) return Annotated(student_request.status(), "demo");
  SetParamsDType(student_request->mutable_model(), options.params_dtype);
  std::vector<std::string> sessions;
  absl::Cleanup delete_sessions = [&client, &sessions] {
    for (const std::string& id : sessions) client.DeleteSession(id).IgnoreError();
  };

  absl::StatusOr<v1::CreateSessionResponse> teacher = client.CreateSession(DemoSessionRequest(
      options.seed + kTeacherSeedOffset, kTeacherInitStd, /*fp8=*/false, options.lr));
  if (!teacher.ok()) return Annotated(teacher.status(), "creating the teacher session");
  sessions.push_back(teacher->session_id());
  absl::StatusOr<v1::CreateSessionResponse> student = client.CreateSession(*student_request);
  if (!student.ok()) return Annotated(student.status(), "creating the student session");
  sessions.push_back(student->session_id());
  const std::string& student_id = student->session_id();

  std::mt19937_64 rng(options.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = options.batch;
  std::vector<float> x(static_cast<size_t>(rows * kIn));

  DemoResult result;
  for (int step = 1; step <= options.steps; ++step) {
    for (float& v : x) v = normal(rng);
    v1::ForwardRequest teacher_forward;
    teacher_forward.set_session_id(teacher->session_id());
    teacher_forward.set_no_grad(true);
    *teacher_forward.add_inputs() = MakeFloatTensor(x, {rows, kIn});
    absl::StatusOr<v1::ForwardResponse> targets_response = client.Forward(teacher_forward);
    if (!targets_response.ok()) return Annotated(targets_response.status(), "teacher Forward");
    absl::StatusOr<std::vector<float>> targets = FloatsOf(targets_response->outputs(0));
    if (!targets.ok()) return Annotated(targets.status(), "teacher output");

    v1::ForwardRequest forward;
    forward.set_session_id(student_id);
    *forward.add_inputs() = MakeFloatTensor(x, {rows, kIn});
    absl::StatusOr<v1::ForwardResponse> forward_response = client.Forward(forward);
    if (!forward_response.ok()) return Annotated(forward_response.status(), "student Forward");
    if (forward_response->outputs_size() != 1) {
      return absl::InternalError(absl::StrCat("student Forward: expected 1 output, got ",
                                              forward_response->outputs_size()));
    }
    absl::StatusOr<std::vector<float>> y = FloatsOf(forward_response->outputs(0));
    if (!y.ok()) return Annotated(y.status(), "student output");
    if (y->size() != targets->size()) {
      return absl::InternalError(absl::StrCat("student output: expected ", targets->size(),
                                              " values, got ", y->size()));
    }

    // MSE over every element; accumulate in double so the printed loss is exact enough
    // to compare steps.
    const double n = static_cast<double>(y->size());
    double loss = 0.0;
    std::vector<float> grad(y->size());
    for (size_t i = 0; i < y->size(); ++i) {
      const double diff = static_cast<double>((*y)[i]) - (*targets)[i];
      loss += diff * diff;
      grad[i] = static_cast<float>(2.0 * diff / n);
    }
    loss /= n;
    result.losses.push_back(static_cast<float>(loss));
    if (options.log != nullptr) {
      *options.log << absl::StrFormat("step %d loss %.6g\n", step, loss) << std::flush;
    }

    v1::BackwardRequest backward;
    backward.set_session_id(student_id);
    backward.set_handle(forward_response->handle());
    *backward.add_grad_outputs() = MakeFloatTensor(grad, {rows, kOut});
    absl::StatusOr<v1::BackwardResponse> backward_response = client.Backward(backward);
    if (!backward_response.ok()) return Annotated(backward_response.status(), "Backward");
    absl::StatusOr<v1::StepResponse> step_response = client.Step(student_id, /*zero_grad=*/true);
    if (!step_response.ok()) return Annotated(step_response.status(), "Step");
  }

  absl::StatusOr<v1::QuantizationState> state = client.GetQuantizationState(student_id);
  if (!state.ok()) return Annotated(state.status(), "GetQuantizationState");
  result.quantization = *std::move(state);
  return result;
}

std::string FormatQuantizationTable(const v1::QuantizationState& state) {
  bool health = false;
  // The layer column is as wide as the longest name ("block1.self_attention.layernorm_qkv").
  int layer_width = 8;
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    health |= t.has_health();
    layer_width = std::max(layer_width, static_cast<int>(t.layer().size()));
  }
  std::string out = absl::StrFormat(
      "%-*s %-12s %-8s %-12s %-10s %-10s %12s %12s %12s %12s %12s %12s", layer_width, "layer", "tensor",
      "recipe", "format", "mode", "execution", "amax", "scale", "scale_inv", "bsi_min",
      "bsi_max", "bsi_mean");
  if (health) {
    absl::StrAppendFormat(&out, " %10s %10s %12s %9s", "underflow", "overflow", "mse",
                          "dyn_range");
  }
  out += "\n";
  for (const v1::QuantizedTensorState& t : state.tensors()) {
    absl::StrAppendFormat(&out, "%-*s %-12s %-8s %-12s %-10s %-10s %12.6g %12.6g %12.6g",
                          layer_width, t.layer(), t.tensor(), t.recipe(), v1::DType_Name(t.format()),
                          t.scaling_mode(), t.execution(), t.amax(), t.scale(), t.scale_inv());
    if (t.has_block_scale_inv()) {
      absl::StrAppendFormat(&out, " %12.6g %12.6g %12.6g", t.block_scale_inv().min(),
                            t.block_scale_inv().max(), t.block_scale_inv().mean());
    } else {
      absl::StrAppendFormat(&out, " %12s %12s %12s", "-", "-", "-");
    }
    if (health && t.has_health()) {
      absl::StrAppendFormat(&out, " %10.4g %10.4g %12.6g %9.3g", t.health().underflow_ratio(),
                            t.health().overflow_ratio(), t.health().mse(),
                            t.health().dynamic_range());
    } else if (health) {
      absl::StrAppendFormat(&out, " %10s %10s %12s %9s", "-", "-", "-", "-");
    }
    out += "\n";
  }
  return out;
}

}  // namespace client
}  // namespace teserve
