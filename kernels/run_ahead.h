// RunAheadLimit: bounds how far the host runs ahead of a CUDA stream.
//
// Host code that enqueues a long pass (a stack of many layers) returns from each launch
// at once; without a bound the whole pass is queued long before the GPU runs it, and a
// stop decided on the host between layers (a cancelled call, a server shutting down)
// only takes effect after everything queued has run. Mark() between the parts of a pass
// records a marker (an event) on the stream and first waits for the marker recorded
// `depth` marks earlier, so at most `depth` parts are queued ahead of the GPU: enough to
// keep it busy, few enough that a stop lands within `depth` parts of device time.
//
// CPU contexts (and builds without CUDA): Mark does nothing. Not thread-safe: one pass
// (one stream) at a time. A failed CUDA call makes Mark a no-op from then on (the pass's
// own kernels report the error).
#ifndef TESERVE_KERNELS_RUN_AHEAD_H_
#define TESERVE_KERNELS_RUN_AHEAD_H_

#include <vector>

#include "core/context.h"

namespace teserve {
namespace kernels {

class RunAheadLimit {
 public:
  explicit RunAheadLimit(int depth) : depth_(depth < 1 ? 1 : depth) {}
  ~RunAheadLimit();
  RunAheadLimit(const RunAheadLimit&) = delete;
  RunAheadLimit& operator=(const RunAheadLimit&) = delete;

  void Mark(const Context& ctx);

 private:
  int depth_;
  std::vector<void*> events_;  // cudaEvent_t, created on the first CUDA mark
  int device_ = -1;            // the device the events belong to
  int next_ = 0;               // the slot the next mark records into
  int recorded_ = 0;           // marks recorded so far (saturates at depth_)
  bool failed_ = false;
};

}  // namespace kernels
}  // namespace teserve

#endif  // TESERVE_KERNELS_RUN_AHEAD_H_
