// A KernelTimingSink that keeps every reported timing, for the timing tests on the CPU
// (tests/kernels/timing_test.cc) and on the GPU (tests/gpu/timing).
#ifndef TESERVE_TESTS_KERNELS_RECORDING_SINK_H_
#define TESERVE_TESTS_KERNELS_RECORDING_SINK_H_

#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "kernels/timing.h"

namespace teserve {
namespace testing_kernels {

struct Recorded {
  kernels::KernelOp op;
  Device device;
  double seconds;
};

class RecordingSink : public kernels::KernelTimingSink {
 public:
  explicit RecordingSink(int64_t interval) : KernelTimingSink(interval) {}
  void Record(kernels::KernelOp op, const Device& device, double seconds) override {
    recorded.push_back(Recorded{op, device, seconds});
  }
  std::vector<Recorded> recorded;
};

}  // namespace testing_kernels
}  // namespace teserve

#endif  // TESERVE_TESTS_KERNELS_RECORDING_SINK_H_
