// PartialFlusher against an in-memory StateStore that can fail on purpose: a stream's partial is
// merged on demand and periodically; a merge whose answer is lost (committed, then Unavailable)
// is retried with the same flush number and counts once; a store that is down keeps the delta
// until it is back; a fenced or finalized session fails the partial and drops its chunks.
// Also SessionDelta's row layout and the TakeDelta / ApplyDelta round trip.
#include "core/state/partial_flusher.h"

#include <atomic>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "core/tensor/reduction_backend.h"
#include "core/state/session_state.h"
#include "core/state/observer_codec.h"
#include "gtest/gtest.h"
#include "tests/support/fake_clock_env.h"
#include "tests/support/numbered_chunks.h"

namespace caliper {
namespace {

ModelConfig Model() { return testing::NumberedChunkModel(); }
Recipe AllOn() {
  Recipe r;
  r.nvfp4_weights = true;
  r.nvfp4_activations = true;
  return r;
}

// Observes chunk i (K of layer i % 2, or an input of module "m{i % 3}" at batch 70 * i).
void Observe(CalibrationSession& s, int i, ReductionBackend& backend,
             const ProducerLedger::Stream* producer = nullptr, uint64_t sequence = 0) {
  testing::ObserveNumberedChunk(s, i, backend, producer, sequence > 0 ? sequence : static_cast<uint64_t>(i) + 1);
}

// The committed state is one CalibrationSession; Merge applies a delta once per (partial,
// flush), checks the producer epoch, and fails as told.
class FakeStore final : public StateStore {
 public:
  explicit FakeStore(std::unique_ptr<CalibrationSession> committed)
      : committed_(std::move(committed)) {}
  const std::string& name() const override { return name_; }
  absl::Status CreateSession(const CalibrationSession&, int) override { return Unused(); }
  absl::Status ImportSession(const CalibrationSession&) override { return Unused(); }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadSession(absl::string_view,
                                                                  absl::string_view) override {
    return Unused();
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadEmpty(absl::string_view,
                                                                absl::string_view) override {
    return committed_->EmptyLike();
  }
  absl::StatusOr<SessionStatus> GetStatus(absl::string_view, absl::string_view) override {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_->Status();
  }
  absl::StatusOr<std::vector<SessionStatus>> ListSessions(absl::string_view) override {
    return Unused();
  }
  absl::Status DeleteSession(absl::string_view, absl::string_view) override { return Unused(); }
  absl::Status FinalizeSession(absl::string_view, absl::string_view) override {
    std::lock_guard<std::mutex> lock(mu_);
    finalized_ = true;
    return absl::OkStatus();
  }
  absl::StatusOr<OpenedProducer> OpenProducer(absl::string_view,
                                              absl::string_view producer) override {
    std::lock_guard<std::mutex> lock(mu_);
    OpenedProducer opened;
    opened.epoch = ++epochs_[std::string(producer)];
    opened.committed = sequences_[std::string(producer)];
    return opened;
  }
  absl::StatusOr<uint64_t> CommittedSequence(absl::string_view, absl::string_view,
                                             absl::string_view producer) override {
    std::lock_guard<std::mutex> lock(mu_);
    return sequences_[std::string(producer)];
  }
  absl::Status Merge(absl::string_view, const SessionDelta& delta) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++merges_;
    if (down_) return absl::UnavailableError("state store fake: down");
    uint64_t& mark = marks_[delta.partial_id];
    if (mark >= delta.flush) return absl::OkStatus();
    if (finalized_) return absl::FailedPreconditionError("session is finalized");
    if (delta.producer.has_value() && epochs_[delta.producer->producer_id] != delta.producer->epoch) {
      return absl::AbortedError("superseded");
    }
    if (absl::Status s = committed_->ApplyDelta(delta); !s.ok()) return s;
    if (delta.producer.has_value()) {
      sequences_[delta.producer->producer_id] = delta.producer->sequence;
    }
    mark = delta.flush;
    if (lose_next_answer_) {
      lose_next_answer_ = false;
      return absl::UnavailableError("state store fake: connection lost during COMMIT");
    }
    return absl::OkStatus();
  }
  // One "transaction" per call; each delta as Merge would take it.
  std::vector<absl::Status> MergeAll(absl::string_view id,
                                     const std::vector<const SessionDelta*>& deltas) override {
    ++transactions_;
    deltas_ += static_cast<int>(deltas.size());
    return StateStore::MergeAll(id, deltas);
  }
  void ForgetPartial(absl::string_view, absl::string_view) override { ++forgotten_; }
  absl::Status Ping() override { return absl::OkStatus(); }

