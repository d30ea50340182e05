// SaveCheckpoint / LoadCheckpoint / ListCheckpoints / CreateSession(from_checkpoint) and
// checkpoint_every_steps through the real server and client: exact resumption, names,
// specs, and damaged checkpoints that load nothing.
#include <cstdlib>
#include <functional>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/checkpoint_training.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;
using testing::CheckpointedRunRequest;
using testing::CheckpointedRunStep;
using testing::ParameterBytes;

std::string FreshDir(const std::string& leaf) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp ? tmp : "/tmp", "/", leaf);
  std::filesystem::remove_all(dir);
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

class CheckpointRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    server::ServerOptions options = testing::LoopbackOptions();
    options.checkpoint_dir = dir_;
    s_ = testing::StartLoopbackServer(options);
    ASSERT_NE(s_.client, nullptr);
  }

  std::string NewSession(v1::CreateSessionRequest request = CheckpointedRunRequest()) {
    auto created = s_.client->CreateSession(request);
    EXPECT_TRUE(created.ok()) << created.status();
    return created.ok() ? created->session_id() : "";
  }
  absl::StatusOr<v1::SaveCheckpointResponse> Save(const std::string& id, const std::string& name,
                                                  bool overwrite = false) {
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_name(name);
    request.set_overwrite(overwrite);
    return s_.client->SaveCheckpoint(request);
  }
  absl::StatusOr<v1::LoadCheckpointResponse> Load(const std::string& id, const std::string& name) {
    v1::LoadCheckpointRequest request;
    request.set_session_id(id);
    request.set_name(name);
    return s_.client->LoadCheckpoint(request);
  }
  absl::StatusOr<v1::CreateSessionResponse> FromCheckpoint(const std::string& name) {
    v1::CreateSessionRequest request;
    request.set_from_checkpoint(name);
    return s_.client->CreateSession(request);
  }

  std::string dir_;
  testing::LoopbackServer s_;
};

TEST_F(CheckpointRpcTest, SaveLoadAndCreateFromCheckpointResumeBitForBit) {
  const std::string id = NewSession();
  for (int step = 1; step <= 3; ++step) ASSERT_TRUE(CheckpointedRunStep(*s_.client, id, step).ok());
  auto saved = Save(id, "after-3");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->name(), "after-3");
  EXPECT_EQ(saved->step(), 3);
  EXPECT_GT(saved->bytes(), 0);
  std::vector<uint32_t> expected;
  for (int step = 4; step <= 6; ++step) expected.push_back(CheckpointedRunStep(*s_.client, id, step).value());
  const auto final_params = ParameterBytes(*s_.client, id).value();

  // The same session, rewound.
  auto loaded = Load(id, "after-3");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->info().step(), 3);
  for (int step = 4; step <= 6; ++step) EXPECT_EQ(CheckpointedRunStep(*s_.client, id, step).value(), expected[step - 4]);
  EXPECT_EQ(ParameterBytes(*s_.client, id).value(), final_params);

  // A new session from it.
  auto created = FromCheckpoint("after-3");
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_EQ(created->info().step(), 3);
  EXPECT_EQ(created->info().model().SerializeAsString(), CheckpointedRunRequest().model().SerializeAsString());
  const std::string resumed = created->session_id();
  for (int step = 4; step <= 6; ++step) {
    EXPECT_EQ(CheckpointedRunStep(*s_.client, resumed, step).value(), expected[step - 4]);
  }
  EXPECT_EQ(ParameterBytes(*s_.client, resumed).value(), final_params);

  auto listing = s_.client->ListCheckpoints();
  ASSERT_TRUE(listing.ok()) << listing.status();
  ASSERT_EQ(listing->checkpoints_size(), 1);
  EXPECT_EQ(listing->checkpoints(0).name(), "after-3");
  EXPECT_EQ(listing->checkpoints(0).step(), 3);
  EXPECT_EQ(listing->checkpoints(0).bytes(), saved->bytes());
  EXPECT_EQ(listing->checkpoints(0).error(), "");
}

TEST_F(CheckpointRpcTest, ExistingNamesNeedOverwrite) {
  const std::string id = NewSession();
  ASSERT_TRUE(Save(id, "c").ok());
  ASSERT_TRUE(CheckpointedRunStep(*s_.client, id, 1).ok());
  auto again = Save(id, "c");
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("checkpoint 'c': exists already (set overwrite"));
  auto replaced = Save(id, "c", /*overwrite=*/true);
  ASSERT_TRUE(replaced.ok()) << replaced.status();
  EXPECT_EQ(replaced->step(), 1);
  EXPECT_EQ(FromCheckpoint("c")->info().step(), 1);
}

