// caliper-server: flags, signals and the process lifetime. Everything else is in
// caliper_server_lib.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/tensor/reduction_backend.h"
#include "server/caliper_server.h"
#include "server/postgres/postgres_store.h"
#include "server/device.h"
#include "server/event_log.h"
#include "server/security.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address HOST:PORT (port 0: any free port)");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0:9464",
          "Prometheus /metrics address HOST:PORT; empty disables it");
ABSL_FLAG(std::string, device, "auto", "Reduction backend: auto, cpu or cuda");
ABSL_FLAG(int64_t, max_message_bytes, int64_t{64} << 20,
          "Largest tensor chunk accepted; larger ones end the stream with RESOURCE_EXHAUSTED");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "On SIGTERM/SIGINT, how long in-flight streams may run before they are cancelled");
ABSL_FLAG(std::string, log_format, "text", "Log lines as text or json");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate chain of the server; enables TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of the server (with --tls_cert)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle; when set, clients must present a certificate it signed (mutual TLS)");
ABSL_FLAG(std::string, tokens_file, "",
          "File of 'tenant token' lines; each call then needs 'authorization: Bearer <token>' and "
          "sees only its tenant's sessions. Empty: one anonymous tenant");
ABSL_FLAG(bool, allow_plaintext_tokens, false,
          "Accept --tokens_file without TLS (tokens travel in clear text: loopback/tests only)");
ABSL_FLAG(int, max_sessions_per_tenant, 0, "Sessions a tenant may hold at once; 0: unbounded");
ABSL_FLAG(int, max_concurrent_streams, 0, "Observe streams open at once; 0: unbounded");
ABSL_FLAG(int, max_modules_per_session, 0,
          "Distinct NVFP4 modules a session may track; 0: unbounded (layers are bounded by the "
          "model)");
ABSL_FLAG(absl::Duration, stream_idle_timeout, absl::ZeroDuration(),
          "Cancel an Observe stream that sends nothing for this long (accepted chunks stay); 0: "
          "never");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for durable session state (one file per session, restored at start-up); "
          "empty: sessions live in memory only");
ABSL_FLAG(absl::Duration, state_flush_interval, absl::Seconds(1),
          "Longest time between writes of a changed session's state (stream ends, "
          "CreateSession and Finalize also wait for a write)");
ABSL_FLAG(std::string, state_store, "",
          "Shared session state for any number of replicas: a PostgreSQL libpq URI "
          "(postgresql://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full; also from "
          "$CALIPER_STATE_STORE). Exclusive with --state_dir");
ABSL_FLAG(int, state_store_pool, 8, "Database connections at most (per replica)");
ABSL_FLAG(std::string, state_store_import, "",
          "A --state_dir directory whose sessions are imported into --state_store at start-up "
          "(sessions already there are left alone)");

