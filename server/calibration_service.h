// caliper.v1.Calibration over gRPC's callback API. Transport only: requests are translated to
// calls of core's SessionService and FleetService (core/service/: one body per RPC over the
// memory, file or PostgreSQL store) and core errors go out through ToGrpcStatus. Observe is a
// ServerReadReactor over raw ByteBuffers, so chunk payloads are reduced in place in the received
// slices (server/raw_tensor_chunk.h): a bad chunk is answered in-band (ObserveSummary.errors) and
// the stream goes on; stream-level faults (unknown session on the first chunk, oversized or
// malformed chunk) end it.
#ifndef CALIPER_SERVER_CALIBRATION_SERVICE_H_
#define CALIPER_SERVER_CALIBRATION_SERVICE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "core/env/env.h"
#include "core/limits/limits.h"
#include "core/service/fleet_service.h"
#include "core/service/session_service.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/thread_pool.h"
#include "proto/caliper.grpc.pb.h"
#include "server/event_log.h"
#include "server/fleet_export.h"
#include "server/fleet_metrics.h"
#include "server/inflight_budget.h"
#include "server/metrics.h"
#include "server/security.h"

namespace caliper {

struct ServiceOptions {
  int64_t max_message_bytes = int64_t{64} << 20;  // largest chunk.data accepted
  int max_errors_per_stream = 64;                  // ObserveSummary.errors cap
  // Null: one anonymous tenant (""). Else every call is tenant-scoped by its bearer token.
  std::shared_ptr<const TokenAuthenticator> authenticator;
  Limits limits;                                   // core/limits/limits.h
  // Observe reads wait for room here (server/inflight_budget.h); null: unbounded.
  InflightBudget* inflight = nullptr;
  // HTTP/2 window of every stream before the server reads (the budget then opens it per read):
  // small, since gRPC buffers it for every open stream whatever the budget says.
  int64_t stream_lookahead_bytes = int64_t{1} << 20;
  int max_concurrent_streams = 1024;               // Observe streams open at once
  // An Observe stream without a whole chunk for this long ends (silent, stalled or trickling
  // senders); 0: never. The clients' streams send continuously or close within seconds.
  absl::Duration stream_idle_timeout = absl::Seconds(60);
  // The clock sessions are created on, streams' idle time and read holds and fleet windows'
  // ages are measured on (a test advances a fake one); the server's file store and flusher use
  // it too.
  Env* env = Env::Default();
  // Where sessions live (required): a MemoryStateStore, --state_dir's FileStateStore or
  // --state_store's PostgreSQL store. Streams fold into partials that `flusher` (over `store`)
  // merges; every answer comes from the store.
  StateStore* store = nullptr;
  PartialFlusher* flusher = nullptr;
  int unary_threads = 8;  // --unary_threads: threads that run the unary calls (they wait on the store)
  // Fleets (docs/fleets.md): null answers the fleet calls UNIMPLEMENTED.
  FleetStore* fleets = nullptr;
  FleetLimits fleet_limits;
  // How often windows are checked for their policy's close and token counts committed (zero:
  // never).
  absl::Duration fleet_sweep_interval = absl::Milliseconds(500);
  // Layers per fleet exported in caliper_fleet_layer_saturation (a label limit).
  int fleet_saturation_layers = 128;
};

class CalibrationService final
    : public v1::Calibration::WithRawCallbackMethod_Observe<v1::Calibration::CallbackService> {
 public:
  // Borrows everything; all must outlive the service.
  CalibrationService(ServiceOptions options, ReductionBackend* backend, ServerMetrics* metrics,
                     EventLog* log);
  ~CalibrationService() override;

  grpc::ServerUnaryReactor* CreateSession(grpc::CallbackServerContext* context,
                                          const v1::CreateSessionRequest* request,
                                          v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* context,
                                       const v1::GetSessionRequest* request,
                                       v1::Session* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteSession(grpc::CallbackServerContext* context,
                                          const v1::DeleteSessionRequest* request,
                                          v1::DeleteSessionResponse* response) override;
  // Requests are TensorChunk and the response an ObserveSummary, as raw bytes.
  grpc::ServerReadReactor<grpc::ByteBuffer>* Observe(grpc::CallbackServerContext* context,
                                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Finalize(grpc::CallbackServerContext* context,
                                     const v1::FinalizeRequest* request,
                                     v1::Session* response) override;
  grpc::ServerUnaryReactor* GetScales(grpc::CallbackServerContext* context,
                                      const v1::ScalesRequest* request,
                                      v1::ScalesResponse* response) override;
  grpc::ServerUnaryReactor* Adapt(grpc::CallbackServerContext* context,
                                  const v1::AdaptRequest* request,
                                  v1::AdaptResponse* response) override;
  grpc::ServerUnaryReactor* Resume(grpc::CallbackServerContext* context,
                                   const v1::ResumeRequest* request,
                                   v1::ResumeResponse* response) override;
  grpc::ServerUnaryReactor* GetReport(grpc::CallbackServerContext* context,
                                      const v1::ReportRequest* request,
                                      v1::ReportResponse* response) override;

  // Fleets (server/fleet_calls.cc).
  grpc::ServerUnaryReactor* CreateFleet(grpc::CallbackServerContext* context,
                                        const v1::CreateFleetRequest* request,
                                        v1::Fleet* response) override;
  grpc::ServerUnaryReactor* GetFleet(grpc::CallbackServerContext* context,
                                     const v1::GetFleetRequest* request,
                                     v1::Fleet* response) override;
  grpc::ServerUnaryReactor* ListFleets(grpc::CallbackServerContext* context,
                                       const v1::ListFleetsRequest* request,
                                       v1::ListFleetsResponse* response) override;
  grpc::ServerUnaryReactor* DeleteFleet(grpc::CallbackServerContext* context,
                                        const v1::DeleteFleetRequest* request,
                                        v1::DeleteFleetResponse* response) override;
  grpc::ServerUnaryReactor* OpenWindow(grpc::CallbackServerContext* context,
                                       const v1::OpenWindowRequest* request,
                                       v1::FleetWindow* response) override;
  grpc::ServerUnaryReactor* CloseWindow(grpc::CallbackServerContext* context,
                                        const v1::CloseWindowRequest* request,
                                        v1::FleetWindow* response) override;
  grpc::ServerUnaryReactor* ListVersions(grpc::CallbackServerContext* context,
                                         const v1::ListVersionsRequest* request,
                                         v1::ListVersionsResponse* response) override;
  grpc::ServerUnaryReactor* GetVersion(grpc::CallbackServerContext* context,
                                       const v1::GetVersionRequest* request,
                                       v1::FleetVersion* response) override;
  grpc::ServerUnaryReactor* PinVersion(grpc::CallbackServerContext* context,
                                       const v1::PinVersionRequest* request,
                                       v1::Fleet* response) override;
  grpc::ServerUnaryReactor* UnpinVersion(grpc::CallbackServerContext* context,
                                         const v1::UnpinVersionRequest* request,
                                         v1::Fleet* response) override;
  grpc::ServerWriteReactor<v1::WatchScalesResponse>* WatchScales(
      grpc::CallbackServerContext* context, const v1::WatchScalesRequest* request) override;
  grpc::ServerUnaryReactor* ReportInUse(grpc::CallbackServerContext* context,
                                        const v1::ReportInUseRequest* request,
                                        v1::ReportInUseResponse* response) override;

 private:
  class ObserveReactor;
  class WatchReactor;

  // What a unary call's body knows of its call: the calling tenant, and the session the log
  // line names (the request's; CreateSession sets the new one).
  struct Call {
    std::string tenant;
    std::string session_id;
  };
  using Body = std::function<absl::Status(Call& call)>;
  // Every unary call: checks `session_id` ("" for none) and the caller's token, runs `body` on
  // a store worker (never on a gRPC thread; out of memory answered as RESOURCE_EXHAUSTED), then
  // finishes with its status, its latency and one log line.
  grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                   absl::string_view method, absl::string_view session_id,
                                   Body body);

  // The calling tenant: "" without an authenticator, else from the call's bearer token.
  absl::StatusOr<std::string> TenantOf(const grpc::CallbackServerContext& context) const;
  // GetScales' answer: the request's deployment and convention parsed, `answer` of them
  // rendered in the request's formats.
  absl::Status ScalesResponse(
      const v1::ScalesRequest& request,
      const std::function<absl::StatusOr<ScalesAnswer>(const ScalesQuery&)>& answer,
      v1::ScalesResponse* response) const;

  // Fleet calls: Answer, with UNIMPLEMENTED when the server has no fleet store.
  grpc::ServerUnaryReactor* FleetCall(grpc::CallbackServerContext* context,
                                      absl::string_view method,
                                      std::function<absl::Status(const std::string& tenant)> call);
  void NotifyWatchers(absl::string_view tenant, absl::string_view fleet);

  // Ends streams without a whole chunk for stream_idle_timeout and takes back the budget of
  // quiet reads (runs on idle_thread_).
  void IdleWatchLoop();

  // Finishes a unary call with `status`, recording its latency and one log line.
  void FinishReactor(grpc::ServerUnaryReactor* reactor, grpc::CallbackServerContext* context,
                     absl::string_view method, absl::string_view session_id, int64_t start_ns,
                     const absl::Status& status);

  const ServiceOptions options_;
  ReductionBackend* const backend_;
  ServerMetrics* const metrics_;
  EventLog* const log_;

  std::atomic<int> open_streams_{0};
  std::mutex streams_mu_;  // guards live_streams_ and stopping_
  std::condition_variable streams_cv_;
  std::set<ObserveReactor*> live_streams_;
  bool stopping_ = false;
  std::thread idle_thread_;
  std::unique_ptr<ThreadPool> store_workers_;

  std::unique_ptr<SessionService> sessions_;
  std::unique_ptr<FleetMetrics> fleet_metrics_;
  std::unique_ptr<FleetExport> fleet_export_;
  std::unique_ptr<FleetService> fleets_;  // null without options_.fleets
  std::mutex fleet_mu_;  // guards watchers_
  std::set<WatchReactor*> watchers_;
};

}  // namespace caliper

#endif  // CALIPER_SERVER_CALIBRATION_SERVICE_H_
