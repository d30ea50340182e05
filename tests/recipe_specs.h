// A RecipeSpec by its recipe name, for tests that run one case per recipe.
#ifndef TESERVE_TESTS_RECIPE_SPECS_H_
#define TESERVE_TESTS_RECIPE_SPECS_H_

#include <string>

#include "teserve/v1/model.pb.h"

namespace teserve {
namespace testing_util {

// "none" (or any other name): no recipe; "delayed" (amax history of 4), "current",
// "mxfp8", "block", "nvfp4": that recipe with its defaults.
inline v1::RecipeSpec RecipeSpecNamed(const std::string& name) {
  v1::RecipeSpec r;
  if (name == "delayed") r.mutable_delayed()->set_amax_history_len(4);
  if (name == "current") r.mutable_current();
  if (name == "mxfp8") r.mutable_mxfp8();
  if (name == "block") r.mutable_block();
  if (name == "nvfp4") r.mutable_nvfp4();
  return r;
}

}  // namespace testing_util
}  // namespace teserve

#endif  // TESERVE_TESTS_RECIPE_SPECS_H_
