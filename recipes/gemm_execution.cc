#include "recipes/gemm_execution.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace teserve {
namespace recipes {
namespace {


GemmPlan Entry(const char* recipe, GemmExecution execution, std::string reason) {
  return GemmPlan{recipe, execution, std::move(reason)};
}

// True when `version` ("12.9", "13.1.0") is at least major.minor. Unknown versions
// (empty or unparsable) count as too old: we only claim what we can prove.
bool VersionAtLeast(const std::string& version, int major, int minor) {
  std::vector<std::string> parts = absl::StrSplit(version, '.');
  int got_major = 0;
  int got_minor = 0;
  if (parts.size() < 2 || !absl::SimpleAtoi(parts[0], &got_major) ||
      !absl::SimpleAtoi(parts[1], &got_minor)) {
    return false;
  }
  return got_major > major || (got_major == major && got_minor >= minor);
}

struct Gpu {
  int cc;          // 90 for 9.0
  std::string sm;  // "sm_90"
  bool hopper() const { return cc / 10 == 9; }
  bool blackwell_or_newer() const { return cc >= 100; }
};

// Delayed and current scaling: per-tensor FP8 GEMMs, which Ada (8.9) introduced.
GemmPlan PerTensorFp8(const char* recipe, const Gpu& gpu) {
  if (gpu.cc >= 89) {
    return Entry(recipe, GemmExecution::kNative, absl::StrCat("per-tensor FP8 GEMMs run natively on ", gpu.sm));
  }
  return Entry(recipe, GemmExecution::kUnavailable,
               absl::StrCat("FP8 needs compute capability 8.9+ (Ada, Hopper, Blackwell); this "
                            "device is ",
                            gpu.sm));
}

// MXFP8 and NVFP4: hardware block scales exist only on Blackwell, where both run natively
// through cuBLASLt's VEC32_UE8M0 / VEC16_UE4M3 modes (cuBLASLt >= 12.8; the rule of
// kernels::MicroScaledGemmSupportFor, which Linear asks at run time, with the same
// TESERVE_NATIVE_MICROSCALED_GEMM=0 switch). Hopper runs them by dequantizing the
// operands (numerically the same computation, slower). The claim follows the GEMM that
// actually runs.
GemmPlan MicroBlockScaled(const char* recipe, const char* what, const Gpu& gpu,
                          const std::string& cublaslt_version) {
  if (gpu.blackwell_or_newer()) {
    const char* off = std::getenv("TESERVE_NATIVE_MICROSCALED_GEMM");
    if (off != nullptr && std::string(off) == "0") {
      return Entry(recipe, GemmExecution::kEmulated,
                   absl::StrCat("native ", what,
                                " GEMMs are turned off (TESERVE_NATIVE_MICROSCALED_GEMM=0); the operands are "
                                "dequantized and multiplied in BF16/FP32"));
    }
    if (VersionAtLeast(cublaslt_version, 12, 8)) {
      return Entry(recipe, GemmExecution::kNative,
                   absl::StrCat(what, " GEMMs run natively on ", gpu.sm, " (cuBLASLt ", cublaslt_version, ", ",
                                std::string(recipe) == "mxfp8" ? "VEC32_UE8M0" : "VEC16_UE4M3", " scales)"));
    }
    return Entry(recipe, GemmExecution::kEmulated,
                 absl::StrCat("native ", what, " GEMMs need cuBLASLt >= 12.8, got ",
                              cublaslt_version.empty() ? "unknown" : cublaslt_version,
                              "; the operands are dequantized and multiplied in BF16/FP32"));
  }
  if (gpu.hopper()) {
    return Entry(recipe, GemmExecution::kEmulated,
                 absl::StrCat(what, " GEMMs run natively only on sm_100+; on ", gpu.sm,
                              " the operands are dequantized and multiplied in BF16/FP32"));
  }
  return Entry(recipe, GemmExecution::kUnavailable,
               absl::StrCat(what, " needs compute capability 9.0+ (emulated) or 10.0+ "
                            "(native); this device is ",
                            gpu.sm));
}

// FP8 block scaling: cuBLASLt 12.9 added the VEC128 / BLK128x128 scale modes, for
// Hopper (sm_90) only. This is the rule of kernels::BlockScaledGemmSupportFor, which
// decides at run time whether Linear's block-scaled GEMMs read the codes (native) or
// dequantize them on the device (emulated), so the claim is what a session runs.
GemmPlan Fp8Block(const Gpu& gpu, const std::string& cublaslt_version) {
  const std::string cublaslt = cublaslt_version.empty() ? "unknown" : cublaslt_version;
  if (gpu.cc < 90) {
    return Entry("block", GemmExecution::kUnavailable,
                 absl::StrCat("FP8 block scaling needs compute capability 9.0+; this device is ",
                              gpu.sm));
  }
  if (!gpu.hopper()) {
    return Entry("block", GemmExecution::kEmulated,
                 absl::StrCat("cuBLASLt's FP8 block scale modes (VEC128_32F / BLK128x128_32F) exist only on "
                              "sm_90; on ",
                              gpu.sm, " the operands are dequantized and multiplied in FP32"));
  }
  if (VersionAtLeast(cublaslt_version, 12, 9)) {
    return Entry("block", GemmExecution::kNative,
                 absl::StrCat("FP8 block-scaled GEMMs run natively on ", gpu.sm,
                              " with cuBLASLt ", cublaslt));
  }
  return Entry("block", GemmExecution::kEmulated,
               absl::StrCat("native FP8 block scaling needs cuBLASLt >= 12.9, got ", cublaslt,
                            "; the operands are dequantized instead"));
}


constexpr char kCpuReference[] = "CPU reference backend: GEMMs run in FP32 on dequantized operands";

}  // namespace

absl::string_view GemmExecutionName(GemmExecution execution) {
  switch (execution) {
    case GemmExecution::kNative: return "native";
    case GemmExecution::kEmulated: return "emulated";
    case GemmExecution::kUnavailable: return "unavailable";
  }
  return "unavailable";
}

std::vector<GemmPlan> PlanGemms(const DeviceFacts& facts) {
  if (!facts.is_cuda) {
    std::vector<GemmPlan> plans;
    for (const char* recipe : kRecipeNames) plans.push_back(Entry(recipe, GemmExecution::kEmulated, kCpuReference));
    return plans;
  }
  const int cc = facts.cc_major * 10 + facts.cc_minor;
  const Gpu gpu{cc, absl::StrCat("sm_", cc)};
  return {
      PerTensorFp8("delayed", gpu),
      PerTensorFp8("current", gpu),
      MicroBlockScaled("mxfp8", "MXFP8", gpu, facts.cublaslt_version),
      Fp8Block(gpu, facts.cublaslt_version),
      MicroBlockScaled("nvfp4", "NVFP4", gpu, facts.cublaslt_version),
  };
}

GemmPlan PlanGemm(absl::string_view recipe, const DeviceFacts& facts) {
  for (GemmPlan& plan : PlanGemms(facts)) {
    if (plan.recipe == recipe) return std::move(plan);
  }
  return GemmPlan{std::string(recipe), GemmExecution::kUnavailable, absl::StrCat("unknown recipe '", recipe, "'")};
}

}  // namespace recipes
}  // namespace teserve
