// CalibrationService::ObserveReactor: one Observe stream over raw ByteBuffers. Chunks are
// parsed in place (server/raw_tensor_chunk.h) and handed to the session; a bad chunk is answered
// in-band in ObserveSummary.errors, a stream fault (unknown session, oversized chunk, sequence
// gap, fenced producer) ends the stream. Also the idle watcher that ends silent and slow streams.
#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/service/observe_stream.h"
#include "server/calibration_service.h"
#include "server/inflight_budget.h"
#include "server/out_of_memory.h"
#include "server/proto_convert.h"
#include "server/raw_tensor_chunk.h"
#include "server/rpc_timing.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

// A pending read without a whole chunk for this long gives its budget reservation back, and a
// first read queued this long for the budget reads without one; what then arrives is charged on
// arrival. So streams that send nothing hold no budget for long and cannot hold a new stream back
// for longer than the wait, while honest bursts (many streams starting at once) stay paced.
constexpr int64_t kReadHoldNs = 1'000'000'000;
constexpr int64_t kFirstReadWaitNs = 3'000'000'000;

}  // namespace

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
        last_read_ns_(NowNs()),
        stream_(service->options_.store, service->options_.flusher, service->options_.limits) {
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
      std::lock_guard<std::mutex> lock(mu_);  // the idle watcher may see the stream already
      ReadNext();
    }
  }

  // Called by the idle watcher under streams_mu_ (so the reactor is alive): the reservation
  // holds above, then past `timeout_ns` (0: never) without a whole chunk (silent, stalled
  // mid-message or trickling) the stream ends with the reason itself (a TryCancel would reach the
  // client as a bare CANCELLED). A stream waiting for the budget is not idle: the server is
  // holding it back.
  void CheckIdle(int64_t now_ns, int64_t timeout_ns) {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return;  // a chunk is being handled right now
    const bool first_read = last_message_bytes_ == 0;
    if (waiting_.load()) {
      if (first_read && now_ns - wait_started_ns_ > kFirstReadWaitNs &&
          service_->options_.inflight->Withdraw(ticket_)) {
        reserved_ = 0;
        GrantedRead();
      }
      return;
    }
    const int64_t quiet_ns = now_ns - last_read_ns_.load();
    if (quiet_ns > kReadHoldNs) ReleaseReservation();
    if (timeout_ns <= 0 || quiet_ns <= timeout_ns || idle_finished_ || finished_.load()) return;
    idle_finished_ = true;
    lock.unlock();
    FinishStream(absl::DeadlineExceededError(absl::StrCat(
        "Observe: no whole chunk for longer than the server's stream_idle_timeout=",
        absl::FormatDuration(service_->options_.stream_idle_timeout),
        " (nothing sent, or a chunk sent too slowly); chunks accepted before are kept (resume "
        "to go on)")));
  }

  void OnReadDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    last_read_ns_.store(NowNs());
    if (idle_finished_ || finished_.load() || !ok) ReleaseReservation();
    if (idle_finished_ || finished_.load()) return;  // already finished with its reason
    if (!ok) {
      // Half-close: the stream is complete. Cancellation (client gone, drain timeout): the
      // chunks that arrived whole stay counted; the status only goes to the log.
      FinishStream(context_->IsCancelled()
                       ? absl::CancelledError("stream cancelled (client gone or server draining)")
                       : absl::OkStatus());
      return;
    }
    SettleReservation(static_cast<int64_t>(request_.Length()));
    absl::Status fault = raw_.Parse(request_);
    last_message_bytes_ = static_cast<int64_t>(raw_.data().size());
    if (fault.ok()) {
      fault = CatchOutOfMemory("Observe", "handling this chunk; retry later",
                               [this] { return HandleChunk(); });
    } else {
      service_->metrics_->ChunkRejected(fault, v1::TARGET_UNSPECIFIED);
      stream_.RecordRejected();
    }
    raw_.Clear();  // frees the payload before the next one arrives
    request_.Clear();
    ReleaseReservation();
    if (!fault.ok()) {
      FinishStream(fault);
      return;
    }
    ReadNext();
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
        {"session", stream_.session_id()},
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
  // A stream's status goes out once everything it accepted is committed: an OK end is
  // acknowledged only then (or fails with why not), and after any end GetSession shows it.
  void FinishStream(const absl::Status& status) {
    // A window's token counts are part of what is committed (its session's K/V observers).
    stream_.WhenCommitted([this, status](absl::Status committed) {
      CompleteStream(status.ok() ? committed : status);
    });
  }

  void CompleteStream(const absl::Status& status) {
    if (finished_.exchange(true)) return;
    final_status_ = status;
    // Settled before the status leaves: once the client's Finish returns, the metrics show this
    // stream and its --max_concurrent_streams slot is free (OnDone may run later).
    Settle(SecondsSince(start_ns_));
    WriteSummary();
    Finish(ToGrpcStatus(status));
  }

  // Reserves in-flight bytes for the next chunk (the size of this stream's previous one, or
  // max_message_bytes for the first: once a read is pending, gRPC opens the stream's window to
  // whatever size the message declares), then StartRead; waits in the budget's queue when full.
  // The holds (kReadHoldNs, kFirstReadWaitNs) keep streams that send nothing from keeping it.
  // Under mu_.
  void ReadNext() {
    InflightBudget* budget = service_->options_.inflight;
    if (budget == nullptr) {
      StartRead(&request_);
      return;
    }
    reserved_ = budget->Clamp(last_message_bytes_ > 0
                                  ? std::max(last_message_bytes_,
                                             service_->options_.stream_lookahead_bytes)
                                  : service_->options_.max_message_bytes);
    wait_started_ns_ = NowNs();
    waiting_.store(true);
    if (budget->Acquire(reserved_, [this] { GrantedRead(); }, &ticket_)) GrantedRead();
  }

  void GrantedRead() {
    last_read_ns_.store(NowNs());
    waiting_.store(false);
    StartRead(&request_);
  }

  // The reservation becomes what arrived: a larger message (its reservation went back, or the
  // client declared more) is already held, so it is charged and other reads wait until it is
  // reduced; what a smaller one did not need goes back at once. Under mu_.
  void SettleReservation(int64_t bytes) {
    InflightBudget* budget = service_->options_.inflight;
    if (budget == nullptr || bytes == reserved_) return;
    if (bytes > reserved_) {
      budget->Charge(bytes - reserved_);
    } else {
      budget->Release(reserved_ - bytes);
    }
    reserved_ = bytes;
  }

  void ReleaseReservation() {
    if (reserved_ > 0 && service_->options_.inflight != nullptr) {
      service_->options_.inflight->Release(reserved_);
    }
    reserved_ = 0;
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
    service_->metrics_->ChunkRejected(status, chunk_.kind());
    summary_.set_rejected_chunks(summary_.rejected_chunks() + 1);
    summary_.set_rejected_bytes(summary_.rejected_bytes() +
                                 static_cast<int64_t>(raw_.data().size()));
    if (summary_.errors_size() < service_->options_.max_errors_per_stream) {
      v1::ChunkError* error = summary_.add_errors();
      error->set_sequence(chunk_.sequence());
      error->set_code(absl::StatusCodeToString(status.code()));
      error->set_message(std::string(status.message()));
      service_->log_->Log(Severity::kWarning, "chunk_rejected",
                          {{"session", stream_.session_id()},
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
      service_->metrics_->ChunkRejected(status, chunk_.kind());
      stream_.RecordRejected();
      return status;
    }
    if (!stream_.bound()) {
      if (absl::Status s = stream_.Bind(chunk_.session_id(), tenant_); !s.ok()) {
        service_->metrics_->ChunkRejected(s, chunk_.kind());
        return s;
      }
    } else if (absl::Status s = stream_.CheckSession(chunk_.session_id()); !s.ok()) {
      RejectChunk(s);
      return absl::OkStatus();
    }

    absl::StatusOr<ChunkRef> chunk = ChunkFromProto(chunk_, service_->options_.limits);
    if (!chunk.ok()) {
      stream_.RecordRejected();
      RejectChunk(chunk.status());
      return absl::OkStatus();
    }
    chunk->data = raw_.data();
    const StreamObserveResult result = stream_.Observe(*chunk, *service_->backend_);
    if (!result.status.ok() && result.ends_stream) {
      service_->metrics_->ChunkRejected(result.status, chunk_.kind());
      return result.status;
    }
    if (!result.status.ok()) {
      RejectChunk(result.status);
      return absl::OkStatus();
    }
    switch (result.outcome) {
      case ObserveOutcome::kAccepted:
        summary_.set_accepted_chunks(summary_.accepted_chunks() + 1);
        summary_.set_accepted_bytes(summary_.accepted_bytes() +
                                     static_cast<int64_t>(chunk->data.size()));
        service_->metrics_->ChunkAccepted(chunk->kind, static_cast<int64_t>(chunk->data.size()));
        if (chunk->statistics.has_value()) {
          service_->metrics_->StatisticsAccepted(
              chunk->kind, static_cast<int64_t>(chunk_.statistics().ByteSizeLong()),
              StatisticsTensorBytes(chunk->dtype, chunk->shape));
        }
        break;
      case ObserveOutcome::kSkippedWarmup:
        summary_.set_skipped_warmup_chunks(summary_.skipped_warmup_chunks() + 1);
        service_->metrics_->ChunkSkippedWarmup(chunk->kind);
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
  // The service's Env clock, for idle time and read holds (start_ns_ times the RPC for metrics).
  int64_t NowNs() const { return absl::ToUnixNanos(service_->options_.env->Now()); }

  const int64_t start_ns_;
  std::atomic<int64_t> last_read_ns_;
  std::atomic<bool> settled_{false};
  std::atomic<bool> finished_{false};  // CompleteStream ran: the status is on its way
  std::atomic<bool> waiting_{false};   // queued for the in-flight budget, no read pending
  std::mutex mu_;                      // held while a chunk is handled
  bool idle_finished_ = false;         // guarded by mu_
  int64_t reserved_ = 0;               // in-flight bytes held for the pending read (mu_)
  int64_t wait_started_ns_ = 0;        // when ReadNext asked the budget (mu_)
  uint64_t ticket_ = 0;                // the budget's name for a queued read (mu_)
  int64_t last_message_bytes_ = 0;
  std::string tenant_;
  grpc::ByteBuffer request_;
  RawTensorChunk raw_;
  const v1::TensorChunk& chunk_ = raw_.header();  // every field but data, which stays in raw_
  ObserveStream stream_;  // bound by the first chunk
  absl::Status final_status_;
};

void CalibrationService::IdleWatchLoop() {
  const int64_t timeout_ns = absl::ToInt64Nanoseconds(options_.stream_idle_timeout);
  // Often enough for the reservation holds, and to end a stream within ~1.25x the timeout.
  const absl::Duration period = absl::Nanoseconds(
      timeout_ns > 0 ? std::clamp<int64_t>(timeout_ns / 4, 1'000'000, 100'000'000) : 100'000'000);
  Env* env = options_.env;
  std::unique_lock<std::mutex> lock(streams_mu_);
  while (!stopping_) {
    if (env->WaitUntil(streams_cv_, lock, env->Now() + period, [this] { return stopping_; })) break;
    const int64_t now = absl::ToUnixNanos(env->Now());
    for (ObserveReactor* stream : live_streams_) stream->CheckIdle(now, timeout_ns);
  }
}

grpc::ServerReadReactor<grpc::ByteBuffer>* CalibrationService::Observe(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  return new ObserveReactor(this, context, response);
}

}  // namespace caliper
