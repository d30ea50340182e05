// Security of the shipped binary (issue 25): TLS and mTLS with certificates made by
// openssl at test time, bearer tokens mapping to tenants (reloaded on SIGHUP), tenant
// isolation of sessions on every RPC, health open to probes, /metrics behind basic auth
// and without session ids in its labels, and no token in logs or metrics.
#include <signal.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/demo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/http_get.h"
#include "tests/integration/server_process.h"

namespace teserve {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::RunCommand;
using testing::ServerProcess;
using testing::TempPath;
using testing::WriteWholeFile;

constexpr char kAliceToken[] = "alice-token-0123456789abcdef";
constexpr char kBobToken[] = "bob-token-0123456789abcdef00";
constexpr char kCarolToken[] = "carol-token-0123456789abcdef";

struct Pki {
  std::string dir, ca, server_cert, server_key, client_cert, client_key, rogue_cert, rogue_key;
};

// A CA, a server certificate for 127.0.0.1/localhost and a client certificate signed by
// it, and a client certificate from an unrelated CA; EC P-256 keys (fast to make).
Pki MakePki() {
  Pki p;
  p.dir = TempPath("pki");
  const std::string d = p.dir;
  const std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  const std::string script = absl::StrCat(
      "set -e; rm -rf ", d, "; mkdir -p ", d, "; cd ", d, "; ",
      "openssl req -x509 ", key, " -keyout ca.key -out ca.pem -days 2 -subj /CN=teserve-test-ca "
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; ",
      "openssl req -x509 ", key, " -keyout rogue-ca.key -out rogue-ca.pem -days 2 -subj /CN=rogue-ca "
      "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; ",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\nextendedKeyUsage=serverAuth\\n' > server.ext; ",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; ",
      "openssl req ", key, " -keyout server.key -out server.csr -subj /CN=localhost; ",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 "
      "-extfile server.ext; ",
      "openssl req ", key, " -keyout client.key -out client.csr -subj /CN=trainer-client; ",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2 "
      "-extfile client.ext; ",
      "openssl req ", key, " -keyout rogue.key -out rogue.csr -subj /CN=rogue-client; ",
      "openssl x509 -req -in rogue.csr -CA rogue-ca.pem -CAkey rogue-ca.key -CAcreateserial -out rogue.pem "
      "-days 2 -extfile client.ext");
  testing::CommandResult made = RunCommand(absl::StrCat("sh -c \"", script, "\""));
  EXPECT_EQ(made.exit_code, 0) << made.output;
  p.ca = d + "/ca.pem";
  p.server_cert = d + "/server.pem";
  p.server_key = d + "/server.key";
  p.client_cert = d + "/client.pem";
  p.client_key = d + "/client.key";
  p.rogue_cert = d + "/rogue.pem";
  p.rogue_key = d + "/rogue.key";
  return p;
}

client::ClientOptions TlsOptions(const Pki& pki, const std::string& token, bool client_cert = true) {
  client::ClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  options.token = token;
  absl::Status loaded = client::LoadTlsFiles(pki.ca, client_cert ? pki.client_cert : "",
                                             client_cert ? pki.client_key : "", &options);
  EXPECT_TRUE(loaded.ok()) << loaded;
  return options;
}

std::string TokensFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  WriteWholeFile(path, text);
  return path;
}

v1::ForwardRequest ForwardOf(const std::string& id) {
  v1::ForwardRequest forward;
  forward.set_session_id(id);
  *forward.add_inputs() = client::MakeFloatTensor(std::vector<float>(4 * 32, 0.5f), {4, 32});
  return forward;
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pki_ = new Pki(MakePki()); }
  static void TearDownTestSuite() { delete pki_; }
  static Pki* pki_;
};
Pki* SecurityTest::pki_ = nullptr;

