#include "server/compute_executor.h"

#include <algorithm>
#include <utility>

namespace teserve {
namespace server {

ComputeExecutor::ComputeExecutor(int threads, std::function<void(int64_t)> on_queue_depth)
    : on_queue_depth_(std::move(on_queue_depth)) {
  threads = std::max(threads, 1);
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Work(); });
}

ComputeExecutor::~ComputeExecutor() {
  {
    absl::MutexLock lock(&mu_);
    closing_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void ComputeExecutor::Submit(absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
  if (on_queue_depth_) on_queue_depth_(static_cast<int64_t>(tasks_.size()));
}

int64_t ComputeExecutor::queued() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(tasks_.size());
}

void ComputeExecutor::Work() {
  for (;;) {
    absl::AnyInvocable<void() &&> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ComputeExecutor::HasWorkOrClosing));
      // Closing with tasks left: they still run (each finishes an accepted call).
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      if (on_queue_depth_) on_queue_depth_(static_cast<int64_t>(tasks_.size()));
    }
    std::move(task)();
  }
}

}  // namespace server
}  // namespace teserve
