// Shared setup for the integration tests: a real TeserveServer on 127.0.0.1 (free port,
// CPU device, metrics off unless asked) and a real Client talking to it.
#ifndef TESERVE_TESTS_INTEGRATION_TEST_SERVER_H_
#define TESERVE_TESTS_INTEGRATION_TEST_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "server/server.h"
#include "teserve/v1/service.pb.h"

namespace teserve {
namespace testing {

server::ServerOptions LoopbackOptions();

// Starts a server (failing the current test on error) and connects a client.
struct LoopbackServer {
  std::unique_ptr<server::TeserveServer> server;
  std::unique_ptr<client::Client> client;
  std::string address;
};
LoopbackServer StartLoopbackServer(const server::ServerOptions& options = LoopbackOptions());

// Deterministic FP32 values in [-2, 2), different per seed.
std::vector<float> PseudoRandomFloats(int64_t count, uint64_t seed);

}  // namespace testing
}  // namespace teserve

#endif  // TESERVE_TESTS_INTEGRATION_TEST_SERVER_H_
