// Compact binary encoding of observer state (core/observers.h) and of the per-producer sequence
// map, for state files. Explicit little-endian, floats by IEEE-754 bit pattern (so -0.0, the
// +/-inf seeds of empty observers and every payload bit round-trip exactly). A standalone blob is
// [u8 tag][u8 codec version][body]; StateEncoder/StateDecoder compose bodies into larger records
// (e.g. a whole session). Decoding never trusts a count: truncated or garbage input is an
// InvalidArgument naming the field ("kv_layer.v_tokens[2]: ..."), never a crash or a huge alloc.
#ifndef CALIPER_CORE_STATE_OBSERVER_CODEC_H_
#define CALIPER_CORE_STATE_OBSERVER_CODEC_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/observers.h"
#include "core/session/producer_ledger.h"
#include "core/session/session_delta.h"

namespace caliper {

// 2 adds the moving-average observers' per-batch ranges (GroupRanges) to K/V layer and activation
// bodies and the layer's histograms to K/V standalone blobs (those blobs say 2; min/max, producer
// and histogram blobs say 1); version 1 bodies still decode (without them). 3 adds the K/V
// layer's TP rank 0 token counts (those blobs and activation blobs say 3; earlier ones decode
// with counts of 0).
// 4 adds the query's arrays (q_absmax, q_tokens, q_batches; q_hist after the K/V histograms) to
// K/V layer bodies; only bodies that carry a query are written as 4, so every other blob keeps
// its version-3 bytes.
inline constexpr uint8_t kObserverCodecVersion = 4;

// Appends fields to a byte string. Never fails.
class StateEncoder {
 public:
  void PutU8(uint8_t value);
  void PutU32(uint32_t value);
  void PutU64(uint64_t value);
  void PutI64(int64_t value);
  void PutF32(float value);    // bit pattern
  void PutF64(double value);   // bit pattern
  void PutString(absl::string_view value);  // u32 length + bytes

  // Bodies (no tag/version); the matching StateDecoder::Get* reads them back.
  // `query`: also the query's arrays (codec version 4 bodies).
  void PutKvLayer(const KvLayerObserver& observer, bool query = false);
  void PutMinMax(const MinMaxObserver& observer);
  void PutActivation(const ActivationObserver& observer);
  void PutProducerSequences(const ProducerSequences& sequences);
  // Sparse: max, max_count, then (slot, count) for nonzero slots only; <= 1027 pairs.
  void PutHistogram(const MagnitudeHistogram& histogram);
  // A layer's K then V histograms: count (0 or heads), then each PutHistogram.
  void PutKvHistograms(const KvLayerObserver& observer, bool query = false);
  // Per-batch ranges: count, then (batch, n, n x (min, max)) in ascending batch order.
  void PutBatchRanges(const std::map<int64_t, GroupRanges>& batches);

  const std::string& bytes() const { return out_; }
  std::string Release() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads fields in order from bytes the caller keeps alive. Each getter names `field` in its
// error; after an error the decoder's position is unspecified, so stop decoding.
class StateDecoder {
 public:
  explicit StateDecoder(absl::string_view bytes) : in_(bytes) {}
  // The codec version the bodies were written with (the record's header says); default current.
  void set_codec_version(uint8_t version) { codec_version_ = version; }
  uint8_t codec_version() const { return codec_version_; }

  absl::StatusOr<uint8_t> GetU8(absl::string_view field);
  absl::StatusOr<uint32_t> GetU32(absl::string_view field);
  absl::StatusOr<uint64_t> GetU64(absl::string_view field);
  absl::StatusOr<int64_t> GetI64(absl::string_view field);
  absl::StatusOr<float> GetF32(absl::string_view field);
  absl::StatusOr<double> GetF64(absl::string_view field);
  absl::StatusOr<std::string> GetString(absl::string_view field);  // UTF-8 text only
  // A u32 count of items of at least `min_item_bytes` each, checked against the bytes left.
  absl::StatusOr<uint32_t> GetCount(absl::string_view field, size_t min_item_bytes);

  // Also validate: absmax finite and >= 0, token and observation counts >= 0, no NaN in min/max,
  // batch ids and producer ids strictly ascending.
  absl::StatusOr<KvLayerObserver> GetKvLayer(absl::string_view field);
  absl::StatusOr<MinMaxObserver> GetMinMax(absl::string_view field);
  absl::StatusOr<ActivationObserver> GetActivation(absl::string_view field);
  absl::StatusOr<ProducerSequences> GetProducerSequences(absl::string_view field);
  // Slots ascending and in range, counts positive, then MagnitudeHistogram::Validate.
  absl::StatusOr<MagnitudeHistogram> GetHistogram(absl::string_view field);
  // Into observer->k_hist / v_hist (and q_hist from version 3); counts other than 0 or
  // k_absmax.size() are refused.
  absl::Status GetKvHistograms(absl::string_view field, KvLayerObserver* observer);
  // Batch ids strictly ascending, no NaN, each group min <= max or unobserved (+inf / -inf).
  absl::StatusOr<std::map<int64_t, GroupRanges>> GetBatchRanges(absl::string_view field);

  // InvalidArgument naming `field` when bytes are left over.
  absl::Status ExpectEnd(absl::string_view field) const;
  size_t remaining() const { return in_.size() - pos_; }

 private:
  absl::Status Need(absl::string_view field, size_t bytes) const;
  uint64_t ReadLittleEndian(size_t bytes);

  absl::string_view in_;
  size_t pos_ = 0;
  // Default: version 3 bodies (a K/V layer without the query); a record that holds version 4
  // bodies says so (its header, or the session state's version).
  uint8_t codec_version_ = 3;
};

// Standalone, versioned blobs. Decoding fails on a wrong tag, an unknown version, a bad body or
// trailing bytes. A K/V layer blob (version 2) carries the layer's histograms too; a histogram
// blob is one module's input |x| histogram.
std::string EncodeKvLayerObserver(const KvLayerObserver& observer);
std::string EncodeHistogram(const MagnitudeHistogram& histogram);
absl::StatusOr<MagnitudeHistogram> DecodeHistogram(absl::string_view bytes);
std::string EncodeMinMaxObserver(const MinMaxObserver& observer);
std::string EncodeActivationObserver(const ActivationObserver& observer);
std::string EncodeProducerSequences(const ProducerSequences& sequences);
absl::StatusOr<KvLayerObserver> DecodeKvLayerObserver(absl::string_view bytes);
absl::StatusOr<MinMaxObserver> DecodeMinMaxObserver(absl::string_view bytes);
absl::StatusOr<ActivationObserver> DecodeActivationObserver(absl::string_view bytes);
absl::StatusOr<ProducerSequences> DecodeProducerSequences(absl::string_view bytes);

// A shared store's rows of a SessionDelta (core/session/session_delta.h): standalone blobs,
// versioned.
std::string EncodeWeightRow(const MinMaxObserver& observer);
std::string EncodeInputRow(const ActivationObserver& observer);
absl::StatusOr<MinMaxObserver> DecodeWeightRow(absl::string_view bytes);
std::string EncodeInputHistogramRow(const MagnitudeHistogram& histogram);
absl::StatusOr<MagnitudeHistogram> DecodeInputHistogramRow(absl::string_view bytes);
// Also checks every batch id lies in `block` (one batch of group ranges for a group row).
absl::StatusOr<ActivationObserver> DecodeInputRow(absl::string_view bytes, int64_t block);

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_OBSERVER_CODEC_H_
