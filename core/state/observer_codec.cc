#include "core/state/observer_codec.h"

#include <bit>
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/limits/utf8.h"

namespace caliper {
namespace {

constexpr uint8_t kTagKvLayer = 'K';
constexpr uint8_t kTagMinMax = 'M';
constexpr uint8_t kTagActivation = 'A';
constexpr uint8_t kTagProducers = 'P';
constexpr uint8_t kTagHistogram = 'H';

constexpr size_t kMinMaxBytes = 4 + 4 + 8;

absl::Status Invalid(absl::string_view field, int64_t index, absl::string_view what) {
  if (index < 0) return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
  return absl::InvalidArgumentError(absl::StrCat(field, "[", index, "]: ", what));
}

absl::Status CheckMinMax(const MinMaxObserver& observer, absl::string_view field, int64_t index) {
  if (std::isnan(observer.min)) return Invalid(field, index, "min is NaN");
  if (std::isnan(observer.max)) return Invalid(field, index, "max is NaN");
  if (observer.observations < 0) {
    return Invalid(field, index, absl::StrCat("observations is negative (", observer.observations, ")"));
  }
  return absl::OkStatus();
}

// The newest version a tag's body has: versions 2 and 3 extended K/V layers and activations,
// version 4 K/V layers; the others keep version 1 (unchanged bytes).
uint8_t VersionOf(uint8_t tag) {
  return tag == kTagKvLayer ? kObserverCodecVersion : tag == kTagActivation ? 3 : 1;
}

// `version`: what the body was written as (0: VersionOf(tag)).
std::string Standalone(uint8_t tag, const StateEncoder& body, uint8_t version = 0) {
  std::string out;
  out.reserve(2 + body.bytes().size());
  out.push_back(static_cast<char>(tag));
  out.push_back(static_cast<char>(version == 0 ? VersionOf(tag) : version));
  out += body.bytes();
  return out;
}

absl::Status ExpectHeader(StateDecoder& in, uint8_t tag, absl::string_view field) {
  absl::StatusOr<uint8_t> got_tag = in.GetU8(absl::StrCat(field, ".tag"));
  if (!got_tag.ok()) return got_tag.status();
  if (*got_tag != tag) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".tag: expected '",
                                                   std::string(1, static_cast<char>(tag)),
                                                   "', got byte ", *got_tag));
  }
  absl::StatusOr<uint8_t> version = in.GetU8(absl::StrCat(field, ".version"));
  if (!version.ok()) return version.status();
  if (*version < 1 || *version > VersionOf(tag)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".version: ", *version, " is not supported (expected ",
        VersionOf(tag) == 1 ? "1" : absl::StrCat("1 to ", VersionOf(tag)), ")"));
  }
  in.set_codec_version(*version);
  return absl::OkStatus();
}

template <typename T, typename GetBody>
absl::StatusOr<T> DecodeStandalone(absl::string_view bytes, uint8_t tag, absl::string_view field,
                                   GetBody get_body) {
  StateDecoder in(bytes);
  absl::Status header = ExpectHeader(in, tag, field);
  if (!header.ok()) return header;
  absl::StatusOr<T> body = get_body(in);
  if (!body.ok()) return body.status();
  absl::Status end = in.ExpectEnd(field);
  if (!end.ok()) return end;
  return body;
}

}  // namespace

// ---- StateEncoder ----

void StateEncoder::PutU8(uint8_t value) { out_.push_back(static_cast<char>(value)); }

