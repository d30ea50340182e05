// How the quantized GEMMs of a recipe run on a device: natively (the GEMM reads the
// quantized operands and their scales), emulated (the operands are dequantized and
// multiplied in higher precision, numerically the quantized computation) or not at all.
// This is the answer TE gives through is_fp8_available / is_mxfp8_available / ... with
// return_reason=True. GetServerInfo reports it for every recipe and sessions report it
// per quantized tensor (GetQuantizationState) from this one function.
//
// A pure function of the device facts, so it is tested for every GPU generation on a
// machine that has none.
#ifndef TESERVE_RECIPES_GEMM_EXECUTION_H_
#define TESERVE_RECIPES_GEMM_EXECUTION_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace teserve {
namespace recipes {

struct DeviceFacts {
  bool is_cuda = false;  // false: the CPU reference backend
  int cc_major = 0;      // compute capability; ignored on CPU
  int cc_minor = 0;
  // cuBLASLt version as "major.minor[.patch]"; empty when unknown or not loadable.
  std::string cublaslt_version;
};

enum class GemmExecution { kNative, kEmulated, kUnavailable };

// "native", "emulated", "unavailable".
absl::string_view GemmExecutionName(GemmExecution execution);

struct GemmPlan {
  std::string recipe;  // "delayed", "current", "mxfp8", "block", "nvfp4"
  GemmExecution execution = GemmExecution::kUnavailable;
  std::string reason;
};

inline constexpr const char* kRecipeNames[] = {"delayed", "current", "mxfp8", "block", "nvfp4"};

// One plan per recipe, in the order of kRecipeNames.
std::vector<GemmPlan> PlanGemms(const DeviceFacts& facts);

// The plan of one recipe (Recipe::name()); unknown names are kUnavailable.
GemmPlan PlanGemm(absl::string_view recipe, const DeviceFacts& facts);

}  // namespace recipes
}  // namespace teserve

#endif  // TESERVE_RECIPES_GEMM_EXECUTION_H_
