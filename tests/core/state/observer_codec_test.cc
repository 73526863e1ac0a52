#include "core/state/observer_codec.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace caliper {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> out;
  for (float v : values) out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

KvLayerObserver SampleKvLayer() {
  KvLayerObserver kv(4);
  kv.k_absmax = {0.0f, -0.0f, 3.5f, std::numeric_limits<float>::max()};
  kv.v_absmax = {std::numeric_limits<float>::denorm_min(), 1e-30f, 448.0f, 0.1f};
  kv.k_tokens = {0, 1, 1'000'000'007, std::numeric_limits<int64_t>::max()};
  kv.v_tokens = {5, 6, 7, 8};
  return kv;
}

void ExpectSameMinMax(const MinMaxObserver& a, const MinMaxObserver& b) {
  EXPECT_EQ(std::bit_cast<uint32_t>(a.min), std::bit_cast<uint32_t>(b.min));
  EXPECT_EQ(std::bit_cast<uint32_t>(a.max), std::bit_cast<uint32_t>(b.max));
  EXPECT_EQ(a.observations, b.observations);
}

TEST(ObserverCodecTest, MinMaxGoldenBytes) {
  MinMaxObserver mm;
  mm.min = -1.5f;   // 0xBFC00000
  mm.max = 2.0f;    // 0x40000000
  mm.observations = 0x0102;
  const std::string expected("M\x01"
                             "\x00\x00\xC0\xBF"
                             "\x00\x00\x00\x40"
                             "\x02\x01\x00\x00\x00\x00\x00\x00",
                             18);
  EXPECT_EQ(EncodeMinMaxObserver(mm), expected);
  auto back = DecodeMinMaxObserver(expected);
  ASSERT_TRUE(back.ok()) << back.status();
  ExpectSameMinMax(*back, mm);
}

TEST(ObserverCodecTest, ProducerGoldenBytes) {
  ProducerSequences seqs{{"ab", 0x0A0B}};
  const std::string expected("P\x01"
                             "\x01\x00\x00\x00"                  // count
                             "\x02\x00\x00\x00" "ab"             // id
                             "\x0B\x0A\x00\x00\x00\x00\x00\x00",  // sequence
                             20);
  EXPECT_EQ(EncodeProducerSequences(seqs), expected);
}

TEST(ObserverCodecTest, KvLayerRoundTripIsBitExact) {
  KvLayerObserver kv = SampleKvLayer();
  kv.k_rank0_tokens = 1'000'000'007;
  kv.v_rank0_tokens = 3;
  const std::string bytes = EncodeKvLayerObserver(kv);
  // + two empty batch maps (version 2), the two rank 0 counts (version 3) and two empty
  // histogram lists.
  EXPECT_EQ(bytes.size(), 2 + 2 * (4 + 4 * 4) + 2 * (4 + 4 * 8) + 2 * 4 + 2 * 8 + 2 * 4);
  auto back = DecodeKvLayerObserver(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Bits(back->k_absmax), Bits(kv.k_absmax));
  EXPECT_TRUE(std::signbit(back->k_absmax[1]));  // -0.0 kept
  EXPECT_EQ(Bits(back->v_absmax), Bits(kv.v_absmax));
  EXPECT_EQ(back->k_tokens, kv.k_tokens);
  EXPECT_EQ(back->v_tokens, kv.v_tokens);
  EXPECT_EQ(back->k_rank0_tokens, 1'000'000'007);
  EXPECT_EQ(back->v_rank0_tokens, 3);
  EXPECT_EQ(EncodeKvLayerObserver(*back), bytes);

  // Version 2 (no rank 0 counts) still decodes, with counts of 0; a negative count is refused.
  std::string v2 = bytes;
  v2[1] = 2;
  v2.erase(v2.size() - 2 * 4 - 2 * 8, 2 * 8);
  auto old = DecodeKvLayerObserver(v2);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->k_tokens, kv.k_tokens);
  EXPECT_EQ(old->k_rank0_tokens, 0);
  EXPECT_EQ(old->v_rank0_tokens, 0);
  kv.v_rank0_tokens = -1;
  const absl::Status negative = DecodeKvLayerObserver(EncodeKvLayerObserver(kv)).status();
  EXPECT_NE(negative.message().find("kv_layer.v_rank0_tokens"), std::string::npos) << negative;

  // Empty and freshly seeded observers too.
  for (int heads : {0, 1, 8}) {
    KvLayerObserver fresh(heads);
    auto again = DecodeKvLayerObserver(EncodeKvLayerObserver(fresh));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->k_absmax.size(), static_cast<size_t>(heads));
    EXPECT_EQ(Bits(again->v_absmax), Bits(fresh.v_absmax));
    EXPECT_EQ(again->v_tokens, fresh.v_tokens);
  }
}