  void set_down(bool down) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = down;
  }
  void LoseNextAnswer() {
    std::lock_guard<std::mutex> lock(mu_);
    lose_next_answer_ = true;
  }
  std::string snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    return SnapshotSession(*committed_).bytes;
  }
  int64_t accepted() {
    std::lock_guard<std::mutex> lock(mu_);
    return committed_->Status().accepted_chunks;
  }
  std::atomic<int> forgotten_{0};
  std::atomic<int> transactions_{0}, deltas_{0};  // MergeAll calls, deltas they carried

 private:
  static absl::Status Unused() { return absl::UnimplementedError("not used by the flusher"); }
  std::string name_ = "fake";
  std::mutex mu_;
  std::unique_ptr<CalibrationSession> committed_;
  std::map<std::string, uint64_t> marks_, epochs_, sequences_;
  bool down_ = false, lose_next_answer_ = false, finalized_ = false;
  int merges_ = 0;
};

class PartialFlusherTest : public ::testing::Test {
 protected:
  PartialFlusherTest() {
    auto created = CalibrationSession::Create(Model(), AllOn(), "s1", "", "");
    reference_ = (*created)->EmptyLike();
    store_ = std::make_unique<FakeStore>(*std::move(created));
    // A long interval: only WhenCommitted flushes, so each test decides when.
    flusher_ = std::make_unique<PartialFlusher>(store_.get(), absl::Hours(1));
  }
  absl::Status Commit(const std::shared_ptr<PartialFlusher::Partial>& partial) {
    std::promise<absl::Status> done;
    flusher_->WhenCommitted(partial, [&](absl::Status s) { done.set_value(s); });
    return done.get_future().get();
  }
  std::shared_ptr<CalibrationSession> Partial() {
    return std::shared_ptr<CalibrationSession>(*store_->LoadEmpty("s1", ""));
  }

  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
  std::unique_ptr<CalibrationSession> reference_;
  std::unique_ptr<FakeStore> store_;
  std::unique_ptr<PartialFlusher> flusher_;
};

TEST_F(PartialFlusherTest, TwoPartialsCommitToTheSameStateAsOneSession) {
  std::shared_ptr<CalibrationSession> a = Partial(), b = Partial();
  auto pa = flusher_->Register(a), pb = flusher_->Register(b);
  for (int i = 0; i < 12; ++i) {
    Observe(*reference_, i, *backend_);
    Observe(i % 2 == 0 ? *a : *b, i, *backend_);
    if (i == 5) {
      ASSERT_TRUE(Commit(pa).ok());
    }
  }
  ASSERT_TRUE(Commit(pa).ok());
  ASSERT_TRUE(Commit(pb).ok());
  EXPECT_EQ(store_->accepted(), 12);
  // The committed state is the reference's, bit for bit (observers, counters, identity).
  EXPECT_EQ(store_->snapshot(), SnapshotSession(*reference_).bytes);
  flusher_->Release(pa);
  flusher_->Release(pb);
}

TEST_F(PartialFlusherTest, ASessionsPartialsMergeInOneTransactionPerFlush) {
  // Six streams of one session, three producers among them: each flush pass is one MergeAll
  // carrying every partial's delta, and the result is the one-session state bit for bit.
  constexpr int kStreams = 6;
  std::vector<std::shared_ptr<CalibrationSession>> sessions;
  std::vector<std::shared_ptr<PartialFlusher::Partial>> partials;
  std::vector<std::optional<ProducerLedger::Stream>> streams(kStreams);
  for (int s = 0; s < kStreams; ++s) {
    sessions.push_back(Partial());
    partials.push_back(flusher_->Register(sessions.back()));
    if (s % 2 == 0) {
      const std::string producer = "p" + std::to_string(s);
      absl::StatusOr<OpenedProducer> opened = store_->OpenProducer("s1", producer);
      sessions.back()->RestoreProducers({{producer, opened->committed}});
      streams[s] = *sessions.back()->OpenProducerStream(producer);
      flusher_->BindProducer(partials.back(), *streams[s], opened->epoch);
    }
  }
  std::vector<uint64_t> sequences(kStreams, 0);
  int passes = 0;
  for (int i = 0; i < 60; ++i) {
    const int s = i % kStreams;
    Observe(*reference_, i, *backend_);
    Observe(*sessions[s], i, *backend_, streams[s] ? &*streams[s] : nullptr, ++sequences[s]);
    if (i % 20 == 19) {
      ASSERT_TRUE(Commit(partials[0]).ok());  // one waiter; the pass flushes every partial
      ++passes;
    }
  }
  EXPECT_EQ(store_->transactions_.load(), passes);
  EXPECT_EQ(store_->deltas_.load(), passes * kStreams);
  EXPECT_EQ(store_->accepted(), 60);
  EXPECT_EQ(*store_->CommittedSequence("s1", "", "p2"), 10u);
  EXPECT_EQ(store_->snapshot(), SnapshotSession(*reference_).bytes);

  // A fenced stream fails alone; the others of its transaction are merged.
  ASSERT_TRUE(store_->OpenProducer("s1", "p0").ok());
  for (int s = 0; s < kStreams; ++s) {
    Observe(*sessions[s], 100 + s, *backend_, streams[s] ? &*streams[s] : nullptr,
            ++sequences[s]);
  }
  EXPECT_EQ(Commit(partials[0]).code(), absl::StatusCode::kAborted);
  for (int s = 1; s < kStreams; ++s) EXPECT_TRUE(Commit(partials[s]).ok()) << s;
  EXPECT_EQ(store_->accepted(), 65);
  EXPECT_EQ(store_->transactions_.load(), passes + 1);  // later passes had nothing to merge
  for (auto& partial : partials) flusher_->Release(partial);
}