TEST_F(SecurityTest, MutualTlsTokensTenantsMetricsAndSighupReload) {
  const Pki& pki = *pki_;
  const std::string tokens = TokensFile(
      "tokens.txt", absl::StrCat("# token tenant\n", kAliceToken, " alice\n\n", kBobToken, " bob\n"));
  const std::string basic = TokensFile("metrics_users.txt", "prometheus:scrape-secret\n");
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key, "--tls_ca=" + pki.ca,
                            "--auth_tokens_file=" + tokens, "--metrics_port=0",
                            "--metrics_basic_auth_file=" + basic, "--shutdown_grace_seconds=3"},
                           TempPath("mtls.log")))
      << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("(TLS, client certificates required)"));
  ASSERT_GT(server.metrics_port(), 0) << server.Log();

  client::Client anonymous(server.address(), TlsOptions(pki, ""));
  client::Client wrong(server.address(), TlsOptions(pki, "not-a-valid-token-at-all-xyz"));
  client::Client alice(server.address(), TlsOptions(pki, kAliceToken));
  client::Client bob(server.address(), TlsOptions(pki, kBobToken));

  // Health stays open for probes; everything on Trainer needs a token.
  absl::StatusOr<std::string> health = anonymous.Health();
  ASSERT_TRUE(health.ok()) << health.status();
  EXPECT_EQ(*health, "SERVING");
  absl::StatusOr<v1::ServerInfo> info = anonymous.GetServerInfo();
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnauthenticated) << info.status();
  EXPECT_THAT(std::string(info.status().message()), HasSubstr("authorization"));
  absl::StatusOr<v1::ListSessionsResponse> listed = wrong.ListSessions();
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnauthenticated) << listed.status();
  EXPECT_THAT(std::string(listed.status().message()), Not(HasSubstr("not-a-valid-token")));
  EXPECT_EQ(wrong.CreateSession(client::DemoSessionRequest(1, 0.05f, true, 1e-2f)).status().code(),
            absl::StatusCode::kUnauthenticated);

  // Sessions belong to a tenant.
  absl::StatusOr<v1::CreateSessionResponse> created = alice.CreateSession(client::DemoSessionRequest(1, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  const std::string id = created->session_id();
  absl::StatusOr<v1::ForwardResponse> own = alice.Forward(ForwardOf(id));
  ASSERT_TRUE(own.ok()) << own.status();

  // Another tenant's calls read exactly like an unknown id: NOT_FOUND on every RPC.
  const std::string unknown_message = std::string(bob.GetSession("0123456789abcdef0123456789abcdef").status().message());
  const auto not_found = [&](const absl::Status& status, const std::string& rpc) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << rpc << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("session_id: no session")) << rpc;
  };
  not_found(bob.GetSession(id).status(), "GetSession");
  not_found(bob.Forward(ForwardOf(id)).status(), "Forward");
  v1::BackwardRequest backward;
  backward.set_session_id(id);
  backward.set_handle(own->handle());
  not_found(bob.Backward(backward).status(), "Backward");
  v1::ForwardBackwardRequest fb;
  fb.set_session_id(id);
  not_found(bob.ForwardBackward(fb).status(), "ForwardBackward");
  not_found(bob.Step(id).status(), "Step");
  not_found(bob.ZeroGrad(id), "ZeroGrad");
  v1::GetParametersRequest get;
  get.set_session_id(id);
  not_found(bob.GetParameters(get).status(), "GetParameters");
  v1::SetParametersRequest set;
  set.set_session_id(id);
  not_found(bob.SetParameters(set), "SetParameters");
  not_found(bob.GetQuantizationState(id).status(), "GetQuantizationState");
  not_found(bob.DeleteSession(id), "DeleteSession");
  absl::StatusOr<v1::ListSessionsResponse> bobs = bob.ListSessions();
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_EQ(bobs->sessions_size(), 0);
  absl::StatusOr<v1::ListSessionsResponse> alices = alice.ListSessions();
  ASSERT_TRUE(alices.ok()) << alices.status();
  ASSERT_EQ(alices->sessions_size(), 1);
  EXPECT_EQ(alices->sessions(0).session_id(), id);
  // Bob's attempts changed nothing: Alice's pending handle is still hers to use.
  backward.clear_grad_outputs();
  *backward.add_grad_outputs() = client::MakeFloatTensor(std::vector<float>(4 * 32, 0.1f), {4, 32});
  EXPECT_TRUE(alice.Backward(backward).ok());

  // Transport: plaintext, TLS without a client certificate, and a certificate from
  // another CA are all refused by the handshake.
  client::Client plaintext(server.address(), [] {
    client::ClientOptions o;
    o.rpc_timeout = absl::Seconds(5);
    o.token = kAliceToken;
    return o;
  }());
  EXPECT_EQ(plaintext.ListSessions().status().code(), absl::StatusCode::kUnavailable);
  client::Client no_cert(server.address(), TlsOptions(pki, kAliceToken, /*client_cert=*/false));
  EXPECT_EQ(no_cert.ListSessions().status().code(), absl::StatusCode::kUnavailable);
  client::ClientOptions rogue_options;
  rogue_options.rpc_timeout = absl::Seconds(5);
  rogue_options.token = kAliceToken;
  ASSERT_TRUE(client::LoadTlsFiles(pki.ca, pki.rogue_cert, pki.rogue_key, &rogue_options).ok());
  client::Client rogue(server.address(), rogue_options);
  EXPECT_EQ(rogue.ListSessions().status().code(), absl::StatusCode::kUnavailable);

  // /metrics: basic auth, and the session label is not the id.
  const int metrics_port = server.metrics_port();
  absl::StatusOr<std::string> open = testing::HttpGet(metrics_port, "/metrics");
  ASSERT_TRUE(open.ok()) << open.status();
  EXPECT_THAT(*open, HasSubstr("401 Unauthorized"));
  EXPECT_THAT(*open, HasSubstr("WWW-Authenticate: Basic"));
  absl::StatusOr<std::string> bad = testing::HttpGet(
      metrics_port, "/metrics", absl::StrCat("Authorization: Basic ", absl::Base64Escape("prometheus:wrong"), "\r\n"));
  ASSERT_TRUE(bad.ok());
  EXPECT_THAT(*bad, HasSubstr("401 Unauthorized"));
  absl::StatusOr<std::string> scraped = testing::HttpGet(
      metrics_port, "/metrics",
      absl::StrCat("Authorization: Basic ", absl::Base64Escape("prometheus:scrape-secret"), "\r\n"));
  ASSERT_TRUE(scraped.ok());
  EXPECT_THAT(*scraped, HasSubstr("200 OK"));
  EXPECT_THAT(*scraped, HasSubstr("teserve_train_steps_total{session=\""));
  EXPECT_THAT(*scraped, Not(HasSubstr(id)));
  EXPECT_THAT(*scraped, ::testing::ContainsRegex("session=\"[0-9a-f]{16}\""));
  EXPECT_THAT(*scraped, Not(HasSubstr(kAliceToken)));

  // SIGHUP reloads the tokens: Bob's token is revoked, Carol's added, Alice keeps her
  // sessions.
  WriteWholeFile(tokens, absl::StrCat(kAliceToken, " alice\n", kCarolToken, " carol\n"));
  server.Signal(SIGHUP);
  ASSERT_TRUE(server.WaitForLog("SIGHUP: credentials reloaded", absl::Seconds(10))) << server.Log();
  client::Client carol(server.address(), TlsOptions(pki, kCarolToken));
  absl::StatusOr<v1::ListSessionsResponse> carols = carol.ListSessions();
  ASSERT_TRUE(carols.ok()) << carols.status();
  EXPECT_EQ(carols->sessions_size(), 0);
  EXPECT_EQ(bob.ListSessions().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(alice.GetSession(id).ok());
  // A broken file keeps the tokens in force and says why (without the token).
  WriteWholeFile(tokens, absl::StrCat(kAliceToken, " alice\nshort carol\n"));
  server.Signal(SIGHUP);
  ASSERT_TRUE(server.WaitForLog("SIGHUP: reload failed", absl::Seconds(10))) << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr(":2: expected a token of 16..4096"));
  EXPECT_TRUE(carol.ListSessions().ok());

  server.Signal(SIGTERM);
  EXPECT_EQ(server.WaitExit(absl::Seconds(20)), 0) << server.Log();
  const std::string log = server.Log();
  for (const char* token : {kAliceToken, kBobToken, kCarolToken}) EXPECT_THAT(log, Not(HasSubstr(token)));
  EXPECT_THAT(log, Not(HasSubstr("scrape-secret")));
}

