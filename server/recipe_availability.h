// Which quantization recipes this server can run on a device, and why (the answer TE
// gives through is_fp8_available / is_mxfp8_available / ... with return_reason=True).
//
// A pure function of the device facts so it can be tested for every GPU generation on a
// machine that has none.
#ifndef TESERVE_SERVER_RECIPE_AVAILABILITY_H_
#define TESERVE_SERVER_RECIPE_AVAILABILITY_H_

#include <string>
#include <vector>

#include "teserve/v1/service.pb.h"

namespace teserve {
namespace server {

struct DeviceFacts {
  bool is_cuda = false;
  int cc_major = 0;  // compute capability; ignored on CPU
  int cc_minor = 0;
  // cuBLASLt version as "major.minor[.patch]"; empty when unknown or not loadable.
  std::string cublaslt_version;
};

// One entry per recipe, in the order delayed, current, mxfp8, block, nvfp4.
std::vector<v1::RecipeAvailability> RecipeAvailabilities(const DeviceFacts& facts);

// The recipe a client gets when it asks for "the default" (TE's default recipe).
inline constexpr char kDefaultRecipe[] = "delayed";

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_RECIPE_AVAILABILITY_H_
