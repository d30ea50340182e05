// Loading a checkpoint directory whose files are arbitrary: train::ReadCheckpoint (the
// manifest, the spec JSON files, the four safetensors files, sizes and SHA-256), then
// what CreateSession(from_checkpoint) does with what it read (server/trainer_service.cc):
// the server's memory admission, train::Session::Create from the checkpoint's specs and
// Session::RestoreState of its state.
//
// Input: the files' contents separated by lines "===8<===" (fuzz_support.h), in the
// order model.json, recipe.json, optimizer.json, parameters.safetensors,
// gradients.safetensors, optimizer.safetensors, state.safetensors and optionally
// checkpoint.json; a file missing from the input is missing from the directory. When
// the last part is absent or a number, the harness writes a manifest that matches the
// files (sizes, SHA-256, that number as the step), so that mutations reach the parsers
// behind the checksums; otherwise the part is the manifest as it is.
//
// Invariants besides "no crash, no sanitizer report": ReadCheckpoint's errors are
// DATA_LOSS, FAILED_PRECONDITION or NOT_FOUND naming the checkpoint; Create and
// RestoreState refuse with client errors only; a restored session's CaptureState gives
// back exactly the tensors it was restored from.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/context.h"
#include "google/protobuf/util/json_util.h"
#include "teserve/v1/checkpoint.pb.h"
#include "tests/fuzz/fuzz_support.h"
#include "train/checkpoint.h"
#include "train/session.h"

namespace teserve {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFiles[] = {"model.json",
                                  "recipe.json",
                                  "optimizer.json",
                                  "parameters.safetensors",
                                  "gradients.safetensors",
                                  "optimizer.safetensors",
                                  "state.safetensors"};
constexpr int kNumFiles = 7;
constexpr char kName[] = "fuzz";


void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good(), absl::StrCat("cannot write ", path.string()));
}

// The --checkpoint_dir of this process: in memory (/dev/shm) when there is one.
const std::string& CheckpointDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TEST_TMPDIR");
    fs::path base = fs::is_directory("/dev/shm") ? fs::path("/dev/shm") : fs::path(tmp ? tmp : "/tmp");
    fs::path path = base / absl::StrCat("teserve-checkpoint-fuzzer-", ::getpid());
    fs::create_directories(path);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(CheckpointDir(), ec);
    });
    return new std::string(path.string());
  }();
  return *dir;
}

// "" when `a` and `b` hold the same tensors (by name), else what differs.
std::string Difference(const std::vector<train::NamedTensor>& a, const std::vector<train::NamedTensor>& b) {
  std::map<std::string, const Tensor*> by_name;
  for (const train::NamedTensor& t : b) by_name[t.name] = &t.tensor;
  if (a.size() != b.size() || by_name.size() != b.size()) return absl::StrCat(a.size(), " vs ", b.size(), " tensors");
  for (const train::NamedTensor& t : a) {
    auto it = by_name.find(t.name);
    if (it == by_name.end()) return absl::StrCat(t.name, " missing");
    const Tensor& x = t.tensor;
    const Tensor& y = *it->second;
    if (x.dtype() != y.dtype() || x.shape() != y.shape() || x.nbytes() != y.nbytes()) {
      return absl::StrCat(t.name, ": dtype or shape");
    }
    if (x.nbytes() > 0 && std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) {
      std::string values;
      if (x.dtype() == DType::kFloat32) {
        for (int64_t i = 0; i < x.numel() && i < 8; ++i) {
          absl::StrAppend(&values, " ", x.data<float>()[i], "/", y.data<float>()[i]);
        }
      }
      return absl::StrCat(t.name, ": values", values);
    }
  }
  return "";
}

void CheckSame(const char* group, const std::vector<train::NamedTensor>& captured,
               const std::vector<train::NamedTensor>& restored) {
  const std::string difference = Difference(captured, restored);
  FUZZ_CHECK(difference.empty(), absl::StrCat(group, " differs after RestoreState: ", difference));
}

void Load(const std::vector<std::string>& parts) {
  const fs::path path = fs::path(CheckpointDir()) / kName;
  std::error_code ec;
  fs::remove_all(path, ec);
  fs::create_directory(path);
  v1::CheckpointManifest manifest;
  manifest.set_format(train::kCheckpointFormat);
  manifest.set_version(train::kCheckpointVersion);
  manifest.set_teserve_version("fuzz");
  for (int i = 0; i < kNumFiles; ++i) {
    const std::string bytes = i < static_cast<int>(parts.size()) ? parts[i] : std::string();
    if (i < static_cast<int>(parts.size())) WriteFile(path / kFiles[i], bytes);
    v1::CheckpointFile* entry = manifest.add_files();
    entry->set_name(kFiles[i]);
    entry->set_bytes(static_cast<int64_t>(bytes.size()));
    entry->set_sha256(train::Sha256Hex(bytes));
  }
  int64_t step = 0;
  const bool raw_manifest = parts.size() > kNumFiles && !absl::SimpleAtoi(parts[kNumFiles], &step);
  std::string manifest_text;
  if (raw_manifest) {
    manifest_text = parts[kNumFiles];
  } else {
    manifest.set_step(step);
    FUZZ_CHECK(google::protobuf::util::MessageToJsonString(manifest, &manifest_text).ok(), "manifest JSON");
  }
  WriteFile(path / train::kCheckpointManifest, manifest_text);

  absl::StatusOr<train::CheckpointContents> read = train::ReadCheckpoint(CheckpointDir(), kName);
  if (!read.ok()) {
    const absl::StatusCode code = read.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kDataLoss || code == absl::StatusCode::kFailedPrecondition ||
                   code == absl::StatusCode::kNotFound,
               read.status().ToString());
    FUZZ_CHECK(absl::StartsWith(read.status().message(), "checkpoint 'fuzz': "), read.status().ToString());
    return;
  }

  // CreateSession(from_checkpoint): admission, the session from the checkpoint's specs,
  // then its state.
  const server::MemoryEstimate estimate = fuzz::EstimateLikeTheServer(read->model, read->optimizer);
  if (!fuzz::AdmitLikeTheServer(estimate).ok()) return;
  auto session = train::Session::Create(read->model, read->recipe, read->optimizer, Context::Cpu());
  if (!session.ok()) {
    const absl::StatusCode code = session.status().code();
    FUZZ_CHECK(code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kResourceExhausted ||
                   code == absl::StatusCode::kUnimplemented,
               session.status().ToString());
    return;
  }
  const absl::Status restored = (*session)->RestoreState(read->state);
  if (!restored.ok()) {
    FUZZ_CHECK(restored.code() == absl::StatusCode::kInvalidArgument, restored.ToString());
    return;
  }
  absl::StatusOr<train::SessionState> captured = (*session)->CaptureState();
  FUZZ_CHECK(captured.ok(), captured.status().ToString());
  FUZZ_CHECK(captured->step == read->state.step, "step differs after RestoreState");
  CheckSame("parameters", captured->parameters, read->state.parameters);
  CheckSame("gradients", captured->gradients, read->state.gradients);
  CheckSame("state", captured->state, read->state.state);
  if (!read->state.optimizer.empty()) {
    CheckSame("optimizer", captured->optimizer, read->state.optimizer);
  }
}

}  // namespace
}  // namespace teserve

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<std::string> parts =
      teserve::fuzz::SplitFiles(absl::string_view(reinterpret_cast<const char*>(data), size));
  if (parts.size() > 8) return 0;
  teserve::Load(parts);
  return 0;
}
