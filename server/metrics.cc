#include "server/metrics.h"

#include <CivetServer.h>
#include <civetweb.h>

#include <array>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <utility>

#include <prometheus/text_serializer.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace caliper {

struct MetricsEndpoint::Probes {
  std::mutex mu;
  bool serving = false;
  std::string unready;  // why /readyz answers 503; "" when ready
};

namespace {

// The probe state of every endpoint in the process, by its port: civetweb's request callback
// gets no pointer of ours, only the connection (whose server_port says which endpoint).
std::mutex probes_mu;
std::map<int, std::shared_ptr<MetricsEndpoint::Probes>>& ProbesByPort() {
  static auto* by_port = new std::map<int, std::shared_ptr<MetricsEndpoint::Probes>>();
  return *by_port;
}

// civetweb's begin_request: answers GET /healthz and /readyz itself (prometheus-cpp's handlers
// always answer 200); returns 0 for every other path, which prometheus-cpp then serves.
int AnswerProbe(mg_connection* connection) {
  const mg_request_info* request = mg_get_request_info(connection);
  const char* uri = request->local_uri != nullptr ? request->local_uri : "";
  const bool ready = std::strcmp(uri, "/readyz") == 0;
  if (!ready && std::strcmp(uri, "/healthz") != 0) return 0;
  std::shared_ptr<MetricsEndpoint::Probes> probes;
  {
    std::lock_guard<std::mutex> lock(probes_mu);
    auto it = ProbesByPort().find(request->server_port);
    if (it != ProbesByPort().end()) probes = it->second;
  }
  int code = 503;
  std::string body = "starting\n";
  if (probes != nullptr) {
    std::lock_guard<std::mutex> lock(probes->mu);
    if (probes->serving && !ready) {
      code = 200;
      body = "caliper_up 1\n";
    } else if (probes->serving) {
      code = probes->unready.empty() ? 200 : 503;
      body = probes->unready.empty() ? "ready\n" : absl::StrCat("not ready: ", probes->unready, "\n");
    }
  }
  mg_printf(connection,
            "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Content-Length: %zu\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n%s",
            code, code == 200 ? "OK" : "Service Unavailable", body.size(), body.c_str());
  return code;
}

constexpr absl::string_view kRpcMethods[] = {
    "CreateSession", "GetSession", "ListSessions", "DeleteSession",
    "Observe",       "Finalize",   "GetScales",    "Adapt",
    "Resume",        "GetReport"};

constexpr absl::string_view kRejectReasons[] = {"invalid_argument",    "not_found",
                                                "failed_precondition", "resource_exhausted",
                                                "other"};

// A target kind's label: the API's name in lower case (ChunkKindName is a switch the compiler
// checks, so a new kind gets its label and its counters with no list to extend here).
const std::array<std::string, kChunkKindCount>& KindLabels() {
  static const std::array<std::string, kChunkKindCount> labels = [] {
    std::array<std::string, kChunkKindCount> out;
    for (int k = 0; k < kChunkKindCount; ++k) {
      out[k] = absl::AsciiStrToLower(ChunkKindName(static_cast<ChunkKind>(k)));
    }
    return out;
  }();
  return labels;
}
constexpr absl::string_view kUnspecifiedKind = "unspecified";

absl::string_view KindLabel(v1::TargetKind kind) {
  if (kind == v1::TARGET_UNSPECIFIED || !v1::TargetKind_IsValid(kind)) return kUnspecifiedKind;
  const std::string label = absl::AsciiStrToLower(v1::TargetKind_Name(kind));
  for (const std::string& known : KindLabels()) {
    if (known == label) return known;
  }
  return kUnspecifiedKind;
}

absl::string_view ReasonOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
      return "invalid_argument";
    case absl::StatusCode::kNotFound:
      return "not_found";
    case absl::StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case absl::StatusCode::kResourceExhausted:
      return "resource_exhausted";
    default:
      return "other";
  }
}

}  // namespace

