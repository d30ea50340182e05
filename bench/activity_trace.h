// What the GPU does during one timed call of a benchmark, launch by launch: CUPTI's
// activity records (kernels, memcpys and memsets with their device start / end, and
// the CUDA runtime calls with their host start / end, all in one time base), printed as
// a timeline with the idle gaps between launches. TimeLaunches runs a traced pass after
// the timed ones when TESERVE_BENCH_TRACE is set (its value is the number of calls to
// trace, the last one printed); the timed numbers never include the tracer.
//
// CUPTI is loaded with dlopen (libcupti.so.13, then libcupti.so) so that no benchmark
// links it and a host without it just prints that the trace is unavailable. Its
// records are read through the structs of the cupti.h the benchmark was built with, so
// the library must be the one of that CUDA version (device bundles carry it).
#ifndef TESERVE_BENCH_ACTIVITY_TRACE_H_
#define TESERVE_BENCH_ACTIVITY_TRACE_H_

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

namespace teserve {
namespace bench {

struct ActivitySpan {
  enum Kind { kKernel, kMemcpy, kMemset, kRuntime } kind;
  std::string name;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

class ActivityTrace {
 public:
  // The tracer of this process; null (with a message on stderr) when CUPTI is missing.
  static ActivityTrace* Get() {
    static ActivityTrace* trace = [] {
      auto* t = new ActivityTrace();
      if (!t->Load()) {
        delete t;
        return static_cast<ActivityTrace*>(nullptr);
      }
      return t;
    }();
    return trace;
  }

  // Records every activity from Start to Stop; Stop returns them sorted by start.
  bool Start() {
    spans().clear();
    if (register_callbacks_(&BufferRequested, &BufferCompleted) != CUPTI_SUCCESS) return false;
    for (CUpti_ActivityKind kind : kKinds) {
      if (enable_(kind) != CUPTI_SUCCESS) return false;
    }
    return true;
  }
  std::vector<ActivitySpan> Stop() {
    flush_all_(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    for (CUpti_ActivityKind kind : kKinds) disable_(kind);
    flush_all_(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    std::lock_guard<std::mutex> lock(mu());
    std::vector<ActivitySpan> out = std::move(spans());
    spans().clear();
    std::sort(out.begin(), out.end(),
              [](const ActivitySpan& a, const ActivitySpan& b) { return a.start_ns < b.start_ns; });
    return out;
  }
  uint64_t Now() const {
    uint64_t t = 0;
    get_timestamp_(&t);
    return t;
  }

 private:
  static constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                                   CUPTI_ACTIVITY_KIND_MEMSET, CUPTI_ACTIVITY_KIND_RUNTIME};
  static constexpr size_t kBufferBytes = 8 << 20;

  bool Load() {
    void* lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      std::fprintf(stderr, "activity trace unavailable: %s\n", dlerror());
      return false;
    }
    auto sym = [&](const char* name) { return dlsym(lib, name); };
    register_callbacks_ = reinterpret_cast<decltype(register_callbacks_)>(sym("cuptiActivityRegisterCallbacks"));
    enable_ = reinterpret_cast<decltype(enable_)>(sym("cuptiActivityEnable"));
    disable_ = reinterpret_cast<decltype(disable_)>(sym("cuptiActivityDisable"));
    flush_all_ = reinterpret_cast<decltype(flush_all_)>(sym("cuptiActivityFlushAll"));
    get_timestamp_ = reinterpret_cast<decltype(get_timestamp_)>(sym("cuptiGetTimestamp"));
    next_record() = reinterpret_cast<NextRecordFn>(sym("cuptiActivityGetNextRecord"));
    callback_name() = reinterpret_cast<CallbackNameFn>(sym("cuptiGetCallbackName"));
    if (!register_callbacks_ || !enable_ || !disable_ || !flush_all_ || !get_timestamp_ || !next_record()) {
      std::fprintf(stderr, "activity trace unavailable: CUPTI lacks an entry point\n");
      return false;
    }
    return true;
  }

  using NextRecordFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
  using CallbackNameFn = CUptiResult (*)(CUpti_CallbackDomain, uint32_t, const char**);
  static CallbackNameFn& callback_name() {
    static CallbackNameFn fn = nullptr;
    return fn;
  }
  static NextRecordFn& next_record() {
    static NextRecordFn fn = nullptr;
    return fn;
  }
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::vector<ActivitySpan>& spans() {
    static std::vector<ActivitySpan> s;
    return s;
  }

  static std::string Demangle(const char* name) {
    if (name == nullptr) return "?";
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    std::string out = status == 0 && d != nullptr ? d : name;
    std::free(d);
    return out;
  }

