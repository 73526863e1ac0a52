#include "core/service/observe_stream.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace caliper {
namespace {

absl::Status Prefixed(absl::string_view prefix, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

StreamObserveResult Rejected(absl::Status status, bool ends_stream) {
  StreamObserveResult result;
  result.status = std::move(status);
  result.ends_stream = ends_stream;
  return result;
}

}  // namespace

ObserveStream::ObserveStream(StateStore* store, PartialFlusher* flusher, Limits limits)
    : store_(store), flusher_(flusher), limits_(std::move(limits)) {}

ObserveStream::~ObserveStream() {
  if (partial_ != nullptr) flusher_->Release(partial_);
}

absl::Status ObserveStream::Bind(absl::string_view session_id, const std::string& tenant) {
  if (session_id.empty()) {
    return absl::InvalidArgumentError("chunk.session_id: required on the first chunk of a stream");
  }
  if (absl::Status s =
          CheckString("chunk.session_id", session_id, "session_id_bytes", kMaxSessionIdBytes);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> empty = store_->LoadEmpty(session_id, tenant);
  if (!empty.ok()) return Prefixed("chunk.", empty.status());
  (*empty)->set_limits(limits_);
  session_ = *std::move(empty);
  partial_ = flusher_->Register(session_);
  tenant_ = tenant;
  session_id_ = std::string(session_id);
  return absl::OkStatus();
}

absl::Status ObserveStream::CheckSession(absl::string_view session_id) {
  if (session_id.empty() || session_id == session_id_) return absl::OkStatus();
  session_->RecordRejected();
  return absl::InvalidArgumentError(
      absl::StrCat("chunk.session_id: \"", session_id, "\" differs from this stream's session \"",
                   session_id_, "\"; open one stream per session"));
}

void ObserveStream::RecordRejected() {
  if (session_ != nullptr) session_->RecordRejected();
}

StreamObserveResult ObserveStream::Observe(const ChunkRef& chunk, ReductionBackend& backend) {
  // Exactly-once: a stream with a producer id is bound to it on its first numbered chunk.
  if (!chunk.producer_id.empty() && !producer_) {
    absl::StatusOr<ProducerLedger::Stream> stream = OpenProducer(chunk.producer_id);
    if (!stream.ok()) return Rejected(stream.status(), /*ends_stream=*/true);
    producer_ = *std::move(stream);
  } else if (producer_ && chunk.producer_id != producer_->producer_id) {
    session_->RecordRejected();
    return Rejected(absl::InvalidArgumentError(absl::StrCat(
                        "chunk.producer_id: \"", chunk.producer_id,
                        "\" differs from this stream's \"", producer_->producer_id,
                        "\"; open one stream per producer")),
                    /*ends_stream=*/false);
  }
  // Fenced by a newer stream of the producer, or the session finalized or deleted, as its
  // last merge found: what this stream sends can no longer count.
  if (absl::Status failed = flusher_->failure(partial_); !failed.ok()) {
    return Rejected(failed, /*ends_stream=*/true);
  }
  StreamObserveResult result = session_->Observe(chunk, backend, producer_ ? &*producer_ : nullptr);
  // A gap or a newer connection of this producer: the stream cannot go on in order.
  if (!result.status.ok() && result.ends_stream) {
    result.status = SupersededOr(result.status, chunk.sequence);
  }
  return result;
}

void ObserveStream::WhenCommitted(std::function<void(absl::Status)> done) {
  if (partial_ == nullptr) {
    done(absl::OkStatus());
    return;
  }
  flusher_->WhenCommitted(partial_, std::move(done));
}

// The producer's committed N comes from the store, which also fences its earlier streams (on
// every replica of a shared store).
absl::StatusOr<ProducerLedger::Stream> ObserveStream::OpenProducer(absl::string_view producer_id) {
  absl::StatusOr<OpenedProducer> opened = store_->OpenProducer(session_id_, producer_id);
  if (!opened.ok()) return opened.status();
  session_->RestoreProducers({{std::string(producer_id), opened->committed}});
  absl::StatusOr<ProducerLedger::Stream> stream = session_->OpenProducerStream(producer_id);
  if (stream.ok()) flusher_->BindProducer(partial_, *stream, opened->epoch);
  return stream;
}

// A gap in this stream whose missing chunks the store already holds: a newer stream of the
// producer committed them, so this one was superseded (its partial only knows its own).
absl::Status ObserveStream::SupersededOr(const absl::Status& gap, uint64_t sequence) {
  if (!producer_ || gap.code() != absl::StatusCode::kFailedPrecondition) return gap;
  absl::StatusOr<uint64_t> committed =
      store_->CommittedSequence(session_id_, tenant_, producer_->producer_id);
  if (!committed.ok() || *committed + 1 < sequence) return gap;
  return absl::AbortedError(absl::StrCat(
      "chunk.sequence: producer '", producer_->producer_id,
      "': this stream was superseded by a newer stream of the same producer, which committed "
      "up to ", *committed, "; resume from ", *committed + 1));
}

}  // namespace caliper
