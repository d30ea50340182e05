// Checkpoints of train::Session: a session restored from a checkpoint continues exactly
// as the original (every recipe, dropout on, mid-accumulation), and damaged, foreign or
// other-version checkpoints are refused with an error naming the file, loading nothing.
#include "train/checkpoint.h"

#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include <cstdlib>
#include <functional>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/recipe_specs.h"
#include "google/protobuf/util/json_util.h"
#include "layers/init.h"
#include "teserve/v1/checkpoint.pb.h"
#include "train/safetensors.h"
#include "train/session.h"

namespace teserve {
namespace train {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kSeq = 32, kBatch = 2, kHidden = 32;

std::string TestDir(const std::string& leaf) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", leaf);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

Tensor Random(Shape shape, uint64_t seed) {
  Tensor t = Tensor::Zeros(DType::kFloat32, shape).value();
  layers::FillNormal(seed, 1.0f, t.mutable_floats());
  return t;
}

// A transformer block with attention and hidden dropout, then a Linear head.
v1::ModelSpec Model() {
  v1::ModelSpec spec;
  spec.set_seed(5);
  v1::LayerSpec* block = spec.add_layers();
  block->set_name("block");
  v1::TransformerLayerSpec* t = block->mutable_transformer_layer();
  t->set_hidden_size(kHidden);
  t->set_ffn_hidden_size(64);
  t->set_num_attention_heads(2);
  t->set_hidden_dropout(0.2f);
  t->set_attention_dropout(0.2f);
  v1::LayerSpec* head = spec.add_layers();
  head->set_name("head");
  head->mutable_linear()->set_in_features(kHidden);
  head->mutable_linear()->set_out_features(kHidden);
  return spec;
}

v1::RecipeSpec Recipe(const std::string& name) { return testing_util::RecipeSpecNamed(name); }

v1::OptimizerSpec AdamW() {
  v1::OptimizerSpec o;
  o.mutable_adamw()->set_lr(0.01f);
  o.set_max_grad_norm(1.0f);
  return o;
}

std::unique_ptr<Session> Make(const v1::RecipeSpec& recipe, const v1::OptimizerSpec& optimizer = AdamW(),
                              const v1::ModelSpec& model = Model()) {
  auto s = Session::Create(model, recipe, optimizer, Context::Cpu());
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

// One ForwardBackward on step-dependent data; returns the loss's bits.
uint32_t Accumulate(Session& s, int step) {
  const Tensor x = Random({kSeq, kBatch, kHidden}, 100 + step);
  const Tensor target = Random({kSeq, kBatch, kHidden}, 200 + step);
  auto r = s.ForwardBackward({x}, layers::SideInputs(), LossOptions(), target, false, false);
  EXPECT_TRUE(r.ok()) << r.status();
  uint32_t bits = 0;
  if (r.ok()) std::memcpy(&bits, &r->loss, 4);
  return bits;
}

uint32_t TrainStep(Session& s, int step) {
  const uint32_t loss = Accumulate(s, step);
  EXPECT_TRUE(s.Step().ok());
  EXPECT_TRUE(s.ZeroGrad().ok());
  return loss;
}

void ExpectSameParameters(const Session& a, const Session& b) {
  auto pa = a.GetParameters({}).value();
  auto pb = b.GetParameters({}).value();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(BitwiseEqual(pa[i].tensor, pb[i].tensor)) << pa[i].name;
}

CheckpointContents Contents(const Session& s) {
  CheckpointContents c;
  c.model = s.model_spec();
  c.recipe = s.recipe_spec();
  c.optimizer = s.optimizer_spec();
  c.state = s.CaptureState().value();
  return c;
}

class ResumeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ResumeTest, RestoredSessionContinuesBitForBit) {
  const std::string dir = TestDir(absl::StrCat("resume_", GetParam()));
  auto a = Make(Recipe(GetParam()));
  for (int step = 0; step < 3; ++step) TrainStep(*a, step);
  Accumulate(*a, 3);  // gradients mid-accumulation are part of the state
  auto written = WriteCheckpoint(dir, "ckpt", Contents(*a), false, "test");
  ASSERT_TRUE(written.ok()) << written.status();
  auto read = ReadCheckpoint(dir, "ckpt");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->state.step, 3);
  EXPECT_EQ(read->model.SerializeAsString(), a->model_spec().SerializeAsString());
  auto b = Make(read->recipe, read->optimizer, read->model);
  ASSERT_TRUE(b->RestoreState(read->state).ok());
  EXPECT_EQ(b->Summary().step, 3);
  ExpectSameParameters(*a, *b);

