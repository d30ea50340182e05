// Sampled kernel timing: the checked entry points of the op families wrap their
// dispatch in a ScopedKernelTimer, which reports the duration of every interval-th call
// of each op to the KernelTimingSink attached to the Context (Context::kernel_timing).
// Without a sink, or in a call that is not sampled, the timer costs one pointer test
// (plus one relaxed atomic increment with a sink).
//
// Devices: on the CPU the duration is the steady-clock time of the dispatch, which is
// the kernel itself (the reference backend computes synchronously). On CUDA devices a
// host clock would only measure the launch, so CUDA contexts are not timed here yet;
// the seam for CUDA events is ScopedKernelTimer: record a start/stop cudaEvent pair on
// ctx.stream around the launch and report cudaEventElapsedTime to Record() once the
// stop event has completed (queried later, never synchronized on the launching thread).
#ifndef TESERVE_KERNELS_TIMING_H_
#define TESERVE_KERNELS_TIMING_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

// The timed ops; KernelOpName gives the metric label ("gemm", "quantize_mxfp8", ...).
enum class KernelOp : int {
  kGemm,
  kAmax,
  kQuantizePerTensor,
  kDequantizePerTensor,
  kQuantizeMxfp8,
  kQuantizeBlock,
  kDequantizeBlock,
  kQuantizeNvfp4,
  kDequantizeNvfp4,
  kLayerNormForward,
  kLayerNormBackward,
  kRmsNormForward,
  kRmsNormBackward,
  kNormalizationForward,
  kNormalizationBackward,
  kActivationForward,
  kActivationBackward,
  kAttentionForward,
  kAttentionBackward,
  kRopeForward,
  kRopeBackward,
  kMseForward,
  kMseBackward,
  kCrossEntropyForward,
  kCrossEntropyBackward,
};
inline constexpr int kNumKernelOps = static_cast<int>(KernelOp::kCrossEntropyBackward) + 1;

absl::string_view KernelOpName(KernelOp op);

// Receives sampled durations. Thread-safe: sessions on different threads share one.
class KernelTimingSink {
 public:
  // Every interval-th call of each op is timed, the first one included; interval <= 0
  // times nothing.
  explicit KernelTimingSink(int64_t interval) : interval_(interval) {}
  virtual ~KernelTimingSink() = default;

  // Counts one call of `op`; true when that call is to be timed.
  bool Sample(KernelOp op) {
    if (interval_ <= 0) return false;
    const int64_t call = calls_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
    return call % interval_ == 0;
  }
  // Calls of `op` counted so far (timed or not).
  int64_t calls(KernelOp op) const {
    return calls_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  int64_t interval() const { return interval_; }

  virtual void Record(KernelOp op, const Device& device, double seconds) = 0;

 private:
  const int64_t interval_;
  std::array<std::atomic<int64_t>, kNumKernelOps> calls_{};
};

class ScopedKernelTimer {
 public:
  ScopedKernelTimer(const Context& ctx, KernelOp op)
      : sink_(ctx.kernel_timing != nullptr && ctx.device.is_cpu() && ctx.kernel_timing->Sample(op)
                  ? ctx.kernel_timing
                  : nullptr),
        op_(op),
        device_(ctx.device) {
    if (sink_ != nullptr) start_ = std::chrono::steady_clock::now();
  }
  ~ScopedKernelTimer() {
    if (sink_ == nullptr) return;
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
    sink_->Record(op_, device_, elapsed.count());
  }
  ScopedKernelTimer(const ScopedKernelTimer&) = delete;
  ScopedKernelTimer& operator=(const ScopedKernelTimer&) = delete;

 private:
  KernelTimingSink* const sink_;  // null: this call is not timed
  const KernelOp op_;
  const Device device_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_TIMING_H_
