#include "kernels/run_ahead.h"

#if TESERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace teserve {
namespace kernels {

RunAheadLimit::~RunAheadLimit() {
#if TESERVE_WITH_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void RunAheadLimit::Mark(const Context& ctx) {
#if TESERVE_WITH_CUDA
  if (ctx.device.is_cpu() || failed_) return;
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) {
    failed_ = true;
    return;
  }
  const int device = static_cast<int>(ctx.device.index);
  if (device != current && cudaSetDevice(device) != cudaSuccess) {
    failed_ = true;
    return;
  }
  if (events_.empty()) {
    device_ = device;
    for (int i = 0; i < depth_; ++i) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess) {
        failed_ = true;
        break;
      }
      events_.push_back(e);
    }
  }
  if (!failed_ && device == device_) {
    cudaEvent_t slot = static_cast<cudaEvent_t>(events_[next_]);
    // The marker recorded depth_ marks ago: wait until the GPU has got that far.
    if (recorded_ >= depth_ && cudaEventSynchronize(slot) != cudaSuccess) failed_ = true;
    if (!failed_ && cudaEventRecord(slot, static_cast<cudaStream_t>(ctx.stream)) != cudaSuccess) failed_ = true;
    next_ = (next_ + 1) % depth_;
    if (recorded_ < depth_) ++recorded_;
  }
  if (failed_) cudaGetLastError();  // leave no sticky error for the pass's own launches
  if (device != current) cudaSetDevice(current);
#else
  (void)ctx;
#endif
}

}  // namespace kernels
}  // namespace teserve