TEST(ObserverCodecTest, EmptyMinMaxKeepsInfinitySeeds) {
  MinMaxObserver empty;
  auto back = DecodeMinMaxObserver(EncodeMinMaxObserver(empty));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->min, kInf);
  EXPECT_EQ(back->max, -kInf);
  EXPECT_EQ(back->observations, 0);
  EXPECT_EQ(back->AbsMax(), 0.0f);

  MinMaxObserver observed;
  observed.Accumulate(RangeStats{-0.0f, 0.25f, 0});
  observed.Accumulate(RangeStats{-3.0f, 1e-40f, 0});
  back = DecodeMinMaxObserver(EncodeMinMaxObserver(observed));
  ASSERT_TRUE(back.ok());
  ExpectSameMinMax(*back, observed);
  EXPECT_EQ(back->AbsMax(), 3.0f);
}

TEST(ObserverCodecTest, ActivationRoundTripKeepsEveryBatchAndResult) {
  ActivationObserver act;
  act.Accumulate(7, RangeStats{-1.0f, 2.0f, 0});
  act.Accumulate(-3, RangeStats{-0.0f, 0.5f, 0});
  act.Accumulate(7, RangeStats{-4.0f, 1.0f, 0});  // pieces of one batch combine
  act.Accumulate(1'000'000'000'000, RangeStats{0.125f, 9.0f, 0});
  act.batches[42];  // a batch with nothing observed: inf seeds
  const std::string bytes = EncodeActivationObserver(act);
  auto back = DecodeActivationObserver(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->batches.size(), act.batches.size());
  for (const auto& [batch, stats] : act.batches) {
    ASSERT_TRUE(back->batches.count(batch)) << batch;
    ExpectSameMinMax(back->batches.at(batch), stats);
  }
  // The order-dependent result is the same, bit for bit.
  for (auto kind : {ActivationObserverKind::kStaticMinMax, ActivationObserverKind::kMinMax}) {
    EXPECT_EQ(std::bit_cast<uint32_t>(back->AbsMax(kind, 0.3)),
              std::bit_cast<uint32_t>(act.AbsMax(kind, 0.3)));
  }
  EXPECT_EQ(EncodeActivationObserver(*back), bytes);
  auto empty = DecodeActivationObserver(EncodeActivationObserver(ActivationObserver{}));
  ASSERT_TRUE(empty.ok());
  EXPECT_TRUE(empty->batches.empty());
}

TEST(ObserverCodecTest, ProducerSequencesRoundTrip) {
  ProducerSequences seqs{{"", 0},
                         {"rank-0", 17},
                         {std::string("bin\0h\xc3\xa9", 7), std::numeric_limits<uint64_t>::max()}};
  auto back = DecodeProducerSequences(EncodeProducerSequences(seqs));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, seqs);
  // State strings are text: invalid UTF-8 is refused (replies carrying it could not be decoded).
  ProducerSequences binary{{std::string("bin\xff", 4), 1}};
  EXPECT_EQ(DecodeProducerSequences(EncodeProducerSequences(binary)).status().message(),
            "producers[0].producer_id: invalid UTF-8 at byte 3");
}

