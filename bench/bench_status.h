// Status helpers of the benchmarks that drive teserve's layers and checked kernels: a
// failure prints what failed and exits (a benchmark has nothing to recover); and the
// Context those benchmarks run in.
#ifndef TESERVE_BENCH_BENCH_STATUS_H_
#define TESERVE_BENCH_BENCH_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/context.h"
#include "core/tensor.h"
#include "kernels/device_info.h"

namespace teserve {
namespace bench {

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return *std::move(v);
}

inline void Check(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

// A stream of its own on cuda:0 and the Context on it: what a GPU session's work runs in.
class GpuStream {
 public:
  GpuStream() : stream_(OrDie(kernels::DeviceStream::Create(0), "stream")) {
    ctx_.device = Device::Cuda(0);
    ctx_.stream = stream_->get();
  }
  const Context& context() const { return ctx_; }

 private:
  std::unique_ptr<kernels::DeviceStream> stream_;
  Context ctx_;
};

}  // namespace bench
}  // namespace teserve

#endif  // TESERVE_BENCH_BENCH_STATUS_H_
