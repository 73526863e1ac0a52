#include "core/session/producer_ledger.h"

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "core/state/observer_codec.h"
#include "core/state/state_file.h"
#include "gtest/gtest.h"

namespace caliper {
namespace {

TEST(ProducerLedgerTest, ProducerRule) {
  ProducerLedger ledger;
  EXPECT_EQ(ledger.ResumeFrom("p"), 1u);
  EXPECT_EQ(*ledger.Accept("p", 1), SequenceVerdict::kNew);
  EXPECT_EQ(*ledger.Accept("p", 2), SequenceVerdict::kNew);
  EXPECT_EQ(*ledger.Accept("p", 3), SequenceVerdict::kNew);
  EXPECT_EQ(ledger.ResumeFrom("p"), 4u);
  EXPECT_EQ(*ledger.Accept("p", 2), SequenceVerdict::kDuplicate);
  EXPECT_EQ(*ledger.Accept("p", 1), SequenceVerdict::kDuplicate);

  auto gap = ledger.Accept("p", 5);
  EXPECT_EQ(gap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gap.status().message().find("next expected is 4"), std::string::npos) << gap.status();
  EXPECT_EQ(ledger.ResumeFrom("p"), 4u);  // a refused sequence changes nothing

  EXPECT_EQ(ledger.Accept("p", 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ledger.Accept("", 1).status().code(), absl::StatusCode::kInvalidArgument);
  // An unknown producer starting past 1 is a gap too, and is not registered.
  EXPECT_EQ(ledger.Accept("q", 2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger.Snapshot(), (ProducerSequences{{"p", 3}}));
  // Producers are independent.
  EXPECT_EQ(*ledger.Accept("q", 1), SequenceVerdict::kNew);
  EXPECT_EQ(ledger.Snapshot(), (ProducerSequences{{"p", 3}, {"q", 1}}));
}

TEST(ProducerLedgerTest, StreamRuleAndReconnect) {
  ProducerLedger ledger;
  auto first = ledger.OpenStream("rank-0");
  ASSERT_TRUE(first.ok());
  for (uint64_t s = 1; s <= 3; ++s) EXPECT_EQ(*ledger.Accept(*first, s), SequenceVerdict::kNew);

  // Inside one stream, sequences rise by exactly one.
  auto repeat = ledger.Accept(*first, 3);
  EXPECT_EQ(repeat.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(repeat.status().message().find("sent 3 after 3"), std::string::npos);
  EXPECT_EQ(ledger.Accept(*first, 2).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ledger.Accept(*first, 5).status().code(), absl::StatusCode::kFailedPrecondition);

  // Reconnect: the new stream fences the old one and may re-send from its last ack.
  auto second = ledger.OpenStream("rank-0");
  ASSERT_TRUE(second.ok());
  auto fenced = ledger.Accept(*first, 4);
  EXPECT_EQ(fenced.status().code(), absl::StatusCode::kAborted);
  EXPECT_NE(fenced.status().message().find("superseded"), std::string::npos);
  EXPECT_EQ(*ledger.Accept(*second, 2), SequenceVerdict::kDuplicate);
  EXPECT_EQ(*ledger.Accept(*second, 3), SequenceVerdict::kDuplicate);
  EXPECT_EQ(*ledger.Accept(*second, 4), SequenceVerdict::kNew);
  EXPECT_EQ(*ledger.Accept(*second, 5), SequenceVerdict::kNew);
  EXPECT_EQ(ledger.ResumeFrom("rank-0"), 6u);

  // A stream may not start past N + 1.
  auto third = ledger.OpenStream("rank-0");
  EXPECT_EQ(ledger.Accept(*third, 7).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*ledger.Accept(*third, 6), SequenceVerdict::kNew);
  EXPECT_EQ(ledger.OpenStream("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ProducerLedgerTest, DurableMarksAndRestore) {
  ProducerLedger ledger;
  for (uint64_t s = 1; s <= 4; ++s) ASSERT_TRUE(ledger.Accept("a", s).ok());
  ASSERT_TRUE(ledger.Accept("b", 1).ok());
  EXPECT_EQ(ledger.LastDurable("a"), 0u);
  const ProducerSequences snapshot = ledger.Snapshot();
  EXPECT_EQ(snapshot, (ProducerSequences{{"a", 4}, {"b", 1}}));
  ASSERT_TRUE(ledger.Accept("a", 5).ok());  // accepted after the snapshot was taken
  ledger.MarkDurable(snapshot);
  EXPECT_EQ(ledger.LastDurable("a"), 4u);   // not 5: acknowledgement never runs ahead of disk
  EXPECT_EQ(ledger.LastDurable("b"), 1u);
  ledger.MarkDurable({{"a", 2}, {"ghost", 9}});  // older snapshot / unknown producer: no effect
  EXPECT_EQ(ledger.LastDurable("a"), 4u);
  EXPECT_EQ(ledger.LastDurable("ghost"), 0u);
  ledger.MarkDurable({{"b", 7}});  // can never exceed what was accepted
  EXPECT_EQ(ledger.LastDurable("b"), 1u);

  // Restart from the persisted snapshot: sequence 5 was never durable, so it is new again.
  auto decoded = DecodeProducerSequences(EncodeProducerSequences(snapshot));
  ASSERT_TRUE(decoded.ok());
  ProducerLedger restored(*decoded);
  EXPECT_EQ(restored.ResumeFrom("a"), 5u);
  EXPECT_EQ(restored.LastDurable("a"), 4u);
  EXPECT_EQ(*restored.Accept("a", 4), SequenceVerdict::kDuplicate);
  EXPECT_EQ(*restored.Accept("a", 5), SequenceVerdict::kNew);
}

TEST(ProducerLedgerTest, RacingDuplicatesCountEachSequenceOnce) {
  ProducerLedger ledger;
  constexpr uint64_t kChunks = 2000;
  constexpr int kThreads = 6;  // two connections per producer, three producers
  std::atomic<int> fresh[3] = {0, 0, 0};
  std::atomic<int> errors = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string producer = "p" + std::to_string(t % 3);
      for (uint64_t s = 1; s <= kChunks; ++s) {
        // This thread already had s - 1 classified, so N >= s - 1 and s can never be a gap.
        auto verdict = ledger.Accept(producer, s);
        if (!verdict.ok()) ++errors;
        else if (*verdict == SequenceVerdict::kNew) ++fresh[t % 3];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(errors.load(), 0);
  for (int p = 0; p < 3; ++p) EXPECT_EQ(fresh[p].load(), static_cast<int>(kChunks));
  EXPECT_EQ(ledger.Snapshot(), (ProducerSequences{{"p0", kChunks}, {"p1", kChunks}, {"p2", kChunks}}));
}

// The building blocks together: producers stream numbered values into a sum, the "server" saves
// {sum, ledger} atomically every few chunks and acknowledges only what is saved, and it crashes
// at random points (losing everything in memory, sometimes mid-write). The restarted server
// resumes from the state file, clients re-send from ResumeFrom, and the final sum counts every
// chunk exactly once.
TEST(ProducerLedgerTest, CrashAndResumeCountsEveryChunkExactlyOnce) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("caliper-ledger-" + std::to_string(::getpid())))
          .string();
  ASSERT_TRUE(Env::Default()->CreateDirs(dir).ok());
  const std::string path = dir + "/session.state";
  constexpr int kProducers = 3;
  constexpr uint64_t kChunks = 300;
  auto value = [](int producer, uint64_t seq) { return static_cast<int64_t>(seq * 1000 + producer); };
  int64_t expected = 0;
  for (int p = 0; p < kProducers; ++p)
    for (uint64_t s = 1; s <= kChunks; ++s) expected += value(p, s);

  std::mt19937 rng(1234);
  int crashes = 0;
  int64_t sum = 0;
  std::optional<ProducerLedger> ledger;
  ledger.emplace();
  std::vector<uint64_t> acked(kProducers, 0);  // what each client has seen acknowledged
  auto save = [&] {
    StateEncoder out;
    out.PutI64(sum);
    const ProducerSequences snapshot = ledger->Snapshot();
    out.PutProducerSequences(snapshot);
    ASSERT_TRUE(WriteStateFileAtomic(path, out.bytes()).ok());
    ledger->MarkDurable(snapshot);
    for (int p = 0; p < kProducers; ++p) {
      uint64_t durable = ledger->LastDurable("p" + std::to_string(p));
      ASSERT_GE(durable, acked[p]);  // a durable mark never goes back, even across restarts
      acked[p] = durable;
    }
  };
  auto restart = [&] {
    ++crashes;
    auto payload = ReadStateFile(path);
    if (absl::IsNotFound(payload.status())) {
      sum = 0;
      ledger.emplace();
      return;
    }
    ASSERT_TRUE(payload.ok()) << payload.status();
    StateDecoder in(*payload);
    sum = *in.GetI64("sum");
    auto sequences = in.GetProducerSequences("producers");
    ASSERT_TRUE(sequences.ok());
    ASSERT_TRUE(in.ExpectEnd("state").ok());
    ledger.emplace(*sequences);
  };

  while (true) {
    bool all_done = true;
    for (int p = 0; p < kProducers; ++p) all_done &= acked[p] == kChunks;
    if (all_done) break;
    // Each client (re)connects, asks where to resume, and re-sends some already-acked chunks too.
    std::vector<ProducerLedger::Stream> streams;
    std::vector<uint64_t> next(kProducers);
    for (int p = 0; p < kProducers; ++p) {
      const std::string id = "p" + std::to_string(p);
      streams.push_back(*ledger->OpenStream(id));
      uint64_t resume = ledger->ResumeFrom(id);
      ASSERT_GE(resume, acked[p] + 1);
      next[p] = std::max<uint64_t>(1, acked[p] + 1 - std::min<uint64_t>(acked[p], rng() % 3));
    }
    bool crashed = false;
    for (int step = 0; step < 200 && !crashed; ++step) {
      int p = static_cast<int>(rng() % kProducers);
      if (next[p] <= kChunks) {
        auto verdict = ledger->Accept(streams[p], next[p]);
        ASSERT_TRUE(verdict.ok()) << verdict.status();
        if (*verdict == SequenceVerdict::kNew) sum += value(p, next[p]);
        ++next[p];
      }
      if (rng() % 13 == 0) save();
      if (rng() % 97 == 0) {
        if (rng() % 2 == 0) {
          // Die mid-write: a partial temp file is left behind and must never be loaded.
          std::string partial = FrameStatePayload("garbage that is never committed");
          auto file = Env::Default()->NewWritableFile(path + std::string(kStateTempMarker) + "x");
          ASSERT_TRUE(file.ok());
          ASSERT_TRUE((*file)->Append(partial.substr(0, rng() % partial.size())).ok());
        }
        restart();
        ASSERT_TRUE(RemoveLeftoverTempFiles(dir).ok());
        crashed = true;
      }
    }
    if (!crashed) save();
  }
  EXPECT_EQ(sum, expected);
  EXPECT_GE(crashes, 5);  // the random crashes really happened
  RecordProperty("crashes", crashes);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace caliper