  for (int step = 3; step < 7; ++step) {
    // Step 3 completes the accumulation begun before the checkpoint.
    if (step > 3) {
      EXPECT_EQ(Accumulate(*a, step), Accumulate(*b, step)) << "step " << step;
    }
    ASSERT_TRUE(a->Step().ok());
    ASSERT_TRUE(b->Step().ok());
    ASSERT_TRUE(a->ZeroGrad().ok());
    ASSERT_TRUE(b->ZeroGrad().ok());
  }
  ExpectSameParameters(*a, *b);
  const auto qa = a->QuantizationState();
  const auto qb = b->QuantizationState();
  ASSERT_EQ(qa.size(), qb.size());
  for (size_t i = 0; i < qa.size(); ++i) {
    EXPECT_EQ(qa[i].amax_history, qb[i].amax_history);
    EXPECT_EQ(qa[i].scale, qb[i].scale);
    EXPECT_EQ(qa[i].quantize_calls, qb[i].quantize_calls);
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, ResumeTest,
                         ::testing::Values("none", "delayed", "current", "mxfp8", "block", "nvfp4"));

// The counters are what make the resumed dropout masks and NVFP4 draws repeat: with
// them reset, the next losses differ.
TEST(Resume, RandomStreamCountersMatter) {
  for (const char* recipe : {"none", "nvfp4"}) {
    auto a = Make(Recipe(recipe));
    for (int step = 0; step < 2; ++step) TrainStep(*a, step);
    SessionState state = a->CaptureState().value();
    int reset = 0;
    for (NamedTensor& t : state.state) {
      const bool rng = t.name.rfind("rng.", 0) == 0 || t.name.find(".rng_draws") != std::string::npos;
      if (rng && t.tensor.data<int64_t>()[0] != 0) {
        t.tensor.data<int64_t>()[0] = 0;
        ++reset;
      }
    }
    EXPECT_GT(reset, 0) << recipe;
    auto b = Make(Recipe(recipe));
    ASSERT_TRUE(b->RestoreState(state).ok());
    EXPECT_NE(TrainStep(*a, 2), TrainStep(*b, 2)) << recipe;
  }
}

TEST(Resume, SgdMomentumAndStateNames) {
  v1::OptimizerSpec sgd;
  sgd.mutable_sgd()->set_lr(0.01f);
  sgd.mutable_sgd()->set_momentum(0.9f);
  auto a = Make(Recipe("delayed"), sgd);
  SessionState fresh = a->CaptureState().value();
  EXPECT_TRUE(fresh.optimizer.empty());  // nothing allocated before the first step
  TrainStep(*a, 0);
  SessionState state = a->CaptureState().value();
  std::vector<std::string> names;
  for (const NamedTensor& t : state.optimizer) names.push_back(t.name);
  EXPECT_THAT(names, ::testing::Contains("head.weight.momentum"));
  names.clear();
  for (const NamedTensor& t : state.state) names.push_back(t.name);
  EXPECT_THAT(names, ::testing::IsSupersetOf({"session.step", "rng.block.dropout_calls",
                                              "rng.block.self_attention.core_attention.dropout_calls",
                                              "quantizer.head.input.amax_history", "quantizer.head.weight.scale"}));
  auto b = Make(Recipe("delayed"), sgd);
  ASSERT_TRUE(b->RestoreState(state).ok());
  EXPECT_EQ(TrainStep(*a, 1), TrainStep(*b, 1));
  ExpectSameParameters(*a, *b);
}

TEST(Restore, MismatchedStateChangesNothing) {
  auto a = Make(Recipe("delayed"));
  TrainStep(*a, 0);
  const auto before = a->GetParameters({}).value();
  SessionState good = a->CaptureState().value();

  struct Case {
    std::string what;
    std::function<void(SessionState*)> damage;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"missing", [](SessionState* s) { s->parameters.pop_back(); }, "parameters.safetensors: tensor 'head.bias' is missing"},
      {"shape", [](SessionState* s) { s->gradients[0].tensor = Tensor::Zeros(DType::kFloat32, {3}).value(); },
       "gradients.safetensors: tensor 'block.self_attention.layernorm_qkv.layer_norm_weight': expected shape [32], got [3]"},
      {"extra", [](SessionState* s) { s->state.push_back({"rng.other", Tensor::Zeros(DType::kInt64, {1}).value()}); },
       "state.safetensors: tensor 'rng.other' is not part of this model's state"},
      {"dtype", [](SessionState* s) { s->state[0].tensor = Tensor::Zeros(DType::kFloat32, {1}).value(); },
       "state.safetensors: tensor 'session.step': expected dtype INT64, got FLOAT32"},
      {"history", [](SessionState* s) {
         for (NamedTensor& t : s->state) {
           if (t.name == "quantizer.head.input.amax_history") t.tensor = Tensor::Zeros(DType::kFloat32, {8}).value();
         }
       }, "state.safetensors: tensor 'quantizer.head.input.amax_history': expected shape [4], got [8]"},
      {"partial optimizer", [](SessionState* s) { s->optimizer.pop_back(); },
       "optimizer.safetensors: tensor 'head.bias.exp_avg_sq' is missing"},
      {"negative counter", [](SessionState* s) {
         for (NamedTensor& t : s->state) {
           if (t.name == "rng.block.dropout_calls") t.tensor.data<int64_t>()[0] = -1;
         }
       }, "state.safetensors: tensor 'rng.block.dropout_calls': expected a count >= 0, got -1"},
  };
  for (const Case& c : cases) {
    SessionState bad = a->CaptureState().value();
    // Fresh, not aliasing the session: the damage must not reach it.
    c.damage(&bad);
    const absl::Status st = a->RestoreState(bad);
    EXPECT_FALSE(st.ok()) << c.what;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message)) << c.what;
    const auto after = a->GetParameters({}).value();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(BitwiseEqual(before[i].tensor, after[i].tensor)) << c.what;
    EXPECT_EQ(a->Summary().step, 1) << c.what;
  }
}

