// server/compute_executor.h: order, the thread bound, the queue-depth reports, and that
// destruction runs what was accepted.
#include "server/compute_executor.h"

#include <atomic>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace teserve {
namespace server {
namespace {

TEST(ComputeExecutor, OneThreadRunsTasksInSubmissionOrder) {
  absl::Mutex mu;
  std::vector<int> order;
  {
    ComputeExecutor executor(1);
    for (int i = 0; i < 50; ++i) {
      executor.Submit([&, i] {
        absl::MutexLock lock(&mu);
        order.push_back(i);
      });
    }
  }  // destruction runs everything accepted
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

// Three threads, four tasks that hold their thread until released: three start and
// run at once, the fourth waits for a thread.
TEST(ComputeExecutor, RunsAsManyTasksAtOnceAsItHasThreads) {
  absl::Mutex mu;
  int started = 0;
  absl::Notification release;
  {
    ComputeExecutor executor(3);
    EXPECT_EQ(executor.threads(), 3);
    for (int i = 0; i < 4; ++i) {
      executor.Submit([&] {
        {
          absl::MutexLock lock(&mu);
          ++started;
        }
        release.WaitForNotification();
      });
    }
    {
      absl::MutexLock lock(&mu);
      EXPECT_TRUE(mu.AwaitWithTimeout(absl::Condition(+[](int* n) { return *n >= 3; }, &started), absl::Seconds(10)));
    }
    absl::SleepFor(absl::Milliseconds(50));  // time for a fourth to start, were it allowed
    {
      absl::MutexLock lock(&mu);
      EXPECT_EQ(started, 3);
    }
    EXPECT_EQ(executor.queued(), 1);
    release.Notify();
  }
  EXPECT_EQ(started, 4);
}

TEST(ComputeExecutor, ReportsTheQueueDepthInOrder) {
  absl::Mutex mu;
  std::vector<int64_t> depths;
  absl::Notification started, release;
  {
    ComputeExecutor executor(1, [&](int64_t depth) {
      absl::MutexLock lock(&mu);
      depths.push_back(depth);
    });
    executor.Submit([&] {
      started.Notify();
      release.WaitForNotification();
    });
    started.WaitForNotification();  // the first task runs: nothing queued
    executor.Submit([] {});
    executor.Submit([] {});
    EXPECT_EQ(executor.queued(), 2);
    release.Notify();
  }
  EXPECT_EQ(depths, (std::vector<int64_t>{1, 0, 1, 2, 1, 0}));
}

TEST(ComputeExecutor, DestructionRunsQueuedTasks) {
  std::atomic<int> ran{0};
  absl::Notification release;
  auto executor = std::make_unique<ComputeExecutor>(1);
  executor->Submit([&] {
    release.WaitForNotification();
    ++ran;
  });
  for (int i = 0; i < 10; ++i) executor->Submit([&] { ++ran; });
  release.Notify();
  executor.reset();
  EXPECT_EQ(ran.load(), 11);
}

}  // namespace
}  // namespace server
}  // namespace teserve