void StateEncoder::PutU32(uint32_t value) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void StateEncoder::PutU64(uint64_t value) {
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void StateEncoder::PutI64(int64_t value) { PutU64(static_cast<uint64_t>(value)); }
void StateEncoder::PutF32(float value) { PutU32(std::bit_cast<uint32_t>(value)); }
void StateEncoder::PutF64(double value) { PutU64(std::bit_cast<uint64_t>(value)); }

void StateEncoder::PutString(absl::string_view value) {
  PutU32(static_cast<uint32_t>(value.size()));
  out_.append(value.data(), value.size());
}

void StateEncoder::PutKvLayer(const KvLayerObserver& observer, bool query) {
  for (const std::vector<float>* absmax : {&observer.k_absmax, &observer.v_absmax}) {
    PutU32(static_cast<uint32_t>(absmax->size()));
    for (float v : *absmax) PutF32(v);
  }
  for (const std::vector<int64_t>* tokens : {&observer.k_tokens, &observer.v_tokens}) {
    PutU32(static_cast<uint32_t>(tokens->size()));
    for (int64_t v : *tokens) PutI64(v);
  }
  PutBatchRanges(observer.k_batches);
  PutBatchRanges(observer.v_batches);
  PutI64(observer.k_rank0_tokens);
  PutI64(observer.v_rank0_tokens);
  if (!query) return;
  PutU32(static_cast<uint32_t>(observer.q_absmax.size()));
  for (float v : observer.q_absmax) PutF32(v);
  PutU32(static_cast<uint32_t>(observer.q_tokens.size()));
  for (int64_t v : observer.q_tokens) PutI64(v);
  PutBatchRanges(observer.q_batches);
}

void StateEncoder::PutKvHistograms(const KvLayerObserver& observer, bool query) {
  for (const std::vector<MagnitudeHistogram>* hists : {&observer.k_hist, &observer.v_hist}) {
    PutU32(static_cast<uint32_t>(hists->size()));
    for (const MagnitudeHistogram& h : *hists) PutHistogram(h);
  }
  if (!query) return;
  PutU32(static_cast<uint32_t>(observer.q_hist.size()));
  for (const MagnitudeHistogram& h : observer.q_hist) PutHistogram(h);
}

void StateEncoder::PutBatchRanges(const std::map<int64_t, GroupRanges>& batches) {
  PutU32(static_cast<uint32_t>(batches.size()));
  for (const auto& [batch, ranges] : batches) {
    PutI64(batch);
    const size_t n = std::min(ranges.min.size(), ranges.max.size());
    PutU32(static_cast<uint32_t>(n));
    for (size_t g = 0; g < n; ++g) {
      PutF32(ranges.min[g]);
      PutF32(ranges.max[g]);
    }
  }
}

// A histogram's first byte: absent, or present with this many mantissa bits per bin (1, from
// servers with 16 bins per octave, meant 4).
constexpr uint8_t kHistogramAbsent = 0;
constexpr uint8_t kHistogramCoarse = 1;

void StateEncoder::PutHistogram(const MagnitudeHistogram& histogram) {
  PutU8(histogram.empty() ? kHistogramAbsent : MagnitudeHistogram::kMantissaBits);
  if (histogram.empty()) return;
  PutF32(histogram.max);
  PutU64(histogram.max_count);
  uint32_t nonzero = 0;
  for (uint64_t c : histogram.counts) nonzero += c != 0;
  PutU32(nonzero);
  for (size_t s = 0; s < histogram.counts.size(); ++s) {
    if (histogram.counts[s] == 0) continue;
    PutU32(static_cast<uint32_t>(s));
    PutU64(histogram.counts[s]);
  }
}

void StateEncoder::PutMinMax(const MinMaxObserver& observer) {
  PutF32(observer.min);
  PutF32(observer.max);
  PutI64(observer.observations);
}

void StateEncoder::PutActivation(const ActivationObserver& observer) {
  PutU32(static_cast<uint32_t>(observer.batches.size()));
  for (const auto& [batch, stats] : observer.batches) {
    PutI64(batch);
    PutMinMax(stats);
  }
  PutBatchRanges(observer.group_batches);
}

void StateEncoder::PutProducerSequences(const ProducerSequences& sequences) {
  PutU32(static_cast<uint32_t>(sequences.size()));
  for (const auto& [producer, sequence] : sequences) {
    PutString(producer);
    PutU64(sequence);
  }
}

// ---- StateDecoder ----

absl::Status StateDecoder::Need(absl::string_view field, size_t bytes) const {
  if (remaining() >= bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ": truncated at byte ", pos_, " (need ",
                                                 bytes, " bytes, ", remaining(), " left)"));
}