ServerMetrics::ServerMetrics(absl::string_view backend)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& bytes = prometheus::BuildCounter()
                    .Name("caliper_ingested_bytes_total")
                    .Help("Tensor bytes accepted into sessions, by target kind.")
                    .Register(*registry_);
  auto& chunks = prometheus::BuildCounter()
                     .Name("caliper_ingested_chunks_total")
                     .Help("Tensor chunks accepted into sessions, by target kind.")
                     .Register(*registry_);
  auto& skipped = prometheus::BuildCounter()
                      .Name("caliper_skipped_warmup_chunks_total")
                      .Help("Chunks of warm-up batches (recipe warmup_batches): acknowledged and "
                            "counted, not observed; by target kind.")
                      .Register(*registry_);
  auto& statistic_bytes = prometheus::BuildCounter()
                              .Name("caliper_statistics_bytes_total")
                              .Help("Bytes of producer-side statistics accepted (statistics "
                                    "mode), by target kind.")
                              .Register(*registry_);
  auto& statistic_tensor_bytes = prometheus::BuildCounter()
                                     .Name("caliper_statistics_tensor_bytes_total")
                                     .Help("Bytes of the tensors accepted statistics stand for, "
                                           "by target kind.")
                                     .Register(*registry_);
  for (int k = 0; k < kChunkKindCount; ++k) {
    const std::string& kind = KindLabels()[k];
    statistic_bytes_[k] = &statistic_bytes.Add({{"kind", kind}});
    statistic_tensor_bytes_[k] = &statistic_tensor_bytes.Add({{"kind", kind}});
    bytes_[k] = &bytes.Add({{"kind", kind}});
    chunks_[k] = &chunks.Add({{"kind", kind}});
    skipped_warmup_[k] = &skipped.Add({{"kind", kind}});
  }
  auto& rejected = prometheus::BuildCounter()
                       .Name("caliper_rejected_chunks_total")
                       .Help("Tensor chunks rejected, by reason and target kind.")
                       .Register(*registry_);
  for (absl::string_view reason : kRejectReasons) {
    std::vector<absl::string_view> kinds(KindLabels().begin(), KindLabels().end());
    kinds.push_back(kUnspecifiedKind);
    for (absl::string_view kind : kinds) {
      rejected_.emplace(std::make_pair(std::string(reason), std::string(kind)),
                        &rejected.Add({{"reason", std::string(reason)}, {"kind", std::string(kind)}}));
    }
  }
  duplicates_ = &prometheus::BuildCounter()
                     .Name("caliper_duplicate_chunks_total")
                     .Help("Re-sent chunks already counted (exactly-once resume): acknowledged, "
                           "ignored.")
                     .Register(*registry_)
                     .Add({});
  active_sessions_ = &prometheus::BuildGauge()
                          .Name("caliper_active_sessions")
                          .Help("Sessions currently held by the server.")
                          .Register(*registry_)
                          .Add({});
  rpc_duration_ = &prometheus::BuildHistogram()
                       .Name("caliper_rpc_duration_seconds")
                       .Help("Wall time of each RPC, by method (Observe: whole stream).")
                       .Register(*registry_);
  const prometheus::Histogram::BucketBoundaries buckets = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
      1,      2.5,   5,      10,    30,   60,    300,  1800};
  for (absl::string_view method : kRpcMethods) {
    rpc_by_method_.emplace(std::string(method),
                           &rpc_duration_->Add({{"method", std::string(method)}}, buckets));
  }
  auto& finalizations = prometheus::BuildCounter()
                            .Name("caliper_finalizations_total")
                            .Help("Finalize calls, by result.")
                            .Register(*registry_);
  finalize_ok_ = &finalizations.Add({{"result", "ok"}});
  finalize_error_ = &finalizations.Add({{"result", "error"}});
  auto& state_writes = prometheus::BuildCounter()
                           .Name("caliper_state_writes_total")
                           .Help("Session state file writes (--state_dir), by result.")
                           .Register(*registry_);
  state_writes_ok_ = &state_writes.Add({{"result", "ok"}});
  state_writes_error_ = &state_writes.Add({{"result", "error"}});
  state_bytes_ = &prometheus::BuildCounter()
                      .Name("caliper_state_written_bytes_total")
                      .Help("Bytes of session state written durably.")
                      .Register(*registry_)
                      .Add({});
  state_write_duration_ = &prometheus::BuildHistogram()
                              .Name("caliper_state_write_duration_seconds")
                              .Help("Latency of one atomic state file write (write, fsync, rename).")
                              .Register(*registry_)
                              .Add({}, prometheus::Histogram::BucketBoundaries{
                                           0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                           0.25, 0.5, 1, 2.5});
  auto& state_loaded = prometheus::BuildCounter()
                           .Name("caliper_state_files_loaded_total")
                           .Help("State files read at start-up, by result (corrupt: set aside).")
                           .Register(*registry_);
  state_restored_ = &state_loaded.Add({{"result", "restored"}});
  state_corrupt_ = &state_loaded.Add({{"result", "corrupt"}});
  prometheus::BuildGauge()
      .Name("caliper_backend_info")
      .Help("The reduction backend in use (value is always 1).")
      .Register(*registry_)
      .Add({{"backend", std::string(backend)}})
      .Set(1);
}

