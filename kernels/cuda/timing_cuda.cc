// The CUDA DeviceTimer of kernels/timing.h: a pair of cudaEvents recorded on the op's
// stream. Sampled calls only (every interval-th call of an op), so creating the events
// per timer costs little; the sink polls cudaEventQuery and never synchronizes.
#include <cuda_runtime_api.h>

#include <memory>

#include "core/context.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/device_entry.h"  // ScopedDevice, StreamOf
#include "kernels/timing.h"

namespace teserve {
namespace kernels {
namespace cuda {
namespace {

class CudaEventTimer final : public DeviceTimer {
 public:
  static std::unique_ptr<DeviceTimer> Start(const Context& ctx) {
    // Events belong to the device of the stream they are recorded on.
    ScopedDevice device(ctx.device.index);
    if (device.status() != cudaSuccess) {
      cudaGetLastError();
      return nullptr;
    }
    auto timer = std::unique_ptr<CudaEventTimer>(new CudaEventTimer(ctx.device.index, StreamOf(ctx)));
    if (cudaEventCreate(&timer->start_) != cudaSuccess || cudaEventCreate(&timer->stop_) != cudaSuccess ||
        cudaEventRecord(timer->start_, timer->stream_) != cudaSuccess) {
      cudaGetLastError();  // a timing that cannot be taken is not the op's error
      return nullptr;
    }
    return timer;
  }

  ~CudaEventTimer() override {
    if (start_ != nullptr) cudaEventDestroy(start_);
    if (stop_ != nullptr) cudaEventDestroy(stop_);
  }

  void Stop() override {
    ScopedDevice device(device_index_);
    if (cudaEventRecord(stop_, stream_) != cudaSuccess) {
      cudaGetLastError();
      failed_ = true;
    }
  }

  double ElapsedSeconds() override {
    if (failed_) return 0.0;
    const cudaError_t ready = cudaEventQuery(stop_);
    if (ready == cudaErrorNotReady) return -1.0;
    float ms = 0.0f;
    if (ready != cudaSuccess || cudaEventElapsedTime(&ms, start_, stop_) != cudaSuccess) {
      cudaGetLastError();
      return 0.0;
    }
    // A kernel shorter than the event resolution reads 0: report the resolution.
    return ms > 0.0f ? ms * 1e-3 : 5e-7;
  }

 private:
  CudaEventTimer(int device_index, cudaStream_t stream) : device_index_(device_index), stream_(stream) {}
  int device_index_;
  cudaStream_t stream_;
  cudaEvent_t start_ = nullptr;
  cudaEvent_t stop_ = nullptr;
  bool failed_ = false;
};

}  // namespace

void RegisterCudaTimer() { RegisterDeviceTimerFactory(&CudaEventTimer::Start); }

}  // namespace cuda
}  // namespace kernels
}  // namespace teserve
