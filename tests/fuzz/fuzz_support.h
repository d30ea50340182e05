// Shared by the fuzz targets: invariant checks that abort (libFuzzer reports an abort
// as a crash and saves the input), the splitting of one input into several files, and
// the server's CreateSession memory admission with a budget that keeps every admitted
// session small enough to fuzz.
#ifndef TESERVE_TESTS_FUZZ_FUZZ_SUPPORT_H_
#define TESERVE_TESTS_FUZZ_FUZZ_SUPPORT_H_

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "server/limits.h"
#include "teserve/v1/model.pb.h"

// Aborts with `what` and the status when `status` is not OK / `cond` is false.
#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "fuzz invariant violated at %s:%d: %s\n", __FILE__, __LINE__, \
                   std::string(what).c_str());                                              \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace teserve {
namespace fuzz {

// The separator between the files of one input (checkpoint_fuzzer); a line of its own
// in the seeds, so they stay readable.
inline constexpr absl::string_view kFileSeparator = "\n===8<===\n";

inline std::vector<std::string> SplitFiles(absl::string_view input) {
  return absl::StrSplit(input, kFileSeparator);
}

// What CreateSession admits (server/trainer_service.cc): the server's own estimate and
// admission check, with --memory_budget_bytes=64MiB and --admission_tokens=256 (the
// defaults, host memory and 8192 tokens, would admit specs too large to fuzz quickly:
// at 8192 tokens every attention layer is estimated at 1 GB of scores). The estimate
// counts at least 16 bytes per parameter, so an admitted session holds at most 4M
// parameters.
inline constexpr int64_t kFuzzMemoryBudgetBytes = int64_t{64} << 20;
inline constexpr int64_t kAdmissionTokens = 256;

inline server::MemoryEstimate EstimateLikeTheServer(const v1::ModelSpec& model, const v1::OptimizerSpec& optimizer) {
  const server::RequestLimits defaults;
  return server::EstimateSessionMemory(model, optimizer, kAdmissionTokens, defaults.max_attention_scores);
}

inline absl::Status AdmitLikeTheServer(const server::MemoryEstimate& estimate) {
  return server::AdmitSession(estimate, kFuzzMemoryBudgetBytes, /*committed_bytes=*/0,
                              /*host_available_bytes=*/-1, kAdmissionTokens);
}

// Bytes currently allocated on the heap, from AddressSanitizer's allocator; -1 in a
// build without it (the gcc replay build).
extern "C" __attribute__((weak)) size_t __sanitizer_get_current_allocated_bytes();
inline int64_t HeapBytes() {
  if (__sanitizer_get_current_allocated_bytes == nullptr) return -1;
  return static_cast<int64_t>(__sanitizer_get_current_allocated_bytes());
}

}  // namespace fuzz
}  // namespace teserve

#endif  // TESERVE_TESTS_FUZZ_FUZZ_SUPPORT_H_