TEST(ObserverCodecTest, EveryTruncationFailsNamingAField) {
  ActivationObserver act;
  act.Accumulate(0, RangeStats{-1.0f, 1.0f, 0});
  act.Accumulate(1, RangeStats{-2.0f, 2.0f, 0});
  const std::vector<std::pair<std::string, std::string>> blobs = {
      {"kv_layer", EncodeKvLayerObserver(SampleKvLayer())},
      {"minmax", EncodeMinMaxObserver(MinMaxObserver{})},
      {"activation", EncodeActivationObserver(act)},
      {"producers", EncodeProducerSequences({{"a", 1}, {"bb", 2}})},
  };
  for (const auto& [name, blob] : blobs) {
    for (size_t keep = 0; keep < blob.size(); ++keep) {
      absl::string_view cut(blob.data(), keep);
      absl::Status status;
      if (name == "kv_layer") status = DecodeKvLayerObserver(cut).status();
      if (name == "minmax") status = DecodeMinMaxObserver(cut).status();
      if (name == "activation") status = DecodeActivationObserver(cut).status();
      if (name == "producers") status = DecodeProducerSequences(cut).status();
      ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << name << " keep " << keep;
      EXPECT_EQ(status.message().substr(0, name.size()), name) << status;
    }
  }
  // The field is the one actually cut: drop the last byte of v_tokens.
  std::string kv = EncodeKvLayerObserver(SampleKvLayer());
  // The (empty) batch maps, the rank 0 counts, the (empty) histogram lists, v_tokens' last byte.
  kv.resize(kv.size() - 33);
  auto status = DecodeKvLayerObserver(kv).status();
  EXPECT_NE(status.message().find("kv_layer.v_tokens"), std::string::npos) << status;
}

// The moving-average observers' per-batch ranges round-trip bit for bit (-0, unobserved
// +inf / -inf seeds included), and version 1 blobs (without them) still decode.
TEST(ObserverCodecTest, BatchRangesRoundTripAndVersionOneStillDecodes) {
  KvLayerObserver kv = SampleKvLayer();
  const float inf = std::numeric_limits<float>::infinity();
  kv.k_batches[3] = GroupRanges{{-0.0f, inf, 1.5f, -2.0f}, {0.0f, -inf, 2.5f, 7.0f}};
  kv.v_batches[-0] = GroupRanges{{-1.0f}, {1.0f}};
  kv.v_batches[1LL << 40] = GroupRanges{{0.25f}, {0.5f}};
  kv.k_hist.resize(kv.k_absmax.size());
  for (float x : {0.5f, -3.0f, 0.0f, 1e-30f}) kv.k_hist[1].Add(x);
  auto back = DecodeKvLayerObserver(EncodeKvLayerObserver(kv));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->k_hist.size(), kv.k_absmax.size());
  EXPECT_EQ(back->k_hist[1].counts, kv.k_hist[1].counts);
  EXPECT_EQ(back->k_hist[1].max, 3.0f);
  EXPECT_TRUE(back->v_hist.empty());
  ASSERT_EQ(back->k_batches.size(), 1u);
  EXPECT_EQ(Bits(back->k_batches.at(3).min), Bits(kv.k_batches.at(3).min));
  EXPECT_EQ(Bits(back->k_batches.at(3).max), Bits(kv.k_batches.at(3).max));
  EXPECT_EQ(back->v_batches.size(), 2u);
  EXPECT_EQ(EncodeKvLayerObserver(*back), EncodeKvLayerObserver(kv));

  ActivationObserver act;
  act.batches[0].Accumulate(RangeStats{-1.0f, 2.0f, 0});
  act.group_batches[0] = GroupRanges{{-1.0f, 0.5f}, {1.0f, 2.0f}};
  auto act_back = DecodeActivationObserver(EncodeActivationObserver(act));
  ASSERT_TRUE(act_back.ok()) << act_back.status();
  EXPECT_EQ(Bits(act_back->group_batches.at(0).max), Bits(act.group_batches.at(0).max));

  // Version 1: the same body without the batch maps.
  std::string v1 = EncodeKvLayerObserver(SampleKvLayer());
  v1[1] = 1;
  v1.resize(v1.size() - 32);  // without the batch maps, rank 0 counts and histogram lists
  auto old = DecodeKvLayerObserver(v1);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(Bits(old->k_absmax), Bits(SampleKvLayer().k_absmax));
  EXPECT_TRUE(old->k_batches.empty());

  // A range that is neither finite nor the unobserved seed, and unsorted batches, are refused.
  KvLayerObserver bad = SampleKvLayer();
  bad.k_batches[0] = GroupRanges{{2.0f}, {1.0f}};
  auto refused = DecodeKvLayerObserver(EncodeKvLayerObserver(bad)).status();
  EXPECT_NE(refused.message().find("kv_layer.k_batches[0].groups[0]"), std::string::npos)
      << refused;
  bad.k_batches[0] = GroupRanges{{std::nanf("")}, {1.0f}};
  EXPECT_FALSE(DecodeKvLayerObserver(EncodeKvLayerObserver(bad)).ok());
}

