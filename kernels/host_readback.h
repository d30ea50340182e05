// HostReadback: small tensors brought from a device to the host without waiting for the
// device's stream, for values the host needs later but not now (delayed scaling's amaxes,
// recipes/quantizer.h).
//
//   Start(ctx, tensors)  enqueues on ctx.stream, behind the work already there, one copy
//                        of every tensor (each on ctx.device, any dtype) into staging
//                        memory this object owns, then records an event on the stream,
//                        and returns without waiting.
//   Wait()               blocks until that event has completed: the work enqueued on the
//                        stream before Start is done, the work enqueued after it need not
//                        be (the host never waits for the whole stream). Then bytes(i)
//                        holds tensor i's bytes. Returns the status of the copy; when it
//                        is not OK the bytes are meaningless.
//   ready()              polls the event: true once Wait would not block.
//
// On a CUDA device the staging memory is page-locked (so the copy is asynchronous and the
// host reads it directly) and kept from call to call, reallocated only when a call needs
// more; the event is made once per device. Many tensors are packed on the device first
// and come over in one copy (cuda::StartDeviceToHost). On the CPU, Start copies at once
// and Wait returns at once.
//
// One readback at a time: Start first waits for one still in flight (its copies write into
// the staging memory the new one reuses). The object keeps the source tensors until Wait,
// and its destructor waits for a copy still in flight. Not thread-safe.
#ifndef TESERVE_KERNELS_HOST_READBACK_H_
#define TESERVE_KERNELS_HOST_READBACK_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "core/context.h"
#include "core/tensor.h"

namespace teserve {
namespace kernels {

class HostReadback {
 public:
  HostReadback() = default;
  ~HostReadback();
  HostReadback(const HostReadback&) = delete;
  HostReadback& operator=(const HostReadback&) = delete;

  // INVALID_ARGUMENT for an undefined tensor or one on another device than ctx's; the
  // CUDA error of a copy that could not be enqueued (nothing of it is then in flight).
  absl::Status Start(const Context& ctx, absl::Span<const Tensor> tensors);
  absl::Status Wait();
  bool ready() const;
  // Started and not yet waited for.
  bool in_flight() const { return in_flight_; }

  // Of the latest Start, valid after its Wait.
  size_t size() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }
  absl::Span<const uint8_t> bytes(size_t i) const;

 private:
  void WaitQuietly();
  uint8_t* staging() const;

  bool in_flight_ = false;
  absl::Status status_;
  std::vector<Tensor> sources_;  // kept until Wait (their memory is being read)
  std::vector<size_t> offsets_;  // tensor i at [offsets_[i], offsets_[i + 1])
  bool on_device_ = false;       // the latest Start used the page-locked staging
  std::vector<uint8_t> host_staging_;
  // CUDA: page-locked staging and the event (cudaEvent_t) of device event_device_.
  void* pinned_ = nullptr;
  size_t pinned_capacity_ = 0;
  // The page-locked table of a gathered read (host_readback_cuda.h), reused likewise.
  void* gather_table_ = nullptr;
  size_t gather_table_capacity_ = 0;
  void* event_ = nullptr;
  int event_device_ = -1;
};

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_HOST_READBACK_H_
