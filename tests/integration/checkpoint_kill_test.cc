// kill -9 of the real server binary mid-run, a restart on the same --checkpoint_dir and
// CreateSession(from_checkpoint) of the newest periodic checkpoint: the losses that
// follow, and the final parameters, equal an uninterrupted run's bit for bit (CPU; on a
// GPU host with TESERVE_TEST_DEVICE=cuda:0).
//
// kill -9 in the middle of SaveCheckpoint, at staggered points of the write (the
// temporary directory just made, after 3, 5 and 7 of its 8 files, while the replacement
// of an existing checkpoint is being written, and once the manifest is there): the
// previous checkpoint stays loadable, a checkpoint is listed only when it is complete,
// and the restart clears the leftovers.
//
// kill -9 while an overwrite trades the old checkpoint for the new one under the same
// name (train/checkpoint.cc: old moved aside to .old-<name>-XXXXXX, new renamed in, old
// deleted): before the first rename, between the two, and after the second. Renames
// microseconds apart can't be hit from outside, so the server runs with rename_pause.so
// preloaded (tests/integration/rename_pause.c), which blocks it at the chosen rename.
// After each restart the name holds the old or the new checkpoint, whole. And, without a
// kill, reads of the name while an overwrite is held between its renames find it whole.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
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
namespace fs = std::filesystem;

// The server's flags for this test: its checkpoint directory (the device is
// testing::TestDevice(): cuda:0 on a GPU host with TESERVE_TEST_DEVICE=cuda:0).
std::vector<std::string> ServerFlags(const std::string& checkpoint_dir) {
  return {absl::StrCat("--checkpoint_dir=", checkpoint_dir), "--shutdown_grace_seconds=5"};
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

// A model whose checkpoint takes measurable time to write: Linear 1024 x 1024 with
// AdamW, 16 MiB of parameters, gradients and moments over 8 files, each fsync'ed.
constexpr int64_t kWide = 1024, kTokens = 8;

v1::CreateSessionRequest WideRequest() {
  v1::CreateSessionRequest request;
  request.mutable_model()->set_seed(3);
  v1::LinearSpec* linear = request.mutable_model()->add_layers()->mutable_linear();
  linear->set_in_features(kWide);
  linear->set_out_features(kWide);
  request.mutable_optimizer()->mutable_adamw()->set_lr(0.01f);
  return request;
}

absl::Status WideStep(client::Client& client, const std::string& id, int step) {
  v1::ForwardBackwardRequest request;
  request.set_session_id(id);
  *request.add_inputs() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kTokens * kWide, 100 + step), {kTokens, kWide});
  request.mutable_loss()->mutable_mse();
  *request.mutable_target() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(kTokens * kWide, 200 + step), {kTokens, kWide});
  RETURN_IF_ERROR(client.ForwardBackward(request).status());
  return client.Step(id, /*zero_grad=*/true).status();
}

// Files in `dir` (0 when it does not exist).
int CountFiles(const fs::path& dir) {
  std::error_code ec;
  int n = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) ++n;
  return n;
}

// The hidden directory "<prefix><name>-XXXXXX" of an interrupted write, or "".
fs::path Hidden(const fs::path& dir, const std::string& prefix, const std::string& name) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    if (file.rfind(prefix + name + "-", 0) == 0) return it->path();
  }
  return fs::path();
}

