// One Observe stream's session side, without its transport: a partial of the committed session
// that only this stream folds into (the flusher merges it into the store), bound by the first
// chunk's session and, on its first numbered chunk, to a producer. The stream rules (one session
// and one producer per stream, exactly-once, a fenced or superseded stream) are decided here;
// the server parses chunks and answers.
#ifndef CALIPER_CORE_SERVICE_OBSERVE_STREAM_H_
#define CALIPER_CORE_SERVICE_OBSERVE_STREAM_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/limits/limits.h"
#include "core/session/session.h"
#include "core/state/partial_flusher.h"
#include "core/state/state_store.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

class ObserveStream {
 public:
  // Borrows both; they must outlive the stream.
  ObserveStream(StateStore* store, PartialFlusher* flusher, Limits limits);
  ~ObserveStream();  // the partial goes back to the flusher (what it holds is still merged)
  ObserveStream(const ObserveStream&) = delete;
  ObserveStream& operator=(const ObserveStream&) = delete;

  bool bound() const { return session_ != nullptr; }
  const std::string& session_id() const { return session_id_; }

  // Binds the stream to the tenant's session `session_id` (the first chunk's): required,
  // bounded, known and open, else the error ends the stream, its message naming chunk.session_id.
  absl::Status Bind(absl::string_view session_id, const std::string& tenant);
  // A later chunk's session_id: empty or the bound one, else InvalidArgument for that chunk.
  absl::Status CheckSession(absl::string_view session_id);
  // The verdict on one parsed chunk of the bound stream (chunk.producer_id as sent). On error,
  // ends_stream says whether the stream ends (a fenced, superseded or out-of-order producer, a
  // finalized or deleted session) or only this chunk is rejected.
  StreamObserveResult Observe(const ChunkRef& chunk, ReductionBackend& backend);
  // A chunk of the bound stream the transport refused (too large, malformed): counted rejected.
  void RecordRejected();
  // `done` with OK once everything this stream accepted is committed (or why not); at once for
  // a stream never bound.
  void WhenCommitted(std::function<void(absl::Status)> done);

 private:
  absl::StatusOr<ProducerLedger::Stream> OpenProducer(absl::string_view producer_id);
  absl::Status SupersededOr(const absl::Status& gap, uint64_t sequence);

  StateStore* const store_;
  PartialFlusher* const flusher_;
  const Limits limits_;
  std::string tenant_, session_id_;
  std::shared_ptr<CalibrationSession> session_;
  std::shared_ptr<PartialFlusher::Partial> partial_;
  std::optional<ProducerLedger::Stream> producer_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SERVICE_OBSERVE_STREAM_H_