// Histograms round-trip exactly; one written with 16 bins per octave (present byte 1, by older
// servers) is refused naming the field rather than read into the wrong bins.
TEST(ObserverCodecTest, HistogramRoundTripAndCoarseOnesRefused) {
  MagnitudeHistogram h;
  for (float v : {0.0f, 1e-40f, 0.5f, 1.0f, 1.0f, 3.25f, -7.0f, 448.0f}) h.Add(v);
  const std::string bytes = EncodeHistogram(h);
  ASSERT_EQ(bytes[2], static_cast<char>(MagnitudeHistogram::kMantissaBits));  // tag, version, bins
  absl::StatusOr<MagnitudeHistogram> back = DecodeHistogram(bytes);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->counts, h.counts);
  EXPECT_EQ(back->max, h.max);
  EXPECT_EQ(back->max_count, h.max_count);
  std::string coarse = bytes;
  coarse[2] = 1;
  absl::StatusOr<MagnitudeHistogram> refused = DecodeHistogram(coarse);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("histogram: histogram of 16 bins per octave"),
            std::string::npos)
      << refused.status();
  coarse[2] = 9;
  EXPECT_FALSE(DecodeHistogram(coarse).ok());
  EXPECT_TRUE(DecodeHistogram(EncodeHistogram(MagnitudeHistogram())).ok());  // absent: as before
}

TEST(ObserverCodecTest, HeaderAndTrailingBytesAreChecked) {
  std::string bytes = EncodeMinMaxObserver(MinMaxObserver{});
  std::string wrong_tag = bytes;
  wrong_tag[0] = 'K';
  EXPECT_NE(DecodeMinMaxObserver(wrong_tag).status().message().find("minmax.tag"),
            std::string::npos);
  std::string wrong_version = bytes;
  wrong_version[1] = 2;
  EXPECT_NE(DecodeMinMaxObserver(wrong_version).status().message().find("minmax.version: 2"),
            std::string::npos);
  auto trailing = DecodeMinMaxObserver(bytes + "x").status();
  EXPECT_NE(trailing.message().find("1 unexpected bytes"), std::string::npos) << trailing;
  // A KV blob is not an activation blob.
  EXPECT_FALSE(DecodeActivationObserver(EncodeKvLayerObserver(KvLayerObserver(2))).ok());
}

TEST(ObserverCodecTest, GarbageCountFailsBeforeAllocating) {
  std::string bytes("K\x01\xff\xff\xff\xff", 6);  // k_absmax claims 4 billion heads
  auto status = DecodeKvLayerObserver(bytes).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("kv_layer.k_absmax: count 4294967295"), std::string::npos)
      << status;
  std::string act("A\x01\x00\x00\x00\x80", 6);
  EXPECT_NE(DecodeActivationObserver(act).status().message().find("activation.batches: count"),
            std::string::npos);
}

