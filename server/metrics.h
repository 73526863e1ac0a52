// Prometheus metrics of the server (names are a contract with deploy/ dashboards and tests;
// renames go into CHANGELOG.md). Durations are `_seconds` histograms named `*_duration_seconds`;
// `kind` labels use the API's target kinds in lower case (key, value, weight, input_activation;
// unspecified when a rejected chunk named none). Label values are bounded sets: no session ids.
// Thread-safe (prometheus-cpp metrics are).
#ifndef CALIPER_SERVER_METRICS_H_
#define CALIPER_SERVER_METRICS_H_

#include <map>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/session/session.h"
#include "proto/caliper.pb.h"

namespace caliper {

class ServerMetrics {
 public:
  // `backend` ("cpu" or "cuda") is exported as caliper_backend_info{backend} = 1.
  explicit ServerMetrics(absl::string_view backend);

  void ChunkAccepted(ChunkKind kind, int64_t bytes);
  // A statistics-mode chunk (also counted by ChunkAccepted, with its 0 data bytes): the bytes of
  // its statistic and of the tensor it stands for, by kind.
  void StatisticsAccepted(ChunkKind kind, int64_t statistic_bytes, int64_t tensor_bytes);
  // A chunk below the recipe's warm-up batches: acknowledged and counted, not observed.
  void ChunkSkippedWarmup(ChunkKind kind);
  // Reason label from the rejection's status code; `kind` as the chunk declared it.
  void ChunkRejected(const absl::Status& status, v1::TargetKind kind);
  // A re-sent chunk already counted (exactly-once): acknowledged, not a rejection.
  void ChunkDuplicate();
  void SetActiveSessions(int64_t count);
  void RpcDone(absl::string_view method, double seconds);
  void Finalization(bool ok);
  // --state_dir: one session state file write (atomic, fsynced) and its size and latency.
  void StateWrite(bool ok, size_t bytes, double seconds);
  // State files found at start-up: restored, or set aside as corrupt.
  void StateLoaded(int64_t restored, int64_t corrupt);

  // The text exposition page, as /metrics serves it (for tests).
  std::string Render() const;
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  // Indexed by ChunkKind.
  prometheus::Counter* bytes_[kChunkKindCount];
  prometheus::Counter* chunks_[kChunkKindCount];
  prometheus::Counter* skipped_warmup_[kChunkKindCount];
  prometheus::Counter* statistic_bytes_[kChunkKindCount];
  prometheus::Counter* statistic_tensor_bytes_[kChunkKindCount];
  // By reason, then kind label.
  std::map<std::pair<std::string, std::string>, prometheus::Counter*, std::less<>> rejected_;
  prometheus::Counter* duplicates_;
  prometheus::Gauge* active_sessions_;
  prometheus::Family<prometheus::Histogram>* rpc_duration_;
  std::map<std::string, prometheus::Histogram*, std::less<>> rpc_by_method_;
  prometheus::Counter* finalize_ok_;
  prometheus::Counter* finalize_error_;
  prometheus::Counter* state_writes_ok_;
  prometheus::Counter* state_writes_error_;
  prometheus::Counter* state_bytes_;
  prometheus::Histogram* state_write_duration_;
  prometheus::Counter* state_restored_;
  prometheus::Counter* state_corrupt_;
};

// Serves `metrics` on http://<listen>/metrics and the probes: plain HTTP, no token, so
// Kubernetes' probes work when the gRPC port needs TLS and tokens. Returns the bound port (listen
// may use port 0); Unavailable when the address cannot be bound. Before ServeHealth() both
// probes answer 503 "starting". After it, GET /healthz (liveness) answers 200 ("caliper_up 1"),
// draining included: it depends on nothing but the process (no session, lock or disk). GET
// /readyz answers 200 "ready", or 503 with the reason given to SetUnready.
class MetricsEndpoint {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(const std::string& listen,
                                                               const ServerMetrics& metrics);
  ~MetricsEndpoint();
  int port() const { return port_; }
  void ServeHealth();  // once the gRPC server is serving
  void SetUnready(std::string reason);  // "" : ready again

  struct Probes;  // what the probe handler answers (shared with it)

 private:
  std::shared_ptr<Probes> probes_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_METRICS_H_