// A quantizer value the recipe does not keep (random draws outside NVFP4, a per-tensor
// scale under a block recipe) is refused, not dropped: restored, it would read back as
// 1 / 0, so the checkpoint would not say what the session holds (found by
// tests/fuzz/checkpoint_fuzzer; corpus/checkpoint_fuzzer/regression-unkept-rng-draws).
TEST(Restore, ValuesTheRecipeDoesNotKeepAreRefused) {
  struct Case {
    std::string recipe;
    std::string tensor;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"delayed", "quantizer.head.weight.rng_draws",
       "state.safetensors: quantizer.head.weight.rng_draws: expected 0 (delayed quantizers draw no random numbers), got 3"},
      {"current", "quantizer.head.input.rng_draws",
       "quantizer.head.input.rng_draws: expected 0 (current quantizers draw no random numbers), got 3"},
      {"mxfp8", "quantizer.head.input.scale",
       "state.safetensors: quantizer.head.input.scale: expected 1 (mxfp8 quantizers keep no per-tensor scale), got 3"},
      {"block", "quantizer.head.grad_output.scale",
       "quantizer.head.grad_output.scale: expected 1 (block quantizers keep no per-tensor scale), got 3"},
  };
  for (const Case& c : cases) {
    auto a = Make(Recipe(c.recipe));
    TrainStep(*a, 0);
    SessionState state = a->CaptureState().value();
    ASSERT_TRUE(a->RestoreState(state).ok()) << c.recipe;
    bool found = false;
    for (NamedTensor& t : state.state) {
      if (t.name != c.tensor) continue;
      found = true;
      if (t.tensor.dtype() == DType::kInt64) t.tensor.data<int64_t>()[0] = 3;
      if (t.tensor.dtype() == DType::kFloat32) t.tensor.data<float>()[0] = 3.0f;
    }
    ASSERT_TRUE(found) << c.tensor;
    const absl::Status st = a->RestoreState(state);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << c.recipe;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message)) << c.recipe;
  }
  // NVFP4 keeps its draws.
  auto n = Make(Recipe("nvfp4"));
  TrainStep(*n, 0);
  SessionState state = n->CaptureState().value();
  for (NamedTensor& t : state.state) {
    if (t.name == "quantizer.head.grad_output.rng_draws") t.tensor.data<int64_t>()[0] = 3;
  }
  ASSERT_TRUE(n->RestoreState(state).ok());
  for (const NamedTensor& t : n->CaptureState().value().state) {
    if (t.name == "quantizer.head.grad_output.rng_draws") {
      EXPECT_EQ(t.tensor.data<int64_t>()[0], 3);
    }
  }
}