TEST(CheckpointKill, KillDuringSaveLeavesThePreviousCheckpointLoadable) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base_dir = tmp ? tmp : "/tmp";
  const fs::path dir = fs::path(base_dir) / "kill-during-save";
  fs::remove_all(dir);

  // The previous checkpoint "base" (after step 1) and the state every attempt saves:
  // "base" resumed and stepped once more (step 2).
  auto server = std::make_unique<testing::ServerProcess>();
  ASSERT_TRUE(server->Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/save-0.log"))) << server->Log();
  std::vector<std::pair<std::string, std::string>> base_params, next_params;
  {
    client::Client client(server->address());
    auto session = client.CreateSession(WideRequest());
    ASSERT_TRUE(session.ok()) << session.status();
    ASSERT_TRUE(WideStep(client, session->session_id(), 1).ok());
    v1::SaveCheckpointRequest save;
    save.set_session_id(session->session_id());
    save.set_name("base");
    auto saved = client.SaveCheckpoint(save);
    ASSERT_TRUE(saved.ok()) << saved.status();
    ASSERT_GT(saved->bytes(), 16 << 20);
    base_params = ParameterBytes(client, session->session_id()).value();
    ASSERT_TRUE(WideStep(client, session->session_id(), 2).ok());
    next_params = ParameterBytes(client, session->session_id()).value();
    ASSERT_NE(base_params, next_params);
  }

  struct Attempt {
    std::string name;
    bool overwrite;
    int kill_at_files;  // in the temporary directory
  };
  const std::vector<Attempt> attempts = {{"next-1", false, 0}, {"next-2", false, 3}, {"next-3", false, 5},
                                         {"next-4", false, 7}, {"base", true, 4},    {"next-6", false, 8}};
  std::vector<std::string> complete = {"base"};  // checkpoints that must be listed
  int mid_save = 0;
  for (size_t k = 0; k < attempts.size(); ++k) {
    const Attempt& a = attempts[k];
    SCOPED_TRACE(absl::StrCat("attempt ", k + 1, ": ", a.name, " killed at ", a.kill_at_files, " files"));
    std::string id;
    {
      // The state to save: "base" resumed, stepped, loaded back (LoadCheckpoint) and
      // stepped again, so both ways of loading are checked on every restart.
      client::Client client(server->address());
      v1::CreateSessionRequest resume;
      resume.set_from_checkpoint("base");
      auto session = client.CreateSession(resume);
      ASSERT_TRUE(session.ok()) << session.status();
      id = session->session_id();
      EXPECT_EQ(ParameterBytes(client, id).value(), base_params);
      ASSERT_TRUE(WideStep(client, id, 2).ok());
      v1::LoadCheckpointRequest load;
      load.set_session_id(id);
      load.set_name("base");
      auto loaded = client.LoadCheckpoint(load);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->info().step(), 1);
      EXPECT_EQ(ParameterBytes(client, id).value(), base_params);
      ASSERT_TRUE(WideStep(client, id, 2).ok());
      ASSERT_EQ(ParameterBytes(client, id).value(), next_params);
    }

    // Save in the background; SIGKILL once the write has reached the attempt's point.
    client::Client client(server->address());
    absl::Status save_status = absl::UnknownError("not returned");
    std::thread saver([&] {
      v1::SaveCheckpointRequest save;
      save.set_session_id(id);
      save.set_name(a.name);
      save.set_overwrite(a.overwrite);
      save_status = client.SaveCheckpoint(save).status();
    });
    bool seen = false;
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (absl::Now() < deadline) {
      const fs::path partial = Hidden(dir, ".tmp-", a.name);
      if (!partial.empty() && CountFiles(partial) >= a.kill_at_files) {
        seen = true;
        break;
      }
      if (server->Log().find(absl::StrCat("checkpoint '", a.name, "' saved")) != std::string::npos) break;
      absl::SleepFor(absl::Microseconds(200));
    }
    server->Signal(SIGKILL);
    EXPECT_EQ(server->WaitExit(absl::Seconds(30)), -1);
    saver.join();
    // A save the client saw succeed survives the crash.
    if (save_status.ok()) {
      EXPECT_TRUE(fs::exists(dir / a.name)) << a.name;
    }
    const bool interrupted = server->Log().find(absl::StrCat("checkpoint '", a.name, "' saved")) == std::string::npos;
    const bool leftovers = !Hidden(dir, ".tmp-", a.name).empty() || !Hidden(dir, ".old-", a.name).empty();
    if (seen && interrupted && leftovers) ++mid_save;
    std::printf("attempt %zu (%s): killed %s, temporary files %s, %s\n", k + 1, a.name.c_str(),
                seen ? "at its point" : "late", leftovers ? "left" : "none",
                interrupted ? "not saved" : "saved before the kill");

    // Under its own name a checkpoint is complete or absent, before any cleanup.
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      const std::string file = e.path().filename().string();
      if (file[0] == '.') continue;
      EXPECT_EQ(CountFiles(e.path()), 8) << file << " is listed half-written";
    }
    const bool next_written = !a.overwrite && fs::exists(dir / a.name);

    // Restart on the same directory: leftovers gone, every listed checkpoint loads.
    server = std::make_unique<testing::ServerProcess>();
    ASSERT_TRUE(server->Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/save-", k + 1, ".log")))
        << server->Log();
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      EXPECT_NE(e.path().filename().string()[0], '.') << e.path() << " left after the restart";
    }
    if (next_written) complete.push_back(a.name);
    client::Client restarted(server->address());
    auto listing = restarted.ListCheckpoints();
    ASSERT_TRUE(listing.ok()) << listing.status();
    std::vector<std::string> names;
    for (const v1::CheckpointInfo& c : listing->checkpoints()) {
      names.push_back(c.name());
      EXPECT_EQ(c.error(), "") << c.name();
    }
    EXPECT_THAT(names, ::testing::UnorderedElementsAreArray(complete));
    for (const std::string& name : names) {
      v1::CreateSessionRequest resume;
      resume.set_from_checkpoint(name);
      auto session = restarted.CreateSession(resume);
      ASSERT_TRUE(session.ok()) << name << ": " << session.status();
      const auto params = ParameterBytes(restarted, session->session_id()).value();
      if (name != "base") {
        EXPECT_EQ(params, next_params) << name;
      } else if (a.overwrite && params == next_params) {
        base_params = next_params;  // the overwrite got as far as its rename: the new "base" whole
      } else {
        EXPECT_EQ(params, base_params) << "base";  // else the old one, whole
      }
      ASSERT_TRUE(restarted.DeleteSession(session->session_id()).ok());
    }
  }
  // The kills landed inside the write (the temporary directory was there, the save not
  // logged) in most attempts; the last one may land after it.
  EXPECT_GE(mid_save, 4) << "kills that landed mid-save";
  server->Signal(SIGTERM);
  EXPECT_EQ(server->WaitExit(absl::Seconds(30)), 0) << server->Log();
}