TEST_F(PartialFlusherTest, ALostCommitAnswerIsRetriedAndCountsOnce) {
  std::shared_ptr<CalibrationSession> a = Partial();
  auto pa = flusher_->Register(a);
  for (int i = 0; i < 4; ++i) Observe(*a, i, *backend_);
  store_->LoseNextAnswer();
  EXPECT_EQ(Commit(pa).code(), absl::StatusCode::kUnavailable);
  for (int i = 4; i < 6; ++i) Observe(*a, i, *backend_);
  ASSERT_TRUE(Commit(pa).ok());  // the lost one again (a no-op), then the new chunks
  EXPECT_EQ(store_->accepted(), 6);
}

TEST_F(PartialFlusherTest, AStoreThatIsDownKeepsTheDeltaUntilItIsBack) {
  std::shared_ptr<CalibrationSession> a = Partial();
  auto pa = flusher_->Register(a);
  for (int i = 0; i < 4; ++i) Observe(*a, i, *backend_);
  store_->set_down(true);
  absl::Status down = Commit(pa);
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(down.message().find("asked for again on resume"), absl::string_view::npos) << down;
  EXPECT_EQ(store_->accepted(), 0);
  store_->set_down(false);
  ASSERT_TRUE(Commit(pa).ok());
  EXPECT_EQ(store_->accepted(), 4);
}

TEST_F(PartialFlusherTest, AFencedProducerStreamFailsAndCountsNothingMore) {
  std::shared_ptr<CalibrationSession> a = Partial();
  auto pa = flusher_->Register(a);
  absl::StatusOr<OpenedProducer> opened = store_->OpenProducer("s1", "p");
  a->RestoreProducers({{"p", opened->committed}});
  absl::StatusOr<ProducerLedger::Stream> stream = a->OpenProducerStream("p");
  flusher_->BindProducer(pa, *stream, opened->epoch);
  for (int i = 0; i < 3; ++i) Observe(*a, i, *backend_, &*stream);
  ASSERT_TRUE(Commit(pa).ok());
  EXPECT_EQ(*store_->CommittedSequence("s1", "", "p"), 3u);
  ASSERT_TRUE(store_->OpenProducer("s1", "p").ok());  // the producer reconnected elsewhere
  for (int i = 3; i < 5; ++i) Observe(*a, i, *backend_, &*stream);
  EXPECT_EQ(Commit(pa).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(flusher_->failure(pa).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store_->accepted(), 3);
  EXPECT_EQ(*store_->CommittedSequence("s1", "", "p"), 3u);
}

TEST_F(PartialFlusherTest, AReleasedPartialIsMergedThenForgotten) {
  std::shared_ptr<CalibrationSession> a = Partial();
  auto pa = flusher_->Register(a);
  for (int i = 0; i < 4; ++i) Observe(*a, i, *backend_);
  ASSERT_TRUE(Commit(pa).ok());
  Observe(*a, 4, *backend_);
  flusher_->Release(pa);
  flusher_->Stop();  // a last pass merges what the released partial still held
  EXPECT_EQ(store_->accepted(), 5);
  EXPECT_EQ(store_->forgotten_.load(), 1);
}

TEST_F(PartialFlusherTest, FlushCommitsEveryPartialOfTheSessionNow) {
  std::shared_ptr<CalibrationSession> a = Partial(), b = Partial();
  auto pa = flusher_->Register(a), pb = flusher_->Register(b);
  for (int i : {0, 2}) Observe(*a, i, *backend_);  // K of layer 0, 2 tokens each (rank 0)
  Observe(*b, 4, *backend_);
  EXPECT_EQ(store_->accepted(), 0);  // the interval is an hour
  ASSERT_TRUE(flusher_->Flush("s1").ok());
  EXPECT_EQ(store_->accepted(), 3);
  // The rank 0 token counts are committed with the statistics, in the same merge.
  absl::StatusOr<SessionStatus> status = store_->GetStatus("s1", "");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->layers[0].k_rank0_tokens, 6);
  EXPECT_EQ(status->layers[0].v_rank0_tokens, 0);
  EXPECT_TRUE(flusher_->Flush("another").ok());  // no partial of it: nothing to wait for
  flusher_->Release(pa);
  flusher_->Release(pb);
  flusher_->Stop();
  EXPECT_TRUE(flusher_->Flush("s1").ok());  // released and merged: nothing left of it
}

