// Sampled kernel timing: the checked entry points of the op families wrap their
// dispatch in a ScopedKernelTimer, which reports the duration of every interval-th call
// of each op to the KernelTimingSink attached to the Context (Context::kernel_timing).
// Without a sink, or in a call that is not sampled, the timer costs one pointer test
// (plus one relaxed atomic increment with a sink).
//
// Devices: on the CPU the duration is the steady-clock time of the dispatch, which is
// the kernel itself (the reference backend computes synchronously). On a CUDA device a
// host clock would only measure the launch: a sampled call records a start / stop event
// pair on ctx.stream around the op (a DeviceTimer, made by the factory the CUDA backend
// registers) and hands it to the sink as pending. The sink reports it to Record() once
// the stop event has completed, polled at the sink's next Sample() call or by Drain();
// no thread ever waits for the GPU to take a timing.
#ifndef TESERVE_KERNELS_TIMING_H_
#define TESERVE_KERNELS_TIMING_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>

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

// A start / stop event pair on a device stream (kernels/cuda/timing_cuda.cc).
class DeviceTimer {
 public:
  virtual ~DeviceTimer() = default;
  // Records the stop event on the stream the timer started on.
  virtual void Stop() = 0;
  // Seconds between the events once the stop event has completed; a negative value
  // while it has not. A timer whose events failed reports 0 and is dropped.
  virtual double ElapsedSeconds() = 0;
};
// Starts a timer on ctx.stream, or returns null when the device cannot time.
using DeviceTimerFactory = std::unique_ptr<DeviceTimer> (*)(const Context& ctx);
// The CUDA backend registers its factory on first use (with its allocator).
void RegisterDeviceTimerFactory(DeviceTimerFactory factory);
DeviceTimerFactory GetDeviceTimerFactory();

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
    if (pending_count_.load(std::memory_order_relaxed) > 0) Drain();
    const int64_t call = calls_[static_cast<int>(op)].fetch_add(1, std::memory_order_relaxed);
    return call % interval_ == 0;
  }
  // Calls of `op` counted so far (timed or not).
  int64_t calls(KernelOp op) const {
    return calls_[static_cast<int>(op)].load(std::memory_order_relaxed);
  }
  int64_t interval() const { return interval_; }

  virtual void Record(KernelOp op, const Device& device, double seconds) = 0;

  // A device timing whose stop event may not have completed yet.
  void AddPending(KernelOp op, const Device& device, std::unique_ptr<DeviceTimer> timer);
  // Reports the pending timings that have completed; the others stay pending.
  void Drain();
  int64_t pending() const { return pending_count_.load(std::memory_order_relaxed); }

 private:
  struct Pending {
    KernelOp op;
    Device device;
    std::unique_ptr<DeviceTimer> timer;
  };

  const int64_t interval_;
  std::array<std::atomic<int64_t>, kNumKernelOps> calls_{};
  std::mutex pending_mu_;
  std::deque<Pending> pending_;  // guarded by pending_mu_
  std::atomic<int64_t> pending_count_{0};
};

class ScopedKernelTimer {
 public:
  ScopedKernelTimer(const Context& ctx, KernelOp op)
      : sink_(ctx.kernel_timing != nullptr && (ctx.device.is_cpu() || GetDeviceTimerFactory() != nullptr) &&
                      ctx.kernel_timing->Sample(op)
                  ? ctx.kernel_timing
                  : nullptr),
        op_(op),
        device_(ctx.device) {
    if (sink_ == nullptr) return;
    if (device_.is_cpu()) {
      start_ = std::chrono::steady_clock::now();
    } else {
      device_timer_ = GetDeviceTimerFactory()(ctx);
    }
  }
  ~ScopedKernelTimer() {
    if (sink_ == nullptr) return;
    if (device_.is_cpu()) {
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      sink_->Record(op_, device_, elapsed.count());
    } else if (device_timer_ != nullptr) {
      device_timer_->Stop();
      sink_->AddPending(op_, device_, std::move(device_timer_));
    }
  }
  ScopedKernelTimer(const ScopedKernelTimer&) = delete;
  ScopedKernelTimer& operator=(const ScopedKernelTimer&) = delete;

 private:
  KernelTimingSink* const sink_;  // null: this call is not timed
  const KernelOp op_;
  const Device device_;
  std::chrono::steady_clock::time_point start_;
  std::unique_ptr<DeviceTimer> device_timer_;
};

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_TIMING_H_
