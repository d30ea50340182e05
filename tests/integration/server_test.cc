// The server around the Trainer: health, reflection, GetServerInfo, session lifecycle,
// --max_sessions, metrics, and shutdown.
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "google/protobuf/unknown_field_set.h"
#include "grpcpp/generic/generic_stub.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/test_server.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;

// Lists services through grpc.reflection.v1alpha.ServerReflection (a bidi stream), with
// the request and response encoded by hand: the reflection proto is not in our tree.
//   request:  ServerReflectionRequest{ list_services = 7: "" }
//   response: ServerReflectionResponse{ list_services_response = 6:
//               ListServiceResponse{ service = 1: ServiceResponse{ name = 1 } } }
std::vector<std::string> ReflectedServices(const std::shared_ptr<grpc::Channel>& channel) {
  std::vector<std::string> names;
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  void* tag = nullptr;
  bool ok = false;
  auto call = stub.PrepareCall(&context,
                               "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                               &cq);
  auto step = [&](void* expected) {
    return cq.Next(&tag, &ok) && tag == expected && ok;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  if (!step(reinterpret_cast<void*>(1))) return names;
  const std::string request("\x3a\x00", 2);
  grpc::Slice slice(request);
  grpc::ByteBuffer request_buffer(&slice, 1);
  call->Write(request_buffer, reinterpret_cast<void*>(2));
  if (!step(reinterpret_cast<void*>(2))) return names;
  grpc::ByteBuffer response_buffer;
  call->Read(&response_buffer, reinterpret_cast<void*>(3));
  if (!step(reinterpret_cast<void*>(3))) return names;
  call->WritesDone(reinterpret_cast<void*>(4));
  step(reinterpret_cast<void*>(4));
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);

  std::vector<grpc::Slice> slices;
  std::string bytes;
  if (!response_buffer.Dump(&slices).ok()) return names;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  google::protobuf::UnknownFieldSet response;
  if (!response.ParseFromString(bytes)) return names;
  for (int i = 0; i < response.field_count(); ++i) {
    if (response.field(i).number() != 6) continue;
    google::protobuf::UnknownFieldSet list;
    if (!list.ParseFromString(response.field(i).length_delimited())) continue;
    for (int j = 0; j < list.field_count(); ++j) {
      google::protobuf::UnknownFieldSet service;
      if (!service.ParseFromString(list.field(j).length_delimited())) continue;
      for (int k = 0; k < service.field_count(); ++k) {
        if (service.field(k).number() == 1) names.push_back(service.field(k).length_delimited());
      }
    }
  }
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return names;
}

TEST(Server, HealthIsServing) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<std::string> health = s.client->Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
}

TEST(Server, ReflectionListsTheTrainerAndHealthServices) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  const std::vector<std::string> services = ReflectedServices(s.client->channel());
  EXPECT_THAT(services, ::testing::Contains("teserve.v1.Trainer"));
  EXPECT_THAT(services, ::testing::Contains("grpc.health.v1.Health"));
  EXPECT_THAT(services, ::testing::Contains("grpc.reflection.v1alpha.ServerReflection"));
}

TEST(Server, ServerInfoOnCpu) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::ServerInfo> info = s.client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->version(), "0.1.0");
  EXPECT_EQ(info->device(), "cpu");
  EXPECT_EQ(info->compute_capability(), "");
  EXPECT_EQ(info->default_recipe(), "delayed");
  EXPECT_EQ(info->max_sessions(), 64);
  EXPECT_EQ(info->max_message_bytes(), int64_t{1} << 30);
  // The limits, at their defaults (LoopbackOptions changes none).
  EXPECT_EQ(info->max_sessions_per_tenant(), 64);
  EXPECT_EQ(info->max_tokens_per_request(), 65536);
  EXPECT_EQ(info->max_attention_scores(), int64_t{1} << 27);
  EXPECT_EQ(info->max_live_handles(), 1024);
  EXPECT_GT(info->memory_budget_bytes(), 0);  // the cgroup limit or MemTotal
  EXPECT_EQ(info->admission_tokens(), 8192);
  EXPECT_EQ(info->session_idle_timeout_seconds(), 0.0);
  EXPECT_FALSE(info->checkpoints_enabled());
  std::vector<std::string> recipes;
  for (const v1::RecipeAvailability& r : info->recipes()) {
    recipes.push_back(r.recipe());
    EXPECT_FALSE(r.reason().empty()) << r.recipe();
  }
  EXPECT_EQ(recipes, (std::vector<std::string>{"delayed", "current", "mxfp8", "block", "nvfp4"}));
  EXPECT_EQ(info->recipes(0).availability(), v1::EMULATED);
  for (const v1::RecipeAvailability& r : info->recipes()) EXPECT_EQ(r.availability(), v1::EMULATED) << r.recipe();
}

