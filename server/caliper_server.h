// A running caliper-server: the gRPC service (with health checking and reflection) plus the
// Prometheus endpoint. Used by main and by in-process tests (listen on port 0, read port()).
#ifndef CALIPER_SERVER_CALIPER_SERVER_H_
#define CALIPER_SERVER_CALIPER_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include <grpcpp/server.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/tensor/reduction_backend.h"
#include "server/calibration_service.h"
#include "server/event_log.h"
#include "server/metrics.h"
#include "server/security.h"

namespace caliper {

struct ServerOptions {
  std::string listen = "0.0.0.0:50051";        // HOST:PORT; port 0 picks a free one
  std::string metrics_listen = "0.0.0.0:9464";  // HOST:PORT; empty disables /metrics
  SecurityOptions security;  // TLS / mTLS files; none: plaintext
  // Limits, tenants and streams. With service.authenticator (tokens), TLS is required unless
  // security.allow_plaintext_tokens.
  ServiceOptions service;
  // Bytes of requests in flight across all streams and connections: gRPC's resource quota (a
  // hard cap: past it gRPC resets streams with RESOURCE_EXHAUSTED) and, half of it, the budget
  // Observe reads wait for (server/inflight_budget.h). Default: a quarter of the base pod's 4Gi
  // memory limit. 0: neither (unbounded).
  int64_t max_inflight_bytes = int64_t{1} << 30;
  // Dead and idle peers (gRPC channel arguments; 0: never). A connection without a call for
  // max_connection_idle, or older than max_connection_age, gets GOAWAY (calls then have
  // kConnectionAgeGrace to finish; clients reconnect and producers resume); a peer that does not
  // answer a keepalive ping sent after keepalive_time of silence within 20 s is closed.
  absl::Duration max_connection_idle = absl::Minutes(5);
  absl::Duration max_connection_age = absl::Hours(2);
  absl::Duration keepalive_time = absl::Minutes(1);
  // Durable sessions: one state file per session here, restored at start-up; empty: in memory.
  std::string state_dir;
  absl::Duration state_flush_interval = absl::Seconds(1);  // upper bound between writes
  // Shared sessions for any number of replicas: a libpq URI (postgresql://...); exclusive with
  // state_dir. Streams fold into partials merged every state_flush_interval.
  std::string state_store;
  int state_store_pool = 8;          // database connections at most
  std::string state_store_import;    // a --state_dir directory whose sessions are imported once
};

class CaliperServer {
 public:
  // Unavailable (naming the flag) when an address cannot be bound; InvalidArgument for bad
  // options. `log` must outlive the server.
  static absl::StatusOr<std::unique_ptr<CaliperServer>> Start(
      const ServerOptions& options, std::unique_ptr<ReductionBackend> backend, EventLog* log);
  ~CaliperServer();

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  // --listen with the bound port, e.g. "127.0.0.1:41234".
  const std::string& address() const { return address_; }
  const std::string& metrics_address() const { return metrics_address_; }
  absl::string_view backend_name() const { return backend_->name(); }

  // Readiness off (/readyz 503 "draining", gRPC health of caliper.v1.Calibration NOT_SERVING)
  // while everything keeps serving: for the drain delay between SIGTERM and Shutdown, so load
  // balancers stop routing here before the port closes. Liveness (/healthz) stays healthy.
  void StartDraining();
  // Stops accepting RPCs, marks health NOT_SERVING, lets in-flight calls finish for up to
  // `drain`, then cancels the rest and writes the state of every changed session. Idempotent.
  void Shutdown(absl::Duration drain);
  void Wait();

  StateStore& store() { return *state_store_; }  // where the sessions live
  ServerMetrics& metrics() { return *server_metrics_; }

 private:
  CaliperServer() = default;
  // Opens --state_dir as the file store (its sessions restored, files set aside reported) and
  // starts the flusher: the same path as --state_store from here on.
  absl::Status RestoreState(const ServerOptions& options, EventLog* log);
  // Opens --state_store (schema migrated), imports --state_store_import, starts the flusher.
  absl::Status OpenStateStore(const ServerOptions& options, EventLog* log);
  // Neither flag: sessions in this process's memory (core/state/memory_state_store.h).
  void UseMemoryStore(const ServerOptions& options, EventLog* log);
  void StartFlusher(const ServerOptions& options, EventLog* log);
  // Fleets live in memory, under --state_dir/fleets, or in --state_store (PostgreSQL).
  absl::Status OpenFleetStore(const ServerOptions& options, EventLog* log);
  // Readiness follows the store: service "caliper.v1.Calibration" is NOT_SERVING while it does
  // not answer; the overall service "" (liveness) stays SERVING.
  void WatchStore(EventLog* log);

  std::unique_ptr<ReductionBackend> backend_;
  std::unique_ptr<ServerMetrics> server_metrics_;
  std::unique_ptr<StateStore> state_store_;  // memory, --state_dir's files or --state_store
  std::unique_ptr<PartialFlusher> flusher_;  // over state_store_; stopped after the server
  std::unique_ptr<FleetStore> fleet_store_;  // in memory, under --state_dir, or in --state_store
  std::unique_ptr<MetricsEndpoint> metrics_;
  std::unique_ptr<InflightBudget> inflight_;  // with max_inflight_bytes
  std::unique_ptr<CalibrationService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::string address_, metrics_address_;
  bool shut_down_ = false;
  std::atomic<bool> draining_{false};
  std::mutex watch_mu_;
  std::condition_variable watch_cv_;
  bool watch_stop_ = false;
  std::thread store_watch_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_CALIPER_SERVER_H_