uint64_t StateDecoder::ReadLittleEndian(size_t bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes; ++i) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(in_[pos_ + i])) << (8 * i);
  }
  pos_ += bytes;
  return value;
}

absl::StatusOr<uint8_t> StateDecoder::GetU8(absl::string_view field) {
  if (absl::Status s = Need(field, 1); !s.ok()) return s;
  return static_cast<uint8_t>(ReadLittleEndian(1));
}

absl::StatusOr<uint32_t> StateDecoder::GetU32(absl::string_view field) {
  if (absl::Status s = Need(field, 4); !s.ok()) return s;
  return static_cast<uint32_t>(ReadLittleEndian(4));
}

absl::StatusOr<uint64_t> StateDecoder::GetU64(absl::string_view field) {
  if (absl::Status s = Need(field, 8); !s.ok()) return s;
  return ReadLittleEndian(8);
}

absl::StatusOr<int64_t> StateDecoder::GetI64(absl::string_view field) {
  absl::StatusOr<uint64_t> raw = GetU64(field);
  if (!raw.ok()) return raw.status();
  return static_cast<int64_t>(*raw);
}

absl::StatusOr<float> StateDecoder::GetF32(absl::string_view field) {
  absl::StatusOr<uint32_t> raw = GetU32(field);
  if (!raw.ok()) return raw.status();
  return std::bit_cast<float>(*raw);
}

absl::StatusOr<double> StateDecoder::GetF64(absl::string_view field) {
  absl::StatusOr<uint64_t> raw = GetU64(field);
  if (!raw.ok()) return raw.status();
  return std::bit_cast<double>(*raw);
}

absl::StatusOr<std::string> StateDecoder::GetString(absl::string_view field) {
  absl::StatusOr<uint32_t> size = GetCount(field, 1);
  if (!size.ok()) return size.status();
  const absl::string_view text = in_.substr(pos_, *size);
  // Every string in a state file is text a reply will carry: invalid UTF-8 would make those
  // replies undecodable for clients, so the file is refused instead.
  if (absl::Status s = CheckUtf8(field, text); !s.ok()) return s;
  pos_ += *size;
  return std::string(text);
}

absl::StatusOr<uint32_t> StateDecoder::GetCount(absl::string_view field, size_t min_item_bytes) {
  absl::StatusOr<uint32_t> count = GetU32(field);
  if (!count.ok()) return count.status();
  // A garbage count must fail here, before anyone allocates for it.
  if (static_cast<uint64_t>(*count) * min_item_bytes > remaining()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": count ", *count, " needs at least ",
        static_cast<uint64_t>(*count) * min_item_bytes, " bytes but only ", remaining(),
        " are left (truncated or corrupt)"));
  }
  return *count;
}

