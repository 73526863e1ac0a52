#include "core/session/producer_ledger.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace caliper {

ProducerLedger::ProducerLedger(const ProducerSequences& durable) { Restore(durable); }

void ProducerLedger::Restore(const ProducerSequences& durable) {
  std::lock_guard<std::mutex> lock(mu_);
  producers_.clear();
  for (const auto& [id, sequence] : durable) {
    Producer& producer = producers_[id];
    producer.accepted = sequence;
    producer.durable = sequence;
  }
}

absl::StatusOr<ProducerLedger::Stream> ProducerLedger::OpenStream(absl::string_view producer_id,
                                                                  size_t max_producers) {
  if (producer_id.empty()) return absl::InvalidArgumentError("producer_id: empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = producers_.find(producer_id);
  if (it == producers_.end()) {
    if (producers_.size() >= max_producers) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "producer '", producer_id, "' would be producer ", producers_.size() + 1,
          " of this session, over the limit max_producers_per_session=", max_producers));
    }
    it = producers_.emplace(std::string(producer_id), Producer{}).first;
  }
  it->second.epoch = next_epoch_++;
  it->second.stream_last = 0;
  return Stream{std::string(producer_id), it->second.epoch};
}

absl::StatusOr<SequenceVerdict> ProducerLedger::Classify(absl::string_view producer_id,
                                                         Producer& producer, uint64_t sequence) {
  if (sequence == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sequence: producer '", producer_id, "' must number its chunks from 1 (got 0)"));
  }
  if (sequence <= producer.accepted) return SequenceVerdict::kDuplicate;
  if (sequence == producer.accepted + 1) {
    producer.accepted = sequence;
    return SequenceVerdict::kNew;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "sequence: producer '", producer_id, "' sent ", sequence, " but the next expected is ",
      producer.accepted + 1, " (chunks in between are missing; resume from ",
      producer.accepted + 1, ")"));
}

absl::StatusOr<SequenceVerdict> ProducerLedger::Accept(const Stream& stream, uint64_t sequence) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = producers_.find(stream.producer_id);
  if (it == producers_.end() || it->second.epoch != stream.epoch) {
    return absl::AbortedError(absl::StrCat("producer '", stream.producer_id,
                                           "': this stream was superseded by a newer stream of "
                                           "the same producer"));
  }
  Producer& producer = it->second;
  if (producer.stream_last != 0 && sequence != producer.stream_last + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sequence: producer '", stream.producer_id, "' sent ", sequence, " after ",
        producer.stream_last, " on the same stream (must rise by exactly 1)"));
  }
  absl::StatusOr<SequenceVerdict> verdict = Classify(stream.producer_id, producer, sequence);
  if (verdict.ok()) producer.stream_last = sequence;
  return verdict;
}

absl::StatusOr<SequenceVerdict> ProducerLedger::Accept(absl::string_view producer_id,
                                                       uint64_t sequence) {
  if (producer_id.empty()) return absl::InvalidArgumentError("producer_id: empty");
  std::lock_guard<std::mutex> lock(mu_);
  auto it = producers_.find(producer_id);
  if (it == producers_.end()) {
    if (sequence != 1) {
      Producer fresh;
      return Classify(producer_id, fresh, sequence);  // the error for 0 or a gap
    }
    it = producers_.emplace(std::string(producer_id), Producer{}).first;
  }
  return Classify(producer_id, it->second, sequence);
}

uint64_t ProducerLedger::ResumeFrom(absl::string_view producer_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = producers_.find(producer_id);
  return it == producers_.end() ? 1 : it->second.accepted + 1;
}

ProducerSequences ProducerLedger::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  ProducerSequences out;
  for (const auto& [id, producer] : producers_) {
    if (producer.accepted > 0) out.emplace_hint(out.end(), id, producer.accepted);
  }
  return out;
}

void ProducerLedger::MarkDurable(const ProducerSequences& persisted) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, sequence] : persisted) {
    auto it = producers_.find(id);
    if (it == producers_.end()) continue;  // never accepted here: nothing to acknowledge
    it->second.durable = std::max(it->second.durable, std::min(sequence, it->second.accepted));
  }
}

uint64_t ProducerLedger::LastDurable(absl::string_view producer_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = producers_.find(producer_id);
  return it == producers_.end() ? 0 : it->second.durable;
}

}  // namespace caliper