// The overwrite's own window. "base" (step 1) is replaced with SaveCheckpoint(overwrite)
// by the state one step later (step 2), and the server is killed at a rename of the
// replacement (see the top of this file). The expected files at each point are checked
// before the kill, so the test says where it killed; after the restart "base" is listed
// complete and loads (from_checkpoint and LoadCheckpoint) as exactly the old or exactly
// the new checkpoint: the old one while the new is not in place, the new one once it is.
TEST(CheckpointKill, KillWhileOverwritingLeavesTheOldOrTheNewCheckpointUnderItsName) {
  const std::string shim = testing::Runfile("tests/integration/rename_pause.so");
  ASSERT_TRUE(fs::exists(shim)) << shim << " is missing (//tests/integration:rename_pause.so, a data dependency)";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base_dir = tmp ? tmp : "/tmp";
  const fs::path dir = fs::path(base_dir) / "kill-during-overwrite";
  fs::remove_all(dir);

  std::vector<std::pair<std::string, std::string>> old_params, new_params;
  {
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/overwrite-0.log"))) << server.Log();
    {
      client::Client client(server.address());
      auto session = client.CreateSession(WideRequest());
      ASSERT_TRUE(session.ok()) << session.status();
      ASSERT_TRUE(WideStep(client, session->session_id(), 1).ok());
      v1::SaveCheckpointRequest save;
      save.set_session_id(session->session_id());
      save.set_name("base");
      ASSERT_TRUE(client.SaveCheckpoint(save).ok());
      old_params = ParameterBytes(client, session->session_id()).value();
      ASSERT_TRUE(WideStep(client, session->session_id(), 2).ok());
      new_params = ParameterBytes(client, session->session_id()).value();
      ASSERT_NE(old_params, new_params);
    }  // the connection closed, so that SIGTERM need not wait for it
    server.Signal(SIGTERM);
    ASSERT_EQ(server.WaitExit(absl::Seconds(30)), 0) << server.Log();
  }

  struct Point {
    std::string pause;  // TESERVE_TEST_RENAME_PAUSE
    std::string window;
    // Files under "base", in the aside directory and in the temporary one when it stops
    // (-1: that directory does not exist).
    int under_name, aside, temporary;
    bool new_in_place;  // what "base" must load as after the restart
  };
  // In this order: "base" is still the old checkpoint until the last point.
  const std::vector<Point> points = {
      {"before:.old-base-*", "new complete in .tmp-base-*, old in place", 8, 0, 8, false},
      {"after:.old-base-*", "old moved aside, nothing under 'base'", -1, 8, 8, false},
      {"after:base", "new in place, old still aside", 8, 8, -1, true},
  };
  for (size_t k = 0; k < points.size(); ++k) {
    const Point& p = points[k];
    SCOPED_TRACE(absl::StrCat("killed at ", p.pause, " (", p.window, ")"));
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      ASSERT_NE(e.path().filename().string()[0], '.') << e.path() << " before the save";
    }
    {
      testing::ServerProcess server;
      ASSERT_TRUE(server.Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/overwrite-", k + 1, "-killed.log"),
                               {absl::StrCat("LD_PRELOAD=", shim), absl::StrCat("TESERVE_TEST_RENAME_PAUSE=", p.pause)}))
          << server.Log();
      client::Client client(server.address());
      // The new state: the old checkpoint resumed and stepped once more.
      v1::CreateSessionRequest resume;
      resume.set_from_checkpoint("base");
      auto session = client.CreateSession(resume);
      ASSERT_TRUE(session.ok()) << session.status();
      ASSERT_EQ(ParameterBytes(client, session->session_id()).value(), old_params);
      ASSERT_TRUE(WideStep(client, session->session_id(), 2).ok());
      ASSERT_EQ(ParameterBytes(client, session->session_id()).value(), new_params);

      absl::Status save_status = absl::UnknownError("not returned");
      std::thread saver([&] {
        v1::SaveCheckpointRequest save;
        save.set_session_id(session->session_id());
        save.set_name("base");
        save.set_overwrite(true);
        save_status = client.SaveCheckpoint(save).status();
      });
      const bool paused = server.WaitForLog("rename_pause: paused", absl::Seconds(30));
      // The directory as the kill leaves it (the server is blocked at the rename).
      const int under_name = fs::exists(dir / "base") ? CountFiles(dir / "base") : -1;
      const fs::path aside = Hidden(dir, ".old-", "base"), temporary = Hidden(dir, ".tmp-", "base");
      const int aside_files = aside.empty() ? -1 : CountFiles(aside);
      const int temporary_files = temporary.empty() ? -1 : CountFiles(temporary);
      server.Signal(SIGKILL);
      EXPECT_EQ(server.WaitExit(absl::Seconds(30)), -1);
      saver.join();
      ASSERT_TRUE(paused) << "the save never reached " << p.pause << "\n" << server.Log();
      EXPECT_FALSE(save_status.ok()) << "the save returned before the kill";
      EXPECT_THAT(server.Log(), ::testing::Not(HasSubstr("checkpoint 'base' saved")));
      EXPECT_EQ(under_name, p.under_name) << "files under 'base'";
      EXPECT_EQ(aside_files, p.aside) << "files in the aside directory " << aside;
      EXPECT_EQ(temporary_files, p.temporary) << "files in the temporary directory " << temporary;
      std::printf("killed at %s: 'base' %d files, aside %d, temporary %d\n", p.pause.c_str(), under_name, aside_files,
                  temporary_files);
    }

    // Restart: the leftovers are gone and "base" is the old or the new checkpoint, whole.
    testing::ServerProcess server;
    ASSERT_TRUE(server.Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/overwrite-", k + 1, "-restart.log")))
        << server.Log();
    for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
      EXPECT_NE(e.path().filename().string()[0], '.') << e.path() << " left after the restart";
    }
    {
      client::Client client(server.address());
      auto listing = client.ListCheckpoints();
      ASSERT_TRUE(listing.ok()) << listing.status();
      ASSERT_EQ(listing->checkpoints_size(), 1);
      EXPECT_EQ(listing->checkpoints(0).name(), "base");
      EXPECT_EQ(listing->checkpoints(0).error(), "");
      const int64_t step = p.new_in_place ? 2 : 1;
      const auto& expected = p.new_in_place ? new_params : old_params;
      EXPECT_EQ(listing->checkpoints(0).step(), step);
      v1::CreateSessionRequest resume;
      resume.set_from_checkpoint("base");
      auto resumed = client.CreateSession(resume);
      ASSERT_TRUE(resumed.ok()) << resumed.status();
      EXPECT_EQ(resumed->info().step(), step);
      EXPECT_EQ(ParameterBytes(client, resumed->session_id()).value(), expected)
          << (p.new_in_place ? "expected the new checkpoint" : "expected the old checkpoint");
      auto fresh = client.CreateSession(WideRequest());
      ASSERT_TRUE(fresh.ok()) << fresh.status();
      v1::LoadCheckpointRequest load;
      load.set_session_id(fresh->session_id());
      load.set_name("base");
      auto loaded = client.LoadCheckpoint(load);
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      EXPECT_EQ(loaded->info().step(), step);
      EXPECT_EQ(ParameterBytes(client, fresh->session_id()).value(), expected);
    }  // the connection closed, so that SIGTERM need not wait for it
    server.Signal(SIGTERM);
    EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 0) << server.Log();
  }
}

