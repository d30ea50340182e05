// teserve: the gRPC training server. Flags are defined below (README.md describes them).
//
// Signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread (the mask is set before gRPC
// starts any) and received synchronously by main with sigwait, so shutdown work and the
// credential reload (SIGHUP) run in ordinary code, never inside a signal handler.
#include <pthread.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "kernels/attention.h"
#include "server/server.h"
#include "server/trainer_service.h"

ABSL_FLAG(std::string, host, "0.0.0.0", "address the gRPC server listens on");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "numeric address the /metrics endpoint listens on; loopback by default, so only "
          "local scrapers reach it (use 0.0.0.0 with --metrics_basic_auth_file for remote ones)");
ABSL_FLAG(bool, metrics_session_ids, false,
          "put session ids in the metrics' session label (default: a 16-hex-digit digest of the id)");
ABSL_FLAG(std::string, metrics_basic_auth_file, "",
          "file of \"user:password\" lines; set: /metrics needs HTTP basic auth with one of them");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the server; with --tls_key: gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle; set: clients must present a certificate it signed (mTLS)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "file of \"<token> <tenant>\" lines; set: every Trainer RPC needs 'authorization: Bearer "
          "<token>' and sees only its tenant's sessions; re-read on SIGHUP");
ABSL_FLAG(int64_t, max_sessions_per_tenant, 0, "most live sessions per tenant; 0 = --max_sessions");
ABSL_FLAG(int64_t, max_tokens_per_request, 65536,
          "most tokens (inputs[0] elements but the feature dims) in one Forward/ForwardBackward");
ABSL_FLAG(int64_t, max_attention_scores, int64_t{1} << 27,
          "most attention scores (batch x heads x seq_q x seq_kv) per attention layer and request");
ABSL_FLAG(int64_t, memory_budget_bytes, 0,
          "memory all sessions' admission estimates may add up to; 0 = the cgroup limit or MemTotal, "
          "-1 = no budget (the host's MemAvailable still applies)");
ABSL_FLAG(int64_t, admission_tokens, 8192,
          "tokens per request the CreateSession memory estimate assumes for activations");
ABSL_FLAG(int, compute_threads, 4,
          "training calls (Forward, Backward, ForwardBackward, Step, ZeroGrad) computing at once on the device; "
          "more wait in arrival order (gRPC's threads never wait on the device)");
ABSL_FLAG(absl::Duration, session_idle_timeout, absl::ZeroDuration(),
          "delete sessions no RPC has named for this long (e.g. 30m); 0 = never");
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
ABSL_FLAG(bool, allow_nondeterministic_attention, false,
          "let cuDNN's fused attention backward use its faster non-deterministic algorithm (dq summed with "
          "atomics); off: results repeat bit for bit, so a run restarted from a checkpoint reproduces its losses");
ABSL_FLAG(int64_t, max_sessions, 64, "most sessions alive at once");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{1} << 30,
          "largest gRPC message sent or received, in bytes");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "directory of the checkpoints (SaveCheckpoint, LoadCheckpoint, CreateSession from_checkpoint "
          "and checkpoint_every_steps); created when missing; empty = checkpoints off");
