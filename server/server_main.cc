// caliper-server: flags, signals and the process lifetime. Everything else is in
// caliper_server_lib.
#include <malloc.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
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
#include "core/limits/limits.h"
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
ABSL_FLAG(int64_t, max_inflight_bytes, caliper::ServerOptions().max_inflight_bytes,
          "Bytes of requests gRPC may hold across all streams and connections (its resource "
          "quota; past it streams are reset with RESOURCE_EXHAUSTED); Observe reads wait while "
          "half of it is taken. About a quarter of the pod's memory limit; 0: unbounded");
ABSL_FLAG(int64_t, stream_lookahead_bytes, caliper::ServiceOptions().stream_lookahead_bytes,
          "HTTP/2 window per Observe stream (bytes a client may send ahead of the server)");
// Limits (core/limits/limits.h has the defaults and why).
ABSL_FLAG(int, max_layers, caliper::ModelLimits().max_layers, "Most layers a model may declare");
ABSL_FLAG(int, max_attention_heads, caliper::ModelLimits().max_attention_heads,
          "Most attention heads a model may declare");
ABSL_FLAG(int, max_kv_heads, caliper::ModelLimits().max_kv_heads,
          "Most KV heads a model may declare");
ABSL_FLAG(int, max_head_dim, caliper::ModelLimits().max_head_dim, "Largest head_dim of a model");
ABSL_FLAG(int, max_hidden_size, caliper::ModelLimits().max_hidden_size,
          "Largest hidden_size of a model");
ABSL_FLAG(int64_t, max_model_string_bytes,
          static_cast<int64_t>(caliper::ModelLimits().max_model_string_bytes),
          "Longest model architecture / model_type");
ABSL_FLAG(int64_t, max_hf_config_json_bytes,
          static_cast<int64_t>(caliper::ModelLimits().max_hf_config_json_bytes),
          "Longest model.hf_config_json");
ABSL_FLAG(int, max_tp_size, caliper::Limits().max_tp_size,
          "Largest deployment TP size GetScales and Adapt accept");
ABSL_FLAG(int, max_total_kv_heads, caliper::Limits().max_total_kv_heads,
          "Most total KV heads (across ranks) GetScales and Adapt accept");
ABSL_FLAG(int, max_formats, caliper::Limits().max_formats,
          "Most distinct formats one GetScales may render (duplicates are dropped)");
ABSL_FLAG(int64_t, max_batches_per_session, caliper::Limits().max_batches_per_session,
          "Most (module, batch) activation statistics a session keeps");
ABSL_FLAG(int, max_producers_per_session, caliper::Limits().max_producers_per_session,
          "Most distinct producer ids a session tracks");
ABSL_FLAG(int64_t, max_producer_id_bytes,
          static_cast<int64_t>(caliper::Limits().max_producer_id_bytes), "Longest producer_id");
ABSL_FLAG(int64_t, max_module_bytes, static_cast<int64_t>(caliper::Limits().max_module_bytes),
          "Longest module name");
ABSL_FLAG(int64_t, max_name_bytes, static_cast<int64_t>(caliper::Limits().max_name_bytes),
          "Longest session name");
ABSL_FLAG(int64_t, max_fused_groups_bytes,
          static_cast<int64_t>(caliper::Limits().max_fused_groups_bytes),
          "Longest recipe.fused_groups");
ABSL_FLAG(int64_t, max_lightllm_json_bytes,
          static_cast<int64_t>(caliper::Limits().max_lightllm_json_bytes),
          "Longest Adapt lightllm_json");
ABSL_FLAG(int, max_sessions, caliper::Limits().max_sessions,
          "Sessions the server holds at once (all tenants)");
ABSL_FLAG(absl::Duration, drain_delay, absl::ZeroDuration(),
          "On SIGTERM/SIGINT, how long the server keeps serving with /readyz answering 503 "
          "(load balancers stop routing here) before it stops accepting; a second signal cuts it "
          "short. The Kubernetes manifests set 5s");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(30),
          "After the drain delay, how long in-flight streams may run before they are cancelled");
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
ABSL_FLAG(int, max_sessions_per_tenant, 0,
          "Sessions a tenant may hold at once; 0: only --max_sessions applies");
ABSL_FLAG(int, max_concurrent_streams, 1024, "Observe streams open at once; 0: unbounded");
ABSL_FLAG(int, max_fleets, caliper::FleetLimits().max_fleets,
          "Fleets the server holds at once (all tenants; docs/fleets.md)");
ABSL_FLAG(int, max_watchers, caliper::FleetLimits().max_watchers,
          "WatchScales streams open at once");
ABSL_FLAG(int, fleet_saturation_layers, caliper::ServiceOptions().fleet_saturation_layers,
          "Layers per fleet exported in caliper_fleet_layer_saturation (the first ones)");
ABSL_FLAG(int, max_modules_per_session, caliper::Limits().max_modules_per_session,
          "Distinct NVFP4 modules a session may track (a 61-layer, 384-expert MoE has ~70k)");
ABSL_FLAG(absl::Duration, stream_idle_timeout, caliper::ServiceOptions().stream_idle_timeout,
          "End an Observe stream that completes no chunk for this long (silent, stalled "
          "mid-message or trickling; DEADLINE_EXCEEDED, accepted chunks stay); 0: never");
ABSL_FLAG(absl::Duration, max_connection_idle, caliper::ServerOptions().max_connection_idle,
          "Close (GOAWAY) a connection without a call for this long; 0: never");
ABSL_FLAG(absl::Duration, max_connection_age, caliper::ServerOptions().max_connection_age,
          "Close (GOAWAY) a connection this old; its calls get 10 more minutes and clients "
          "reconnect; 0: never");