TEST(Server, ServerInfoReportsTheLimitsSet) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.max_sessions_per_tenant = 3;
  options.max_tokens_per_request = 1000;
  options.max_attention_scores = 4096;
  options.memory_budget_bytes = -1;
  options.admission_tokens = 512;
  options.session_idle_timeout = absl::Seconds(90);
  options.checkpoint_dir = absl::StrCat(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp", "/info_ckpt");
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  absl::StatusOr<v1::ServerInfo> info = s.client->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->max_sessions_per_tenant(), 3);
  EXPECT_EQ(info->max_tokens_per_request(), 1000);
  EXPECT_EQ(info->max_attention_scores(), 4096);
  EXPECT_EQ(info->memory_budget_bytes(), -1);
  EXPECT_EQ(info->admission_tokens(), 512);
  EXPECT_EQ(info->session_idle_timeout_seconds(), 90.0);
  EXPECT_TRUE(info->checkpoints_enabled());
}

TEST(Server, SessionLifecycle) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  auto created = s.client->CreateSession(client::DemoSessionRequest(3, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->session_id();
  EXPECT_THAT(id, ::testing::MatchesRegex("[0-9a-f]{32}"));
  EXPECT_EQ(created->info().device(), "cpu");
  EXPECT_EQ(created->info().recipe_name(), "delayed");
  ASSERT_EQ(created->info().layers_size(), 4);
  EXPECT_EQ(created->info().layers(1).kind(), "Linear");

  auto got = s.client->GetSession(id);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->session_id(), id);
  EXPECT_EQ(got->model().SerializeAsString(), created->info().model().SerializeAsString());
  auto listed = s.client->ListSessions();
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->sessions_size(), 1);
  EXPECT_EQ(listed->sessions(0).session_id(), id);

  ASSERT_TRUE(s.client->DeleteSession(id).ok());
  EXPECT_EQ(s.client->GetSession(id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.client->DeleteSession(id).code(), absl::StatusCode::kNotFound);
}

TEST(Server, MaxSessionsLimit) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.max_sessions = 2;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  const v1::CreateSessionRequest spec = client::DemoSessionRequest(3, 0.05f, true, 1e-2f);
  auto first = s.client->CreateSession(spec);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(s.client->CreateSession(spec).ok());
  auto third = s.client->CreateSession(spec);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr("expected at most 2 live sessions (--max_sessions)"));
  EXPECT_EQ(*s.client->Health(), "SERVING");
  // A freed slot can be used again.
  ASSERT_TRUE(s.client->DeleteSession(first->session_id()).ok());
  EXPECT_TRUE(s.client->CreateSession(spec).ok());
}

