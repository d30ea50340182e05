// teserve_cli: talk to a teserve server from the shell.
//
//   teserve_cli health      [--server=ADDR]
//   teserve_cli demo        [--server=ADDR] [--model=M] [--steps=N] [--seed=S] [--recipe=R]
//   teserve_cli quant-state SESSION [--server=ADDR]
//   teserve_cli fp8-health  SESSION [--server=ADDR] [--watch] [--interval=2s]
//   teserve_cli server-info [--server=ADDR]
//
// Exit codes: 0 success, 1 the server or the call failed, 2 bad usage.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "client/demo.h"
#include "client/fp8_health.h"
#include "client/transformer_demo.h"

ABSL_FLAG(std::string, server, "localhost:50051", "teserve address, host:port");
ABSL_FLAG(std::string, token, "", "bearer token for servers with --auth_tokens_file");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA bundle that signed the server's certificate; set: TLS");
ABSL_FLAG(std::string, tls_cert, "", "PEM client certificate (mTLS); set: TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_server_name, "",
          "TLS: the name checked against the server's certificate instead of --server's host "
          "(a probe connecting to localhost checks the certificate's DNS name)");
ABSL_FLAG(std::optional<int>, steps, std::nullopt,
          "demo: training steps (default 200 for mlp, 400 for transformer)");
ABSL_FLAG(uint64_t, seed, 1, "demo: seed for parameters and data");
ABSL_FLAG(std::string, recipe, "delayed",
          "demo: the trained model's recipe: delayed, current, mxfp8, block or nvfp4");
ABSL_FLAG(std::string, params_dtype, "float32",
          "demo: LayerSpec.params_dtype of the trained model (float32, bfloat16, float16)");
ABSL_FLAG(std::string, model, "mlp",
          "demo: mlp (LayerNorm/Linear student of a teacher) or transformer (2 TransformerLayers "
          "reversing token sequences)");
ABSL_FLAG(bool, watch, false, "fp8-health: redraw the table every --interval until interrupted");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(2), "fp8-health --watch: time between redraws");

namespace {

constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: teserve_cli <command> [flags]\n"
    "  health                  health check (grpc.health.v1); exit 0 when SERVING\n"
    "  demo [--model=mlp|transformer] [--steps=N] [--seed=S]\n"
    "       [--recipe=delayed|current|mxfp8|block|nvfp4]\n"
    "                          train a small low-precision stack remotely (default recipe\n"
    "                          delayed), print the loss per step and the final table of\n"
    "                          recipe, format, scaling mode, amax, scales per tensor;\n"
    "                          mlp (default): LayerNorm/Linear student of a fixed teacher;\n"
    "                          transformer: 2 TransformerLayers + Linear head learn to\n"
    "                          reverse token sequences (cross entropy), then print the\n"
    "                          token accuracy on fresh sequences\n"
    "  quant-state SESSION     recipe, format, mode, execution, amax, scale, scale_inv,\n"
    "                          block scale_inv min/max/mean, FP8 health stats and amax\n"
    "                          history per quantized tensor\n"
    "  fp8-health SESSION [--watch] [--interval=2s]\n"
    "                          per layer and tensor: format, amax, amax window max, scale,\n"
    "                          underflow %, overflow %, MSE (latest sampled health stats)\n"
    "                          and emulated/native execution; --watch redraws the table\n"
    "                          every --interval until interrupted\n"
    "  server-info             version, device, library versions, recipe availability\n"
    "common flags: --server=HOST:PORT (default localhost:50051)";

int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "teserve_cli: " << what << ": " << status.ToString() << "\n";
  return kExitFailure;
}

int Usage(const std::string& problem) {
  std::cerr << "teserve_cli: " << problem << "\n" << kUsage << "\n";
  return kExitUsage;
}

int Health(teserve::client::Client& client) {
  absl::StatusOr<std::string> status = client.Health();
  if (!status.ok()) return Fail("health", status.status());
  std::cout << *status << "\n";
  return *status == "SERVING" ? 0 : kExitFailure;
}

int TransformerDemo(teserve::client::Client& client) {
  teserve::client::TransformerDemoOptions options;
  options.steps = absl::GetFlag(FLAGS_steps).value_or(options.steps);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.recipe = absl::GetFlag(FLAGS_recipe);
  options.params_dtype = *teserve::client::ParseParamsDType(absl::GetFlag(FLAGS_params_dtype));  // Demo checked it
  options.log = &std::cout;
  absl::StatusOr<teserve::client::TransformerDemoResult> result =
      teserve::client::RunTransformerDemo(client, options);
  if (!result.ok()) return Fail("demo", result.status());
  const float first = result->losses.front();
  const float last = result->losses.back();
  std::cout << absl::StrFormat(
      "model transformer, recipe %s: loss %.6g -> %.6g (%.1fx lower) in %d steps\n", options.recipe, first,
      last, last > 0 ? first / last : 0.0f, options.steps);
  std::cout << absl::StrFormat("token accuracy %.4f on %d fresh tokens (chance %.4f)\n", result->accuracy,
                               result->eval_tokens, 1.0 / options.vocab);
  std::cout << teserve::client::FormatQuantizationTable(result->quantization);
  return 0;
}

