// Status helpers of the benchmarks that drive teserve's layers and checked kernels: a
// failure prints what failed and exits (a benchmark has nothing to recover).
#ifndef TESERVE_BENCH_BENCH_STATUS_H_
#define TESERVE_BENCH_BENCH_STATUS_H_

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

}  // namespace bench
}  // namespace teserve

#endif  // TESERVE_BENCH_BENCH_STATUS_H_
