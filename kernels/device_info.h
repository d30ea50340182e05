// What the machine offers: GPUs, their compute capability and the versions of the
// CUDA libraries teserve uses. Safe to call on machines without a GPU or without the
// CUDA backend compiled in (then gpu_count is 0 and cuda_compiled says why).
#ifndef TESERVE_KERNELS_DEVICE_INFO_H_
#define TESERVE_KERNELS_DEVICE_INFO_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace teserve {
namespace kernels {

struct DeviceInfo {
  bool cuda_compiled = false;     // TESERVE_WITH_CUDA
  int gpu_count = 0;              // 0 when no driver / no device
  std::string no_gpu_reason;      // why gpu_count is 0 (e.g. the cudaGetDeviceCount error)
  // Of device 0 when gpu_count > 0:
  std::string device_name;        // "NVIDIA H200"
  int cc_major = 0;               // compute capability
  int cc_minor = 0;
  std::string cuda_runtime_version;  // "13.0"
  std::string driver_version;        // "13.0" (CUDA driver API version)
  std::string cublaslt_version;      // "13.1.0" or empty
  std::string cudnn_version;         // "9.14.0" or empty when not loadable
  std::string nccl_version;          // "2.28.3" or empty when not loadable
};

// Queries once per call; cheap enough for GetServerInfo.
DeviceInfo QueryDeviceInfo();

struct DeviceMemory {
  int64_t used_bytes = 0;   // total - free, whoever allocated it
  int64_t total_bytes = 0;
  // teserve's stream-ordered pool on the device: what it holds from the driver, and of
  // that what tensors use (the rest is kept for reuse).
  int64_t pool_reserved_bytes = 0;
  int64_t pool_used_bytes = 0;
};

// cudaMemGetInfo of GPU `index` (selects it on the calling thread). UNAVAILABLE naming
// the CUDA error, or FAILED_PRECONDITION in builds without CUDA.
absl::StatusOr<DeviceMemory> QueryDeviceMemory(int index);

// A CUDA stream of one device, owned: the destructor waits for the stream's work and
// destroys it. Sessions on a GPU each own one, so their work is ordered on it.
//
// The stream is created blocking (ordered with the legacy default stream): ops that
// still allocate their outputs without a stream (on the legacy stream) then free them
// only after the session's earlier work, which keeps reuse safe. The price is that
// such ops serialize sessions; ops that allocate on the Context's stream do not.
class DeviceStream {
 public:
  // FAILED_PRECONDITION in builds without CUDA; the CUDA error otherwise.
  static absl::StatusOr<std::unique_ptr<DeviceStream>> Create(int device_index);
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  void* get() const { return stream_; }  // a cudaStream_t
  // Waits for the work enqueued so far.
  absl::Status Synchronize() const;

 private:
  DeviceStream(int device_index, void* stream) : device_index_(device_index), stream_(stream) {}
  int device_index_;
  void* stream_;
};

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_DEVICE_INFO_H_
