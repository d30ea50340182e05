// kill -9 of the real server binary mid-run, a restart on the same --checkpoint_dir and
// CreateSession(from_checkpoint) of the newest periodic checkpoint: the losses that
// follow, and the final parameters, equal an uninterrupted run's bit for bit (CPU; on a
// GPU host with TESERVE_TEST_DEVICE=cuda:0).
#include <signal.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/checkpoint_training.h"
#include "tests/integration/server_process.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;
using testing::CheckpointedRunRequest;
using testing::CheckpointedRunStep;
using testing::ParameterBytes;

// The server's flags for this test: its checkpoint directory, and the device
// (TESERVE_TEST_DEVICE, e.g. cuda:0 on a GPU host; cpu by default).
std::vector<std::string> ServerFlags(const std::string& checkpoint_dir) {
  const char* device = std::getenv("TESERVE_TEST_DEVICE");
  return {absl::StrCat("--checkpoint_dir=", checkpoint_dir), "--shutdown_grace_seconds=5",
          absl::StrCat("--device=", device != nullptr && *device != '\0' ? device : "cpu")};
}

constexpr int kSteps = 12;

TEST(CheckpointKill, ResumedRunEqualsUninterruptedRunBitForBit) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base = tmp ? tmp : "/tmp";
  const std::string dir = absl::StrCat(base, "/checkpoints");
  std::filesystem::remove_all(dir);

  // First server: the uninterrupted reference run and the run that gets killed.
  testing::ServerProcess first;
  ASSERT_TRUE(first.Start(ServerFlags(dir), absl::StrCat(base, "/first.log"))) << first.Log();
  EXPECT_THAT(first.Log(), HasSubstr(absl::StrCat("checkpoints in ", dir)));
  std::vector<uint32_t> reference_losses;
  std::vector<std::pair<std::string, std::string>> reference_params;
  {
    client::Client client(first.address());
    auto reference = client.CreateSession(CheckpointedRunRequest());
    ASSERT_TRUE(reference.ok()) << reference.status();
    for (int step = 1; step <= kSteps; ++step) {
      auto loss = CheckpointedRunStep(client, reference->session_id(), step);
      ASSERT_TRUE(loss.ok()) << loss.status();
      reference_losses.push_back(*loss);
    }
    reference_params = ParameterBytes(client, reference->session_id()).value();

    v1::CreateSessionRequest request = CheckpointedRunRequest();
    request.set_checkpoint_every_steps(3);
    request.set_keep_last_checkpoints(2);
    request.set_checkpoint_prefix("run");
    auto run = client.CreateSession(request);
    ASSERT_TRUE(run.ok()) << run.status();
    for (int step = 1; step <= 10; ++step) {
      v1::StepResponse response;
      auto loss = CheckpointedRunStep(client, run->session_id(), step, &response);
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_EQ(*loss, reference_losses[step - 1]) << "step " << step;
      EXPECT_EQ(response.checkpoint(), step % 3 == 0 ? absl::StrCat("run-step-00000000", step) : "");
    }
    // Step 11 is in flight (or about to be) when the server dies.
    std::thread in_flight([&] { (void)CheckpointedRunStep(client, run->session_id(), 11); });
    absl::SleepFor(absl::Milliseconds(5));
    first.Signal(SIGKILL);  // no shutdown, no flush, no goodbye
    EXPECT_EQ(first.WaitExit(absl::Seconds(30)), -1) << "killed by a signal";
    in_flight.join();
  }
  EXPECT_THAT(first.Log(), HasSubstr("checkpoint 'run-step-000000009' saved: step 9"));
  EXPECT_THAT(first.Log(), HasSubstr("checkpoint 'run-step-000000003' deleted (keep_last_checkpoints 2)"));
  EXPECT_THAT(first.Log(), ::testing::Not(HasSubstr("shutdown complete")));

  // Second server on the same directory: resume from the newest checkpoint.
  testing::ServerProcess second;
  ASSERT_TRUE(second.Start(ServerFlags(dir), absl::StrCat(base, "/second.log"))) << second.Log();
  {
    client::Client client(second.address());
    auto listing = client.ListCheckpoints();
    ASSERT_TRUE(listing.ok()) << listing.status();
    std::vector<std::string> names;
    for (const v1::CheckpointInfo& c : listing->checkpoints()) names.push_back(c.name());
    ASSERT_THAT(names, ::testing::ElementsAre("run-step-000000006", "run-step-000000009"));
    EXPECT_EQ(listing->checkpoints(1).step(), 9);
    EXPECT_EQ(client.ListSessions()->sessions_size(), 0);  // the sessions died with the process

    v1::CreateSessionRequest request;
    request.set_from_checkpoint(names.back());
    request.set_checkpoint_every_steps(3);
    request.set_keep_last_checkpoints(2);
    request.set_checkpoint_prefix("run");
    auto resumed = client.CreateSession(request);
    ASSERT_TRUE(resumed.ok()) << resumed.status();
    EXPECT_EQ(resumed->info().step(), 9);
    for (int step = 10; step <= kSteps; ++step) {
      auto loss = CheckpointedRunStep(client, resumed->session_id(), step);
      ASSERT_TRUE(loss.ok()) << loss.status();
      EXPECT_EQ(*loss, reference_losses[step - 1]) << "step " << step << " after the restart";
    }
    EXPECT_EQ(ParameterBytes(client, resumed->session_id()).value(), reference_params);
    EXPECT_EQ(client.GetSession(resumed->session_id())->step(), kSteps);
  }
  EXPECT_THAT(second.Log(), HasSubstr("checkpoint 'run-step-000000012' saved: step 12"));
  second.Signal(SIGTERM);
  EXPECT_EQ(second.WaitExit(absl::Seconds(30)), 0) << second.Log();
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir)) entries.push_back(e.path().filename().string());
  EXPECT_THAT(entries, ::testing::UnorderedElementsAre("run-step-000000009", "run-step-000000012"));
}

}  // namespace
}  // namespace teserve