TEST(CheckpointNames, OnlyTheDocumentedCharacterSet) {
  for (const std::string& ok : std::vector<std::string>{"a", "run-1", "run_1.step-000000003", "A9", std::string(128, 'x')}) {
    EXPECT_TRUE(ValidateCheckpointName(ok, "name").ok()) << ok;
  }
  for (const std::string& bad : std::vector<std::string>{"", "../x", "/etc", "a/b", ".hidden", "-x", "_x", "a..b", "..", "a b", "a\\b",
                                 "a\nb", std::string(129, 'x'), std::string("a\0b", 3), "caf\xc3\xa9"}) {
    const absl::Status st = ValidateCheckpointName(bad, "name");
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(st.message()), HasSubstr("name: expected a checkpoint name: 1 to 128 characters from [A-Za-z0-9._-]"));
  }
  const std::string dir = TestDir("names");
  auto s = Make(Recipe("none"));
  EXPECT_EQ(WriteCheckpoint(dir, "../escape", Contents(*s), false, "t").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/../escape")));
  EXPECT_EQ(ReadCheckpoint(dir, "/etc").status().code(), absl::StatusCode::kInvalidArgument);
}

class DamageTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    session_ = Make(Recipe("delayed"));
    TrainStep(*session_, 0);
    ASSERT_TRUE(WriteCheckpoint(dir_, "c", Contents(*session_), false, "test").ok());
    ASSERT_TRUE(ReadCheckpoint(dir_, "c").ok());
  }
  std::string Path(const std::string& file) const { return absl::StrCat(dir_, "/c/", file); }
  absl::Status Read() const { return ReadCheckpoint(dir_, "c").status(); }
  // Makes the manifest agree with a file that was replaced on purpose.
  void RefreshManifest(const std::string& file) {
    const std::string bytes = ReadFile(Path(file));
    std::string manifest = ReadFile(Path("checkpoint.json"));
    v1::CheckpointManifest parsed;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(manifest, &parsed).ok());
    for (v1::CheckpointFile& f : *parsed.mutable_files()) {
      if (f.name() != file) continue;
      f.set_bytes(bytes.size());
      unsigned char digest[32];
      unsigned int n = 0;
      EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
      std::string hex;
      for (unsigned int i = 0; i < n; ++i) absl::StrAppend(&hex, absl::Hex(digest[i], absl::kZeroPad2));
      f.set_sha256(hex);
    }
    std::string out;
    ASSERT_TRUE(google::protobuf::util::MessageToJsonString(parsed, &out).ok());
    WriteFile(Path("checkpoint.json"), out);
  }

  std::string dir_;
  std::unique_ptr<Session> session_;
};

void ExpectError(const absl::Status& st, absl::StatusCode code, const std::string& text) {
  EXPECT_EQ(st.code(), code) << st;
  EXPECT_THAT(std::string(st.message()), HasSubstr(text));
  EXPECT_THAT(std::string(st.message()), HasSubstr("checkpoint 'c': "));
}

TEST_F(DamageTest, Truncated) {
  const std::string bytes = ReadFile(Path("parameters.safetensors"));
  WriteFile(Path("parameters.safetensors"), bytes.substr(0, bytes.size() / 2));
  ExpectError(Read(), absl::StatusCode::kDataLoss,
              absl::StrCat("parameters.safetensors: truncated: ", bytes.size() / 2, " bytes, the manifest says ",
                           bytes.size()));
}

