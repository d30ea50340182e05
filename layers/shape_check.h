// Shape validation shared by the layers' OutputShapes.
#ifndef TESERVE_LAYERS_SHAPE_CHECK_H_
#define TESERVE_LAYERS_SHAPE_CHECK_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/status.h"
#include "core/tensor.h"

namespace teserve {
namespace layers {

inline absl::Status ExpectInputCount(const std::vector<Shape>& shapes, size_t count,
                                     absl::string_view field) {
  if (shapes.size() != count) {
    return InvalidField(field, absl::StrCat(count, " tensor", count == 1 ? "" : "s"),
                        shapes.size());
  }
  return absl::OkStatus();
}

// The shape must have rank >= 1 and last dimension `features`; `what` says where the
// expectation comes from ("in_features of layer 'fc1'").
inline absl::Status ExpectFeatures(const Shape& shape, int64_t features, absl::string_view field,
                                   absl::string_view what) {
  if (shape.empty()) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat("rank >= 1 with last dimension ", features, " (", what, ")"),
                        "a scalar (rank 0)");
  }
  if (shape.back() != features) {
    return InvalidField(absl::StrCat(field, ".shape"),
                        absl::StrCat("last dimension ", features, " (", what, ")"),
                        absl::StrCat(ShapeToString(shape)));
  }
  return absl::OkStatus();
}

}  // namespace layers
}  // namespace teserve

#endif  // TESERVE_LAYERS_SHAPE_CHECK_H_
