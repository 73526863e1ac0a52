#include "server/caliper_server.h"

#include <algorithm>
#include <climits>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/resource_quota.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state/file_state_store.h"
#include "core/state/memory_state_store.h"
#include "core/state/session_store.h"
#include "server/postgres/postgres_fleet_store.h"
#include "server/postgres/postgres_store.h"

namespace caliper {
namespace {

// HOST:PORT with the port replaced (works for "[::]:0" too: the port follows the last colon).
std::string WithPort(const std::string& listen, int port) {
  const size_t colon = listen.rfind(':');
  return absl::StrCat(colon == std::string::npos ? listen : listen.substr(0, colon), ":", port);
}

// Room for the TensorChunk envelope around the largest accepted data field, so an oversized
// chunk reaches our own check and gets the clear message rather than gRPC's generic one.
// Health-checked name that readiness probes ask for (the store answers); "" is liveness.
constexpr char kReadinessService[] = "caliper.v1.Calibration";
constexpr int kFleetStorePool = 4;

constexpr int64_t kMessageHeadroomBytes = int64_t{1} << 20;

// Calls on a connection past --max_connection_age get this long to finish after its GOAWAY.
constexpr absl::Duration kConnectionAgeGrace = absl::Minutes(10);
// A keepalive ping unanswered for this long closes the connection (a dead peer).
constexpr absl::Duration kKeepaliveTimeout = absl::Seconds(20);
// A TCP connection that has not finished the HTTP/2 (or TLS) handshake by then is closed.
constexpr absl::Duration kHandshakeTimeout = absl::Seconds(20);

// A channel-argument duration in milliseconds; 0 (never) as gRPC's "infinite".
int ChannelMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return INT_MAX;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d), INT_MAX));
}

}  // namespace