ABSL_FLAG(absl::Duration, keepalive_time, caliper::ServerOptions().keepalive_time,
          "Ping a connection silent for this long; one that does not answer within 20 s is "
          "closed (a dead peer); 0: never");
ABSL_FLAG(std::string, state_dir, "",
          "Directory for durable session state (one file per session, restored at start-up); "
          "empty: sessions live in memory only");
ABSL_FLAG(absl::Duration, state_flush_interval, absl::Seconds(1),
          "Longest time a stream's statistics wait before they are merged into the state store "
          "(and written, with --state_dir or --state_store); stream ends merge at once");
ABSL_FLAG(std::string, state_store, "",
          "Shared session state for any number of replicas: a PostgreSQL libpq URI "
          "(postgresql://USER:PASSWORD@HOST:PORT/DB?sslmode=verify-full; also from "
          "$CALIPER_STATE_STORE). Exclusive with --state_dir");
ABSL_FLAG(int, state_store_pool, 8,
          "Database connections at most (per replica), shared by unary calls, stream starts, the "
          "flusher and readiness checks; a caller waits up to 10 s for one");
ABSL_FLAG(int, unary_threads, 8,
          "Threads that answer unary calls (each waits on the state store: memory, --state_dir or "
          "--state_store), never on gRPC's threads");
ABSL_FLAG(std::string, state_store_import, "",
          "A --state_dir directory whose sessions are imported into --state_store at start-up "
          "(sessions already there are left alone)");

namespace {
// A byte-count flag; a negative value becomes 0, which ValidateLimits refuses by name.
size_t ByteFlag(int64_t value) { return value < 0 ? 0 : static_cast<size_t>(value); }
}  // namespace

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
  options.max_inflight_bytes = absl::GetFlag(FLAGS_max_inflight_bytes);
  options.service.stream_lookahead_bytes = absl::GetFlag(FLAGS_stream_lookahead_bytes);
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
  caliper::Limits& limits = options.service.limits;
  limits.model.max_layers = absl::GetFlag(FLAGS_max_layers);
  limits.model.max_attention_heads = absl::GetFlag(FLAGS_max_attention_heads);
  limits.model.max_kv_heads = absl::GetFlag(FLAGS_max_kv_heads);
  limits.model.max_head_dim = absl::GetFlag(FLAGS_max_head_dim);
  limits.model.max_hidden_size = absl::GetFlag(FLAGS_max_hidden_size);
  limits.model.max_model_string_bytes = ByteFlag(absl::GetFlag(FLAGS_max_model_string_bytes));
  limits.model.max_hf_config_json_bytes = ByteFlag(absl::GetFlag(FLAGS_max_hf_config_json_bytes));
  limits.max_tp_size = absl::GetFlag(FLAGS_max_tp_size);
  limits.max_total_kv_heads = absl::GetFlag(FLAGS_max_total_kv_heads);
  limits.max_formats = absl::GetFlag(FLAGS_max_formats);
  limits.max_modules_per_session = absl::GetFlag(FLAGS_max_modules_per_session);
  limits.max_batches_per_session = absl::GetFlag(FLAGS_max_batches_per_session);
  limits.max_producers_per_session = absl::GetFlag(FLAGS_max_producers_per_session);
  limits.max_producer_id_bytes = ByteFlag(absl::GetFlag(FLAGS_max_producer_id_bytes));
  limits.max_module_bytes = ByteFlag(absl::GetFlag(FLAGS_max_module_bytes));
  limits.max_name_bytes = ByteFlag(absl::GetFlag(FLAGS_max_name_bytes));
  limits.max_fused_groups_bytes = ByteFlag(absl::GetFlag(FLAGS_max_fused_groups_bytes));
  limits.max_lightllm_json_bytes = ByteFlag(absl::GetFlag(FLAGS_max_lightllm_json_bytes));
  limits.max_sessions = absl::GetFlag(FLAGS_max_sessions);
  limits.max_sessions_per_tenant = absl::GetFlag(FLAGS_max_sessions_per_tenant);
  options.service.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.service.fleet_limits.max_fleets = absl::GetFlag(FLAGS_max_fleets);
  options.service.fleet_limits.max_watchers = absl::GetFlag(FLAGS_max_watchers);
  options.service.fleet_saturation_layers = absl::GetFlag(FLAGS_fleet_saturation_layers);
  options.service.stream_idle_timeout = absl::GetFlag(FLAGS_stream_idle_timeout);
  options.max_connection_idle = absl::GetFlag(FLAGS_max_connection_idle);
  options.max_connection_age = absl::GetFlag(FLAGS_max_connection_age);
  options.keepalive_time = absl::GetFlag(FLAGS_keepalive_time);
  options.state_dir = absl::GetFlag(FLAGS_state_dir);
  options.service.unary_threads = absl::GetFlag(FLAGS_unary_threads);
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
  const absl::Duration delay = std::max(absl::GetFlag(FLAGS_drain_delay), absl::ZeroDuration());
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_timeout);
  log.Log(caliper::Severity::kInfo, "draining",
          {{"signal", signal_number == SIGTERM ? "SIGTERM" : "SIGINT"},
           {"drain_delay", absl::FormatDuration(delay)},
           {"drain_timeout", absl::FormatDuration(drain)}});
  (*server)->StartDraining();
  if (delay > absl::ZeroDuration()) {
    const timespec wait = absl::ToTimespec(delay);
    sigtimedwait(&signals, nullptr, &wait);  // still serving; a second signal ends the delay
  }
  (*server)->Shutdown(drain);
  log.Log(caliper::Severity::kInfo, "stopped", {});
  return 0;
}
