// teserve: the gRPC training server. Flags are defined below (README.md describes them).
//
// Signals: SIGTERM and SIGINT are blocked in every thread (the mask is set before gRPC
// starts any) and received synchronously by main with sigwait, so shutdown work runs in
// ordinary code, never inside a signal handler.
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "server/server.h"
#include "server/trainer_service.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "address to listen on (gRPC and metrics)");
ABSL_FLAG(int, port, 50051, "gRPC port; 0 picks a free one");
ABSL_FLAG(int, metrics_port, 9464, "Prometheus /metrics port; 0 picks a free one, -1 = off");
ABSL_FLAG(std::string, metrics_detail, "tensor",
          "tensor | layer | session | off: per-tensor FP8 series, per-layer maxima, "
          "session series only, or only RPC and session-count series");
ABSL_FLAG(int64_t, fp8_stats_interval, 10,
          "measure FP8 underflow/overflow/MSE in every Nth training step; 0 = never");
ABSL_FLAG(int64_t, kernel_timing_interval, 16,
          "time every Nth call of each kernel op for teserve_kernel_duration_seconds; 0 = never");
ABSL_FLAG(std::string, device, "auto", "auto | cpu | cuda | cuda:N");
ABSL_FLAG(int64_t, max_sessions, 64, "most sessions alive at once");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "largest gRPC message sent or received, in bytes");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory of the checkpoints (SaveCheckpoint, LoadCheckpoint, CreateSession from_checkpoint "
          "and checkpoint_every_steps); created when missing; empty = checkpoints off");
ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "on SIGTERM, how long in-flight RPCs may run before they are cancelled");

namespace {

void Log(const std::string& line) {
  absl::FPrintF(stderr, "[teserve] %s\n", line);
  std::fflush(stderr);
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("teserve: gRPC server for Transformer-Engine-style layers");
  absl::ParseCommandLine(argc, argv);

  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  teserve::server::ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_detail = absl::GetFlag(FLAGS_metrics_detail);
  options.fp8_stats_interval = absl::GetFlag(FLAGS_fp8_stats_interval);
  options.kernel_timing_interval = absl::GetFlag(FLAGS_kernel_timing_interval);
  options.device = absl::GetFlag(FLAGS_device);
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);

  Log(absl::StrFormat("teserve %s starting", teserve::server::kTeserveVersion));
  auto server = teserve::server::TeserveServer::Start(options);
  if (!server.ok()) {
    Log(absl::StrFormat("startup failed: %s", server.status().ToString()));
    return 1;
  }
  Log(absl::StrFormat("device %s", (*server)->device().description));
  if (!(*server)->device_note().empty()) Log((*server)->device_note());
  Log(options.checkpoint_dir.empty() ? std::string("checkpoints off (no --checkpoint_dir)")
                                     : absl::StrFormat("checkpoints in %s", options.checkpoint_dir));
  Log(absl::StrFormat("gRPC listening on %s:%d", options.host, (*server)->port()));
  if ((*server)->metrics_port() >= 0) {
    Log(absl::StrFormat("metrics on http://%s:%d/metrics", options.host,
                        (*server)->metrics_port()));
    Log(absl::StrFormat("metrics detail %s, FP8 health every %d steps, kernel timing every %d calls",
                        options.metrics_detail, options.fp8_stats_interval,
                        options.kernel_timing_interval));
  } else {
    Log("metrics endpoint off (--metrics_port=-1)");
  }

  int signal_number = 0;
  if (sigwait(&stop_signals, &signal_number) != 0) signal_number = SIGTERM;
  const int grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  Log(absl::StrFormat("received %s; shutting down (in-flight RPCs get %ds)",
                      signal_number == SIGINT ? "SIGINT" : "SIGTERM", grace));
  (*server)->Shutdown(absl::Seconds(grace));
  (*server)->Wait();
  server->reset();
  Log("shutdown complete");
  return 0;
}