absl::StatusOr<std::unique_ptr<CaliperServer>> CaliperServer::Start(
    const ServerOptions& options, std::unique_ptr<ReductionBackend> backend, EventLog* log) {
  if (options.service.max_message_bytes <= 0 ||
      options.service.max_message_bytes > (int64_t{2} << 30) - kMessageHeadroomBytes - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes: must be in (0, 2 GiB - 1 MiB), got ",
                     options.service.max_message_bytes));
  }
  if (options.service.max_concurrent_streams < 0 ||
      options.service.stream_idle_timeout < absl::ZeroDuration() ||
      options.max_connection_idle < absl::ZeroDuration() ||
      options.max_connection_age < absl::ZeroDuration() ||
      options.keepalive_time < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--max_concurrent_streams, --stream_idle_timeout, --max_connection_idle, "
        "--max_connection_age and --keepalive_time must not be negative (0: unbounded)");
  }
  if (options.service.unary_threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--unary_threads: must be >= 1, got ",
                                                   options.service.unary_threads));
  }
  if (options.max_inflight_bytes < 0 || options.service.stream_lookahead_bytes <= 0 ||
      options.service.stream_lookahead_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_inflight_bytes must be >= 0 and --stream_lookahead_bytes in (0, 1 GiB], got ",
        options.max_inflight_bytes, " and ", options.service.stream_lookahead_bytes));
  }
  if (absl::Status s = ValidateLimits(options.service.limits); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--", s.message()));
  }
  if (options.state_flush_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state_flush_interval: must be positive, got ",
        absl::FormatDuration(options.state_flush_interval)));
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      BuildServerCredentials(options.security, options.service.authenticator);
  if (!credentials.ok()) return credentials.status();
  auto server = std::unique_ptr<CaliperServer>(new CaliperServer());
  server->backend_ = std::move(backend);
  server->server_metrics_ = std::make_unique<ServerMetrics>(server->backend_->name());
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> endpoint =
        MetricsEndpoint::Start(options.metrics_listen, *server->server_metrics_);
    if (!endpoint.ok()) return endpoint.status();
    server->metrics_ = *std::move(endpoint);
    server->metrics_address_ = WithPort(options.metrics_listen, server->metrics_->port());
  }

  if (!options.state_dir.empty() && !options.state_store.empty()) {
    return absl::InvalidArgumentError(
        "--state_dir and --state_store: give one (import a state directory into the store "
        "with --state_store_import)");
  }
  if (!options.state_dir.empty()) {
    if (absl::Status s = server->RestoreState(options, log); !s.ok()) return s;
  }
  if (!options.state_store.empty()) {
    if (absl::Status s = server->OpenStateStore(options, log); !s.ok()) return s;
  } else if (!options.state_store_import.empty()) {
    return absl::InvalidArgumentError("--state_store_import: needs --state_store");
  }
  if (server->state_store_ == nullptr) server->UseMemoryStore(options, log);

  ServiceOptions service_options = options.service;
  if (options.max_inflight_bytes > 0) {
    server->inflight_ = std::make_unique<InflightBudget>(options.max_inflight_bytes / 2);
    service_options.inflight = server->inflight_.get();
  }
  service_options.store = server->state_store_.get();
  service_options.flusher = server->flusher_.get();
  if (absl::Status s = server->OpenFleetStore(options, log); !s.ok()) return s;
  service_options.fleets = server->fleet_store_.get();
  server->service_ = std::make_unique<CalibrationService>(
      service_options, server->backend_.get(), server->server_metrics_.get(), log);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *credentials, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(options.service.max_message_bytes + kMessageHeadroomBytes));
  // Throughput for large chunks (the default channel arguments reach about 0.1x of loopback TCP):
  // big frames, a deep flow-control window (bounded, since it is buffered per stream) and no BDP
  // probing.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, 16 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES,
                             static_cast<int>(options.service.stream_lookahead_bytes));
  grpc::ResourceQuota quota("caliper-inflight");
  if (options.max_inflight_bytes > 0) {
    quota.Resize(static_cast<size_t>(options.max_inflight_bytes));
    builder.SetResourceQuota(quota);
  }
  builder.AddChannelArgument(GRPC_ARG_HTTP2_WRITE_BUFFER_SIZE, 64 << 20);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Dead and idle peers are closed (docs/hostile-load.md); the count of connections is capped
  // in front of the server, gRPC 1.51 has no such argument.
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             ChannelMillis(options.max_connection_idle));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_MS,
                             ChannelMillis(options.max_connection_age));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_AGE_GRACE_MS,
                             ChannelMillis(kConnectionAgeGrace));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, ChannelMillis(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, ChannelMillis(kKeepaliveTimeout));
  // Keep pinging a connection whose streams send nothing: that is where a dead peer hides.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
                             ChannelMillis(kHandshakeTimeout));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("--listen=", options.listen, ": cannot bind the gRPC port"));
  }
  server->address_ = WithPort(options.listen, server->port_);
  if (server->metrics_ != nullptr) server->metrics_->ServeHealth();
  if (server->state_store_ != nullptr) {
    CaliperServer* raw = server.get();
    server->store_watch_ = std::thread([raw, log] { raw->WatchStore(log); });
  }
  return server;
}