absl::StatusOr<KvLayerObserver> StateDecoder::GetKvLayer(absl::string_view field) {
  KvLayerObserver out;
  struct FloatArray {
    const char* name;
    std::vector<float>* values;
  };
  for (FloatArray array : {FloatArray{"k_absmax", &out.k_absmax},
                           FloatArray{"v_absmax", &out.v_absmax}}) {
    const std::string name = absl::StrCat(field, ".", array.name);
    absl::StatusOr<uint32_t> count = GetCount(name, 4);
    if (!count.ok()) return count.status();
    array.values->resize(*count);
    for (uint32_t i = 0; i < *count; ++i) {
      const float v = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
      if (!std::isfinite(v)) return Invalid(name, i, "not finite");
      if (v < 0) return Invalid(name, i, absl::StrCat("negative absmax ", v));
      (*array.values)[i] = v;
    }
  }
  struct CountArray {
    const char* name;
    std::vector<int64_t>* values;
  };
  for (CountArray array : {CountArray{"k_tokens", &out.k_tokens},
                           CountArray{"v_tokens", &out.v_tokens}}) {
    const std::string name = absl::StrCat(field, ".", array.name);
    absl::StatusOr<uint32_t> count = GetCount(name, 8);
    if (!count.ok()) return count.status();
    array.values->resize(*count);
    for (uint32_t i = 0; i < *count; ++i) {
      const int64_t v = static_cast<int64_t>(ReadLittleEndian(8));
      if (v < 0) return Invalid(name, i, absl::StrCat("negative token count ", v));
      (*array.values)[i] = v;
    }
  }
  if (codec_version_ >= 2) {
    for (auto [name, batches] : {std::pair{"k_batches", &out.k_batches},
                                 std::pair{"v_batches", &out.v_batches}}) {
      absl::StatusOr<std::map<int64_t, GroupRanges>> got =
          GetBatchRanges(absl::StrCat(field, ".", name));
      if (!got.ok()) return got.status();
      *batches = *std::move(got);
    }
  }
  if (codec_version_ >= 3) {
    for (auto [name, count] : {std::pair{"k_rank0_tokens", &out.k_rank0_tokens},
                               std::pair{"v_rank0_tokens", &out.v_rank0_tokens}}) {
      absl::StatusOr<int64_t> value = GetI64(absl::StrCat(field, ".", name));
      if (!value.ok()) return value.status();
      if (*value < 0) {
        return Invalid(absl::StrCat(field, ".", name), -1,
                       absl::StrCat("negative token count ", *value));
      }
      *count = *value;
    }
  }
  if (codec_version_ >= 4) {
    const std::string absmax_name = absl::StrCat(field, ".q_absmax");
    absl::StatusOr<uint32_t> count = GetCount(absmax_name, 4);
    if (!count.ok()) return count.status();
    if (*count != out.k_absmax.size()) {
      return absl::InvalidArgumentError(absl::StrCat(absmax_name, ": ", *count,
                                                     " entries, expected num_kv_heads=",
                                                     out.k_absmax.size()));
    }
    out.q_absmax.resize(*count);
    for (uint32_t i = 0; i < *count; ++i) {
      const float v = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
      if (!std::isfinite(v)) return Invalid(absmax_name, i, "not finite");
      if (v < 0) return Invalid(absmax_name, i, absl::StrCat("negative absmax ", v));
      out.q_absmax[i] = v;
    }
    const std::string tokens_name = absl::StrCat(field, ".q_tokens");
    count = GetCount(tokens_name, 8);
    if (!count.ok()) return count.status();
    if (*count != out.q_absmax.size()) {
      return absl::InvalidArgumentError(absl::StrCat(tokens_name, ": ", *count,
                                                     " entries, expected ", out.q_absmax.size()));
    }
    out.q_tokens.resize(*count);
    for (uint32_t i = 0; i < *count; ++i) {
      const int64_t v = static_cast<int64_t>(ReadLittleEndian(8));
      if (v < 0) return Invalid(tokens_name, i, absl::StrCat("negative token count ", v));
      out.q_tokens[i] = v;
    }
    absl::StatusOr<std::map<int64_t, GroupRanges>> got =
        GetBatchRanges(absl::StrCat(field, ".q_batches"));
    if (!got.ok()) return got.status();
    out.q_batches = *std::move(got);
  }
  return out;
}