int Demo(teserve::client::Client& client) {
  const std::string model = absl::GetFlag(FLAGS_model);
  if (model != "mlp" && model != "transformer") {
    return Usage(absl::StrFormat("--model: expected mlp or transformer, got '%s'", model));
  }
  teserve::client::DemoOptions options;
  options.steps = absl::GetFlag(FLAGS_steps).value_or(options.steps);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.recipe = absl::GetFlag(FLAGS_recipe);
  options.log = &std::cout;
  const std::vector<std::string>& recipes = teserve::client::DemoRecipeNames();
  if (std::find(recipes.begin(), recipes.end(), options.recipe) == recipes.end()) {
    return Usage(absl::StrFormat("--recipe: expected one of %s, got '%s'",
                                 absl::StrJoin(recipes, ", "), options.recipe));
  }
  if (options.steps < 1) return Usage(absl::StrFormat("--steps: expected >= 1, got %d", options.steps));
  const absl::StatusOr<teserve::v1::DType> params_dtype =
      teserve::client::ParseParamsDType(absl::GetFlag(FLAGS_params_dtype));
  if (!params_dtype.ok()) return Usage(std::string(params_dtype.status().message()));
  options.params_dtype = *params_dtype;
  if (model == "transformer") return TransformerDemo(client);
  absl::StatusOr<teserve::client::DemoResult> result = teserve::client::RunDemo(client, options);
  if (!result.ok()) return Fail("demo", result.status());
  const float first = result->losses.front();
  const float last = result->losses.back();
  std::cout << absl::StrFormat("recipe %s: loss %.6g -> %.6g (%.1fx lower) in %d steps\n",
                               options.recipe, first, last, last > 0 ? first / last : 0.0f,
                               options.steps);
  std::cout << teserve::client::FormatQuantizationTable(result->quantization);
  return 0;
}

int QuantState(teserve::client::Client& client, const std::string& session_id) {
  absl::StatusOr<teserve::v1::QuantizationState> state =
      client.GetQuantizationState(session_id);
  if (!state.ok()) return Fail("quant-state", state.status());
  std::cout << absl::StrFormat("session %s at step %d\n", state->session_id(), state->step());
  std::cout << teserve::client::FormatQuantizationTable(*state);
  for (const auto& t : state->tensors()) {
    if (t.amax_history().empty()) continue;
    std::cout << absl::StrFormat("%s.%s amax_history (newest first): %s\n", t.layer(),
                                 t.tensor(), absl::StrJoin(t.amax_history(), " "));
  }
  return 0;
}

int Fp8Health(teserve::client::Client& client, const std::string& session_id) {
  const bool watch = absl::GetFlag(FLAGS_watch);
  const absl::Duration interval = absl::GetFlag(FLAGS_interval);
  if (watch && interval <= absl::ZeroDuration()) {
    return Usage(absl::StrFormat("--interval: expected a positive duration, got %s",
                                 absl::FormatDuration(interval)));
  }
  const bool terminal = isatty(STDOUT_FILENO) == 1;
  for (;;) {
    absl::StatusOr<teserve::v1::QuantizationState> state = client.GetQuantizationState(session_id);
    if (!state.ok()) return Fail("fp8-health", state.status());
    // On a terminal each redraw replaces the previous table; piped, tables follow each other.
    if (watch && terminal) std::cout << "\x1b[H\x1b[2J";
    if (watch) std::cout << absl::FormatTime("%Y-%m-%d %H:%M:%S\n", absl::Now(), absl::LocalTimeZone());
    std::cout << teserve::client::FormatFp8HealthTable(*state) << std::flush;
    if (!watch) return 0;
    absl::SleepFor(interval);
  }
}

int ServerInfo(teserve::client::Client& client) {
  absl::StatusOr<teserve::v1::ServerInfo> info = client.GetServerInfo();
  if (!info.ok()) return Fail("server-info", info.status());
  std::cout << info->DebugString();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) return Usage("missing command");
  const std::string command = args[1];
  const size_t operands = args.size() - 2;

  teserve::client::ClientOptions options;
  options.token = absl::GetFlag(FLAGS_token);
  options.tls_server_name = absl::GetFlag(FLAGS_tls_server_name);
  const absl::Status tls = teserve::client::LoadTlsFiles(absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                                                        absl::GetFlag(FLAGS_tls_key), &options);
  if (!tls.ok()) return Usage(std::string(tls.message()));
  teserve::client::Client client(absl::GetFlag(FLAGS_server), options);
  if (command == "health" && operands == 0) return Health(client);
  if (command == "demo" && operands == 0) return Demo(client);
  if (command == "server-info" && operands == 0) return ServerInfo(client);
  if (command == "quant-state") {
    if (operands != 1) return Usage("quant-state: expected one SESSION id");
    return QuantState(client, args[2]);
  }
  if (command == "fp8-health") {
    if (operands != 1) return Usage("fp8-health: expected one SESSION id");
    return Fp8Health(client, args[2]);
  }
  if (command == "health" || command == "demo" || command == "server-info") {
    return Usage(command + ": takes no positional arguments");
  }
  return Usage("unknown command '" + command + "'");
}