TEST_F(CheckpointRpcTest, NamesAreValidated) {
  const std::string id = NewSession();
  for (const std::string& bad : std::vector<std::string>{"", "../x", "/tmp/x", "a/b", ".hidden", "..", "x\n"}) {
    auto saved = Save(id, bad);
    EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(saved.status().message()), HasSubstr("name: expected a checkpoint name")) << bad;
    EXPECT_EQ(Load(id, bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    auto created = FromCheckpoint(bad);
    if (bad.empty()) continue;  // empty from_checkpoint: no model, a spec error
    EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(created.status().message()), HasSubstr("from_checkpoint: expected a checkpoint name"));
  }
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir_, "/../x")));
  v1::CreateSessionRequest request = CheckpointedRunRequest();
  request.set_checkpoint_every_steps(1);
  request.set_checkpoint_prefix("../up");
  auto created = s_.client->CreateSession(request);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(created.status().message()), HasSubstr("checkpoint_prefix: expected a checkpoint name"));
  request.set_checkpoint_prefix("ok");
  request.set_checkpoint_every_steps(-1);
  EXPECT_THAT(std::string(s_.client->CreateSession(request).status().message()),
              HasSubstr("checkpoint_every_steps: expected a count >= 0"));
}

TEST_F(CheckpointRpcTest, SpecsMustAgree) {
  const std::string id = NewSession();
  ASSERT_TRUE(Save(id, "c").ok());
  v1::CreateSessionRequest other = CheckpointedRunRequest();
  other.mutable_optimizer()->mutable_adamw()->set_lr(0.02f);
  const std::string other_id = NewSession(other);
  auto loaded = Load(other_id, "c");
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loaded.status().message()),
              HasSubstr("checkpoint 'c': optimizer.json: the checkpoint's optimizer differs from this session's"));

  v1::CreateSessionRequest both = CheckpointedRunRequest();
  both.set_from_checkpoint("c");
  auto created = s_.client->CreateSession(both);
  EXPECT_EQ(created.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(created.status().message()),
              HasSubstr("from_checkpoint: expected model, recipe and optimizer unset"));
  auto missing = FromCheckpoint("nope");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("checkpoint 'nope': no such checkpoint"));
}

// Each damage: LoadCheckpoint fails naming the file and leaves the session as it was;
// CreateSession(from_checkpoint) fails and creates nothing.
TEST_F(CheckpointRpcTest, DamagedCheckpointsLoadNothing) {
  const std::string id = NewSession();
  ASSERT_TRUE(CheckpointedRunStep(*s_.client, id, 1).ok());
  ASSERT_TRUE(Save(id, "good").ok());
  ASSERT_TRUE(CheckpointedRunStep(*s_.client, id, 2).ok());
  const auto params = ParameterBytes(*s_.client, id).value();
  const std::string quant = s_.client->GetQuantizationState(id)->SerializeAsString();

  struct Damage {
    std::string name;
    std::string file;
    std::function<std::string(std::string)> edit;
    absl::StatusCode code;
    std::string message;
  };
  const std::vector<Damage> damages = {
      {"truncated", "parameters.safetensors", [](std::string b) { return b.substr(0, b.size() - 100); },
       absl::StatusCode::kDataLoss, "parameters.safetensors: truncated: "},
      {"corrupted", "optimizer.safetensors",
       [](std::string b) {
         b[b.size() - 1] ^= 1;
         return b;
       },
       absl::StatusCode::kDataLoss, "optimizer.safetensors: corrupted: its SHA-256 is "},
      {"foreign", "checkpoint.json", [](std::string) { return std::string(R"({"format":"keras","version":1})"); },
       absl::StatusCode::kFailedPrecondition, "checkpoint.json: not a teserve checkpoint (format 'keras'"},
      {"version", "checkpoint.json",
       [](std::string b) { return absl::StrReplaceAll(b, {{"\"version\": 1", "\"version\": 2"}}); },
       absl::StatusCode::kFailedPrecondition, "checkpoint.json: checkpoint format version 2"},
  };
  for (const Damage& d : damages) {
    const std::string copy = absl::StrCat(dir_, "/", d.name);
    std::filesystem::copy(absl::StrCat(dir_, "/good"), copy);
    const std::string path = absl::StrCat(copy, "/", d.file);
    WriteFile(path, d.edit(ReadFile(path)));

    auto loaded = Load(id, d.name);
    EXPECT_EQ(loaded.status().code(), d.code) << d.name << ": " << loaded.status();
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(absl::StrCat("checkpoint '", d.name, "': ", d.message)));
    EXPECT_EQ(ParameterBytes(*s_.client, id).value(), params) << d.name;
    EXPECT_EQ(s_.client->GetSession(id)->step(), 2) << d.name;
    EXPECT_EQ(s_.client->GetQuantizationState(id)->SerializeAsString(), quant) << d.name;

    const int sessions = s_.client->ListSessions()->sessions_size();
    auto created = FromCheckpoint(d.name);
    EXPECT_EQ(created.status().code(), d.code) << d.name;
    EXPECT_THAT(std::string(created.status().message()), HasSubstr(d.message)) << d.name;
    EXPECT_EQ(s_.client->ListSessions()->sessions_size(), sessions) << d.name;
  }
  // The session still trains, and the good checkpoint still loads.
  EXPECT_TRUE(CheckpointedRunStep(*s_.client, id, 3).ok());
  auto good = Load(id, "good");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->info().step(), 1);
  auto listing = s_.client->ListCheckpoints().value();
  ASSERT_EQ(listing.checkpoints_size(), 5);
  EXPECT_EQ(listing.checkpoints(0).name(), "corrupted");
  EXPECT_EQ(listing.checkpoints(0).error(), "");
  EXPECT_EQ(listing.checkpoints(1).name(), "foreign");
  EXPECT_THAT(listing.checkpoints(1).error(), HasSubstr("not a teserve checkpoint"));
}

