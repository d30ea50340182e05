#include "train/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "core/status.h"
#include "google/protobuf/util/json_util.h"
#include "teserve/v1/checkpoint.pb.h"
#include "train/safetensors.h"

namespace teserve {
namespace train {
namespace {

namespace fs = std::filesystem;

constexpr const char* kGroups[] = {"parameters", "gradients", "optimizer", "state"};
constexpr const char* kSpecFiles[] = {"model.json", "recipe.json", "optimizer.json"};

std::string JoinPath(const std::string& a, const std::string& b) { return a.empty() ? b : absl::StrCat(a, "/", b); }

absl::Status IoError(absl::string_view what, absl::string_view file, int err) {
  const std::string message = absl::StrCat(what, " ", file, ": ", std::strerror(err));
  if (err == ENOSPC || err == EDQUOT) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}


// Writes `bytes` to a new file `path` and fsyncs it.
absl::Status WriteFileSynced(const std::string& path, absl::string_view file, absl::string_view bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("create", file, errno);
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return IoError("write", file, err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError("fsync", file, err);
  }
  if (::close(fd) != 0) return IoError("close", file, errno);
  return absl::OkStatus();
}

absl::Status FsyncDir(const std::string& path, absl::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("open directory", what, errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) return IoError("fsync directory", what, err);
  return absl::OkStatus();
}

// The file's bytes; NOT_FOUND (with errno's text) when it cannot be opened.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path, absl::string_view file) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(file, ": missing"));
    return IoError("open", file, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::DataLossError(absl::StrCat(file, ": not a regular file"));
  }
  std::string out;
  char buffer[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return IoError("read", file, err);
    }
    if (n == 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

// `dir`/<prefix><name>-XXXXXX, created.
absl::StatusOr<std::string> MakeHiddenDir(const std::string& dir, absl::string_view prefix, absl::string_view name) {
  std::string templ = JoinPath(dir, absl::StrCat(prefix, name, "-XXXXXX"));
  if (::mkdtemp(templ.data()) == nullptr) return IoError("create a temporary directory for", name, errno);
  return templ;
}

std::string NowRfc3339() { return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone()); }

std::map<std::string, std::string> GroupMetadata(absl::string_view group, int64_t step) {
  return {{"format", kCheckpointFormat},
          {"version", absl::StrCat(kCheckpointVersion)},
          {"group", std::string(group)},
          {"step", absl::StrCat(step)}};
}

const std::vector<NamedTensor>& GroupOf(const SessionState& state, absl::string_view group) {
  if (group == "parameters") return state.parameters;
  if (group == "gradients") return state.gradients;
  if (group == "optimizer") return state.optimizer;
  return state.state;
}
std::vector<NamedTensor>& GroupOf(SessionState& state, absl::string_view group) {
  return const_cast<std::vector<NamedTensor>&>(GroupOf(static_cast<const SessionState&>(state), group));
}

absl::StatusOr<std::string> SpecJson(const google::protobuf::Message& spec) {
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  const auto status = google::protobuf::util::MessageToJsonString(spec, &out, options);
  if (!status.ok()) return absl::InternalError(absl::StrCat("JSON of the spec: ", std::string(status.message())));
  return out;
}

// Parses a manifest: format and version first (leniently, so that another version's
// fields do not hide the version), then strictly.
absl::StatusOr<v1::CheckpointManifest> ParseManifest(absl::string_view text) {
  v1::CheckpointManifest lenient;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  auto status = google::protobuf::util::JsonStringToMessage(std::string(text), &lenient, options);
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat(kCheckpointManifest, ": not a valid manifest (",
                                            std::string(status.message()), ")"));
  }
  if (lenient.format() != kCheckpointFormat) {
    return absl::FailedPreconditionError(absl::StrCat(kCheckpointManifest, ": not a teserve checkpoint (format ",
                                                      Quoted(lenient.format()), ", expected '", kCheckpointFormat,
                                                      "')"));
  }
  if (lenient.version() != kCheckpointVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        kCheckpointManifest, ": checkpoint format version ", lenient.version(), " (written by teserve ",
        Quoted(lenient.teserve_version()), "); this server reads version ", kCheckpointVersion));
  }
  v1::CheckpointManifest strict;
  options.ignore_unknown_fields = false;
  status = google::protobuf::util::JsonStringToMessage(std::string(text), &strict, options);
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat(kCheckpointManifest, ": not a valid manifest (",
                                            std::string(status.message()), ")"));
  }
  return strict;
}