absl::Status CaliperServer::OpenStateStore(const ServerOptions& options, EventLog* log) {
  if (!absl::StartsWith(options.state_store, "postgresql://") &&
      !absl::StartsWith(options.state_store, "postgres://")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--state_store: \"", RedactedPostgresName(options.state_store),
        "\" is not a postgresql:// URI (the only store so far)"));
  }
  PostgresStoreOptions store_options;
  store_options.uri = options.state_store;
  store_options.pool_size = options.state_store_pool;
  store_options.limits = options.service.limits;
  absl::StatusOr<std::unique_ptr<StateStore>> store = OpenPostgresStore(store_options);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("--state_store: ", store.status().message()));
  }
  state_store_ = *std::move(store);
  if (!options.state_store_import.empty()) {
    absl::StatusOr<std::unique_ptr<SessionStore>> dir =
        SessionStore::Open(options.state_store_import);
    if (!dir.ok()) {
      return absl::Status(dir.status().code(), absl::StrCat("--state_store_import=",
                                                            options.state_store_import, ": ",
                                                            dir.status().message()));
    }
    SessionStore::Loaded loaded = (*dir)->LoadAll();
    int imported = 0, present = 0;
    for (const std::unique_ptr<CalibrationSession>& session : loaded.sessions) {
      absl::Status s = state_store_->ImportSession(*session);
      if (s.code() == absl::StatusCode::kAlreadyExists) {
        ++present;
      } else if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("--state_store_import: session ",
                                                   session->id(), ": ", s.message()));
      } else {
        ++imported;
      }
    }
    log->Log(loaded.errors.empty() ? Severity::kInfo : Severity::kWarning, "state_imported",
             {{"state_dir", options.state_store_import},
              {"imported", absl::StrCat(imported)},
              {"already_present", absl::StrCat(present)},
              {"corrupt_files_set_aside", absl::StrCat(loaded.errors.size())}});
  }
  StartFlusher(options, log);
  return absl::OkStatus();
}

void CaliperServer::WatchStore(EventLog* log) {
  bool was_ok = true;
  while (true) {
    const absl::Status status = state_store_->Ping();
    if (!draining_) {
      if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
        health->SetServingStatus(kReadinessService, status.ok());
      }
      if (metrics_ != nullptr) {
        metrics_->SetUnready(status.ok() ? "" : absl::StrCat("state store unreachable: ",
                                                            status.message()));
      }
    }
    if (status.ok() != was_ok) {
      log->Log(status.ok() ? Severity::kInfo : Severity::kError,
               status.ok() ? "state_store_back" : "state_store_unavailable",
               {{"store", state_store_->name()}, {"error", std::string(status.message())}});
      was_ok = status.ok();
    }
    std::unique_lock<std::mutex> lock(watch_mu_);
    if (watch_cv_.wait_for(lock, std::chrono::seconds(2), [this] { return watch_stop_; })) return;
  }
}

absl::Status CaliperServer::OpenFleetStore(const ServerOptions& options, EventLog* log) {
  if (!options.state_store.empty()) {
    PostgresStoreOptions store_options;
    store_options.uri = options.state_store;
    // Fleet calls are few and short: a small pool of their own beside the sessions'.
    store_options.pool_size = std::min(options.state_store_pool, kFleetStorePool);
    store_options.limits = options.service.limits;
    absl::StatusOr<std::unique_ptr<FleetStore>> store =
        OpenPostgresFleetStore(store_options, options.service.fleet_limits);
    if (!store.ok()) {
      return absl::Status(store.status().code(),
                          absl::StrCat("--state_store: ", store.status().message()));
    }
    fleet_store_ = *std::move(store);
    return absl::OkStatus();
  }
  if (options.state_dir.empty()) {
    fleet_store_ = NewMemoryFleetStore(options.service.fleet_limits);
    return absl::OkStatus();
  }
  const std::string dir = absl::StrCat(options.state_dir, "/fleets");
  std::vector<absl::Status> errors;
  absl::StatusOr<std::unique_ptr<FleetStore>> store = OpenFileFleetStore(
      dir, options.service.fleet_limits, options.service.limits, &errors);
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("--state_dir=", options.state_dir, ": ",
                                     store.status().message()));
  }
  for (const absl::Status& error : errors) {
    log->Log(Severity::kError, "fleet_state_corrupt",
             {{"state_dir", dir}, {"error", std::string(error.message())}});
  }
  fleet_store_ = *std::move(store);
  return absl::OkStatus();
}