TEST_F(DamageTest, TruncatedAndManifestAgrees) {
  // Even a manifest rewritten to match cannot make a truncated safetensors file load.
  const std::string bytes = ReadFile(Path("optimizer.safetensors"));
  WriteFile(Path("optimizer.safetensors"), bytes.substr(0, bytes.size() - 10));
  RefreshManifest("optimizer.safetensors");
  ExpectError(Read(), absl::StatusCode::kDataLoss,
              "optimizer.safetensors: truncated: the tensors need");
}

TEST_F(DamageTest, CorruptedData) {
  std::string bytes = ReadFile(Path("gradients.safetensors"));
  bytes[bytes.size() - 3] ^= 0x40;
  WriteFile(Path("gradients.safetensors"), bytes);
  ExpectError(Read(), absl::StatusCode::kDataLoss, "gradients.safetensors: corrupted: its SHA-256 is ");
}

TEST_F(DamageTest, CorruptedHeader) {
  std::string bytes = ReadFile(Path("state.safetensors"));
  bytes[8] = '[';
  WriteFile(Path("state.safetensors"), bytes);
  ExpectError(Read(), absl::StatusCode::kDataLoss, "state.safetensors: not a safetensors file: the header is not a JSON object");
}

TEST_F(DamageTest, CorruptedSpec) {
  std::string bytes = ReadFile(Path("model.json"));
  bytes[bytes.size() / 2] ^= 0x01;
  WriteFile(Path("model.json"), bytes);
  ExpectError(Read(), absl::StatusCode::kDataLoss, "model.json: corrupted");
}

TEST_F(DamageTest, MissingFile) {
  std::filesystem::remove(Path("recipe.json"));
  ExpectError(Read(), absl::StatusCode::kDataLoss, "recipe.json: missing");
}

TEST_F(DamageTest, ForeignSafetensors) {
  // A safetensors file from elsewhere (no teserve metadata), the manifest updated to it.
  auto foreign = EncodeSafetensors({{"weight", Tensor::Zeros(DType::kFloat32, {4}).value()}}, {{"format", "pt"}});
  WriteFile(Path("parameters.safetensors"), foreign.value());
  RefreshManifest("parameters.safetensors");
  ExpectError(Read(), absl::StatusCode::kFailedPrecondition,
              "parameters.safetensors: not a teserve checkpoint file (its safetensors metadata has format 'pt'");
}

TEST_F(DamageTest, ForeignDirectory) {
  std::filesystem::remove(Path("checkpoint.json"));
  ExpectError(Read(), absl::StatusCode::kFailedPrecondition, "checkpoint.json is missing: not a teserve checkpoint");
  WriteFile(Path("checkpoint.json"), R"({"format": "pytorch-lightning", "version": 1})");
  ExpectError(Read(), absl::StatusCode::kFailedPrecondition,
              "checkpoint.json: not a teserve checkpoint (format 'pytorch-lightning', expected 'teserve-checkpoint')");
  WriteFile(Path("checkpoint.json"), "\x89PNG garbage");
  ExpectError(Read(), absl::StatusCode::kDataLoss, "checkpoint.json: not a valid manifest");
}

TEST_F(DamageTest, ManifestVersionMismatch) {
  std::string manifest = ReadFile(Path("checkpoint.json"));
  manifest = absl::StrReplaceAll(manifest, {{"\"version\": 1", "\"version\": 7, \"future_field\": true"}});
  WriteFile(Path("checkpoint.json"), manifest);
  ExpectError(Read(), absl::StatusCode::kFailedPrecondition,
              "checkpoint.json: checkpoint format version 7 (written by teserve 'test'); this server reads version 1");
}

TEST_F(DamageTest, FileVersionMismatch) {
  auto file = DecodeSafetensors(ReadFile(Path("state.safetensors")), "state.safetensors").value();
  file.metadata["version"] = "2";
  WriteFile(Path("state.safetensors"), EncodeSafetensors(file.tensors, file.metadata).value());
  RefreshManifest("state.safetensors");
  ExpectError(Read(), absl::StatusCode::kFailedPrecondition,
              "state.safetensors: checkpoint format version '2'; this server reads version 1");
}

TEST_F(DamageTest, NotFound) {
  const absl::Status st = ReadCheckpoint(dir_, "nope").status();
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("checkpoint 'nope': no such checkpoint"));
}