absl::Status Prefixed(const absl::Status& status, absl::string_view name) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("checkpoint ", Quoted(name), ": ", status.message()));
}

// Checks one file's bytes against the manifest entry (size, then its own structure for
// safetensors, then the checksum).
absl::Status CheckAgainstManifest(const v1::CheckpointFile& entry, absl::string_view bytes) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < entry.bytes()) {
    return absl::DataLossError(
        absl::StrCat(entry.name(), ": truncated: ", size, " bytes, the manifest says ", entry.bytes()));
  }
  if (size > entry.bytes()) {
    return absl::DataLossError(absl::StrCat(entry.name(), ": ", size, " bytes, the manifest says ", entry.bytes(),
                                            " (corrupted or replaced)"));
  }
  return absl::OkStatus();
}

absl::Status CheckChecksum(const v1::CheckpointFile& entry, absl::string_view bytes) {
  const std::string sha = Sha256Hex(bytes);
  if (sha != entry.sha256()) {
    return absl::DataLossError(absl::StrCat(entry.name(), ": corrupted: its SHA-256 is ", sha.substr(0, 16),
                                            "..., the manifest says ", Quoted(entry.sha256().substr(0, 16)), "..."));
  }
  return absl::OkStatus();
}

absl::Status ParseSpec(absl::string_view file, absl::string_view bytes, google::protobuf::Message* spec) {
  google::protobuf::util::JsonParseOptions options;
  const auto status = google::protobuf::util::JsonStringToMessage(std::string(bytes), spec, options);
  if (!status.ok()) {
    return absl::DataLossError(absl::StrCat(file, ": not a valid ", spec->GetDescriptor()->name(), " (",
                                            std::string(status.message()), ")"));
  }
  return absl::OkStatus();
}

absl::Status CheckGroupMetadata(absl::string_view file, absl::string_view group, int64_t step,
                                const std::map<std::string, std::string>& metadata) {
  auto get = [&](const char* key) {
    auto it = metadata.find(key);
    return it == metadata.end() ? std::string() : it->second;
  };
  if (get("format") != kCheckpointFormat) {
    return absl::FailedPreconditionError(absl::StrCat(
        file, ": not a teserve checkpoint file (its safetensors metadata has format ", Quoted(get("format")),
        ", expected '", kCheckpointFormat, "'; written by another program?)"));
  }
  if (get("version") != absl::StrCat(kCheckpointVersion)) {
    return absl::FailedPreconditionError(absl::StrCat(file, ": checkpoint format version ", Quoted(get("version")),
                                                      "; this server reads version ", kCheckpointVersion));
  }
  if (get("group") != group) {
    return absl::DataLossError(
        absl::StrCat(file, ": holds the group ", Quoted(get("group")), ", expected '", group, "'"));
  }
  if (get("step") != absl::StrCat(step)) {
    return absl::DataLossError(
        absl::StrCat(file, ": saved at step ", Quoted(get("step")), " but the manifest says step ", step));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Sha256Hex(absl::string_view bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &size, EVP_sha256(), nullptr);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < size; ++i) {
    out.push_back(hex[digest[i] >> 4]);
    out.push_back(hex[digest[i] & 15]);
  }
  return out;
}

