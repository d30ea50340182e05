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

// What CreateSession admits (server/trainer_service.cc): the same estimate with the
// server's default --admission_tokens and --max_attention_scores, against a budget of
// 256 MiB instead of the host's memory. The estimate counts at least 16 bytes per
// parameter, so an admitted session's parameters and gradients take at most 128 MiB.
inline constexpr int64_t kFuzzMemoryBudgetBytes = int64_t{256} << 20;
inline constexpr int64_t kAdmissionTokens = 8192;  // --admission_tokens default

inline absl::Status AdmitLikeTheServer(const v1::ModelSpec& model, const v1::OptimizerSpec& optimizer) {
  const server::RequestLimits defaults;
  const server::MemoryEstimate estimate =
      server::EstimateSessionMemory(model, optimizer, kAdmissionTokens, defaults.max_attention_scores);
  return server::AdmitSession(estimate, kFuzzMemoryBudgetBytes, /*committed_bytes=*/0,
                              /*host_available_bytes=*/-1, kAdmissionTokens);
}

}  // namespace fuzz
}  // namespace teserve

#endif  // TESERVE_TESTS_FUZZ_FUZZ_SUPPORT_H_