// Not a kill: RPCs that read "base" while an overwrite of it has moved the old checkpoint
// aside and not yet renamed the new one in (the server held there 1.5 s by
// rename_pause.so) find it whole, the old or the new checkpoint, never missing and never
// half of each: LoadCheckpoint, CreateSession(from_checkpoint) and ListCheckpoints, all
// three at once.
TEST(CheckpointKill, ReadsDuringAnOverwriteFindTheNameWhole) {
  const std::string shim = testing::Runfile("tests/integration/rename_pause.so");
  ASSERT_TRUE(fs::exists(shim)) << shim << " is missing (//tests/integration:rename_pause.so, a data dependency)";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string base_dir = tmp ? tmp : "/tmp";
  const fs::path dir = fs::path(base_dir) / "read-during-overwrite";
  fs::remove_all(dir);
  testing::ServerProcess server;
  ASSERT_TRUE(server.Start(ServerFlags(dir.string()), absl::StrCat(base_dir, "/read-during-overwrite.log"),
                           {absl::StrCat("LD_PRELOAD=", shim), "TESERVE_TEST_RENAME_PAUSE=after:.old-base-*",
                            "TESERVE_TEST_RENAME_PAUSE_MS=1500"}))
      << server.Log();
  {
    client::Client client(server.address());
    auto session = client.CreateSession(WideRequest());
    auto reader = client.CreateSession(WideRequest());
    ASSERT_TRUE(session.ok() && reader.ok()) << session.status() << " " << reader.status();
    ASSERT_TRUE(WideStep(client, session->session_id(), 1).ok());
    v1::SaveCheckpointRequest save;
    save.set_session_id(session->session_id());
    save.set_name("base");
    ASSERT_TRUE(client.SaveCheckpoint(save).ok());  // a new name: nothing moved aside, no pause
    const auto old_params = ParameterBytes(client, session->session_id()).value();
    ASSERT_TRUE(WideStep(client, session->session_id(), 2).ok());
    const auto new_params = ParameterBytes(client, session->session_id()).value();
    ASSERT_NE(old_params, new_params);

    absl::Status save_status = absl::UnknownError("not returned");
    std::thread saver([&] {
      save.set_overwrite(true);
      save_status = client.SaveCheckpoint(save).status();
    });
    ASSERT_TRUE(server.WaitForLog("rename_pause: paused after", absl::Seconds(30))) << server.Log();
    EXPECT_FALSE(fs::exists(dir / "base")) << "the overwrite is between its renames";

    // What each read found: the step and parameters it loaded, or its error.
    absl::StatusOr<int64_t> loaded_step = absl::UnknownError("not returned"), resumed_step = loaded_step;
    std::vector<std::pair<std::string, std::string>> loaded_params, resumed_params;
    absl::StatusOr<v1::ListCheckpointsResponse> listing = absl::UnknownError("not returned");
    std::thread load([&] {
      v1::LoadCheckpointRequest request;
      request.set_session_id(reader->session_id());
      request.set_name("base");
      auto loaded = client.LoadCheckpoint(request);
      if (!loaded.ok()) {
        loaded_step = loaded.status();
        return;
      }
      loaded_step = loaded->info().step();
      loaded_params = ParameterBytes(client, reader->session_id()).value();
    });
    std::thread resume([&] {
      v1::CreateSessionRequest request;
      request.set_from_checkpoint("base");
      auto resumed = client.CreateSession(request);
      if (!resumed.ok()) {
        resumed_step = resumed.status();
        return;
      }
      resumed_step = resumed->info().step();
      resumed_params = ParameterBytes(client, resumed->session_id()).value();
    });
    std::thread list([&] { listing = client.ListCheckpoints(); });
    load.join();
    resume.join();
    list.join();
    saver.join();
    EXPECT_TRUE(save_status.ok()) << save_status;
    EXPECT_THAT(server.Log(), HasSubstr("checkpoint 'base' saved: step 2"));

    auto whole = [&](const absl::StatusOr<int64_t>& step, const std::vector<std::pair<std::string, std::string>>& params,
                     const std::string& what) {
      ASSERT_TRUE(step.ok()) << what << ": " << step.status();
      ASSERT_TRUE(*step == 1 || *step == 2) << what << ": step " << *step;
      EXPECT_EQ(params, *step == 1 ? old_params : new_params) << what << " at step " << *step;
      std::printf("%s during the overwrite: step %lld\n", what.c_str(), static_cast<long long>(*step));
    };
    whole(loaded_step, loaded_params, "LoadCheckpoint");
    whole(resumed_step, resumed_params, "CreateSession(from_checkpoint)");
    ASSERT_TRUE(listing.ok()) << listing.status();
    ASSERT_EQ(listing->checkpoints_size(), 1) << "ListCheckpoints during the overwrite";
    EXPECT_EQ(listing->checkpoints(0).name(), "base");
    EXPECT_EQ(listing->checkpoints(0).error(), "");
  }  // the connection closed, so that SIGTERM need not wait for it
  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(30)), 0) << server.Log();
}

}  // namespace
}  // namespace teserve
