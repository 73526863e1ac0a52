// Exactly-once bookkeeping for producer streams (docs/durability.md). A producer numbers its chunks
// 1, 2, 3, ... (0 is "unnumbered" and refused). Per producer the ledger keeps N, the highest
// sequence such that 1..N were all accepted, and classifies an incoming sequence s:
//   s <= N      kDuplicate: re-sent after a reconnect; acknowledge it, count it nowhere.
//   s == N + 1  kNew: count it; N becomes s.
//   s >  N + 1  FailedPrecondition: a gap (chunks lost in between); nothing changes.
// Stream rule: within one stream, sequences rise by exactly one; the first may be anywhere in
// 1..N+1 (a client re-sends from its last acknowledged chunk). Going back or repeating inside a
// stream is FailedPrecondition. Opening a stream fences the producer's previous stream: its
// later Accept calls fail with Aborted, so two connections of one producer never interleave.
// A sequence is consumed once Accept says kNew; callers hold their own state lock across
// Accept and the fold so a snapshot never has one without the other. Thread-safe.
#ifndef CALIPER_CORE_SESSION_PRODUCER_LEDGER_H_
#define CALIPER_CORE_SESSION_PRODUCER_LEDGER_H_

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace caliper {

enum class SequenceVerdict { kNew, kDuplicate };

// Last durable sequence per producer_id.
using ProducerSequences = std::map<std::string, uint64_t>;

class ProducerLedger {
 public:
  // Identifies one stream of one producer; copyable, cheap.
  struct Stream {
    std::string producer_id;
    uint64_t epoch = 0;
  };

  ProducerLedger() = default;
  // Starts from persisted state (Snapshot() of an earlier ledger): accepted == durable.
  explicit ProducerLedger(const ProducerSequences& durable);
  // Replaces all producers with persisted counts (accepted == durable); open streams end.
  void Restore(const ProducerSequences& durable);

  // Registers a new stream for `producer_id` and fences any earlier one.
  // InvalidArgument for an empty id.
  // A producer beyond `max_producers` known ones is ResourceExhausted naming
  // max_producers_per_session.
  absl::StatusOr<Stream> OpenStream(absl::string_view producer_id,
                                    size_t max_producers = SIZE_MAX);

  // Classifies `sequence` on `stream` (the stream rule plus the producer rule above).
  // InvalidArgument for sequence 0 (that chunk's fault); FailedPrecondition for a gap or a
  // sequence out of order on the stream, Aborted when a newer stream of the same producer was
  // opened: the stream cannot go on.
  absl::StatusOr<SequenceVerdict> Accept(const Stream& stream, uint64_t sequence);

  // Producer rule only, for callers without streams (e.g. a unary RPC).
  absl::StatusOr<SequenceVerdict> Accept(absl::string_view producer_id, uint64_t sequence);

  // The first sequence the producer should send: N + 1 (1 for an unknown producer).
  uint64_t ResumeFrom(absl::string_view producer_id) const;

  // N for every producer: persist it with the state it describes, then MarkDurable it.
  ProducerSequences Snapshot() const;
  // Records that `persisted` (an earlier Snapshot) is on disk; durable marks never go back.
  void MarkDurable(const ProducerSequences& persisted);
  // The highest sequence of `producer_id` known durable: acknowledge up to here only.
  uint64_t LastDurable(absl::string_view producer_id) const;

 private:
  struct Producer {
    uint64_t accepted = 0;  // N
    uint64_t durable = 0;
    uint64_t epoch = 0;       // of the current stream; 0 before any stream
    uint64_t stream_last = 0; // last sequence seen on the current stream, 0 before the first
  };

  absl::StatusOr<SequenceVerdict> Classify(absl::string_view producer_id, Producer& producer,
                                           uint64_t sequence);

  mutable std::mutex mu_;
  std::map<std::string, Producer, std::less<>> producers_;
  uint64_t next_epoch_ = 1;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_PRODUCER_LEDGER_H_
