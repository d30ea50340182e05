// QueryDeviceInfo must never fail: without a GPU (or without CUDA compiled in) it reports
// gpu_count 0 and a reason; with one it names the device and the library versions.
#include "kernels/device_info.h"

#include <cstdint>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

// The server's teserve_device_memory_bytes{device="cuda:N"}: cudaMemGetInfo of the GPU,
// or FAILED_PRECONDITION in a build without CUDA.
TEST(DeviceInfo, DeviceMemoryOfTheFirstGpu) {
  const absl::StatusOr<kernels::DeviceMemory> memory = kernels::QueryDeviceMemory(0);
  if (TESERVE_WITH_CUDA == 0) {
    ASSERT_FALSE(memory.ok());
    EXPECT_EQ(memory.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(memory.status().message().find("built without CUDA"), absl::string_view::npos);
    return;
  }
  std::string reason;
  if (!testing::GpuAvailable(&reason)) {
    ASSERT_FALSE(memory.ok());
    EXPECT_EQ(memory.status().code(), absl::StatusCode::kUnavailable);
    return;
  }
  ASSERT_TRUE(memory.ok()) << memory.status();
  EXPECT_GT(memory->total_bytes, int64_t{1} << 30);
  EXPECT_GT(memory->used_bytes, 0);  // this process's context at least
  EXPECT_LE(memory->used_bytes, memory->total_bytes);
  std::cout << "cuda:0 memory used " << memory->used_bytes << " of " << memory->total_bytes << " bytes\n";
}

}  // namespace
}  // namespace teserve