absl::Status ValidateCheckpointName(absl::string_view name, absl::string_view field) {
  bool ok = !name.empty() && name.size() <= kMaxCheckpointNameLength && absl::ascii_isalnum(name[0]) &&
            !absl::StrContains(name, "..");
  for (char c : name) ok = ok && (absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-');
  if (!ok) {
    return InvalidField(field,
                        absl::StrCat("a checkpoint name: 1 to ", kMaxCheckpointNameLength,
                                     " characters from [A-Za-z0-9._-] starting with a letter or digit, without '..'"),
                        Quoted(name));
  }
  return absl::OkStatus();
}

absl::StatusOr<CheckpointWriteResult> WriteCheckpoint(const std::string& dir, const std::string& name,
                                                      const CheckpointContents& contents, bool overwrite,
                                                      absl::string_view teserve_version) {
  RETURN_IF_ERROR(ValidateCheckpointName(name, "name"));
  const std::string final_path = JoinPath(dir, name);
  std::error_code ec;
  const bool exists = fs::exists(final_path, ec);
  if (exists && !overwrite) {
    return absl::AlreadyExistsError(
        absl::StrCat("checkpoint ", Quoted(name), ": exists already (set overwrite to replace it)"));
  }
  // Everything is encoded before the first byte is written.
  std::vector<std::pair<std::string, std::string>> files;
  const google::protobuf::Message* specs[] = {&contents.model, &contents.recipe, &contents.optimizer};
  for (int i = 0; i < 3; ++i) {
    ASSIGN_OR_RETURN(std::string json, SpecJson(*specs[i]));
    files.emplace_back(kSpecFiles[i], std::move(json));
  }
  // The tensor groups are encoded and hashed side by side: a deep model's state is
  // tens of thousands of small tensors, and encoding them is most of a checkpoint's time.
  constexpr int kNumGroups = sizeof(kGroups) / sizeof(kGroups[0]);
  std::vector<absl::StatusOr<std::string>> encoded(kNumGroups);
  const size_t first_group = files.size();
  std::vector<std::string> hashes(first_group + kNumGroups);
  {
    std::vector<std::thread> workers;
    for (int g = 0; g < kNumGroups; ++g) {
      workers.emplace_back([&, g] {
        encoded[g] = EncodeSafetensors(GroupOf(contents.state, kGroups[g]), GroupMetadata(kGroups[g], contents.state.step));
        if (encoded[g].ok()) hashes[first_group + g] = Sha256Hex(*encoded[g]);
      });
    }
    for (std::thread& w : workers) w.join();
  }
  for (int g = 0; g < kNumGroups; ++g) {
    if (!encoded[g].ok()) return encoded[g].status();
    files.emplace_back(absl::StrCat(kGroups[g], ".safetensors"), std::move(*encoded[g]));
  }
  v1::CheckpointManifest manifest;
  manifest.set_format(kCheckpointFormat);
  manifest.set_version(kCheckpointVersion);
  manifest.set_teserve_version(std::string(teserve_version));
  manifest.set_created(NowRfc3339());
  manifest.set_step(contents.state.step);
  CheckpointWriteResult result;
  for (size_t i = 0; i < files.size(); ++i) {
    const auto& [file, bytes] = files[i];
    v1::CheckpointFile* entry = manifest.add_files();
    entry->set_name(file);
    entry->set_bytes(static_cast<int64_t>(bytes.size()));
    entry->set_sha256(hashes[i].empty() ? Sha256Hex(bytes) : hashes[i]);
    result.bytes += static_cast<int64_t>(bytes.size());
  }
  ASSIGN_OR_RETURN(std::string manifest_json, SpecJson(manifest));
  result.bytes += static_cast<int64_t>(manifest_json.size());
  files.emplace_back(kCheckpointManifest, std::move(manifest_json));  // written last

  ASSIGN_OR_RETURN(const std::string tmp, MakeHiddenDir(dir, ".tmp-", name));
  auto fail = [&](const absl::Status& status) {
    fs::remove_all(tmp, ec);
    return Prefixed(status, name);
  };
  for (const auto& [file, bytes] : files) {
    const absl::Status written = WriteFileSynced(JoinPath(tmp, file), file, bytes);
    if (!written.ok()) return fail(written);
  }
  if (absl::Status s = FsyncDir(tmp, "the new checkpoint"); !s.ok()) return fail(s);
  std::string old;
  if (fs::exists(final_path, ec)) {
    absl::StatusOr<std::string> aside = MakeHiddenDir(dir, ".old-", name);
    if (!aside.ok()) return fail(aside.status());
    old = *aside;
    // rename(2) replaces an empty directory, so the old checkpoint takes the new name.
    if (::rename(final_path.c_str(), old.c_str()) != 0) return fail(IoError("move aside", name, errno));
  }
  if (::rename(tmp.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    if (!old.empty()) ::rename(old.c_str(), final_path.c_str());
    return fail(IoError("rename into place", name, err));
  }
  RETURN_IF_ERROR(Prefixed(FsyncDir(dir, "--checkpoint_dir"), name));
  if (!old.empty()) fs::remove_all(old, ec);
  return result;
}

absl::StatusOr<CheckpointContents> ReadCheckpoint(const std::string& dir, const std::string& name) {
  RETURN_IF_ERROR(ValidateCheckpointName(name, "name"));
  const std::string path = JoinPath(dir, name);
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("checkpoint ", Quoted(name), ": no such checkpoint in --checkpoint_dir"));
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", Quoted(name), ": not a checkpoint directory"));
  }
  absl::StatusOr<std::string> manifest_text = ReadWholeFile(JoinPath(path, kCheckpointManifest), kCheckpointManifest);
  if (absl::IsNotFound(manifest_text.status())) {
    return absl::FailedPreconditionError(absl::StrCat("checkpoint ", Quoted(name), ": ", kCheckpointManifest,
                                                      " is missing: not a teserve checkpoint"));
  }
  RETURN_IF_ERROR(Prefixed(manifest_text.status(), name));
  absl::StatusOr<v1::CheckpointManifest> manifest = ParseManifest(*manifest_text);
  RETURN_IF_ERROR(Prefixed(manifest.status(), name));
  if (manifest->step() < 0) {
    return Prefixed(absl::DataLossError(absl::StrCat(kCheckpointManifest, ": step ", manifest->step(), " < 0")), name);
  }

  // Exactly the files this version writes, each once.
  std::set<std::string> expected;
  for (const char* f : kSpecFiles) expected.insert(f);
  for (const char* g : kGroups) expected.insert(absl::StrCat(g, ".safetensors"));
  std::map<std::string, const v1::CheckpointFile*> entries;
  for (const v1::CheckpointFile& f : manifest->files()) {
    if (expected.count(f.name()) == 0 || !entries.emplace(f.name(), &f).second) {
      return Prefixed(absl::DataLossError(absl::StrCat(kCheckpointManifest, ": lists an unexpected file ",
                                                       Quoted(f.name()))),
                      name);
    }
  }
  for (const std::string& f : expected) {
    if (entries.count(f) == 0) {
      return Prefixed(absl::DataLossError(absl::StrCat(kCheckpointManifest, ": does not list ", f)), name);
    }
  }

  CheckpointContents out;
  out.state.step = manifest->step();
  google::protobuf::Message* specs[] = {&out.model, &out.recipe, &out.optimizer};
  for (int i = 0; i < 3; ++i) {
    const v1::CheckpointFile& entry = *entries.at(kSpecFiles[i]);
    absl::StatusOr<std::string> bytes = ReadWholeFile(JoinPath(path, entry.name()), entry.name());
    if (absl::IsNotFound(bytes.status())) return Prefixed(absl::DataLossError(bytes.status().message()), name);
    RETURN_IF_ERROR(Prefixed(bytes.status(), name));
    RETURN_IF_ERROR(Prefixed(CheckAgainstManifest(entry, *bytes), name));
    RETURN_IF_ERROR(Prefixed(CheckChecksum(entry, *bytes), name));
    RETURN_IF_ERROR(Prefixed(ParseSpec(entry.name(), *bytes, specs[i]), name));
  }
  for (const char* group : kGroups) {
    const v1::CheckpointFile& entry = *entries.at(absl::StrCat(group, ".safetensors"));
    absl::StatusOr<std::string> bytes = ReadWholeFile(JoinPath(path, entry.name()), entry.name());
    if (absl::IsNotFound(bytes.status())) return Prefixed(absl::DataLossError(bytes.status().message()), name);
    RETURN_IF_ERROR(Prefixed(bytes.status(), name));
    RETURN_IF_ERROR(Prefixed(CheckAgainstManifest(entry, *bytes), name));
    absl::StatusOr<SafetensorsFile> decoded = DecodeSafetensors(*bytes, entry.name());
    RETURN_IF_ERROR(Prefixed(decoded.status(), name));
    RETURN_IF_ERROR(Prefixed(CheckGroupMetadata(entry.name(), group, manifest->step(), decoded->metadata), name));
    RETURN_IF_ERROR(Prefixed(CheckChecksum(entry, *bytes), name));
    GroupOf(out.state, group) = std::move(decoded->tensors);
  }
  return out;
}