  static void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
    *size = kBufferBytes;
    *max_records = 0;
  }
  static void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    std::lock_guard<std::mutex> lock(mu());
    CUpti_Activity* record = nullptr;
    while (next_record()(buffer, valid, &record) == CUPTI_SUCCESS) {
      ActivitySpan s;
      switch (record->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
        case CUPTI_ACTIVITY_KIND_KERNEL: {
          const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
          s = {ActivitySpan::kKernel, Demangle(k->name), k->start, k->end};
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
          static const char* kinds[] = {"?", "HtoD", "DtoH", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA", "DtoD", "HtoH"};
          const unsigned k = m->copyKind < 10 ? m->copyKind : 0;
          s = {ActivitySpan::kMemcpy, std::string("memcpy ") + kinds[k] + " " + std::to_string(m->bytes) + " B",
               m->start, m->end};
          break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
          const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
          s = {ActivitySpan::kMemset, "memset " + std::to_string(m->bytes) + " B", m->start, m->end};
          break;
        }
        case CUPTI_ACTIVITY_KIND_RUNTIME: {
          const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
          const char* name = nullptr;
          if (callback_name() == nullptr ||
              callback_name()(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS || name == nullptr) {
            name = "?";
          }
          s = {ActivitySpan::kRuntime, std::string("runtime ") + name, a->start, a->end};
          break;
        }
        default:
          continue;
      }
      spans().push_back(std::move(s));
    }
    std::free(buffer);
  }

  CUptiResult (*register_callbacks_)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*enable_)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*disable_)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*flush_all_)(uint32_t) = nullptr;
  CUptiResult (*get_timestamp_)(uint64_t*) = nullptr;
};

// Prints the device timeline of the calls [begin_ns, end_ns): one line per kernel,
// memcpy or memset (offset from the call's start, idle gap before it, duration, name),
// the host's runtime calls that took 5 us or more ("host" lines, offset and duration;
// the time before the first launch is host work), and a summary (wall, device busy,
// host time in runtime calls).
inline void PrintTimeline(const std::string& label, const std::vector<ActivitySpan>& spans, uint64_t begin_ns,
                          uint64_t end_ns) {
  double busy_us = 0.0, runtime_us = 0.0;
  int launches = 0, runtime_calls = 0;
  uint64_t last_end = 0, first_start = 0;
  std::string lines;
  char buf[512];
  for (const ActivitySpan& s : spans) {
    if (s.start_ns < begin_ns || s.start_ns >= end_ns) continue;
    if (s.kind == ActivitySpan::kRuntime) {
      const double us = 1e-3 * (s.end_ns - s.start_ns);
      runtime_us += us;
      ++runtime_calls;
      if (us >= 5.0) {
        std::snprintf(buf, sizeof(buf), "trace %s | host +%9.1f us | %8.1f us | %s\n", label.c_str(),
                      1e-3 * (s.start_ns - begin_ns), us, s.name.c_str());
        lines += buf;
      }
      continue;
    }
    if (first_start == 0) first_start = s.start_ns;
    const double gap = last_end == 0 ? 1e-3 * (s.start_ns - begin_ns) : 1e-3 * (double(s.start_ns) - double(last_end));
    const double dur = 1e-3 * (s.end_ns - s.start_ns);
    busy_us += dur;
    ++launches;
    std::snprintf(buf, sizeof(buf), "trace %s | +%9.1f us | gap %7.1f | %8.1f us | %.150s\n", label.c_str(),
                  1e-3 * (s.start_ns - begin_ns), gap, dur, s.name.c_str());
    lines += buf;
    last_end = std::max(last_end, s.end_ns);
  }
  const double wall = 1e-3 * (end_ns - begin_ns);
  std::printf("%s", lines.c_str());
  std::printf(
      "trace %s | summary: call %.1f us, device busy %.1f us (%.1f%%), %d launches, first launch at +%.1f us, "
      "last end at +%.1f us, %d runtime calls taking %.1f us of host time\n",
      label.c_str(), wall, busy_us, wall > 0 ? 100.0 * busy_us / wall : 0.0, launches,
      first_start ? 1e-3 * (first_start - begin_ns) : 0.0, last_end ? 1e-3 * (last_end - begin_ns) : 0.0,
      runtime_calls, runtime_us);
  std::fflush(stdout);
}

// TESERVE_BENCH_TRACE=N: runs `launch` N times (default 3) under the tracer and prints
// the timeline of the last call. `launch` must wait for its work (TimeLaunches' calls
// do), so that the call's activities lie inside its host interval.
inline void TraceLaunches(const std::string& label, const std::function<void()>& launch) {
  const char* env = std::getenv("TESERVE_BENCH_TRACE");
  if (env == nullptr) return;
  ActivityTrace* trace = ActivityTrace::Get();
  if (trace == nullptr || !trace->Start()) {
    std::fprintf(stderr, "activity trace for %s could not start\n", label.c_str());
    return;
  }
  const int calls = std::max(1, std::atoi(env) > 0 ? std::atoi(env) : 3);
  uint64_t begin = 0, end = 0;
  for (int i = 0; i < calls; ++i) {
    begin = trace->Now();
    launch();
    end = trace->Now();
  }
  PrintTimeline(label, trace->Stop(), begin, end);
}

}  // namespace bench
}  // namespace teserve

#endif  // TESERVE_BENCH_ACTIVITY_TRACE_H_
