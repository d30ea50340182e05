#include "kernels/timing.h"

#include <vector>

namespace teserve {
namespace kernels {

absl::string_view KernelOpName(KernelOp op) {
  switch (op) {
    case KernelOp::kGemm: return "gemm";
    case KernelOp::kAmax: return "amax";
    case KernelOp::kQuantizePerTensor: return "quantize_per_tensor";
    case KernelOp::kDequantizePerTensor: return "dequantize_per_tensor";
    case KernelOp::kQuantizeMxfp8: return "quantize_mxfp8";
    case KernelOp::kQuantizeBlock: return "quantize_block";
    case KernelOp::kDequantizeBlock: return "dequantize_block";
    case KernelOp::kQuantizeNvfp4: return "quantize_nvfp4";
    case KernelOp::kDequantizeNvfp4: return "dequantize_nvfp4";
    case KernelOp::kLayerNormForward: return "layernorm_forward";
    case KernelOp::kLayerNormBackward: return "layernorm_backward";
    case KernelOp::kRmsNormForward: return "rmsnorm_forward";
    case KernelOp::kRmsNormBackward: return "rmsnorm_backward";
    case KernelOp::kNormalizationForward: return "normalization_forward";
    case KernelOp::kNormalizationBackward: return "normalization_backward";
    case KernelOp::kActivationForward: return "activation_forward";
    case KernelOp::kActivationBackward: return "activation_backward";
    case KernelOp::kAttentionForward: return "attention_forward";
    case KernelOp::kAttentionBackward: return "attention_backward";
    case KernelOp::kRopeForward: return "rope_forward";
    case KernelOp::kRopeBackward: return "rope_backward";
    case KernelOp::kMseForward: return "mse_forward";
    case KernelOp::kMseBackward: return "mse_backward";
    case KernelOp::kCrossEntropyForward: return "cross_entropy_forward";
    case KernelOp::kCrossEntropyBackward: return "cross_entropy_backward";
  }
  return "unknown";
}

namespace {
std::atomic<DeviceTimerFactory> device_timer_factory{nullptr};
}  // namespace

void RegisterDeviceTimerFactory(DeviceTimerFactory factory) {
  device_timer_factory.store(factory, std::memory_order_release);
}

DeviceTimerFactory GetDeviceTimerFactory() { return device_timer_factory.load(std::memory_order_acquire); }

void KernelTimingSink::AddPending(KernelOp op, const Device& device, std::unique_ptr<DeviceTimer> timer) {
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_.push_back(Pending{op, device, std::move(timer)});
  pending_count_.store(static_cast<int64_t>(pending_.size()), std::memory_order_relaxed);
}

void KernelTimingSink::Drain() {
  struct Done {
    KernelOp op;
    Device device;
    double seconds;
  };
  std::vector<Done> done;
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    // Events of one stream complete in order, those of several streams need not: every
    // pending timer is asked. A timer whose events failed (0 s) is dropped unreported.
    for (auto it = pending_.begin(); it != pending_.end();) {
      const double seconds = it->timer->ElapsedSeconds();
      if (seconds < 0.0) {
        ++it;
        continue;
      }
      if (seconds > 0.0) done.push_back(Done{it->op, it->device, seconds});
      it = pending_.erase(it);
    }
    pending_count_.store(static_cast<int64_t>(pending_.size()), std::memory_order_relaxed);
  }
  for (const Done& d : done) Record(d.op, d.device, d.seconds);
}

}  // namespace kernels
}  // namespace teserve