TEST(Server, RejectsMessagesOverTheLimit) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.max_message_bytes = 4096;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  auto created = s.client->CreateSession(client::DemoSessionRequest(3, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  v1::ForwardRequest forward;
  forward.set_session_id(created->session_id());
  *forward.add_inputs() =
      client::MakeFloatTensor(testing::PseudoRandomFloats(64 * 32, 1), {64, 32});  // 8 KiB
  EXPECT_EQ(s.client->Forward(forward).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(*s.client->Health(), "SERVING");
}

// Empty batches, rank-1 and rank-0 inputs are the session's to accept or reject; the
// server must answer either way and keep serving.
TEST(Server, AnswersOddShapesWithoutFalling) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  auto created = s.client->CreateSession(client::DemoSessionRequest(3, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::vector<std::vector<int64_t>> shapes = {{0, 32}, {32}, {}, {2, 0, 32}, {1, 1, 32}};
  for (const std::vector<int64_t>& shape : shapes) {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    v1::ForwardRequest forward;
    forward.set_session_id(created->session_id());
    *forward.add_inputs() = client::MakeFloatTensor(testing::PseudoRandomFloats(count, 5), shape);
    auto response = s.client->Forward(forward);
    if (!response.ok()) {
      EXPECT_EQ(response.status().code(), absl::StatusCode::kInvalidArgument) << response.status();
      EXPECT_THAT(std::string(response.status().message()), HasSubstr("inputs[0]"));
    } else if (response->handle() != 0) {
      v1::BackwardRequest backward;
      backward.set_session_id(created->session_id());
      backward.set_handle(response->handle());
      *backward.add_grad_outputs() = response->outputs(0);
      auto grads = s.client->Backward(backward);
      EXPECT_TRUE(grads.ok()) << grads.status();
    }
    EXPECT_EQ(*s.client->Health(), "SERVING");
  }
}

TEST(Server, MetricsCountRpcsByMethodAndCode) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.metrics_port = 0;
  testing::LoopbackServer s = testing::StartLoopbackServer(options);
  ASSERT_NE(s.server, nullptr);
  ASSERT_GT(s.server->metrics_port(), 0);
  ASSERT_TRUE(s.client->CreateSession(client::DemoSessionRequest(3, 0.05f, true, 1e-2f)).ok());
  EXPECT_EQ(s.client->GetSession("ffffffffffffffff").status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<std::string> page = testing::HttpGet(s.server->metrics_port(), "/metrics");
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_THAT(*page, HasSubstr("HTTP/1.1 200 OK"));
  EXPECT_THAT(*page, HasSubstr("teserve_rpc_requests_total{code=\"OK\",method=\"CreateSession\"} 1"));
  EXPECT_THAT(*page,
              HasSubstr("teserve_rpc_requests_total{code=\"NOT_FOUND\",method=\"GetSession\"} 1"));
  EXPECT_THAT(*page, HasSubstr("teserve_rpc_duration_seconds_count{method=\"CreateSession\"} 1"));
  EXPECT_THAT(*page, HasSubstr("teserve_sessions 1"));
  absl::StatusOr<std::string> missing = testing::HttpGet(s.server->metrics_port(), "/nope");
  ASSERT_TRUE(missing.ok()) << missing.status();
  EXPECT_THAT(*missing, HasSubstr("404"));
}

TEST(Server, StartupErrorsAreStatuses) {
  server::ServerOptions options = testing::LoopbackOptions();
  options.device = "cuda:7";
  auto no_gpu = server::TeserveServer::Start(options);
  EXPECT_EQ(no_gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(no_gpu.status().message()), HasSubstr("--device=cuda:7"));
  options.device = "tpu";
  EXPECT_EQ(server::TeserveServer::Start(options).status().code(),
            absl::StatusCode::kInvalidArgument);
  options = testing::LoopbackOptions();
  options.max_sessions = 0;
  EXPECT_THAT(std::string(server::TeserveServer::Start(options).status().message()),
              HasSubstr("--max_sessions: expected at least 1, got 0"));
}

TEST(Server, SelectDevicePrefersTheGpuOnAuto) {
  kernels::DeviceInfo gpu;
  gpu.cuda_compiled = true;
  gpu.gpu_count = 1;
  gpu.device_name = "NVIDIA H200";
  gpu.cc_major = 9;
  auto picked = server::SelectDevice("auto", gpu);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->device.ToString(), "cuda:0");
  EXPECT_EQ(picked->description, "cuda:0 (NVIDIA H200, sm_90)");
  kernels::DeviceInfo none;
  none.no_gpu_reason = "no driver";
  picked = server::SelectDevice("auto", none);
  ASSERT_TRUE(picked.ok()) << picked.status();
  EXPECT_EQ(picked->device.ToString(), "cpu");
  EXPECT_EQ(server::SelectDevice("cuda:1", gpu).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(Server, ShutdownDrainsAndStopsServing) {
  testing::LoopbackServer s = testing::StartLoopbackServer();
  ASSERT_NE(s.server, nullptr);
  ASSERT_EQ(*s.client->Health(), "SERVING");
  s.server->Shutdown(absl::Seconds(1));
  s.server->Wait();
  client::ClientOptions quick;
  quick.rpc_timeout = absl::Seconds(2);
  client::Client late(s.address, quick);
  EXPECT_FALSE(late.Health().ok());
}

}  // namespace
}  // namespace teserve
