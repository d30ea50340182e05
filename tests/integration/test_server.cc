#include "tests/integration/test_server.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/server_process.h"

namespace teserve {
namespace testing {

server::ServerOptions LoopbackOptions() {
  server::ServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.metrics_port = -1;
  options.device = TestDevice();
  return options;
}

LoopbackServer StartLoopbackServer(const server::ServerOptions& options) {
  LoopbackServer out;
  auto started = server::TeserveServer::Start(options);
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return out;
  out.server = std::move(*started);
  out.address = absl::StrCat("127.0.0.1:", out.server->port());
  out.client = std::make_unique<client::Client>(out.address);
  return out;
}

std::vector<float> PseudoRandomFloats(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = uniform(rng);
  return values;
}

}  // namespace testing
}  // namespace teserve
