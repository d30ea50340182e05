// Checkpoints: a session's specs and SessionState (train/session.h) in a directory
//   <checkpoint_dir>/<name>/
//     model.json, recipe.json, optimizer.json   the specs, protobuf JSON
//     parameters.safetensors                    SessionState groups, one file each
//     gradients.safetensors                     (train/safetensors.h; each header's
//     optimizer.safetensors                      __metadata__ holds format, version,
//     state.safetensors                          group and step)
//     checkpoint.json                           the manifest (proto/teserve/v1/
//                                               checkpoint.proto): format, version,
//                                               step, and every file's size and SHA-256
//
// Writing is atomic: the files go to a fresh temporary directory beside the target
// (".tmp-<name>-XXXXXX"), each written and fsync'ed, the manifest last; then the
// directory is fsync'ed, renamed to <name> and the parent fsync'ed. A crash at any point
// leaves either the previous checkpoint of that name or the new one, never a mix.
// Replacing an existing checkpoint (overwrite) moves the old one aside to
// ".old-<name>-XXXXXX" first and deletes it after the rename; CleanCheckpointDir puts
// such a leftover back when a crash came between the two renames.
//
// Reading trusts nothing and loads nothing partially: the manifest is checked first
// (format, version, the exact file list), then every file against its size and SHA-256
// and its own header, and the whole checkpoint is returned only when every file passed.
// Errors name the checkpoint and the file and say what is wrong:
//   NOT_FOUND            no checkpoint of that name
//   FAILED_PRECONDITION  not a teserve checkpoint (no or a foreign manifest, a
//                        safetensors file without teserve metadata) or another version
//   DATA_LOSS            truncated, corrupted (size, checksum, structure) or inconsistent
//
// Names: 1 to 128 characters from [A-Za-z0-9._-], starting with a letter or digit, with
// no ".." — so never a path, absolute or relative, and never one of the hidden names
// used while writing.
#ifndef TESERVE_TRAIN_CHECKPOINT_H_
#define TESERVE_TRAIN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "train/session.h"
#include "teserve/v1/model.pb.h"

namespace teserve {
namespace train {

inline constexpr char kCheckpointFormat[] = "teserve-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr size_t kMaxCheckpointNameLength = 128;
inline constexpr char kCheckpointManifest[] = "checkpoint.json";

// INVALID_ARGUMENT naming `field` ("name: expected 1 to 128 characters from
// [A-Za-z0-9._-] starting with a letter or digit, without '..', got '../x'").
absl::Status ValidateCheckpointName(absl::string_view name, absl::string_view field);

struct CheckpointContents {
  v1::ModelSpec model;
  v1::RecipeSpec recipe;
  v1::OptimizerSpec optimizer;
  SessionState state;
};

struct CheckpointWriteResult {
  int64_t bytes = 0;  // of all files
};

// Writes <dir>/<name> as described above. ALREADY_EXISTS when it exists and !overwrite;
// RESOURCE_EXHAUSTED when the disk is full; INTERNAL for other I/O errors (with the
// file and errno's text). `dir` must exist.
absl::StatusOr<CheckpointWriteResult> WriteCheckpoint(const std::string& dir, const std::string& name,
                                                      const CheckpointContents& contents, bool overwrite,
                                                      absl::string_view teserve_version);

absl::StatusOr<CheckpointContents> ReadCheckpoint(const std::string& dir, const std::string& name);

struct CheckpointListing {
  std::string name;
  int64_t step = 0;
  int64_t bytes = 0;
  std::string created;
  std::string error;  // why the manifest could not be read (then step/bytes are 0)
};

// Directories of `dir` with valid checkpoint names, by name; the manifest is read (not
// the files).
absl::StatusOr<std::vector<CheckpointListing>> ListCheckpoints(const std::string& dir);

absl::Status DeleteCheckpoint(const std::string& dir, const std::string& name);

// Creates `dir` when missing, removes the temporary directories of interrupted writes
// and puts back a checkpoint whose replacement was interrupted between its two renames.
// A checkpoint directory belongs to one server process at a time.
absl::Status CleanCheckpointDir(const std::string& dir);

// Lowercase hex SHA-256 of `bytes`, as the manifest records each file's.
std::string Sha256Hex(absl::string_view bytes);

}  // namespace train
}  // namespace teserve

#endif  // TESERVE_TRAIN_CHECKPOINT_H_
