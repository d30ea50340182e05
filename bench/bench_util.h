// Shared by the C++ benchmarks in bench/: CUDA-event timing (warm-up, then one event
// pair per iteration, median and minimum reported), random device buffers, command-line
// flags and the JSON they print (stdout, and --json=PATH). bench/run_bench.py runs the
// binaries, adds PyTorch's time for the same shapes and prints the table.
//
// Bytes are the fewest an op must move through device memory: each input read once, each
// output written once (workspaces and re-reads not counted), so TB/s = bytes / time is
// comparable with the device copy bandwidth.
#ifndef TESERVE_BENCH_BENCH_UTIL_H_
#define TESERVE_BENCH_BENCH_UTIL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "bench/activity_trace.h"

namespace teserve {
namespace bench {

#define BENCH_CHECK(call)                                                              \
  do {                                                                                 \
    const cudaError_t bench_status_ = (call);                                          \
    if (bench_status_ != cudaSuccess) {                                                \
      std::fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call,        \
                   cudaGetErrorString(bench_status_));                                 \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

struct Flags {
  std::string json_path;
  int warmup = 10;
  int iters = 50;
  std::vector<std::pair<int64_t, int64_t>> shapes{{16384, 8192}};
};

// --json=PATH --warmup=N --iters=N --shapes=16384x8192,4096x1024
inline Flags ParseFlags(int argc, char** argv) {
  Flags flags;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const size_t n = std::strlen(name);
      return arg.compare(0, n, name) == 0 ? arg.c_str() + n : nullptr;
    };
    if (const char* v = value("--json=")) {
      flags.json_path = v;
    } else if (const char* v = value("--warmup=")) {
      flags.warmup = std::atoi(v);
    } else if (const char* v = value("--iters=")) {
      flags.iters = std::max(1, std::atoi(v));
    } else if (const char* v = value("--shapes=")) {
      flags.shapes.clear();
      std::string list = v;
      size_t start = 0;
      while (start < list.size()) {
        size_t end = list.find(',', start);
        if (end == std::string::npos) end = list.size();
        const std::string item = list.substr(start, end - start);
        const size_t x = item.find('x');
        if (x != std::string::npos) {
          flags.shapes.push_back({std::atoll(item.substr(0, x).c_str()), std::atoll(item.substr(x + 1).c_str())});
        }
        start = end + 1;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s (--json=PATH --warmup=N --iters=N --shapes=RxC,...)\n",
                   arg.c_str());
      std::exit(2);
    }
  }
  return flags;
}

struct Timing {
  double median_us = 0.0;
  double min_us = 0.0;
};

// Runs `launch` warmup times, then times each of `iters` runs with its own event pair
// recorded on `stream` (the legacy default stream unless given); then, with
// TESERVE_BENCH_TRACE set, traces a few more runs (activity_trace.h). A launch that
// waits for its work is timed from the host's view; one that only enqueues on `stream`
// is timed as the device runs back-to-back calls (the host running ahead, as a
// PyTorch training loop does).
inline Timing TimeLaunches(const std::function<cudaError_t()>& launch, const Flags& flags,
                           const std::string& trace_label = "call", cudaStream_t stream = nullptr) {
  for (int i = 0; i < flags.warmup; ++i) BENCH_CHECK(launch());
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> events(2 * flags.iters);
  for (cudaEvent_t& e : events) BENCH_CHECK(cudaEventCreate(&e));
  for (int i = 0; i < flags.iters; ++i) {
    BENCH_CHECK(cudaEventRecord(events[2 * i], stream));
    BENCH_CHECK(launch());
    BENCH_CHECK(cudaEventRecord(events[2 * i + 1], stream));
  }
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<double> us(flags.iters);
  for (int i = 0; i < flags.iters; ++i) {
    float ms = 0.0f;
    BENCH_CHECK(cudaEventElapsedTime(&ms, events[2 * i], events[2 * i + 1]));
    us[i] = 1000.0 * ms;
  }
  for (cudaEvent_t& e : events) BENCH_CHECK(cudaEventDestroy(e));
  TraceLaunches(trace_label, [&] {
    BENCH_CHECK(launch());
    BENCH_CHECK(cudaDeviceSynchronize());
  });
  std::sort(us.begin(), us.end());
  return Timing{us[us.size() / 2], us.front()};
}

// Deterministic pseudo-random uniform in [-1, 1) (splitmix64).
inline float Uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + i + 1;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(static_cast<double>(z >> 40) / static_cast<double>(1ull << 23) - 1.0);
}