TEST_F(DamageTest, OverwriteIsAtomicAndAlreadyExists) {
  EXPECT_EQ(WriteCheckpoint(dir_, "c", Contents(*session_), false, "test").status().code(),
            absl::StatusCode::kAlreadyExists);
  TrainStep(*session_, 1);
  ASSERT_TRUE(WriteCheckpoint(dir_, "c", Contents(*session_), true, "test").ok());
  EXPECT_EQ(ReadCheckpoint(dir_, "c")->state.step, 2);
  // No leftovers beside it.
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) entries.push_back(e.path().filename().string());
  EXPECT_THAT(entries, ::testing::ElementsAre("c"));
  auto listing = ListCheckpoints(dir_).value();
  ASSERT_EQ(listing.size(), 1u);
  EXPECT_EQ(listing[0].step, 2);
  EXPECT_GT(listing[0].bytes, 0);
}

TEST_F(DamageTest, CleanRemovesInterruptedWrites) {
  std::filesystem::create_directories(absl::StrCat(dir_, "/.tmp-c-abc123"));
  // A replacement interrupted between its renames: the old copy is put back.
  std::filesystem::rename(absl::StrCat(dir_, "/c"), absl::StrCat(dir_, "/.old-c-xyz789"));
  ASSERT_TRUE(CleanCheckpointDir(dir_).ok());
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) entries.push_back(e.path().filename().string());
  EXPECT_THAT(entries, ::testing::ElementsAre("c"));
  EXPECT_TRUE(ReadCheckpoint(dir_, "c").ok());
}

TEST(Safetensors, RejectsMalformedHeaders) {
  auto encode = [](const std::string& json, const std::string& data) {
    std::string out(8, '\0');
    const uint64_t n = json.size();
    for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
    return out + json + data;
  };
  struct Case {
    std::string bytes;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"abc", "f: truncated: 3 bytes, shorter than the 8-byte header length"},
      {std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8), "f: not a safetensors file: its first 8 bytes give a header"},
      {encode(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234"), "f: truncated: the tensors need 8 bytes of data but only 4"},
      {encode(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", "1234"), "tensor 'a': data_offsets [0, 4] hold 4 bytes, but F32 [2] needs 8"},
      {encode(R"({"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}})", "1234"), "tensor 'a': unsupported dtype 'F99'"},
      {encode(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "1234"), "tensor 'a': shape has an entry that is not a size"},
      {encode(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", "12345678"), "tensor 'a': data starts at 4, expected 0"},
      {encode(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", "12345678"), "f: 4 unexpected bytes after the tensor data"},
      {encode(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", "1234"), "overflows"},
      {encode(R"({"a":1})", ""), "tensor 'a': expected an object"},
      {encode(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", "1234"), "f: the header is not valid JSON"},
      {encode(R"({"__metadata__":{"k":1}})", ""), "__metadata__.k: expected a string"},
  };
  for (const Case& c : cases) {
    auto r = DecodeSafetensors(c.bytes, "f");
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << c.message;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(c.message));
  }
}

TEST(Safetensors, RoundTripsAndPadsTheHeader) {
  Tensor ints = Tensor::Zeros(DType::kInt64, {2}).value();
  ints.data<int64_t>()[0] = -5;
  ints.data<int64_t>()[1] = int64_t{1} << 40;
  const std::vector<NamedTensor> tensors = {{"w", Random({3, 5}, 1)}, {"empty", Tensor::Zeros(DType::kFloat32, {0}).value()},
                                            {"n\"q", ints}};
  const std::string bytes = EncodeSafetensors(tensors, {{"format", "x"}}).value();
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  auto decoded = DecodeSafetensors(bytes, "f");
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->metadata.at("format"), "x");
  ASSERT_EQ(decoded->tensors.size(), 3u);
  for (const NamedTensor& want : tensors) {
    bool found = false;
    for (const NamedTensor& got : decoded->tensors) {
      if (got.name == want.name) {
        found = true;
        EXPECT_TRUE(BitwiseEqual(got.tensor, want.tensor)) << want.name;
      }
    }
    EXPECT_TRUE(found) << want.name;
  }
}

}  // namespace
}  // namespace train
}  // namespace teserve
