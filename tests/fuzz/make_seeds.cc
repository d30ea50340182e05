// Writes the seed corpora of the fuzz targets (corpus/<target>/seed-*), deterministically:
//   bazel run //tests/fuzz:make_seeds -- "$PWD/tests/fuzz/corpus"
// Each seed is a valid input that gets far: a CreateSessionRequest per model of
// fuzz_models.h (spec_fuzzer); per model a Forward, Backward, ForwardBackward,
// SetParameters and GetParameters request (request_fuzzer); checkpoints of small trained
// sessions in checkpoint_fuzzer's format, and their safetensors files
// (safetensors_fuzzer). Inputs fuzzing found and that once failed live beside them as
// regression-* files; this tool leaves those alone.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/context.h"
#include "google/protobuf/util/json_util.h"
#include "server/tensor_codec.h"
#include "teserve/v1/checkpoint.pb.h"
#include "teserve/v1/service.pb.h"
#include "tests/fuzz/fuzz_models.h"
#include "tests/fuzz/fuzz_support.h"
#include "train/checkpoint.h"
#include "train/session.h"

namespace teserve {
namespace {

namespace fs = std::filesystem;

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out.good()) {
    std::fprintf(stderr, "make_seeds: cannot write %s\n", (dir / name).c_str());
    std::exit(1);
  }
}