absl::Status StateDecoder::GetKvHistograms(absl::string_view field, KvLayerObserver* observer) {
  const size_t heads = observer->k_absmax.size();
  for (int kv = 0; kv < (codec_version_ >= 4 ? 3 : 2); ++kv) {
    const std::string name =
        absl::StrCat(field, ".", kv == 0 ? "k_hist" : kv == 1 ? "v_hist" : "q_hist");
    absl::StatusOr<uint32_t> count = GetCount(name, 1);
    if (!count.ok()) return count.status();
    if (*count != 0 && *count != heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, ": ", *count, " histograms, expected 0 or num_kv_heads=", heads));
    }
    std::vector<MagnitudeHistogram>& hists =
        kv == 0 ? observer->k_hist : kv == 1 ? observer->v_hist : observer->q_hist;
    hists.resize(*count);
    for (uint32_t h = 0; h < *count; ++h) {
      absl::StatusOr<MagnitudeHistogram> hist = GetHistogram(absl::StrCat(name, "[", h, "]"));
      if (!hist.ok()) return hist.status();
      hists[h] = *std::move(hist);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<int64_t, GroupRanges>> StateDecoder::GetBatchRanges(
    absl::string_view field) {
  absl::StatusOr<uint32_t> count = GetCount(field, 8 + 4);
  if (!count.ok()) return count.status();
  std::map<int64_t, GroupRanges> out;
  int64_t previous = 0;
  for (uint32_t i = 0; i < *count; ++i) {
    // Entries vary in size: every read is checked (the count guaranteed only the smallest).
    absl::StatusOr<int64_t> got_batch = GetI64(absl::StrCat(field, "[", i, "].batch"));
    if (!got_batch.ok()) return got_batch.status();
    const int64_t batch = *got_batch;
    if (i > 0 && batch <= previous) {
      return Invalid(field, i, absl::StrCat("batch id ", batch, " not above the previous ",
                                            previous, " (duplicate or out of order)"));
    }
    previous = batch;
    const std::string groups_field = absl::StrCat(field, "[", i, "].groups");
    absl::StatusOr<uint32_t> groups = GetCount(groups_field, 8);
    if (!groups.ok()) return groups.status();
    GroupRanges ranges;
    ranges.min.resize(*groups);
    ranges.max.resize(*groups);
    for (uint32_t g = 0; g < *groups; ++g) {
      const float lo = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
      const float hi = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
      const bool unobserved = lo == std::numeric_limits<float>::infinity() &&
                              hi == -std::numeric_limits<float>::infinity();
      if (!unobserved && !(std::isfinite(lo) && std::isfinite(hi) && lo <= hi)) {
        return Invalid(groups_field, g, absl::StrCat("min ", lo, " / max ", hi,
                                                     " is not a finite range"));
      }
      ranges.min[g] = lo;
      ranges.max[g] = hi;
    }
    out.emplace_hint(out.end(), batch, std::move(ranges));
  }
  return out;
}

absl::StatusOr<MagnitudeHistogram> StateDecoder::GetHistogram(absl::string_view field) {
  MagnitudeHistogram out;
  absl::StatusOr<uint8_t> present = GetU8(absl::StrCat(field, ".present"));
  if (!present.ok()) return present.status();
  if (*present == kHistogramCoarse) {
    return Invalid(field, -1,
                   absl::StrCat("histogram of 16 bins per octave, written by an older server; "
                                "this server keeps ", MagnitudeHistogram::kBinsPerOctave,
                                " and cannot refine it: finish the session with the server that "
                                "started it, or start it again"));
  }
  if (*present != kHistogramAbsent && *present != MagnitudeHistogram::kMantissaBits) {
    return Invalid(field, -1, absl::StrCat("present flag ", *present, " is not 0 or ",
                                           MagnitudeHistogram::kMantissaBits));
  }
  if (*present == kHistogramAbsent) return out;
  absl::StatusOr<float> max = GetF32(absl::StrCat(field, ".max"));
  if (!max.ok()) return max.status();
  absl::StatusOr<uint64_t> max_count = GetU64(absl::StrCat(field, ".max_count"));
  if (!max_count.ok()) return max_count.status();
  const std::string name = absl::StrCat(field, ".bins");
  absl::StatusOr<uint32_t> count = GetCount(name, 12);
  if (!count.ok()) return count.status();
  out.counts.assign(MagnitudeHistogram::kSlots, 0);
  out.max = *max;
  out.max_count = *max_count;
  int64_t previous = -1;
  for (uint32_t i = 0; i < *count; ++i) {
    const int64_t slot = static_cast<int64_t>(ReadLittleEndian(4));
    const uint64_t c = ReadLittleEndian(8);
    if (slot <= previous || slot >= MagnitudeHistogram::kSlots) {
      return Invalid(name, i, absl::StrCat("slot ", slot, " out of order or range"));
    }
    if (c == 0) return Invalid(name, i, "zero count stored");
    out.counts[slot] = c;
    previous = slot;
  }
  const std::string name_z(field);
  if (absl::Status s = out.Validate(name_z.c_str()); !s.ok()) return s;
  return out;
}

absl::StatusOr<MinMaxObserver> StateDecoder::GetMinMax(absl::string_view field) {
  if (absl::Status s = Need(field, kMinMaxBytes); !s.ok()) return s;
  MinMaxObserver out;
  out.min = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
  out.max = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
  out.observations = static_cast<int64_t>(ReadLittleEndian(8));
  if (absl::Status s = CheckMinMax(out, field, -1); !s.ok()) return s;
  return out;
}

absl::StatusOr<ActivationObserver> StateDecoder::GetActivation(absl::string_view field) {
  const std::string name = absl::StrCat(field, ".batches");
  absl::StatusOr<uint32_t> count = GetCount(name, 8 + kMinMaxBytes);
  if (!count.ok()) return count.status();
  ActivationObserver out;
  int64_t previous = 0;
  for (uint32_t i = 0; i < *count; ++i) {
    const int64_t batch = static_cast<int64_t>(ReadLittleEndian(8));
    if (i > 0 && batch <= previous) {
      return Invalid(name, i, absl::StrCat("batch id ", batch, " not above the previous ",
                                           previous, " (duplicate or out of order)"));
    }
    previous = batch;
    MinMaxObserver stats;
    stats.min = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
    stats.max = std::bit_cast<float>(static_cast<uint32_t>(ReadLittleEndian(4)));
    stats.observations = static_cast<int64_t>(ReadLittleEndian(8));
    if (absl::Status s = CheckMinMax(stats, name, i); !s.ok()) return s;
    out.batches.emplace_hint(out.batches.end(), batch, stats);
  }
  if (codec_version_ >= 2) {
    absl::StatusOr<std::map<int64_t, GroupRanges>> groups =
        GetBatchRanges(absl::StrCat(field, ".group_batches"));
    if (!groups.ok()) return groups.status();
    out.group_batches = *std::move(groups);
  }
  return out;
}

absl::StatusOr<ProducerSequences> StateDecoder::GetProducerSequences(absl::string_view field) {
  absl::StatusOr<uint32_t> count = GetCount(field, 4 + 8);
  if (!count.ok()) return count.status();
  ProducerSequences out;
  for (uint32_t i = 0; i < *count; ++i) {
    const std::string item = absl::StrCat(field, "[", i, "]");
    absl::StatusOr<std::string> producer = GetString(absl::StrCat(item, ".producer_id"));
    if (!producer.ok()) return producer.status();
    if (!out.empty() && *producer <= out.rbegin()->first) {
      return absl::InvalidArgumentError(
          absl::StrCat(item, ".producer_id: not above the previous id (duplicate or unsorted)"));
    }
    absl::StatusOr<uint64_t> sequence = GetU64(absl::StrCat(item, ".sequence"));
    if (!sequence.ok()) return sequence.status();
    out.emplace_hint(out.end(), std::move(*producer), *sequence);
  }
  return out;
}

absl::Status StateDecoder::ExpectEnd(absl::string_view field) const {
  if (remaining() == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": ", remaining(), " unexpected bytes after the end at byte ", pos_));
}