TEST_F(PartialFlusherTest, TheIntervalRunsOnTheEnvClock) {
  // An hour's interval on a fake clock: nothing merges until the clock is advanced past it,
  // then the periodic pass merges without a waiter and without anyone sleeping an hour.
  testing_util::FakeClockEnv clock;
  flusher_.reset();
  std::atomic<int> flushes{0};
  flusher_ = std::make_unique<PartialFlusher>(
      store_.get(), absl::Hours(1), [&](const PartialFlusher::FlushEvent&) { ++flushes; },
      &clock);
  std::shared_ptr<CalibrationSession> a = Partial();
  auto pa = flusher_->Register(a);
  for (int i = 0; i < 3; ++i) Observe(*a, i, *backend_);
  while (clock.waits() == 0) std::this_thread::yield();  // the flusher is parked in its wait
  clock.Advance(absl::Minutes(59));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(flushes.load(), 0);
  EXPECT_EQ(store_->accepted(), 0);
  clock.Advance(absl::Minutes(1));
  for (int spins = 0; store_->accepted() < 3 && spins < 5000; ++spins) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(store_->accepted(), 3);
  EXPECT_GE(flushes.load(), 1);
  flusher_->Release(pa);
  flusher_.reset();  // stops the thread before the clock it waits on goes away
}

TEST(SessionDeltaTest, TakeDeltaThenApplyDeltaRebuildsTheSessionExactly) {
  auto backend = MakeCpuBackend(1);
  auto whole = *CalibrationSession::Create(Model(), AllOn(), "s", "", "");
  std::unique_ptr<CalibrationSession> rebuilt = whole->EmptyLike();
  auto partial = whole->EmptyLike();
  for (int i = 0; i < 9; ++i) {
    Observe(*whole, i, *backend);
    Observe(*partial, i, *backend);
    if (i % 3 == 2) {
      ASSERT_TRUE(rebuilt->ApplyDelta(partial->TakeDelta(nullptr)).ok());
    }
  }
  EXPECT_TRUE(partial->TakeDelta(nullptr).empty());
  EXPECT_EQ(SnapshotSession(*whole).bytes, SnapshotSession(*rebuilt).bytes);

  // Rows: inputs keyed by (module, block of 64 batch ids); batch 70 * i lands in block i + i/11.
  auto again = whole->EmptyLike();
  Observe(*again, 1, *backend);
  SessionDelta delta = again->TakeDelta(nullptr);
  ASSERT_EQ(delta.inputs.size(), 1u);
  EXPECT_EQ(delta.inputs.begin()->first, (std::pair<std::string, int64_t>{"m1", 1}));
  EXPECT_EQ(DecodeInputRow(EncodeInputRow(delta.inputs.begin()->second), 1)->batches.size(), 1u);
  EXPECT_FALSE(DecodeInputRow(EncodeInputRow(delta.inputs.begin()->second), 0).ok());

  // The minmax observer's per-group ranges: one row per (module, batch), keyed GroupRowOf.
  Recipe minmax = AllOn();
  minmax.activation_observer = ActivationObserverKind::kMinMax;
  auto grouped = *CalibrationSession::Create(Model(), minmax, "g", "", "");
  Observe(*grouped, 1, *backend);
  Observe(*grouped, 3, *backend);
  SessionDelta rows = grouped->TakeDelta(nullptr);
  ASSERT_EQ(rows.inputs.count({"m1", GroupRowOf(70)}), 1u);
  const ActivationObserver& group_row = rows.inputs.at({"m1", GroupRowOf(70)});
  EXPECT_TRUE(group_row.batches.empty());
  ASSERT_EQ(group_row.group_batches.size(), 1u);
  EXPECT_TRUE(DecodeInputRow(EncodeInputRow(group_row), GroupRowOf(70)).ok());
  EXPECT_FALSE(DecodeInputRow(EncodeInputRow(group_row), GroupRowOf(71)).ok());
  EXPECT_TRUE(rows.inputs.at({"m1", ActivationBlockOf(70)}).group_batches.empty());
  auto regrouped = grouped->EmptyLike();
  ASSERT_TRUE(regrouped->ApplyDelta(rows).ok());

  // Rows that do not fit the model are refused, naming the field.
  SessionDelta bad;
  bad.kv_layers[7] = KvLayerObserver(2);
  absl::Status refused = rebuilt->ApplyDelta(bad);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("kv_layers[7]"), absl::string_view::npos) << refused;
}

}  // namespace
}  // namespace caliper