absl::Status CaliperServer::RestoreState(const ServerOptions& options, EventLog* log) {
  ServerMetrics* metrics = server_metrics_.get();
  FileStateStore::Hooks hooks;
  hooks.on_write = [metrics, log](const FileStateStore::WriteEvent& event) {
    metrics->StateWrite(event.status.ok(), event.bytes, absl::ToDoubleSeconds(event.duration));
    if (!event.status.ok()) {
      log->Log(Severity::kError, "state_write_failed",
               {{"session", event.session_id}, {"error", std::string(event.status.message())}});
    }
  };
  hooks.on_sessions = [metrics](size_t sessions) {
    metrics->SetActiveSessions(static_cast<int64_t>(sessions));
  };
  std::vector<absl::Status> errors;
  absl::StatusOr<std::unique_ptr<FileStateStore>> store = FileStateStore::Open(
      options.state_dir, options.service.limits, options.service.env, &errors, std::move(hooks));
  if (!store.ok()) {
    return absl::Status(store.status().code(),
                        absl::StrCat("--state_dir=", options.state_dir, ": ",
                                     store.status().message()));
  }
  for (const absl::Status& error : errors) {
    log->Log(Severity::kError, "state_file_not_loaded",
             {{"state_dir", options.state_dir}, {"error", std::string(error.message())}});
  }
  const size_t sessions = (*store)->size();
  server_metrics_->StateLoaded(static_cast<int64_t>(sessions),
                               static_cast<int64_t>(errors.size()));
  server_metrics_->SetActiveSessions(static_cast<int64_t>(sessions));
  log->Log(errors.empty() ? Severity::kInfo : Severity::kWarning, "state_restored",
           {{"state_dir", options.state_dir},
            {"sessions", absl::StrCat(sessions)},
            {"corrupt_files_set_aside", absl::StrCat(errors.size())}});
  state_store_ = *std::move(store);
  StartFlusher(options, log);
  return absl::OkStatus();
}

void CaliperServer::UseMemoryStore(const ServerOptions& options, EventLog* log) {
  ServerMetrics* metrics = server_metrics_.get();
  state_store_ = std::make_unique<MemoryStateStore>(
      options.service.limits,
      [metrics](size_t sessions) { metrics->SetActiveSessions(static_cast<int64_t>(sessions)); });
  StartFlusher(options, log);
}

void CaliperServer::StartFlusher(const ServerOptions& options, EventLog* log) {
  ServerMetrics* metrics = server_metrics_.get();
  // The file store counts its own writes (on_write), the memory store writes nothing; a
  // database merge is counted here.
  const bool count_merges = !options.state_store.empty();
  flusher_ = std::make_unique<PartialFlusher>(
      state_store_.get(), options.state_flush_interval,
      [metrics, log, count_merges](const PartialFlusher::FlushEvent& event) {
        if (count_merges) {
          metrics->StateWrite(event.status.ok(), 0, absl::ToDoubleSeconds(event.duration));
        }
        if (!event.status.ok()) {
          log->Log(Severity::kError, "state_merge_failed",
                   {{"session", event.session_id}, {"error", std::string(event.status.message())}});
        }
      },
      options.service.env);
}

CaliperServer::~CaliperServer() { Shutdown(absl::ZeroDuration()); }

void CaliperServer::StartDraining() {
  if (draining_.exchange(true) || server_ == nullptr) return;
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->SetServingStatus(kReadinessService, false);
  }
  if (metrics_ != nullptr) metrics_->SetUnready("draining (the server is shutting down)");
}

void CaliperServer::Shutdown(absl::Duration drain) {
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  StartDraining();
  if (store_watch_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(watch_mu_);
      watch_stop_ = true;
    }
    watch_cv_.notify_all();
    store_watch_.join();
  }
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService()) {
    health->Shutdown();  // probes see NOT_SERVING while we drain
  }
  server_->Shutdown(absl::ToChronoTime(absl::Now() + drain));
  server_->Wait();
  if (flusher_ != nullptr) flusher_->Stop();  // after the last stream: nothing changes now
}

void CaliperServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace caliper