inline uint16_t FloatToBf16Bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // finite inputs only
}

// Device buffer of `count` random values (mean `offset`, spread `spread`), as BF16 when
// `bf16`, else FP32. Never zeros: unwritten or skipped work would hide behind them.
inline void* RandomDeviceBuffer(int64_t count, bool bf16, float offset, float spread, uint64_t seed) {
  const size_t bytes = static_cast<size_t>(count) * (bf16 ? 2 : 4);
  std::vector<uint8_t> host(bytes);
  for (int64_t i = 0; i < count; ++i) {
    const float v = offset + spread * Uniform(seed, static_cast<uint64_t>(i));
    if (bf16) {
      const uint16_t b = FloatToBf16Bits(v);
      std::memcpy(host.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(host.data() + 4 * i, &v, 4);
    }
  }
  void* device = nullptr;
  BENCH_CHECK(cudaMalloc(&device, bytes));
  BENCH_CHECK(cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice));
  return device;
}

inline void* DeviceBuffer(int64_t bytes) {
  void* device = nullptr;
  BENCH_CHECK(cudaMalloc(&device, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  BENCH_CHECK(cudaMemset(device, 0x5A, static_cast<size_t>(std::max<int64_t>(bytes, 1))));
  return device;
}

struct Result {
  std::string op;
  int64_t rows = 0;
  int64_t cols = 0;
  std::string dtype;
  Timing timing;
  int64_t bytes = 0;
  std::string config;  // how the op ran (grid, variant), free text
  int64_t flops = 0;   // arithmetic ops, for compute-bound ops (GEMM); 0 = not reported
};

inline std::string DeviceName() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    return "unknown";
  }
  return prop.name;
}

// {"bench": ..., "device": ..., "results": [{op, shape, dtype, median_us, min_us, bytes,
// tbps, config}, ...]} to stdout and, with --json, to that file.
inline void WriteJson(const std::string& bench, const std::vector<Result>& results, const Flags& flags) {
  std::string out = "{\"bench\": \"" + bench + "\", \"device\": \"" + DeviceName() + "\", \"results\": [";
  char line[1024];
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    std::snprintf(line, sizeof(line),
                  "%s\n  {\"op\": \"%s\", \"shape\": [%lld, %lld], \"dtype\": \"%s\", "
                  "\"median_us\": %.3f, \"min_us\": %.3f, \"bytes\": %lld, \"tbps\": %.4f, "
                  "\"flops\": %lld, \"tflops\": %.1f, \"config\": \"%s\"}",
                  i == 0 ? "" : ",", r.op.c_str(), static_cast<long long>(r.rows),
                  static_cast<long long>(r.cols), r.dtype.c_str(), r.timing.median_us,
                  r.timing.min_us, static_cast<long long>(r.bytes),
                  r.bytes / (r.timing.median_us * 1e-6) / 1e12, static_cast<long long>(r.flops),
                  r.flops / (r.timing.median_us * 1e-6) / 1e12, r.config.c_str());
    out += line;
  }
  out += "\n]}\n";
  std::fputs(out.c_str(), stdout);
  if (!flags.json_path.empty()) {
    FILE* f = std::fopen(flags.json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", flags.json_path.c_str());
      std::exit(1);
    }
    std::fputs(out.c_str(), f);
    std::fclose(f);
  }
}

// cudaFree of every buffer in `buffers`.
inline void FreeDeviceBuffers(std::initializer_list<void*> buffers) {
  for (void* p : buffers) BENCH_CHECK(cudaFree(p));
}

// main() of a benchmark timed per --shapes entry: parses the flags, calls
// run(rows, cols, flags, &results) for each shape in order and writes the JSON as `bench`.
inline int RunPerShape(
    int argc, char** argv, const std::string& bench,
    const std::function<void(int64_t, int64_t, const Flags&, std::vector<Result>*)>& run) {
  const Flags flags = ParseFlags(argc, argv);
  std::vector<Result> results;
  for (const auto& [rows, cols] : flags.shapes) run(rows, cols, flags, &results);
  WriteJson(bench, results, flags);
  return 0;
}

}  // namespace bench
}  // namespace teserve

#endif  // TESERVE_BENCH_BENCH_UTIL_H_