// ---- Standalone blobs ----

std::string EncodeKvLayerObserver(const KvLayerObserver& observer) {
  // A layer without the query keeps its version-3 bytes.
  const bool query = !observer.q_absmax.empty() || !observer.q_tokens.empty() ||
                     !observer.q_hist.empty() || !observer.q_batches.empty();
  StateEncoder body;
  body.PutKvLayer(observer, query);
  body.PutKvHistograms(observer, query);
  return Standalone(kTagKvLayer, body, query ? 4 : 3);
}

std::string EncodeHistogram(const MagnitudeHistogram& histogram) {
  StateEncoder body;
  body.PutHistogram(histogram);
  return Standalone(kTagHistogram, body);
}

absl::StatusOr<MagnitudeHistogram> DecodeHistogram(absl::string_view bytes) {
  return DecodeStandalone<MagnitudeHistogram>(
      bytes, kTagHistogram, "histogram",
      [](StateDecoder& in) { return in.GetHistogram("histogram"); });
}

std::string EncodeMinMaxObserver(const MinMaxObserver& observer) {
  StateEncoder body;
  body.PutMinMax(observer);
  return Standalone(kTagMinMax, body);
}

std::string EncodeActivationObserver(const ActivationObserver& observer) {
  StateEncoder body;
  body.PutActivation(observer);
  return Standalone(kTagActivation, body);
}