TEST_F(SecurityTest, TlsWithoutClientCertificatesAndTheCliFlags) {
  const Pki& pki = *pki_;
  const std::string tokens = TokensFile("tokens2.txt", absl::StrCat(kAliceToken, " alice\n"));
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--tls_cert=" + pki.server_cert, "--tls_key=" + pki.server_key,
                            "--auth_tokens_file=" + tokens},
                           TempPath("tls.log")))
      << server.Log();
  EXPECT_THAT(server.Log(), HasSubstr("(TLS)"));
  client::Client alice(server.address(), TlsOptions(pki, kAliceToken, /*client_cert=*/false));
  EXPECT_TRUE(alice.ListSessions().ok());

  const std::string cli = testing::Runfile("client/teserve_cli");
  const std::string common = absl::StrCat(cli, " --server=", server.address(), " --tls_ca=", pki.ca);
  testing::CommandResult info = RunCommand(absl::StrCat(common, " --token=", kAliceToken, " server-info"));
  EXPECT_EQ(info.exit_code, 0) << info.output;
  testing::CommandResult refused = RunCommand(absl::StrCat(common, " server-info"));
  EXPECT_NE(refused.exit_code, 0) << refused.output;
  EXPECT_THAT(refused.output, HasSubstr("UNAUTHENTICATED"));
  testing::CommandResult health = RunCommand(absl::StrCat(common, " health"));
  EXPECT_EQ(health.exit_code, 0) << health.output;
  EXPECT_THAT(health.output, HasSubstr("SERVING"));
  // The Kubernetes exec probe's form (deploy/k8s/components/tls-auth): the name checked
  // against the certificate is given, not taken from --server's host.
  testing::CommandResult named = RunCommand(absl::StrCat(common, " --tls_server_name=localhost health"));
  EXPECT_EQ(named.exit_code, 0) << named.output;
  testing::CommandResult misnamed = RunCommand(absl::StrCat(common, " --tls_server_name=teserve.teserve.svc health"));
  EXPECT_NE(misnamed.exit_code, 0) << misnamed.output;
}