TEST_F(CheckpointRpcTest, PeriodicCheckpointsKeepTheLastK) {
  v1::CreateSessionRequest request = CheckpointedRunRequest();
  request.set_checkpoint_every_steps(2);
  request.set_keep_last_checkpoints(2);
  request.set_checkpoint_prefix("run");
  const std::string id = NewSession(request);
  ASSERT_TRUE(Save(id, "manual").ok());
  for (int step = 1; step <= 7; ++step) {
    v1::StepResponse response;
    ASSERT_TRUE(CheckpointedRunStep(*s_.client, id, step, &response).ok());
    EXPECT_EQ(response.checkpoint(), step % 2 == 0 ? absl::StrCat("run-step-00000000", step) : "") << step;
    EXPECT_EQ(response.checkpoint_error(), "");
  }
  std::vector<std::string> names;
  const v1::ListCheckpointsResponse listing = s_.client->ListCheckpoints().value();
  for (const v1::CheckpointInfo& c : listing.checkpoints()) names.push_back(c.name());
  EXPECT_THAT(names, ::testing::ElementsAre("manual", "run-step-000000004", "run-step-000000006"));
  std::vector<std::string> entries;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) entries.push_back(e.path().filename().string());
  EXPECT_THAT(entries, ::testing::UnorderedElementsAre("manual", "run-step-000000004", "run-step-000000006"));
  // The default prefix is the session id.
  request.clear_checkpoint_prefix();
  request.set_keep_last_checkpoints(0);
  const std::string other = NewSession(request);
  for (int step = 1; step <= 2; ++step) ASSERT_TRUE(CheckpointedRunStep(*s_.client, other, step).ok());
  EXPECT_TRUE(std::filesystem::exists(absl::StrCat(dir_, "/", other, "-step-000000002")));
}

