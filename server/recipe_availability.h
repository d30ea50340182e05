// Which quantization recipes this server can run on a device, and why: the wire form
// of recipes::PlanGemms (recipes/gemm_execution.h), which sessions use too.
#ifndef TESERVE_SERVER_RECIPE_AVAILABILITY_H_
#define TESERVE_SERVER_RECIPE_AVAILABILITY_H_

#include <vector>

#include "recipes/gemm_execution.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace server {

using recipes::DeviceFacts;

// One entry per recipe, in the order delayed, current, mxfp8, block, nvfp4.
std::vector<v1::RecipeAvailability> RecipeAvailabilities(const DeviceFacts& facts);

// The recipe a client gets when it asks for "the default" (TE's default recipe).
inline constexpr char kDefaultRecipe[] = "delayed";

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_RECIPE_AVAILABILITY_H_