TEST_F(SecurityTest, BadSecurityFlagsStopStartupNamingTheFlag) {
  const Pki& pki = *pki_;
  struct Case {
    std::vector<std::string> flags;
    std::string message;
  };
  const std::string short_token = TokensFile("short.txt", "abc alice\n");
  const std::string bad_tenant = TokensFile("tenant.txt", absl::StrCat(kAliceToken, " al/ice\n"));
  const std::string empty = TokensFile("empty.txt", "# nobody\n");
  const std::vector<Case> cases = {
      {{"--tls_cert=" + pki.server_cert}, "--tls_cert, --tls_key: expected both or neither"},
      {{"--tls_ca=" + pki.ca}, "--tls_ca: expected --tls_cert and --tls_key too"},
      {{"--tls_cert=/nonexistent/cert.pem", "--tls_key=" + pki.server_key}, "--tls_cert: cannot read"},
      {{"--auth_tokens_file=/nonexistent/tokens"}, "--auth_tokens_file: cannot read"},
      {{"--auth_tokens_file=" + short_token}, ":1: expected a token of 16..4096 printable ASCII"},
      {{"--auth_tokens_file=" + bad_tenant}, ":1: expected a tenant of 1..64 characters"},
      {{"--auth_tokens_file=" + empty}, "expected at least one \"<token> <tenant>\" line"},
      {{"--metrics_basic_auth_file=" + empty}, "--metrics_basic_auth_file"},
  };
  for (const Case& c : cases) {
    ServerProcess server;
    EXPECT_FALSE(server.Start(c.flags, TempPath("bad.log")));
    EXPECT_EQ(server.WaitExit(absl::Seconds(10)), 1);
    EXPECT_THAT(server.Log(), HasSubstr(c.message));
    EXPECT_THAT(server.Log(), Not(HasSubstr(kAliceToken)));
  }
}

TEST_F(SecurityTest, MetricsBindLoopbackByDefaultAndIdsOnlyWhenAsked) {
  ServerProcess server;
  ASSERT_TRUE(server.Start({"--metrics_port=0", "--metrics_session_ids"}, TempPath("ids.log"))) << server.Log();
  EXPECT_THAT(server.Log(), ::testing::ContainsRegex("metrics on http://127\\.0\\.0\\.1:[0-9]+/metrics"));
  client::ClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  client::Client c(server.address(), options);
  absl::StatusOr<v1::CreateSessionResponse> created = c.CreateSession(client::DemoSessionRequest(1, 0.05f, true, 1e-2f));
  ASSERT_TRUE(created.ok()) << created.status();
  absl::StatusOr<std::string> scraped = testing::HttpGet(server.metrics_port(), "/metrics");
  ASSERT_TRUE(scraped.ok());
  EXPECT_THAT(*scraped, HasSubstr(absl::StrCat("session=\"", created->session_id(), "\"")));
  EXPECT_THAT(server.Log(), HasSubstr("no --auth_tokens_file"));
}

}  // namespace
}  // namespace teserve