void ServerMetrics::ChunkAccepted(ChunkKind kind, int64_t bytes) {
  bytes_[static_cast<int>(kind)]->Increment(static_cast<double>(bytes));
  chunks_[static_cast<int>(kind)]->Increment();
}

void ServerMetrics::StatisticsAccepted(ChunkKind kind, int64_t statistic_bytes,
                                       int64_t tensor_bytes) {
  statistic_bytes_[static_cast<int>(kind)]->Increment(static_cast<double>(statistic_bytes));
  statistic_tensor_bytes_[static_cast<int>(kind)]->Increment(static_cast<double>(tensor_bytes));
}

void ServerMetrics::ChunkSkippedWarmup(ChunkKind kind) {
  skipped_warmup_[static_cast<int>(kind)]->Increment();
}

void ServerMetrics::ChunkRejected(const absl::Status& status, v1::TargetKind kind) {
  rejected_.find(std::make_pair(std::string(ReasonOf(status)), std::string(KindLabel(kind))))
      ->second->Increment();
}

void ServerMetrics::ChunkDuplicate() { duplicates_->Increment(); }

void ServerMetrics::SetActiveSessions(int64_t count) {
  active_sessions_->Set(static_cast<double>(count));
}

void ServerMetrics::RpcDone(absl::string_view method, double seconds) {
  auto it = rpc_by_method_.find(method);
  if (it != rpc_by_method_.end()) it->second->Observe(seconds);
}

void ServerMetrics::Finalization(bool ok) { (ok ? finalize_ok_ : finalize_error_)->Increment(); }

void ServerMetrics::StateWrite(bool ok, size_t bytes, double seconds) {
  (ok ? state_writes_ok_ : state_writes_error_)->Increment();
  if (ok) state_bytes_->Increment(static_cast<double>(bytes));
  state_write_duration_->Observe(seconds);
}

void ServerMetrics::StateLoaded(int64_t restored, int64_t corrupt) {
  state_restored_->Increment(static_cast<double>(restored));
  state_corrupt_->Increment(static_cast<double>(corrupt));
}

std::string ServerMetrics::Render() const {
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, const ServerMetrics& metrics) {
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  endpoint->probes_ = std::make_shared<Probes>();
  static const CivetCallbacks* callbacks = [] {
    auto* c = new CivetCallbacks();
    c->begin_request = AnswerProbe;
    return c;
  }();
  try {
    endpoint->exposer_ = std::make_unique<prometheus::Exposer>(listen, 2, callbacks);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("--metrics_listen=", listen, ": cannot serve metrics: ", e.what()));
  }
  endpoint->exposer_->RegisterCollectable(metrics.registry());
  std::vector<int> ports = endpoint->exposer_->GetListeningPorts();
  endpoint->port_ = ports.empty() ? 0 : ports.front();
  std::lock_guard<std::mutex> lock(probes_mu);
  ProbesByPort()[endpoint->port_] = endpoint->probes_;
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  std::lock_guard<std::mutex> lock(probes_mu);
  auto it = ProbesByPort().find(port_);
  if (it != ProbesByPort().end() && it->second == probes_) ProbesByPort().erase(it);
}

void MetricsEndpoint::ServeHealth() {
  std::lock_guard<std::mutex> lock(probes_->mu);
  probes_->serving = true;
}

void MetricsEndpoint::SetUnready(std::string reason) {
  std::lock_guard<std::mutex> lock(probes_->mu);
  probes_->unready = std::move(reason);
}

}  // namespace caliper
