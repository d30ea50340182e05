#include "server/recipe_availability.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace teserve {
namespace server {
namespace {

using ::testing::HasSubstr;

struct Expected {
  const char* recipe;
  v1::Availability availability;
  const char* reason_fragment;
};

void ExpectAvailabilities(const DeviceFacts& facts, const std::vector<Expected>& expected) {
  const std::vector<v1::RecipeAvailability> got = RecipeAvailabilities(facts);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(expected[i].recipe);
    EXPECT_EQ(got[i].recipe(), expected[i].recipe);
    EXPECT_EQ(v1::Availability_Name(got[i].availability()),
              v1::Availability_Name(expected[i].availability));
    EXPECT_THAT(got[i].reason(), HasSubstr(expected[i].reason_fragment));
  }
}

DeviceFacts Gpu(int major, int minor, const char* cublaslt) {
  DeviceFacts facts;
  facts.is_cuda = true;
  facts.cc_major = major;
  facts.cc_minor = minor;
  facts.cublaslt_version = cublaslt;
  return facts;
}

TEST(RecipeAvailability, CpuEmulatesPerTensorFp8AndLacksBlockRecipes) {
  ExpectAvailabilities(
      DeviceFacts{},
      {{"delayed", v1::EMULATED, "CPU reference backend: GEMMs run in FP32 on dequantized"},
       {"current", v1::EMULATED, "CPU reference backend"},
       {"mxfp8", v1::EMULATED, "CPU reference backend"},
       {"block", v1::EMULATED, "CPU reference backend"},
       {"nvfp4", v1::EMULATED, "CPU reference backend"}});
}

TEST(RecipeAvailability, AmpereHasNoFp8) {
  ExpectAvailabilities(Gpu(8, 0, "12.9.1"),
                       {{"delayed", v1::UNAVAILABLE, "compute capability 8.9+"},
                        {"current", v1::UNAVAILABLE, "this device is sm_80"},
                        {"mxfp8", v1::UNAVAILABLE, "9.0+ (emulated) or 10.0+ (native)"},
                        {"block", v1::UNAVAILABLE, "needs compute capability 9.0+"},
                        {"nvfp4", v1::UNAVAILABLE, "this device is sm_80"}});
}

TEST(RecipeAvailability, AdaRunsPerTensorFp8Only) {
  ExpectAvailabilities(Gpu(8, 9, "12.9.1"),
                       {{"delayed", v1::NATIVE, "natively on sm_89"},
                        {"current", v1::NATIVE, "natively on sm_89"},
                        {"mxfp8", v1::UNAVAILABLE, "this device is sm_89"},
                        {"block", v1::UNAVAILABLE, "this device is sm_89"},
                        {"nvfp4", v1::UNAVAILABLE, "this device is sm_89"}});
}

TEST(RecipeAvailability, HopperEmulatesMicroscalingAndNeedsNewCublasLtForBlocks) {
  ExpectAvailabilities(Gpu(9, 0, "13.1.0"),
                       {{"delayed", v1::NATIVE, "sm_90"},
                        {"current", v1::NATIVE, "sm_90"},
                        {"mxfp8", v1::EMULATED, "natively only on sm_100+"},
                        {"block", v1::NATIVE, "cuBLASLt 13.1.0"},
                        {"nvfp4", v1::EMULATED, "dequantized"}});
  ExpectAvailabilities(Gpu(9, 0, "12.8.4"),
                       {{"delayed", v1::NATIVE, "sm_90"},
                        {"current", v1::NATIVE, "sm_90"},
                        {"mxfp8", v1::EMULATED, "sm_100+"},
                        {"block", v1::EMULATED, "needs cuBLASLt >= 12.9, got 12.8.4"},
                        {"nvfp4", v1::EMULATED, "sm_100+"}});
}

TEST(RecipeAvailability, UnknownCublasLtVersionIsNotTrusted) {
  const std::vector<v1::RecipeAvailability> got = RecipeAvailabilities(Gpu(9, 0, ""));
  EXPECT_EQ(got[3].recipe(), "block");
  EXPECT_EQ(got[3].availability(), v1::EMULATED);
  EXPECT_THAT(got[3].reason(), HasSubstr("got unknown"));
}

// The claim follows the GEMM that runs: MXFP8 and NVFP4 natively through cuBLASLt's
// VEC32_UE8M0 / VEC16_UE4M3 modes (>= 12.8), while cuBLASLt's VEC128_32F / BLK128x128_32F
// scale modes are Hopper's (Blackwell's block-scaled tensor cores take E8M0 / E4M3
// scales), so FP8 blocks are dequantized.
TEST(RecipeAvailability, BlackwellRunsMicroscalingNativelyAndEmulatesFp8Blocks) {
  ExpectAvailabilities(Gpu(10, 0, "12.9.0"),
                       {{"delayed", v1::NATIVE, "sm_100"},
                        {"current", v1::NATIVE, "sm_100"},
                        {"mxfp8", v1::NATIVE, "MXFP8 GEMMs run natively on sm_100 (cuBLASLt 12.9.0, VEC32_UE8M0"},
                        {"block", v1::EMULATED, "exist only on sm_90; on sm_100 the operands are dequantized"},
                        {"nvfp4", v1::NATIVE, "NVFP4 GEMMs run natively on sm_100 (cuBLASLt 12.9.0, VEC16_UE4M3"}});
}

TEST(RecipeAvailability, BlackwellWithAnOldCublasLtEmulatesMicroscaling) {
  const std::vector<v1::RecipeAvailability> got = RecipeAvailabilities(Gpu(10, 0, "12.6.3"));
  for (int i : {2, 4}) {
    SCOPED_TRACE(got[i].recipe());
    EXPECT_EQ(got[i].availability(), v1::EMULATED);
    EXPECT_THAT(got[i].reason(), HasSubstr("GEMMs need cuBLASLt >= 12.8, got 12.6.3"));
  }
}

TEST(RecipeAvailability, NativeMicroscalingCanBeTurnedOff) {
  ASSERT_EQ(setenv("TESERVE_NATIVE_MICROSCALED_GEMM", "0", 1), 0);
  const std::vector<v1::RecipeAvailability> got = RecipeAvailabilities(Gpu(10, 0, "13.0.0"));
  ASSERT_EQ(unsetenv("TESERVE_NATIVE_MICROSCALED_GEMM"), 0);
  for (int i : {2, 4}) {
    SCOPED_TRACE(got[i].recipe());
    EXPECT_EQ(got[i].availability(), v1::EMULATED);
    EXPECT_THAT(got[i].reason(), HasSubstr("TESERVE_NATIVE_MICROSCALED_GEMM=0"));
  }
}

TEST(RecipeAvailability, DefaultRecipeIsDelayedScaling) { EXPECT_STREQ(kDefaultRecipe, "delayed"); }

}  // namespace
}  // namespace server
}  // namespace teserve
