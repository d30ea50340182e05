// Called once by libFuzzer (and by replay_main) before the first input.
#include "google/protobuf/stubs/logging.h"

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  // The parser logs every string field with invalid UTF-8 it rejects; on fuzzed input
  // that is most inputs, and the logging would cost more than the parsing.
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
