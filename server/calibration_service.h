// caliper.v1.Calibration over gRPC's callback API. Transport only: requests are translated to
// core::CalibrationSession calls and core errors go out through ToGrpcStatus. Observe is a
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
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "core/tensor/reduction_backend.h"
#include "core/limits/limits.h"
#include "server/inflight_budget.h"
#include "core/session/session.h"
#include "core/session/session_registry.h"
#include "core/state/partial_flusher.h"
#include "core/state/session_store.h"
#include "core/state/state_store.h"
#include "proto/caliper.grpc.pb.h"
#include "server/event_log.h"
#include "server/metrics.h"
#include "server/security.h"
#include "server/store_workers.h"

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
  absl::Duration stream_idle_timeout = absl::ZeroDuration();  // 0: none
  // --state_dir (a FileStateStore) or --state_store (PostgreSQL, shared by replicas): sessions
  // live in this store, not in the registry; streams fold into partials that `flusher` merges,
  // and every answer waits for the store. Both set or both null (in memory).
  StateStore* store = nullptr;
  PartialFlusher* flusher = nullptr;
  int store_threads = 8;  // threads for unary calls that wait on the store
};

class CalibrationService final
    : public v1::Calibration::WithRawCallbackMethod_Observe<v1::Calibration::CallbackService> {
 public:
  // Borrows everything; all must outlive the service.
  CalibrationService(ServiceOptions options, SessionRegistry* registry,
                     ReductionBackend* backend, ServerMetrics* metrics, EventLog* log);
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

 private:
  class ObserveReactor;

  // The calling tenant: "" without an authenticator, else from the call's bearer token.
  absl::StatusOr<std::string> TenantOf(const grpc::CallbackServerContext& context) const;
  // The session if it exists and belongs to the calling tenant, else NotFound/Unauthenticated.
  absl::StatusOr<std::shared_ptr<CalibrationSession>> GetOwned(
      const grpc::CallbackServerContext& context, absl::string_view session_id) const;
  // GetScales' answer for `session` (however it was found: in memory or from the store).
  absl::Status ScalesResponseFor(const CalibrationSession& session,
                                 const v1::ScalesRequest& request,
                                 v1::ScalesResponse* response) const;
  // Deletes the tenant's session (in memory; the stores delete through StoreDeleteSession).
  absl::Status DeleteWithState(absl::string_view session_id, absl::string_view tenant);
  // --state_store: each call runs `call` on a store worker, then finishes with its status.
  grpc::ServerUnaryReactor* OnStore(grpc::CallbackServerContext* context,
                                    absl::string_view method, std::string session_id,
                                    std::function<absl::Status(const std::string& tenant)> call);
  grpc::ServerUnaryReactor* StoreCreateSession(grpc::CallbackServerContext* context,
                                               const v1::CreateSessionRequest* request,
                                               v1::Session* response);
  grpc::ServerUnaryReactor* StoreGetSession(grpc::CallbackServerContext* context,
                                            const v1::GetSessionRequest* request,
                                            v1::Session* response);
  grpc::ServerUnaryReactor* StoreListSessions(grpc::CallbackServerContext* context,
                                              v1::ListSessionsResponse* response);
  grpc::ServerUnaryReactor* StoreDeleteSession(grpc::CallbackServerContext* context,
                                               const v1::DeleteSessionRequest* request);
  grpc::ServerUnaryReactor* StoreFinalize(grpc::CallbackServerContext* context,
                                          const v1::FinalizeRequest* request,
                                          v1::Session* response);
  grpc::ServerUnaryReactor* StoreGetScales(grpc::CallbackServerContext* context,
                                           const v1::ScalesRequest* request,
                                           v1::ScalesResponse* response);
  grpc::ServerUnaryReactor* StoreGetReport(grpc::CallbackServerContext* context,
                                           const v1::ReportRequest* request,
                                           v1::ReportResponse* response);
  grpc::ServerUnaryReactor* StoreResume(grpc::CallbackServerContext* context,
                                        const v1::ResumeRequest* request,
                                        v1::ResumeResponse* response);

  // Cancels streams idle for longer than stream_idle_timeout (runs on idle_thread_).
  void IdleWatchLoop();

  // Finishes a unary call with `status`, recording its latency and one log line.
  grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                        absl::string_view method, absl::string_view session_id,
                                        int64_t start_ns, const absl::Status& status);
  void FinishReactor(grpc::ServerUnaryReactor* reactor, grpc::CallbackServerContext* context,
                     absl::string_view method, absl::string_view session_id, int64_t start_ns,
                     const absl::Status& status);

  const ServiceOptions options_;
  SessionRegistry* const registry_;
  ReductionBackend* const backend_;
  ServerMetrics* const metrics_;
  EventLog* const log_;

  std::atomic<int> open_streams_{0};
  std::mutex streams_mu_;  // guards live_streams_ and stopping_
  std::condition_variable streams_cv_;
  std::set<ObserveReactor*> live_streams_;
  bool stopping_ = false;
  std::thread idle_thread_;
  std::unique_ptr<StoreWorkers> store_workers_;  // with options_.store
};

}  // namespace caliper

#endif  // CALIPER_SERVER_CALIBRATION_SERVICE_H_
