// The threads that run the server's training calls (Forward, Backward, ForwardBackward,
// Step, ZeroGrad) on the server's device, so that gRPC's callback threads never wait on a
// device: a handler checks the call on its callback thread, hands the computation here
// and returns; a compute thread runs it (enqueueing the work on the session's stream and
// waiting only where results must be read) and finishes the call.
//
// Tasks start in submission order on `threads` threads. Calls of different sessions run
// side by side on their own streams; more calls than threads wait in order. The queue
// depth goes to `on_queue_depth` (called under the queue's lock, so the values arrive in
// order: keep it cheap, e.g. a gauge's Set) whenever it changes. Destruction runs every queued task, then joins: a
// task that was accepted always finishes its call.
#ifndef TESERVE_SERVER_COMPUTE_EXECUTOR_H_
#define TESERVE_SERVER_COMPUTE_EXECUTOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace teserve {
namespace server {

class ComputeExecutor {
 public:
  explicit ComputeExecutor(int threads, std::function<void(int64_t)> on_queue_depth = nullptr);
  ~ComputeExecutor();
  ComputeExecutor(const ComputeExecutor&) = delete;
  ComputeExecutor& operator=(const ComputeExecutor&) = delete;

  void Submit(absl::AnyInvocable<void() &&> task);

  int threads() const { return static_cast<int>(threads_.size()); }
  // Tasks accepted and not started yet.
  int64_t queued() const;

 private:
  void Work();
  bool HasWorkOrClosing() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return closing_ || !tasks_.empty(); }

  const std::function<void(int64_t)> on_queue_depth_;
  mutable absl::Mutex mu_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mu_);
  bool closing_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace server
}  // namespace teserve

#endif  // TESERVE_SERVER_COMPUTE_EXECUTOR_H_
