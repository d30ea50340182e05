// CHECK for the standalone probes in bench/probes (built by hand with nvcc, not by Bazel):
// a failed CUDA runtime call prints where and why, and ends the probe.
#ifndef TESERVE_BENCH_PROBES_PROBE_CHECK_H_
#define TESERVE_BENCH_PROBES_PROBE_CHECK_H_

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

#endif  // TESERVE_BENCH_PROBES_PROBE_CHECK_H_
