#include "layers/spec_checks.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/status.h"

namespace teserve {
namespace layers {

absl::Status CheckSize(int64_t value, absl::string_view field) {
  if (value <= 0 || value > kMaxDim) return InvalidField(field, absl::StrCat("a size in 1..", kMaxDim), value);
  return absl::OkStatus();
}

absl::Status CheckPositiveFinite(float value, absl::string_view field) {
  if (!std::isfinite(value) || value <= 0.0f) return InvalidField(field, "a finite value > 0", value);
  return absl::OkStatus();
}

absl::Status CheckInitStd(bool has, float value, absl::string_view field) {
  if (has && (!std::isfinite(value) || value < 0.0f)) return InvalidField(field, "a finite value >= 0", value);
  return absl::OkStatus();
}

absl::StatusOr<NormKind> ParseNormalization(const std::string& name, absl::string_view field) {
  if (name.empty() || name == "LayerNorm") return NormKind::kLayerNorm;
  if (name == "RMSNorm") return NormKind::kRmsNorm;
  return InvalidField(field, "one of LayerNorm, RMSNorm", Quoted(name));
}

absl::Status CheckTiles(int64_t value, const recipes::Recipe& recipe, absl::string_view field,
                        absl::string_view what) {
  const int64_t multiple = recipe.block_multiple();
  if (value % multiple == 0) return absl::OkStatus();
  return InvalidField(field,
                      absl::StrCat(what, what.empty() ? "" : "to be ", "a multiple of ", multiple, " (", recipe.name(),
                                   " blocks must tile it)"),
                      value);
}

int64_t NormParameterCount(NormKind kind, int64_t width) { return kind == NormKind::kLayerNorm ? 2 * width : width; }

}  // namespace layers
}  // namespace teserve