template <typename T>
T Must(absl::StatusOr<T> value, const std::string& what) {
  if (!value.ok()) {
    std::fprintf(stderr, "make_seeds: %s: %s\n", what.c_str(), value.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*value);
}

void MustOk(const absl::Status& status, const std::string& what) {
  if (!status.ok()) {
    std::fprintf(stderr, "make_seeds: %s: %s\n", what.c_str(), status.ToString().c_str());
    std::exit(1);
  }
}

std::unique_ptr<train::Session> NewSession(const v1::CreateSessionRequest& r) {
  return Must(train::Session::Create(r.model(), r.recipe(), r.optimizer(), Context::Cpu()), "Create");
}

std::string RequestSeed(int rpc, int model, const google::protobuf::Message& message) {
  std::string out;
  out.push_back(static_cast<char>(rpc));
  out.push_back(static_cast<char>(model));
  out += message.SerializeAsString();
  return out;
}

void RequestSeeds(const fs::path& dir) {
  for (int i = 0; i < fuzz::kNumModels; ++i) {
    const v1::ForwardRequest forward = fuzz::ValidForward(i);
    Write(dir, absl::StrCat("seed-forward-m", i), RequestSeed(0, i, forward));

    auto session = NewSession(fuzz::ModelRequest(i));
    std::vector<Tensor> inputs = Must(server::DecodeFloatTensors(forward.inputs(), "inputs"), "decode");
    layers::SideInputs side = Must(server::DecodeSideInputs(forward.side_inputs()), "decode side");
    train::ForwardResult result = Must(session->Forward(inputs, true, side), absl::StrCat("Forward of model ", i));

    v1::BackwardRequest backward;
    backward.set_handle(result.handle);
    for (const Tensor& out : result.outputs) MustOk(server::EncodeTensor(out, backward.add_grad_outputs()), "encode");
    Write(dir, absl::StrCat("seed-backward-m", i), RequestSeed(1, i, backward));

    v1::ForwardBackwardRequest fb;
    *fb.mutable_inputs() = forward.inputs();
    *fb.mutable_side_inputs() = forward.side_inputs();
    fb.mutable_loss()->mutable_mse();
    MustOk(server::EncodeTensor(result.outputs[0], fb.mutable_target()), "encode");
    fb.set_return_input_grad(true);
    fb.set_return_outputs(i % 2 == 0);
    Write(dir, absl::StrCat("seed-forward_backward-m", i), RequestSeed(2, i, fb));

    // Parameters of up to 512 elements (keeps the seeds small).
    v1::SetParametersRequest set;
    v1::GetParametersRequest get;
    for (const train::NamedTensor& p : Must(session->GetParameters({}), "GetParameters")) {
      get.add_names(p.name);
      if (p.tensor.numel() > 512) continue;
      v1::NamedTensor* wire = set.add_parameters();
      wire->set_name(p.name);
      MustOk(server::EncodeTensor(p.tensor, wire->mutable_tensor()), "encode");
    }
    get.set_include_grads(i % 2 == 1);
    Write(dir, absl::StrCat("seed-set_parameters-m", i), RequestSeed(3, i, set));
    Write(dir, absl::StrCat("seed-get_parameters-m", i), RequestSeed(4, i, get));
  }
}

void SpecSeeds(const fs::path& dir) {
  for (int i = 0; i < fuzz::kNumModels; ++i) {
    Write(dir, absl::StrCat("seed-model-", i), fuzz::ModelRequest(i).SerializeAsString());
  }
  // Several layers in one stack, periodic checkpoints, SGD.
  v1::CreateSessionRequest stack;
  stack.mutable_model()->set_seed(5);
  auto* mha = stack.mutable_model()->add_layers();
  mha->set_name("attn");
  mha->mutable_multihead_attention()->set_hidden_size(16);
  mha->mutable_multihead_attention()->set_num_attention_heads(4);
  mha->mutable_multihead_attention()->set_qkv_format("bshd");
  auto* mlp = stack.mutable_model()->add_layers();
  mlp->set_name("mlp");
  mlp->mutable_layer_norm_mlp()->set_hidden_size(16);
  mlp->mutable_layer_norm_mlp()->set_ffn_hidden_size(64);
  mlp->mutable_layer_norm_mlp()->set_activation("clamped_swiglu");
  mlp->mutable_layer_norm_mlp()->mutable_activation_params()->set_limit(5.0f);
  auto* head = stack.mutable_model()->add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(16);
  head->mutable_linear()->set_out_features(4);
  head->mutable_linear()->set_bias(false);
  stack.mutable_recipe()->mutable_delayed()->set_amax_compute_algo("most_recent");
  stack.mutable_optimizer()->mutable_sgd()->set_lr(0.5f);
  stack.set_checkpoint_every_steps(10);
  stack.set_checkpoint_prefix("run");
  Write(dir, "seed-stack", stack.SerializeAsString());
}

// A small session after one ForwardBackward + Step (optimizer state allocated unless
// `step` is false), saved with WriteCheckpoint; returns its files in checkpoint_fuzzer's
// order, each file's bytes.
std::vector<std::string> CheckpointFiles(const v1::CreateSessionRequest& spec, const v1::ForwardRequest& forward,
                                         bool step) {
  auto session = NewSession(spec);
  if (step) {
    std::vector<Tensor> inputs = Must(server::DecodeFloatTensors(forward.inputs(), "inputs"), "decode");
    layers::SideInputs side = Must(server::DecodeSideInputs(forward.side_inputs()), "decode side");
    train::ForwardResult out = Must(session->Forward(inputs, false, side), "Forward");
    v1::LossSpec loss;
    loss.mutable_mse();
    train::LossOptions mse = Must(train::LossFromProto(loss), "loss");
    Must(session->ForwardBackward(inputs, side, mse, out.outputs[0], false, false), "ForwardBackward");
    Must(session->Step(), "Step");
  }
  train::CheckpointContents contents;
  contents.model = session->model_spec();
  contents.recipe = session->recipe_spec();
  contents.optimizer = session->optimizer_spec();
  contents.state = Must(session->CaptureState(), "CaptureState");
  const fs::path tmp = fs::temp_directory_path() / absl::StrCat("teserve-make-seeds-", ::getpid());
  fs::create_directories(tmp);
  Must(train::WriteCheckpoint(tmp.string(), "seed", contents, /*overwrite=*/true, "seed"), "WriteCheckpoint");
  std::vector<std::string> files;
  for (const char* name : {"model.json", "recipe.json", "optimizer.json", "parameters.safetensors",
                           "gradients.safetensors", "optimizer.safetensors", "state.safetensors"}) {
    std::ifstream in(tmp / "seed" / name, std::ios::binary);
    files.emplace_back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  fs::remove_all(tmp);
  return files;
}

void CheckpointSeeds(const fs::path& checkpoint_dir, const fs::path& safetensors_dir) {
  struct Case {
    const char* name;
    v1::CreateSessionRequest spec;
    v1::ForwardRequest forward;
    bool step;
  };
  std::vector<Case> cases;
  {  // Linear 4 -> 2, SGD with momentum
    Case c{"linear", {}, {}, true};
    auto* l = c.spec.mutable_model()->add_layers()->mutable_linear();
    l->set_in_features(4);
    l->set_out_features(2);
    c.spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
    c.spec.mutable_optimizer()->mutable_sgd()->set_momentum(0.9f);
    *c.forward.add_inputs() = fuzz::FloatTensor({3, 4});
    cases.push_back(c);
  }
  {  // LayerNorm -> Linear under delayed scaling, AdamW, before the first Step
    Case c{"delayed", {}, {}, false};
    c.spec.mutable_model()->add_layers()->mutable_layer_norm()->set_hidden_size(4);
    auto* l = c.spec.mutable_model()->add_layers()->mutable_linear();
    l->set_in_features(4);
    l->set_out_features(4);
    c.spec.mutable_recipe()->mutable_delayed()->set_amax_history_len(3);
    c.spec.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
    cases.push_back(c);
  }
  {  // TransformerLayer with dropout (RNG counters) under current scaling, AdamW
    Case c{"transformer", {}, {}, true};
    auto* t = c.spec.mutable_model()->add_layers()->mutable_transformer_layer();
    t->set_hidden_size(8);
    t->set_ffn_hidden_size(8);
    t->set_num_attention_heads(2);
    c.spec.mutable_recipe()->mutable_current();
    c.spec.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
    *c.forward.add_inputs() = fuzz::FloatTensor({2, 1, 8});
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    std::vector<std::string> files = CheckpointFiles(c.spec, c.forward, c.step);
    const std::string step = c.step ? "1" : "0";
    Write(checkpoint_dir, absl::StrCat("seed-", c.name),
          absl::StrCat(absl::StrJoin(files, fuzz::kFileSeparator), fuzz::kFileSeparator, step));
    const char* groups[] = {"parameters", "gradients", "optimizer", "state"};
    for (int g = 0; g < 4; ++g) Write(safetensors_dir, absl::StrCat("seed-", c.name, "-", groups[g]), files[3 + g]);
  }
  // A manifest as the harness would not write it: the checkpoint of the first case with
  // its real manifest text in place of the step.
  std::vector<std::string> files = CheckpointFiles(cases[0].spec, cases[0].forward, true);
  v1::CheckpointManifest manifest;
  manifest.set_format(train::kCheckpointFormat);
  manifest.set_version(train::kCheckpointVersion);
  manifest.set_step(1);
  manifest.add_files()->set_name("model.json");
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(manifest, &json);
  Write(checkpoint_dir, "seed-manifest",
        absl::StrCat(absl::StrJoin(files, fuzz::kFileSeparator), fuzz::kFileSeparator, json));
}

}  // namespace
}  // namespace teserve

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  const std::filesystem::path corpus = argv[1];
  teserve::RequestSeeds(corpus / "request_fuzzer");
  teserve::SpecSeeds(corpus / "spec_fuzzer");
  teserve::CheckpointSeeds(corpus / "checkpoint_fuzzer", corpus / "safetensors_fuzzer");
  std::printf("make_seeds: seeds written under %s\n", corpus.c_str());
  return 0;
}