// --help lists the flags defined under server/ (Abseil's default filter wants a file named after
// the binary, so it listed none); --helpfull adds Abseil's own.
bool IsServerFlagFile(absl::string_view file) {
  return absl::StartsWith(file, "server/") || absl::StrContains(file, "/server/");
}

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = IsServerFlagFile;
  usage.contains_helpshort_flags = IsServerFlagFile;
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "streamed FP8 KV-cache and NVFP4 calibration over gRPC.\n"
      "Usage: caliper-server [--listen=HOST:PORT] [--metrics_listen=HOST:PORT] "
      "[--device=auto|cpu|cuda] [flags below]");
  absl::ParseCommandLine(argc, argv);
  // Received chunks are freed and re-allocated every few milliseconds: keep that memory mapped
  // rather than returning it to the kernel and faulting it back in (measured: about a third of
  // the ingest CPU; bench/README.md). Peak RSS is unchanged; the idle RSS stays near the peak.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);

  const std::string log_format = absl::GetFlag(FLAGS_log_format);
  if (log_format != "text" && log_format != "json") {
    std::fprintf(stderr, "--log_format: must be text or json, got \"%s\"\n", log_format.c_str());
    return 2;
  }
  caliper::EventLog log(log_format == "json" ? caliper::LogFormat::kJson
                                             : caliper::LogFormat::kText);

  // Block the shutdown signals in every thread (gRPC's included) and take them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string device = absl::GetFlag(FLAGS_device);
  std::string backend_reason;
  absl::StatusOr<std::unique_ptr<caliper::ReductionBackend>> backend =
      caliper::MakeBackend(device, &backend_reason);
  if (!backend.ok()) {
    log.Log(caliper::Severity::kError, "startup_failed",
            {{"flag", "--device=" + device}, {"message", std::string(backend.status().message())}});
    return 1;
  }
  log.Log(caliper::Severity::kInfo, "backend", {{"device", device}, {"reason", backend_reason}});

  caliper::ServerOptions options;
  options.listen = absl::GetFlag(FLAGS_listen);
  options.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  options.service.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.security.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  options.security.tls_key = absl::GetFlag(FLAGS_tls_key);
  options.security.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  options.security.allow_plaintext_tokens = absl::GetFlag(FLAGS_allow_plaintext_tokens);
  if (const std::string tokens_file = absl::GetFlag(FLAGS_tokens_file); !tokens_file.empty()) {
    absl::StatusOr<std::vector<caliper::TenantToken>> tokens =
        caliper::LoadTokensFile(tokens_file);
    if (!tokens.ok()) {
      log.Log(caliper::Severity::kError, "startup_failed",
              {{"flag", "--tokens_file"}, {"message", std::string(tokens.status().message())}});
      return 1;
    }
    options.service.authenticator =
        std::make_shared<const caliper::TokenAuthenticator>(*std::move(tokens));
  }
  options.service.limits.max_sessions_per_tenant = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  options.service.limits.max_modules_per_session = absl::GetFlag(FLAGS_max_modules_per_session);
  options.service.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.service.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.state_flush_interval = absl::GetFlag(FLAGS_state_flush_interval);
  options.state_store = absl::GetFlag(FLAGS_state_store);
  if (options.state_store.empty()) {
    // A Secret mounted as an environment variable keeps the password out of the args.
    if (const char* env = std::getenv("CALIPER_STATE_STORE")) options.state_store = env;
  }
  options.state_store_pool = absl::GetFlag(FLAGS_state_store_pool);
  options.state_store_import = absl::GetFlag(FLAGS_state_store_import);
  absl::StatusOr<std::unique_ptr<caliper::CaliperServer>> server =
      caliper::CaliperServer::Start(options, *std::move(backend), &log);
  if (!server.ok()) {
    log.Log(caliper::Severity::kError, "startup_failed",
            {{"message", std::string(server.status().message())}});
    return 1;
  }
  const std::string metrics =
      options.metrics_listen.empty() ? "disabled" : (*server)->metrics_address();
  // Parsed by test harnesses: keep the format.
  std::printf("caliper-server listening on %s (metrics %s, backend %s)\n",
              (*server)->address().c_str(), metrics.c_str(),
              std::string((*server)->backend_name()).c_str());
  std::fflush(stdout);
  log.Log(caliper::Severity::kInfo, "started",
          {{"listen", (*server)->address()},
           {"metrics", metrics},
           {"backend", std::string((*server)->backend_name())},
           {"max_message_bytes", absl::StrCat(options.service.max_message_bytes)},
           {"tls", options.security.tls_cert.empty()
                       ? "off"
                       : (options.security.tls_client_ca.empty() ? "tls" : "mtls")},
           {"tenants", options.service.authenticator ? "tokens" : "anonymous"},
           {"state_dir", options.state_dir.empty() ? "none (in memory)" : options.state_dir},
           {"state_store", options.state_store.empty()
                               ? "none"
                               : caliper::RedactedPostgresName(options.state_store)}});

  int signal_number = 0;
  sigwait(&signals, &signal_number);
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_timeout);
  log.Log(caliper::Severity::kInfo, "draining",
          {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"},
           {"drain_timeout", absl::FormatDuration(drain)}});
  (*server)->Shutdown(drain);
  log.Log(caliper::Severity::kInfo, "stopped", {});
  return 0;
}