ABSL_FLAG(int, shutdown_grace_seconds, 10,
          "on SIGTERM, how long the stop may take: in-flight RPCs may run for all of it (with --checkpoint_dir, "
          "training calls for the first 40%; the rest is for final checkpoints), then the process exits 0");

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
  sigaddset(&stop_signals, SIGHUP);  // reload credentials
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  teserve::server::ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  options.metrics_detail = absl::GetFlag(FLAGS_metrics_detail);
  options.fp8_stats_interval = absl::GetFlag(FLAGS_fp8_stats_interval);
  options.kernel_timing_interval = absl::GetFlag(FLAGS_kernel_timing_interval);
  options.device = absl::GetFlag(FLAGS_device);
  teserve::kernels::AllowNondeterministicAttention(absl::GetFlag(FLAGS_allow_nondeterministic_attention));
  options.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.metrics_host = absl::GetFlag(FLAGS_metrics_host);
  options.metrics_session_ids = absl::GetFlag(FLAGS_metrics_session_ids);
  options.metrics_basic_auth_file = absl::GetFlag(FLAGS_metrics_basic_auth_file);
  options.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.max_sessions_per_tenant = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  options.max_tokens_per_request = absl::GetFlag(FLAGS_max_tokens_per_request);
  options.max_attention_scores = absl::GetFlag(FLAGS_max_attention_scores);
  options.memory_budget_bytes = absl::GetFlag(FLAGS_memory_budget_bytes);
  options.admission_tokens = absl::GetFlag(FLAGS_admission_tokens);
  options.compute_threads = absl::GetFlag(FLAGS_compute_threads);
  options.session_idle_timeout = absl::GetFlag(FLAGS_session_idle_timeout);
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
  Log(absl::StrFormat("gRPC listening on %s:%d (%s)", options.host, (*server)->port(),
                      (*server)->mtls_enabled() ? "TLS, client certificates required"
                      : (*server)->tls_enabled() ? "TLS" : "plaintext"));
  if ((*server)->auth_enabled()) {
    Log(absl::StrFormat("bearer tokens required (--auth_tokens_file %s; SIGHUP reloads it)",
                        options.auth_tokens_file));
    if (!(*server)->tls_enabled()) {
      Log("warning: bearer tokens without --tls_cert travel in plaintext; use TLS off loopback");
    }
  } else {
    Log("no --auth_tokens_file: every caller can use every session");
  }
  if ((*server)->metrics_port() >= 0) {
    Log(absl::StrFormat("metrics on http://%s:%d/metrics%s", options.metrics_host,
                        (*server)->metrics_port(),
                        options.metrics_basic_auth_file.empty() ? "" : " (basic auth)"));
    Log(absl::StrFormat("metrics detail %s, FP8 health every %d steps, kernel timing every %d calls",
                        options.metrics_detail, options.fp8_stats_interval,
                        options.kernel_timing_interval));
  } else {
    Log("metrics endpoint off (--metrics_port=-1)");
  }

  int signal_number = 0;
  for (;;) {
    if (sigwait(&stop_signals, &signal_number) != 0) signal_number = SIGTERM;
    if (signal_number != SIGHUP) break;
    const absl::Status reloaded = (*server)->ReloadCredentials();
    Log(reloaded.ok() ? std::string("SIGHUP: credentials reloaded")
                      : absl::StrFormat("SIGHUP: reload failed, keeping the credentials loaded before: %s",
                                        reloaded.ToString()));
  }
  const int grace = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  // The CPU backend computes on gRPC's threads and stops only between layers; past the
  // grace period (plus a margin for cancelled calls to unwind) the process exits anyway,
  // so a stop never hangs on one long layer or a slow checkpoint write (writes are
  // atomic: an interrupted one leaves no checkpoint behind, and the periodic ones stay).
  std::thread([grace] {
    absl::SleepFor(absl::Seconds(grace) + absl::Seconds(2));
    Log("in-flight work outlived the grace period; exiting now");
    std::_Exit(0);
  }).detach();
  const char* signal_name = signal_number == SIGINT ? "SIGINT" : "SIGTERM";
  if (options.checkpoint_dir.empty()) {
    Log(absl::StrFormat("received %s; shutting down (in-flight RPCs get %ds)", signal_name, grace));
  } else {
    Log(absl::StrFormat("received %s; shutting down (in-flight RPCs get %.1fs, final checkpoints of the sessions "
                        "configured to checkpoint until %ds)",
                        signal_name, grace * teserve::server::kCallShareOfGrace, grace));
  }
  const absl::Time signalled = absl::Now();
  (*server)->Shutdown(absl::Seconds(grace));
  (*server)->Wait();
  Log(absl::StrFormat("shutdown complete, %.2fs after %s", absl::ToDoubleSeconds(absl::Now() - signalled),
                      signal_name));
  // The process ends here without destroying the server: its sessions' memory goes back
  // with the process (the driver releases device memory in one step), while destroying
  // them would free a deep model's ~10^5 device tensors one by one, past the grace period;
  // and no exit-time destructor can then race the server's own threads. Everything that
  // must outlive the process (checkpoints, fsynced; the log, flushed) is written by now.
  std::fflush(stdout);
  std::fflush(stderr);
  std::_Exit(0);
}
