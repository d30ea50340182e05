#include "kernels/host_readback.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/status.h"
#include "kernels/dispatch.h"
#include "kernels/tensor_checks.h"

#if TESERVE_WITH_CUDA
#include "kernels/cuda/host_readback_cuda.h"
#endif

namespace teserve {
namespace kernels {

HostReadback::~HostReadback() {
  WaitQuietly();
#if TESERVE_WITH_CUDA
  cuda::DestroyEvent(event_, event_device_);
  cuda::FreePinnedHost(pinned_, pinned_capacity_);
  cuda::FreePinnedHost(gather_table_, gather_table_capacity_);
#endif
}

void HostReadback::WaitQuietly() {
  if (in_flight_) Wait().IgnoreError();
}

uint8_t* HostReadback::staging() const {
  return on_device_ ? static_cast<uint8_t*>(pinned_) : const_cast<uint8_t*>(host_staging_.data());
}

absl::Status HostReadback::Start(const Context& ctx, absl::Span<const Tensor> tensors) {
  WaitQuietly();
  sources_.clear();
  offsets_.clear();
  status_ = absl::OkStatus();
  for (size_t i = 0; i < tensors.size(); ++i) {
    const std::string name = absl::StrCat("tensors[", i, "]");
    RETURN_IF_ERROR(CheckDefined(name, tensors[i]));
    RETURN_IF_ERROR(CheckDevice(name, tensors[i], ctx));
  }
  std::vector<size_t> offsets{0};
  for (const Tensor& t : tensors) offsets.push_back(offsets.back() + static_cast<size_t>(t.nbytes()));
  const size_t total = offsets.back();

  if (ctx.device.is_cpu()) {
    on_device_ = false;
    host_staging_.resize(total);
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (tensors[i].nbytes() > 0) {
        std::memcpy(host_staging_.data() + offsets[i], tensors[i].raw_data(), static_cast<size_t>(tensors[i].nbytes()));
      }
    }
    offsets_ = std::move(offsets);
    in_flight_ = true;
    return absl::OkStatus();
  }
#if TESERVE_WITH_CUDA
  if (total > pinned_capacity_) {
    cuda::FreePinnedHost(pinned_, pinned_capacity_);
    pinned_ = nullptr;
    pinned_capacity_ = 0;
    // A little headroom, so that a count that varies by a tensor or two does not
    // reallocate every call.
    const size_t capacity = std::max<size_t>(256, 2 * total);
    ASSIGN_OR_RETURN(pinned_, cuda::AllocatePinnedHost(capacity));
    pinned_capacity_ = capacity;
  }
  on_device_ = true;
  sources_.assign(tensors.begin(), tensors.end());
  cuda::GatherTable table{gather_table_, gather_table_capacity_};
  const absl::Status started = cuda::StartDeviceToHost(ctx, tensors, static_cast<uint8_t*>(pinned_), offsets,
                                                       &event_, &event_device_, &table, &sources_);
  gather_table_ = table.pinned;
  gather_table_capacity_ = table.capacity;
  if (!started.ok()) {
    sources_.clear();
    return started;
  }
  offsets_ = std::move(offsets);
  in_flight_ = true;
  return absl::OkStatus();
#else
  return NoKernel("HostReadback", ctx.device, kNoCudaBackend);
#endif
}

absl::Status HostReadback::Wait() {
  if (!in_flight_) return status_;
  in_flight_ = false;
#if TESERVE_WITH_CUDA
  if (on_device_) status_ = cuda::WaitEvent(event_, event_device_);
#endif
  sources_.clear();
  return status_;
}

bool HostReadback::ready() const {
  if (!in_flight_ || !on_device_) return true;
#if TESERVE_WITH_CUDA
  return cuda::EventDone(event_, event_device_);
#else
  return true;
#endif
}

absl::Span<const uint8_t> HostReadback::bytes(size_t i) const {
  if (i + 1 >= offsets_.size()) return {};
  return absl::Span<const uint8_t>(staging() + offsets_[i], offsets_[i + 1] - offsets_[i]);
}

}  // namespace kernels
}  // namespace teserve
