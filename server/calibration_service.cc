#include "server/calibration_service.h"

#include <algorithm>
#include <new>
#include <chrono>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/calibration/kv_scales.h"
#include "core/formats/lightllm_format.h"
#include "server/proto_convert.h"
#include "server/raw_tensor_chunk.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

double SecondsSince(int64_t start_ns) {
  return static_cast<double>(absl::GetCurrentTimeNanos() - start_ns) * 1e-9;
}

std::string Millis(double seconds) { return absl::StrCat(static_cast<int64_t>(seconds * 1e3)); }

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// An allocation that fails despite the limits (e.g. under an address-space cap) answers
// RESOURCE_EXHAUSTED with a message (logged with the call) instead of escaping into gRPC, which
// would answer an empty UNIMPLEMENTED.
template <typename Body>
absl::Status CatchOutOfMemory(absl::string_view method, Body&& body) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(absl::StrCat(
        method, ": the server ran out of memory answering this request; retry later or ask "
                "for less (see the server's limits)"));
  }
}

// Session ids are 32 hex digits; anything much longer is refused before it is looked up,
// echoed or logged.
absl::Status CheckSessionId(absl::string_view field, absl::string_view id) {
  return CheckString(field, id, "session_id_bytes", kMaxSessionIdBytes);
}

}  // namespace

CalibrationService::CalibrationService(ServiceOptions options, SessionRegistry* registry,
                                       ReductionBackend* backend, ServerMetrics* metrics,
                                       EventLog* log)
    : options_(std::move(options)),
      registry_(registry),
      backend_(backend),
      metrics_(metrics),
      log_(log) {
  if (options_.stream_idle_timeout > absl::ZeroDuration()) {
    idle_thread_ = std::thread([this] { IdleWatchLoop(); });
  }
}

CalibrationService::~CalibrationService() {
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    stopping_ = true;
  }
  streams_cv_.notify_all();
  if (idle_thread_.joinable()) idle_thread_.join();
}

absl::StatusOr<std::string> CalibrationService::TenantOf(
    const grpc::CallbackServerContext& context) const {
  if (options_.authenticator == nullptr) return std::string();
  return options_.authenticator->TenantOf(context);
}

grpc::ServerUnaryReactor* CalibrationService::FinishUnary(grpc::CallbackServerContext* context,
                                                          absl::string_view method,
                                                          absl::string_view session_id,
                                                          int64_t start_ns,
                                                          const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishReactor(reactor, context, method, session_id, start_ns, status);
  return reactor;
}

void CalibrationService::FinishReactor(grpc::ServerUnaryReactor* reactor,
                                       grpc::CallbackServerContext* context,
                                       absl::string_view method, absl::string_view session_id,
                                       int64_t start_ns, const absl::Status& status) {
  const double seconds = SecondsSince(start_ns);
  metrics_->RpcDone(method, seconds);
  EventLog::Fields fields = {{"method", std::string(method)},
                             {"session", std::string(session_id.substr(0, kMaxSessionIdBytes))},
                             {"peer", context->peer()},
                             {"code", absl::StatusCodeToString(status.code())},
                             {"duration_ms", Millis(seconds)}};
  if (!status.ok()) fields.emplace_back("message", std::string(status.message()));
  log_->Log(status.ok() ? Severity::kInfo : Severity::kWarning, "rpc", fields);
  reactor->Finish(ToGrpcStatus(status));
}