// With bearer tokens each tenant has its own checkpoints (<checkpoint_dir>/@<tenant>):
// another tenant's cannot be listed, loaded, resumed, overwritten or pruned, even under
// the same name; a tenant named ".." stays inside the directory.
TEST(CheckpointTenants, ATenantSeesOnlyItsOwnCheckpoints) {
  const std::string dir = FreshDir("tenant_checkpoints");
  constexpr char kAlice[] = "alice-checkpoint-token-0123456789";
  constexpr char kBob[] = "bob-checkpoint-token-0123456789ab";
  constexpr char kDots[] = "dots-checkpoint-token-0123456789a";
  const std::string tokens = absl::StrCat(dir, "-tokens.txt");
  WriteFile(tokens, absl::StrCat(kAlice, " alice\n", kBob, " bob\n", kDots, " ..\n"));
  server::ServerOptions options = testing::LoopbackOptions();
  options.checkpoint_dir = dir;
  options.auth_tokens_file = tokens;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  auto connect = [&](const char* token) {
    client::ClientOptions client_options;
    client_options.token = token;
    return std::make_unique<client::Client>(s.address, client_options);
  };
  auto alice = connect(kAlice), bob = connect(kBob), dots = connect(kDots);
  auto names = [](client::Client& c) {
    std::vector<std::string> out;
    absl::StatusOr<v1::ListCheckpointsResponse> listing = c.ListCheckpoints();
    EXPECT_TRUE(listing.ok()) << listing.status();
    if (listing.ok()) {
      for (const v1::CheckpointInfo& info : listing->checkpoints()) out.push_back(info.name());
    }
    return out;
  };
  auto save = [](client::Client& c, const std::string& id, const std::string& name) {
    v1::SaveCheckpointRequest request;
    request.set_session_id(id);
    request.set_name(name);
    return c.SaveCheckpoint(request).status();
  };

  v1::CreateSessionRequest periodic = CheckpointedRunRequest();
  periodic.set_checkpoint_every_steps(1);
  periodic.set_keep_last_checkpoints(1);
  periodic.set_checkpoint_prefix("run");
  auto a = alice->CreateSession(periodic);
  ASSERT_TRUE(a.ok()) << a.status();
  for (int step = 1; step <= 2; ++step) ASSERT_TRUE(CheckpointedRunStep(*alice, a->session_id(), step).ok());
  ASSERT_TRUE(save(*alice, a->session_id(), "shared").ok());
  EXPECT_THAT(names(*alice), ::testing::ElementsAre("run-step-000000002", "shared"));
  EXPECT_TRUE(names(*bob).empty()) << "bob sees alice's checkpoints";

  // Bob cannot load or resume alice's checkpoints; NOT_FOUND as for names that don't exist.
  auto b = bob->CreateSession(periodic);
  ASSERT_TRUE(b.ok()) << b.status();
  v1::LoadCheckpointRequest load;
  load.set_session_id(b->session_id());
  load.set_name("shared");
  EXPECT_EQ(bob->LoadCheckpoint(load).status().code(), absl::StatusCode::kNotFound);
  v1::CreateSessionRequest resume;
  resume.set_from_checkpoint("run-step-000000002");
  EXPECT_EQ(bob->CreateSession(resume).status().code(), absl::StatusCode::kNotFound);
  // Bob's own "shared" and periodic checkpoints neither collide with alice's nor prune them.
  ASSERT_TRUE(CheckpointedRunStep(*bob, b->session_id(), 1).ok());
  EXPECT_TRUE(save(*bob, b->session_id(), "shared").ok()) << "no ALREADY_EXISTS from alice's";
  for (int step = 2; step <= 3; ++step) ASSERT_TRUE(CheckpointedRunStep(*bob, b->session_id(), step).ok());
  EXPECT_THAT(names(*bob), ::testing::ElementsAre("run-step-000000003", "shared"));
  EXPECT_THAT(names(*alice), ::testing::ElementsAre("run-step-000000002", "shared"));
  auto resumed = alice->CreateSession(resume);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->info().step(), 2);
  EXPECT_EQ(ParameterBytes(*alice, resumed->session_id()).value(), ParameterBytes(*alice, a->session_id()).value());

  // A tenant named ".." is a directory "@.." inside, not the parent.
  auto d = dots->CreateSession(CheckpointedRunRequest());
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(save(*dots, d->session_id(), "mine").ok());
  EXPECT_THAT(names(*dots), ::testing::ElementsAre("mine"));
  EXPECT_TRUE(std::filesystem::is_directory(absl::StrCat(dir, "/@../mine")));
  std::vector<std::string> top;
  for (const auto& e : std::filesystem::directory_iterator(dir)) top.push_back(e.path().filename().string());
  EXPECT_THAT(top, ::testing::UnorderedElementsAre("@alice", "@bob", "@.."));
  EXPECT_FALSE(std::filesystem::exists(absl::StrCat(dir, "/../mine")));
}

TEST(CheckpointRpcOff, WithoutCheckpointDirTheRpcsSaySo) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  auto created = s.client->CreateSession(CheckpointedRunRequest());
  ASSERT_TRUE(created.ok());
  v1::SaveCheckpointRequest save;
  save.set_session_id(created->session_id());
  save.set_name("c");
  auto saved = s.client->SaveCheckpoint(save);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(saved.status().message()), HasSubstr("start it with --checkpoint_dir"));
  EXPECT_EQ(s.client->ListCheckpoints().status().code(), absl::StatusCode::kFailedPrecondition);
  v1::CreateSessionRequest periodic = CheckpointedRunRequest();
  periodic.set_checkpoint_every_steps(5);
  auto refused = s.client->CreateSession(periodic);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("checkpoint_every_steps: this server keeps no checkpoints"));
}

}  // namespace
}  // namespace teserve