absl::StatusOr<std::vector<CheckpointListing>> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointListing> out;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("list --checkpoint_dir: ", ec.message()));
  for (const fs::directory_entry& entry : it) {
    const std::string name = entry.path().filename().string();
    if (!ValidateCheckpointName(name, "name").ok() || !entry.is_directory(ec)) continue;
    CheckpointListing listing;
    listing.name = name;
    absl::StatusOr<std::string> text =
        ReadWholeFile(JoinPath(JoinPath(dir, name), kCheckpointManifest), kCheckpointManifest);
    absl::StatusOr<v1::CheckpointManifest> manifest =
        text.ok() ? ParseManifest(*text) : absl::StatusOr<v1::CheckpointManifest>(text.status());
    if (manifest.ok()) {
      listing.step = manifest->step();
      listing.created = manifest->created();
      listing.bytes = static_cast<int64_t>(text->size());
      for (const v1::CheckpointFile& f : manifest->files()) listing.bytes += f.bytes();
    } else {
      listing.error = std::string(manifest.status().message());
    }
    out.push_back(std::move(listing));
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointListing& a, const CheckpointListing& b) { return a.name < b.name; });
  return out;
}

absl::Status DeleteCheckpoint(const std::string& dir, const std::string& name) {
  RETURN_IF_ERROR(ValidateCheckpointName(name, "name"));
  // Renamed away first, so that no reader ever sees a half-deleted checkpoint.
  ASSIGN_OR_RETURN(const std::string trash, MakeHiddenDir(dir, ".tmp-", name));
  if (::rename(JoinPath(dir, name).c_str(), trash.c_str()) != 0) {
    const int err = errno;
    std::error_code ec;
    fs::remove_all(trash, ec);
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat("checkpoint ", Quoted(name), ": no such checkpoint"));
    return Prefixed(IoError("delete", name, err), name);
  }
  std::error_code ec;
  fs::remove_all(trash, ec);
  return absl::OkStatus();
}

absl::Status CleanCheckpointDir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::FailedPreconditionError(absl::StrCat("--checkpoint_dir: cannot create ", dir, ": ", ec.message()));
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat("--checkpoint_dir: ", dir, " is not a directory"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("--checkpoint_dir: ", dir, " is not writable"));
  }
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (absl::StartsWith(file, ".tmp-")) {
      fs::remove_all(entry.path(), ec);
    } else if (absl::StartsWith(file, ".old-") && file.size() > 12) {
      // ".old-<name>-XXXXXX": put back when <name> is gone, else drop.
      const std::string original = file.substr(5, file.size() - 5 - 7);
      const std::string target = JoinPath(dir, original);
      if (ValidateCheckpointName(original, "name").ok() && !fs::exists(target, ec)) {
        ::rename(entry.path().c_str(), target.c_str());
      } else {
        fs::remove_all(entry.path(), ec);
      }
    }
  }
  return FsyncDir(dir, "--checkpoint_dir");
}

}  // namespace train
}  // namespace teserve