grpc::ServerUnaryReactor* CalibrationService::FinishUnaryWhenDurable(
    grpc::CallbackServerContext* context, absl::string_view method,
    const std::shared_ptr<CalibrationSession>& session, int64_t start_ns,
    std::function<void()> undo) {
  if (options_.persister == nullptr) {
    return FinishUnary(context, method, session->id(), start_ns, absl::OkStatus());
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  options_.persister->WhenDurable(
      session, [this, reactor, context, method = std::string(method), id = session->id(),
                start_ns, undo = std::move(undo)](absl::Status status) {
        if (!status.ok() && undo) undo();
        FinishReactor(reactor, context, method, id, start_ns, status);
      });
  return reactor;
}

absl::StatusOr<std::shared_ptr<CalibrationSession>> CalibrationService::GetOwned(
    const grpc::CallbackServerContext& context, absl::string_view session_id) const {
  if (absl::Status s = CheckSessionId("session_id", session_id); !s.ok()) return s;
  absl::StatusOr<std::string> tenant = TenantOf(context);
  if (!tenant.ok()) return tenant.status();
  return registry_->GetForTenant(session_id, *tenant);
}

absl::Status CalibrationService::DeleteWithState(absl::string_view session_id,
                                                absl::string_view tenant) {
  absl::Status status = registry_->DeleteForTenant(session_id, tenant);
  metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
  if (status.ok() && options_.persister != nullptr) {
    if (absl::Status removed = options_.persister->Remove(session_id); !removed.ok()) {
      status = absl::InternalError(absl::StrCat(
          "session deleted, but its state file could not be removed (it would come back after "
          "a restart): ", removed.message()));
    }
  }
  return status;
}

grpc::ServerUnaryReactor* CalibrationService::CreateSession(
    grpc::CallbackServerContext* context, const v1::CreateSessionRequest* request,
    v1::Session* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  std::shared_ptr<CalibrationSession> created;
  absl::Status status = CatchOutOfMemory("CreateSession", [&]() -> absl::Status {
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    if (absl::Status s = CheckString("name", request->name(), "max_name_bytes",
                                     options_.limits.max_name_bytes);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<ModelConfig> model = ModelFromProto(request->model(), options_.limits.model);
    if (!model.ok()) return model.status();
    absl::StatusOr<Recipe> recipe = RecipeFromProto(request->recipe(), options_.limits);
    if (!recipe.ok()) return recipe.status();
    if (absl::Status s = CheckLimit("sessions", static_cast<int64_t>(registry_->size()) + 1,
                                    "max_sessions", options_.limits.max_sessions,
                                    absl::StatusCode::kResourceExhausted);
        !s.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(s.message(), "; delete finished sessions first"));
    }
    SessionLimits limits;
    limits.max_sessions_per_tenant = options_.limits.max_sessions_per_tenant;
    limits.max_modules_per_session = options_.limits.max_modules_per_session;
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session = registry_->CreateForTenant(
        *std::move(model), *std::move(recipe), request->name(), *std::move(tenant), limits);
    if (!session.ok()) return session.status();
    created = *std::move(session);
    *response = SessionToProto(created->Status());
    metrics_->SetActiveSessions(static_cast<int64_t>(registry_->size()));
    return absl::OkStatus();
  });
  if (!status.ok() || created == nullptr) return FinishUnary(context, "CreateSession", "", start, status);
  // The id goes out only once a restart would know it; a session that cannot be made durable
  // is taken back, so a failed create leaves nothing behind.
  return FinishUnaryWhenDurable(context, "CreateSession", created, start,
                                [this, id = created->id(), owner = created->tenant()] {
                                  DeleteWithState(id, owner).IgnoreError();
                                });
}

grpc::ServerUnaryReactor* CalibrationService::GetSession(grpc::CallbackServerContext* context,
                                                         const v1::GetSessionRequest* request,
                                                         v1::Session* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("GetSession", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (session.ok()) *response = SessionToProto((*session)->Status());
    return session.status();
  });
  return FinishUnary(context, "GetSession", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::ListSessions(
    grpc::CallbackServerContext* context, const v1::ListSessionsRequest* /*request*/,
    v1::ListSessionsResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("ListSessions", [&]() -> absl::Status {
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    for (const std::shared_ptr<CalibrationSession>& session : registry_->ListForTenant(*tenant)) {
      *response->add_sessions() = SessionToProto(session->Status());
    }
    return absl::OkStatus();
  });
  return FinishUnary(context, "ListSessions", "", start, status);
}

grpc::ServerUnaryReactor* CalibrationService::DeleteSession(
    grpc::CallbackServerContext* context, const v1::DeleteSessionRequest* request,
    v1::DeleteSessionResponse* /*response*/) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("DeleteSession", [&]() -> absl::Status {
    if (absl::Status s = CheckSessionId("session_id", request->session_id()); !s.ok()) return s;
    absl::StatusOr<std::string> tenant = TenantOf(*context);
    if (!tenant.ok()) return tenant.status();
    return DeleteWithState(request->session_id(), *tenant);
  });
  return FinishUnary(context, "DeleteSession", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Finalize(grpc::CallbackServerContext* context,
                                                       const v1::FinalizeRequest* request,
                                                       v1::Session* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  std::shared_ptr<CalibrationSession> finalized;
  absl::Status status = CatchOutOfMemory("Finalize", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    if (absl::Status s = (*session)->Finalize(); !s.ok()) return s;
    *response = SessionToProto((*session)->Status());
    finalized = *std::move(session);
    return absl::OkStatus();
  });
  metrics_->Finalization(status.ok());
  if (status.ok()) return FinishUnaryWhenDurable(context, "Finalize", finalized, start);
  return FinishUnary(context, "Finalize", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::GetScales(grpc::CallbackServerContext* context,
                                                        const v1::ScalesRequest* request,
                                                        v1::ScalesResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("GetScales", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    absl::StatusOr<Deployment> deployment =
        DeploymentFromProto(request->deployment(), options_.limits);
    if (!deployment.ok()) return deployment.status();
    absl::StatusOr<std::vector<std::string>> formats =
        FormatsFromProto(request->formats(), options_.limits);
    if (!formats.ok()) return formats.status();
    // Scales come only from a finalization a restart would find: one whose state write failed
    // may come back OPEN with fewer chunks, so serving it would hand out scales for lost data.
    if (options_.persister != nullptr && !(*session)->FinalizationDurable()) {
      absl::StatusOr<SessionScales> probe = (*session)->Scales(Deployment(), Nvfp4Convention());
      if (!probe.ok()) return probe.status();  // not finalized at all: the usual error
      return absl::UnavailableError(absl::StrCat(
          "session ", (*session)->id(),
          ": its finalization is not durable yet (the state write failed); call Finalize again "
          "once the state directory is writable"));
    }
    absl::StatusOr<SessionScales> scales =
        (*session)->Scales(*deployment, ConventionFromProto(request->convention()));
    if (!scales.ok()) return scales.status();
    absl::StatusOr<v1::ScalesResponse> proto = ScalesToProto(*scales, *formats);
    if (!proto.ok()) return proto.status();
    *response = *std::move(proto);
    return absl::OkStatus();
  });
  return FinishUnary(context, "GetScales", request->session_id(), start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Adapt(grpc::CallbackServerContext* context,
                                                    const v1::AdaptRequest* request,
                                                    v1::AdaptResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("Adapt", [&]() -> absl::Status {
    // Stateless, but with --tokens_file every call needs a token (README "Server").
    if (absl::StatusOr<std::string> tenant = TenantOf(*context); !tenant.ok()) {
      return tenant.status();
    }
    absl::StatusOr<AdaptArgs> args = AdaptFromProto(*request, options_.limits);
    if (!args.ok()) return args.status();
    int total = args->total_heads;
    if (args->model.has_value()) {
      if (total <= 0) {
        absl::StatusOr<int> deployed = DeployedTotalKvHeads(
            args->model->num_kv_heads, args->tp_size > 0 ? args->tp_size : 1);
        if (!deployed.ok()) return Prefixed("tp_size: ", deployed.status());
        total = *deployed;
      }
      if (absl::Status s = CheckLightLlmForModel(args->calibration, *args->model, total);
          !s.ok()) {
        return Prefixed("lightllm_json: ", s);
      }
    }
    if (total <= 0) {
      return absl::InvalidArgumentError("total_heads: required (or model and tp_size)");
    }
    absl::StatusOr<LightLlmCalibration> adapted = AdaptLightLlmCalibration(args->calibration, total);
    if (!adapted.ok()) return adapted.status();
    response->set_lightllm_json(SerializeLightLlmCalibration(*adapted));
    response->set_total_heads(total);
    return absl::OkStatus();
  });
  return FinishUnary(context, "Adapt", "", start, status);
}

grpc::ServerUnaryReactor* CalibrationService::Resume(grpc::CallbackServerContext* context,
                                                     const v1::ResumeRequest* request,
                                                     v1::ResumeResponse* response) {
  const int64_t start = absl::GetCurrentTimeNanos();
  absl::Status status = CatchOutOfMemory("Resume", [&]() -> absl::Status {
    absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
        GetOwned(*context, request->session_id());
    if (!session.ok()) return session.status();
    if (request->producer_id().empty()) {
      return absl::InvalidArgumentError("producer_id: required");
    }
    if (absl::Status s = CheckString("producer_id", request->producer_id(),
                                     "max_producer_id_bytes",
                                     options_.limits.max_producer_id_bytes);
        !s.ok()) {
      return s;
    }
    // With --state_dir only durable chunks count: a producer re-sends the rest (acknowledged
    // as duplicates where they were accepted), so a crash after this answer loses nothing.
    response->set_next_sequence(options_.persister != nullptr
                                    ? (*session)->DurableResumeFrom(request->producer_id())
                                    : (*session)->ResumeFrom(request->producer_id()));
    return absl::OkStatus();
  });
  return FinishUnary(context, "Resume", request->session_id(), start, status);
}

// One client stream. Chunks are processed one at a time on the callback thread that delivered
// them (reduction included, over the received slices); parallelism comes from concurrent streams.
class CalibrationService::ObserveReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  ObserveReactor(CalibrationService* service, grpc::CallbackServerContext* context,
                 grpc::ByteBuffer* response)
      : service_(service),
        context_(context),
        response_(response),
        start_ns_(absl::GetCurrentTimeNanos()),
        last_read_ns_(start_ns_) {
    absl::StatusOr<std::string> tenant = service_->TenantOf(*context);
    const int open = ++service_->open_streams_;
    const int limit = service_->options_.max_concurrent_streams;
    if (!tenant.ok()) {
      FinishStream(tenant.status());
    } else if (limit > 0 && open > limit) {
      FinishStream(absl::ResourceExhaustedError(absl::StrCat(
          "Observe: ", open - 1, " streams already open, the server's --max_concurrent_streams=",
          limit, "; retry later or use fewer producers")));
    } else {
      tenant_ = *std::move(tenant);
      {
        std::lock_guard<std::mutex> lock(service_->streams_mu_);
        service_->live_streams_.insert(this);
      }
      StartRead(&request_);
    }
  }

  // Called by the idle watcher under streams_mu_ (so the reactor is alive).
  void CancelIfIdle(int64_t now_ns, int64_t timeout_ns) {
    if (!idle_cancelled_.load() && now_ns - last_read_ns_.load() > timeout_ns) {
      idle_cancelled_.store(true);
      context_->TryCancel();
    }
  }

  void OnReadDone(bool ok) override {
    last_read_ns_.store(absl::GetCurrentTimeNanos());
    if (!ok) {
      // Half-close: the stream is complete. Cancellation (client gone, drain timeout, idle): the
      // chunks that arrived whole stay counted; the status only goes to the log.
      if (idle_cancelled_.load()) {
        FinishStream(absl::DeadlineExceededError(absl::StrCat(
            "stream idle for longer than the server's --stream_idle_timeout=",
            absl::FormatDuration(service_->options_.stream_idle_timeout),
            "; accepted chunks are kept")));
      } else {
        FinishStream(context_->IsCancelled()
                         ? absl::CancelledError("stream cancelled (client gone or server draining)")
                         : absl::OkStatus());
      }
      return;
    }
    absl::Status fault = raw_.Parse(request_);
    if (fault.ok()) {
      fault = HandleChunk();
    } else {
      service_->metrics_->ChunkRejected(fault);
      if (session_) session_->RecordRejected();
    }
    if (!fault.ok()) {
      FinishStream(fault);
      return;
    }
    raw_.Clear();  // frees the payload before the next one arrives
    request_.Clear();
    StartRead(&request_);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->streams_mu_);
      service_->live_streams_.erase(this);
    }
    const double seconds = SecondsSince(start_ns_);
    Settle(seconds);
    const double bytes = static_cast<double>(summary_.accepted_bytes());
    EventLog::Fields fields = {
        {"method", "Observe"},
        {"session", session_id_},
        {"peer", context_->peer()},
        {"code", absl::StatusCodeToString(final_status_.code())},
        {"duration_ms", Millis(seconds)},
        {"accepted_chunks", absl::StrCat(summary_.accepted_chunks())},
        {"rejected_chunks", absl::StrCat(summary_.rejected_chunks())},
        {"skipped_warmup_chunks", absl::StrCat(summary_.skipped_warmup_chunks())},
        {"duplicate_chunks", absl::StrCat(summary_.duplicate_chunks())},
        {"accepted_bytes", absl::StrCat(summary_.accepted_bytes())},
        {"mb_per_s", absl::StrCat(seconds > 0 ? static_cast<int64_t>(bytes / seconds / 1e6) : 0)}};
    if (!final_status_.ok()) fields.emplace_back("message", std::string(final_status_.message()));
    service_->log_->Log(final_status_.ok() ? Severity::kInfo : Severity::kWarning, "rpc", fields);
    delete this;
  }

 private:
  // An OK end is acknowledged only once everything the stream accepted is durable.
  void FinishStream(const absl::Status& status) {
    if (status.ok() && session_ != nullptr && service_->options_.persister != nullptr) {
      service_->options_.persister->WhenDurable(
          session_, [this](absl::Status durable) { CompleteStream(durable); });
      return;
    }
    CompleteStream(status);
  }

  void CompleteStream(const absl::Status& status) {
    final_status_ = status;
    // Settled before the status leaves: once the client's Finish returns, the metrics show this
    // stream and its --max_concurrent_streams slot is free (OnDone may run later).
    Settle(SecondsSince(start_ns_));
    WriteSummary();
    Finish(ToGrpcStatus(status));
  }

  void WriteSummary() {
    std::string bytes = summary_.SerializeAsString();
    grpc::Slice slice(std::move(bytes));
    *response_ = grpc::ByteBuffer(&slice, 1);
  }

  void Settle(double seconds) {
    if (settled_.exchange(true)) return;
    --service_->open_streams_;
    service_->metrics_->RpcDone("Observe", seconds);
  }

  // Reports one rejected chunk in-band; the stream goes on.
  void RejectChunk(const absl::Status& status) {
    service_->metrics_->ChunkRejected(status);
    summary_.set_rejected_chunks(summary_.rejected_chunks() + 1);
    summary_.set_rejected_bytes(summary_.rejected_bytes() +
                                 static_cast<int64_t>(raw_.data().size()));
    if (summary_.errors_size() < service_->options_.max_errors_per_stream) {
      v1::ChunkError* error = summary_.add_errors();
      error->set_sequence(chunk_.sequence());
      error->set_code(absl::StatusCodeToString(status.code()));
      error->set_message(std::string(status.message()));
      service_->log_->Log(Severity::kWarning, "chunk_rejected",
                          {{"session", session_id_},
                           {"peer", context_->peer()},
                           {"sequence", absl::StrCat(chunk_.sequence())},
                           {"code", absl::StatusCodeToString(status.code())},
                           {"message", std::string(status.message())}});
    }
  }

  // Returns a non-OK status only for faults that end the stream.
  absl::Status HandleChunk() {
    const int64_t limit = service_->options_.max_message_bytes;
    if (static_cast<int64_t>(raw_.data().size()) > limit) {
      absl::Status status = absl::ResourceExhaustedError(absl::StrCat(
          "chunk.data: ", raw_.data().size(), " bytes (sequence ", chunk_.sequence(),
          ") exceeds the server's --max_message_bytes=", limit,
          "; split the tensor into smaller chunks (along tokens, rows or TP shards)"));
      service_->metrics_->ChunkRejected(status);
      if (session_) session_->RecordRejected();
      return status;
    }
    if (!session_) {
      if (chunk_.session_id().empty()) {
        absl::Status status =
            absl::InvalidArgumentError("chunk.session_id: required on the first chunk of a stream");
        service_->metrics_->ChunkRejected(status);
        return status;
      }
      absl::StatusOr<std::shared_ptr<CalibrationSession>> session =
          service_->registry_->GetForTenant(chunk_.session_id(), tenant_);
      if (!session.ok()) {
        service_->metrics_->ChunkRejected(session.status());
        return Prefixed("chunk.", session.status());
      }
      session_ = *std::move(session);
      session_id_ = chunk_.session_id();
    } else if (!chunk_.session_id().empty() && chunk_.session_id() != session_id_) {
      session_->RecordRejected();
      RejectChunk(absl::InvalidArgumentError(
          absl::StrCat("chunk.session_id: \"", chunk_.session_id(),
                       "\" differs from this stream's session \"", session_id_,
                       "\"; open one stream per session")));
      return absl::OkStatus();
    }

    absl::StatusOr<ChunkRef> chunk = ChunkFromProto(chunk_);
    if (!chunk.ok()) {
      session_->RecordRejected();
      RejectChunk(chunk.status());
      return absl::OkStatus();
    }
    chunk->data = raw_.data();
    // Exactly-once: a stream with a producer id is bound to it on its first numbered chunk.
    if (!chunk_.producer_id().empty() && !producer_) {
      absl::StatusOr<ProducerLedger::Stream> stream =
          session_->OpenProducerStream(chunk_.producer_id());
      if (!stream.ok()) {
        service_->metrics_->ChunkRejected(stream.status());
        return stream.status();
      }
      producer_ = *std::move(stream);
    } else if (producer_ && chunk_.producer_id() != producer_->producer_id) {
      session_->RecordRejected();
      RejectChunk(absl::InvalidArgumentError(absl::StrCat(
          "chunk.producer_id: \"", chunk_.producer_id(), "\" differs from this stream's \"",
          producer_->producer_id, "\"; open one stream per producer")));
      return absl::OkStatus();
    }
    absl::StatusOr<ObserveOutcome> outcome = session_->Observe(
        *chunk, *service_->backend_, producer_ ? &*producer_ : nullptr);
    if (!outcome.ok() && producer_ &&
        (outcome.status().code() == absl::StatusCode::kAborted ||
         (outcome.status().code() == absl::StatusCode::kFailedPrecondition &&
          absl::StrContains(outcome.status().message(), "chunk.sequence")))) {
      // A gap or a newer connection of this producer: the stream cannot go on in order.
      service_->metrics_->ChunkRejected(outcome.status());
      return outcome.status();
    }
    if (!outcome.ok()) {
      RejectChunk(outcome.status());
      return absl::OkStatus();
    }
    switch (*outcome) {
      case ObserveOutcome::kAccepted:
        summary_.set_accepted_chunks(summary_.accepted_chunks() + 1);
        summary_.set_accepted_bytes(summary_.accepted_bytes() +
                                     static_cast<int64_t>(chunk->data.size()));
        service_->metrics_->ChunkAccepted(chunk->kind, static_cast<int64_t>(chunk->data.size()));
        break;
      case ObserveOutcome::kSkippedWarmup:
        summary_.set_skipped_warmup_chunks(summary_.skipped_warmup_chunks() + 1);
        break;
      case ObserveOutcome::kDuplicate:
        summary_.set_duplicate_chunks(summary_.duplicate_chunks() + 1);
        service_->metrics_->ChunkDuplicate();
        break;
    }
    return absl::OkStatus();
  }

  CalibrationService* const service_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;  // summary_ serialized, when the stream finishes
  v1::ObserveSummary summary_;
  const int64_t start_ns_;
  std::atomic<int64_t> last_read_ns_;
  std::atomic<bool> idle_cancelled_{false};
  std::atomic<bool> settled_{false};
  std::string tenant_;
  grpc::ByteBuffer request_;
  RawTensorChunk raw_;
  const v1::TensorChunk& chunk_ = raw_.header();  // every field but data, which stays in raw_
  std::shared_ptr<CalibrationSession> session_;  // bound by the first chunk
  std::optional<ProducerLedger::Stream> producer_;  // bound by the first chunk with a producer
  std::string session_id_;
  absl::Status final_status_;
};

void CalibrationService::IdleWatchLoop() {
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(options_.stream_idle_timeout);
  // Check often enough that a stream is cancelled within ~1.25x the timeout.
  const auto period = std::chrono::nanoseconds(std::clamp<int64_t>(timeout_ns / 4, 1'000'000,
                                                                   1'000'000'000));
  std::unique_lock<std::mutex> lock(streams_mu_);
  while (!stopping_) {
    streams_cv_.wait_for(lock, period);
    const int64_t now = absl::GetCurrentTimeNanos();
    for (ObserveReactor* stream : live_streams_) stream->CancelIfIdle(now, timeout_ns);
  }
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CalibrationService::Observe(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new ObserveReactor(this, context, response);
}

}  // namespace caliper