std::string EncodeProducerSequences(const ProducerSequences& sequences) {
  StateEncoder body;
  body.PutProducerSequences(sequences);
  return Standalone(kTagProducers, body);
}

absl::StatusOr<KvLayerObserver> DecodeKvLayerObserver(absl::string_view bytes) {
  return DecodeStandalone<KvLayerObserver>(
      bytes, kTagKvLayer, "kv_layer", [](StateDecoder& in) -> absl::StatusOr<KvLayerObserver> {
        absl::StatusOr<KvLayerObserver> layer = in.GetKvLayer("kv_layer");
        if (!layer.ok() || in.codec_version() < 2) return layer;
        if (absl::Status s = in.GetKvHistograms("kv_layer", &*layer); !s.ok()) return s;
        if (in.codec_version() >= 4 && layer->q_absmax.empty() && layer->q_hist.empty() &&
            layer->q_batches.empty()) {
          // Encoding is canonical: a layer without a query is written as version 2.
          return absl::InvalidArgumentError(
              "kv_layer.version: 4 without a query (such a layer is version 3)");
        }
        return layer;
      });
}

absl::StatusOr<MinMaxObserver> DecodeMinMaxObserver(absl::string_view bytes) {
  return DecodeStandalone<MinMaxObserver>(
      bytes, kTagMinMax, "minmax", [](StateDecoder& in) { return in.GetMinMax("minmax"); });
}

absl::StatusOr<ActivationObserver> DecodeActivationObserver(absl::string_view bytes) {
  return DecodeStandalone<ActivationObserver>(
      bytes, kTagActivation, "activation",
      [](StateDecoder& in) { return in.GetActivation("activation"); });
}

absl::StatusOr<ProducerSequences> DecodeProducerSequences(absl::string_view bytes) {
  return DecodeStandalone<ProducerSequences>(
      bytes, kTagProducers, "producers",
      [](StateDecoder& in) { return in.GetProducerSequences("producers"); });
}

std::string EncodeWeightRow(const MinMaxObserver& observer) {
  return EncodeMinMaxObserver(observer);
}

std::string EncodeInputRow(const ActivationObserver& observer) {
  return EncodeActivationObserver(observer);
}

absl::StatusOr<MinMaxObserver> DecodeWeightRow(absl::string_view bytes) {
  return DecodeMinMaxObserver(bytes);
}

std::string EncodeInputHistogramRow(const MagnitudeHistogram& histogram) {
  return EncodeHistogram(histogram);
}

absl::StatusOr<MagnitudeHistogram> DecodeInputHistogramRow(absl::string_view bytes) {
  return DecodeHistogram(bytes);
}

absl::StatusOr<ActivationObserver> DecodeInputRow(absl::string_view bytes, int64_t block) {
  absl::StatusOr<ActivationObserver> observer = DecodeActivationObserver(bytes);
  if (!observer.ok()) return observer.status();
  if (IsGroupRow(block)) {
    if (!observer->batches.empty() || observer->group_batches.size() != 1 ||
        GroupRowOf(observer->group_batches.begin()->first) != block) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input row ", block, ": a group row holds the group ranges of batch ", -3 - block,
          " only"));
    }
    return observer;
  }
  for (const auto& [batch, stats] : observer->batches) {
    if (batch < 0 || ActivationBlockOf(batch) != block) {
      return absl::InvalidArgumentError(
          absl::StrCat("input row: batch ", batch, " does not belong to block ", block));
    }
  }
  for (const auto& [batch, ranges] : observer->group_batches) {
    if (batch < 0 || ActivationBlockOf(batch) != block) {
      return absl::InvalidArgumentError(absl::StrCat("input row: group batch ", batch,
                                                     " does not belong to block ", block));
    }
  }
  return observer;
}

}  // namespace caliper