TEST(ObserverCodecTest, SemanticGarbageIsRejectedNamingTheElement) {
  KvLayerObserver kv(3);
  kv.v_absmax[2] = std::nanf("");
  EXPECT_NE(DecodeKvLayerObserver(EncodeKvLayerObserver(kv)).status().message().find(
                "kv_layer.v_absmax[2]: not finite"),
            std::string::npos);
  kv = KvLayerObserver(3);
  kv.k_absmax[1] = -2.0f;
  EXPECT_NE(DecodeKvLayerObserver(EncodeKvLayerObserver(kv)).status().message().find(
                "kv_layer.k_absmax[1]: negative"),
            std::string::npos);
  kv = KvLayerObserver(3);
  kv.k_tokens[0] = -1;
  EXPECT_NE(DecodeKvLayerObserver(EncodeKvLayerObserver(kv)).status().message().find(
                "kv_layer.k_tokens[0]: negative"),
            std::string::npos);

  MinMaxObserver mm;
  mm.min = std::nanf("");
  EXPECT_NE(DecodeMinMaxObserver(EncodeMinMaxObserver(mm)).status().message().find(
                "minmax: min is NaN"),
            std::string::npos);

  // Batches out of order: swap the two batch ids in an encoded blob.
  ActivationObserver act;
  act.Accumulate(1, RangeStats{0.0f, 1.0f, 0});
  act.Accumulate(2, RangeStats{0.0f, 1.0f, 0});
  std::string bytes = EncodeActivationObserver(act);
  const size_t first_id = 2 + 4, second_id = first_id + 8 + 16;
  ASSERT_EQ(bytes[first_id], 1);
  ASSERT_EQ(bytes[second_id], 2);
  bytes[second_id] = 1;
  EXPECT_NE(DecodeActivationObserver(bytes).status().message().find(
                "activation.batches[1]: batch id 1 not above the previous 1"),
            std::string::npos);

  std::string producers = EncodeProducerSequences({{"a", 1}, {"b", 2}});
  producers[2 + 4 + 4 + 1 + 8 + 4] = 'a';  // second id becomes a duplicate of the first
  EXPECT_NE(DecodeProducerSequences(producers).status().message().find(
                "producers[1].producer_id: not above"),
            std::string::npos);
}

TEST(ObserverCodecTest, ComposesIntoLargerRecords) {
  StateEncoder out;
  out.PutString("session-1");
  out.PutF64(0.01);
  out.PutU32(2);
  out.PutKvLayer(SampleKvLayer());
  out.PutKvLayer(KvLayerObserver(1));
  out.PutProducerSequences({{"r0", 3}});
  const std::string bytes = out.Release();

  StateDecoder in(bytes);
  EXPECT_EQ(*in.GetString("id"), "session-1");
  EXPECT_EQ(*in.GetF64("averaging_constant"), 0.01);
  EXPECT_EQ(*in.GetU32("layers"), 2u);
  EXPECT_EQ(in.GetKvLayer("layers[0]")->k_tokens, SampleKvLayer().k_tokens);
  EXPECT_EQ(in.GetKvLayer("layers[1]")->k_absmax.size(), 1u);
  EXPECT_EQ(in.GetProducerSequences("producers")->at("r0"), 3u);
  EXPECT_TRUE(in.ExpectEnd("session").ok());
  auto missing = in.GetU8("extra");
  EXPECT_NE(missing.status().message().find("extra: truncated"), std::string::npos);
}

// Canonical encoding: whatever random bytes decode successfully re-encode to the same bytes,
// and nothing crashes (the libFuzzer target runs the same property for longer).
TEST(ObserverCodecTest, RandomBytesNeverCrashAndDecodedBlobsAreCanonical) {
  std::mt19937 rng(7);
  int decoded = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string bytes(rng() % 64, '\0');
    for (char& c : bytes) c = static_cast<char>(rng() % 4 == 0 ? rng() : rng() % 3);
    if (!bytes.empty()) bytes[0] = "KMAP"[rng() % 4];
    if (bytes.size() > 1) {
      bytes[1] = bytes[0] == 'K' ? static_cast<char>(3 + rng() % 2) : bytes[0] == 'A' ? 3 : 1;
    }
    if (auto kv = DecodeKvLayerObserver(bytes); kv.ok()) {
      ++decoded;
      EXPECT_EQ(EncodeKvLayerObserver(*kv), bytes);
    }
    if (auto mm = DecodeMinMaxObserver(bytes); mm.ok()) {
      ++decoded;
      EXPECT_EQ(EncodeMinMaxObserver(*mm), bytes);
    }
    if (auto act = DecodeActivationObserver(bytes); act.ok()) {
      ++decoded;
      EXPECT_EQ(EncodeActivationObserver(*act), bytes);
    }
    if (auto p = DecodeProducerSequences(bytes); p.ok()) {
      ++decoded;
      EXPECT_EQ(EncodeProducerSequences(*p), bytes);
    }
  }
  EXPECT_GT(decoded, 50);  // the property was exercised, not vacuous
}

}  // namespace
}  // namespace caliper
