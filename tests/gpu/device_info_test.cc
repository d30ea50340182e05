// QueryDeviceInfo must never fail: without a GPU (or without CUDA compiled in) it reports
// gpu_count 0 and a reason; with one it names the device and the library versions.
#include "kernels/device_info.h"

#include <iostream>
#include <string>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"

namespace teserve {
namespace {

TEST(DeviceInfo, ReportsGpusOrWhyThereAreNone) {
  const kernels::DeviceInfo info = kernels::QueryDeviceInfo();
  EXPECT_EQ(info.cuda_compiled, TESERVE_WITH_CUDA != 0);
  std::string reason;
  if (!testing::GpuAvailable(&reason)) {
    EXPECT_EQ(info.gpu_count, 0);
    EXPECT_FALSE(info.no_gpu_reason.empty());
    EXPECT_TRUE(info.device_name.empty());
    return;
  }
  EXPECT_GT(info.gpu_count, 0);
  EXPECT_TRUE(info.no_gpu_reason.empty()) << info.no_gpu_reason;
  EXPECT_FALSE(info.device_name.empty());
  EXPECT_GE(info.cc_major, 7);
  EXPECT_FALSE(info.cuda_runtime_version.empty());
  EXPECT_FALSE(info.driver_version.empty());
  EXPECT_FALSE(info.cublaslt_version.empty());
  ::testing::Test::RecordProperty("device", info.device_name);
  std::cout << "device " << info.device_name << " sm_" << info.cc_major << info.cc_minor
            << " runtime " << info.cuda_runtime_version << " driver " << info.driver_version
            << " cublasLt " << info.cublaslt_version << " cudnn '" << info.cudnn_version
            << "' nccl '" << info.nccl_version << "'\n";
}

}  // namespace
}  // namespace teserve
