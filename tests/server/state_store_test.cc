// One contract for every StateStore (core/state/state_store.h), run against the PostgreSQL store
// (a real PostgreSQL 15 started for this test), the file store (--state_dir) and the memory
// store (neither flag): merges from several "replicas" (PostgreSQL: separate pools; file and
// memory: one store, many threads) and their flushers equal one process fed every chunk,
// MergeAll equals separate merges, fencing, idempotent retries, finalize/delete, tenancy and
// limits across replicas, import. PostgreSQL alone: schema migration
// (concurrent opens run it once), one transaction per MergeAll, a database restart.
#include "server/postgres/postgres_store.h"
#include "core/state/file_state_store.h"
#include "core/state/memory_state_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <future>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state/partial_flusher.h"
#include "core/tensor/reduction_backend.h"
#include "core/state/session_state.h"
#include "core/state/observer_codec.h"
#include "gtest/gtest.h"
#include "tests/support/postgres_instance.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

using caliper::testing::PostgresInstance;

constexpr int kLayers = 3, kHeads = 2, kHeadDim = 4, kModules = 5;

ModelConfig TinyModel() {
  ModelConfig m;
  m.architecture = "LlamaForCausalLM";
  m.model_type = "llama";
  m.num_layers = kLayers;
  m.num_attention_heads = 4;
  m.num_kv_heads = kHeads;
  m.head_dim = kHeadDim;
  m.hidden_size = 16;
  return m;
}

Recipe AllOn() {
  Recipe r;
  r.nvfp4_weights = true;
  r.nvfp4_activations = true;
  r.activation_observer = ActivationObserverKind::kMinMax;  // order-dependent maths
  r.kv_observer = KvObserverKind::kMinMax;  // per-batch K/V rows too
  r.histograms = true;  // and input histogram rows next to the per-batch group rows
  return r;
}

// Chunk i of a deterministic stream: K, V, weight and input chunks over layers, modules and
// batches spanning several activation blocks.
struct TestChunk {
  std::vector<float> data;
  std::string module;
  ChunkRef ref;
};
TestChunk MakeChunk(int i) {
  TestChunk c;
  std::mt19937 rng(static_cast<uint32_t>(i) * 7919u + 1);
  std::normal_distribution<float> dist(0.0f, 1.0f + static_cast<float>(i % 13));
  const int kind = i % 4;
  c.data.resize(kind < 2 ? 3 * kHeads * kHeadDim : 32);
  for (float& x : c.data) x = dist(rng);
  c.module = absl::StrCat("model.layers.", i % kModules, ".mlp.down_proj");
  c.ref.kind = kind == 0 ? ChunkKind::kKey
             : kind == 1 ? ChunkKind::kValue
             : kind == 2 ? ChunkKind::kWeight
                         : ChunkKind::kInput;
  c.ref.layer = i % kLayers;
  c.ref.module = c.module;
  c.ref.dtype = DType::kF32;
  c.ref.shape = kind < 2 ? std::vector<int64_t>{3, kHeads, kHeadDim} : std::vector<int64_t>{2, 16};
  c.ref.batch = (i * 37) % 150;
  c.ref.sequence = 0;
  return c;
}
void Observe(CalibrationSession& session, int i, ReductionBackend& backend,
             const ProducerLedger::Stream* producer = nullptr, uint64_t sequence = 0) {
  TestChunk c = MakeChunk(i);
  c.ref.data = ByteSpans(reinterpret_cast<const uint8_t*>(c.data.data()),
                         c.data.size() * sizeof(float));
  c.ref.sequence = sequence;
  ASSERT_TRUE(session.Observe(c.ref, backend, producer).status.ok());
}

// Same statistics: every count, every K/V absmax and every NVFP4 amax bit for bit.
void ExpectSameResults(CalibrationSession& expected, CalibrationSession& actual) {
  const SessionStatus a = expected.Status(), b = actual.Status();
  EXPECT_EQ(a.accepted_chunks, b.accepted_chunks);
  EXPECT_EQ(a.accepted_bytes, b.accepted_bytes);
  EXPECT_EQ(a.duplicate_chunks, b.duplicate_chunks);
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t l = 0; l < a.layers.size(); ++l) {
    EXPECT_EQ(a.layers[l].k_tokens, b.layers[l].k_tokens) << l;
    EXPECT_EQ(a.layers[l].v_tokens, b.layers[l].v_tokens) << l;
  }
  ASSERT_TRUE(expected.Finalize().ok());
  ASSERT_TRUE(actual.Finalize().ok());
  absl::StatusOr<SessionScales> x = expected.Scales({}, Nvfp4Convention::kCompressedTensors);
  absl::StatusOr<SessionScales> y = actual.Scales({}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(x.ok() && y.ok());
  EXPECT_EQ(x->kv_scales->k_absmax, y->kv_scales->k_absmax);
  EXPECT_EQ(x->kv_scales->v_absmax, y->kv_scales->v_absmax);
  ASSERT_EQ(x->nvfp4.modules.size(), y->nvfp4.modules.size());
  for (const auto& [name, m] : x->nvfp4.modules) {
    const ModuleNvfp4Scales& n = y->nvfp4.modules.at(name);
    EXPECT_EQ(m.weight_amax, n.weight_amax) << name;
    EXPECT_EQ(m.input_amax, n.input_amax) << name;
  }
}

// Another "replica" of the one memory or file store: every call forwarded (either is one
// server's).
class SharedStore final : public StateStore {
 public:
  explicit SharedStore(StateStore* store) : store_(store) {}
  const std::string& name() const override { return store_->name(); }
  absl::Status CreateSession(const CalibrationSession& s, int max) override {
    return store_->CreateSession(s, max);
  }
  absl::Status ImportSession(const CalibrationSession& s) override {
    return store_->ImportSession(s);
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadSession(absl::string_view id,
                                                                  absl::string_view t) override {
    return store_->LoadSession(id, t);
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> LoadEmpty(absl::string_view id,
                                                                absl::string_view t) override {
    return store_->LoadEmpty(id, t);
  }
  absl::StatusOr<SessionStatus> GetStatus(absl::string_view id, absl::string_view t) override {
    return store_->GetStatus(id, t);
  }
  absl::StatusOr<std::vector<SessionStatus>> ListSessions(absl::string_view t) override {
    return store_->ListSessions(t);
  }
  absl::Status DeleteSession(absl::string_view id, absl::string_view t) override {
    return store_->DeleteSession(id, t);
  }
  absl::Status FinalizeSession(absl::string_view id, absl::string_view t) override {
    return store_->FinalizeSession(id, t);
  }
  absl::StatusOr<OpenedProducer> OpenProducer(absl::string_view id,
                                              absl::string_view p) override {
    return store_->OpenProducer(id, p);
  }
  absl::StatusOr<uint64_t> CommittedSequence(absl::string_view id, absl::string_view t,
                                             absl::string_view p) override {
    return store_->CommittedSequence(id, t, p);
  }
  absl::Status Merge(absl::string_view id, const SessionDelta& d) override {
    return store_->Merge(id, d);
  }
  std::vector<absl::Status> MergeAll(absl::string_view id,
                                     const std::vector<const SessionDelta*>& d) override {
    return store_->MergeAll(id, d);
  }
  void ForgetPartial(absl::string_view id, absl::string_view p) override {
    store_->ForgetPartial(id, p);
  }
  absl::Status Ping() override { return store_->Ping(); }

 private:
  StateStore* const store_;
};

enum class StoreKind { kPostgres, kFile, kMemory };

class StoreTestBase : public ::testing::Test {
 protected:
  // One PostgreSQL per test process, started by the first test that needs it, stopped at exit.
  static void StartPostgres() {
    if (pg_ != nullptr || start_error_ != nullptr) return;
    absl::StatusOr<std::unique_ptr<PostgresInstance>> pg = PostgresInstance::Start();
    if (!pg.ok()) {
      start_error_ = new absl::Status(pg.status());
      return;
    }
    static std::unique_ptr<PostgresInstance> owner;  // stopped when the process exits
    owner = *std::move(pg);
    pg_ = owner.get();
  }
  // Opens the store under test; false (the test skips or fails) when it cannot.
  bool OpenStore(StoreKind kind) {
    kind_ = kind;
    if (kind == StoreKind::kPostgres) {
      StartPostgres();
      if (pg_ == nullptr) {
        if (absl::IsNotFound(*start_error_)) {
          skip_ = true;
          return false;
        }
        ADD_FAILURE() << *start_error_;
        return false;
      }
    } else if (kind == StoreKind::kFile) {
      absl::StatusOr<std::unique_ptr<FileStateStore>> file =
          FileStateStore::Open(dir_.path() + "/state", limits_);
      EXPECT_TRUE(file.ok()) << file.status();
      if (!file.ok()) return false;
      local_ = *std::move(file);
    } else {
      local_ = std::make_unique<MemoryStateStore>(limits_);
    }
    store_ = Open();
    return store_ != nullptr;
  }

  // A store for another replica of the same state.
  std::unique_ptr<StateStore> Open(int pool = 4) {
    if (kind_ != StoreKind::kPostgres) return std::make_unique<SharedStore>(local_.get());
    PostgresStoreOptions options;
    options.uri = pg_->uri();
    options.limits = limits_;
    options.pool_size = pool;
    options.acquire_timeout = absl::Seconds(5);
    absl::StatusOr<std::unique_ptr<StateStore>> store = OpenPostgresStore(options);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }

  std::shared_ptr<CalibrationSession> NewSession(const std::string& tenant = "") {
    static std::atomic<int> counter{0};
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s = CalibrationSession::Create(
        TinyModel(), AllOn(), absl::StrCat("s", ++counter, "-", ::getpid()), "name", tenant);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(store_->CreateSession(**s, 0).ok());
    return std::shared_ptr<CalibrationSession>(std::move(*s));
  }

  static PostgresInstance* pg_;
  static absl::Status* start_error_;
  StoreKind kind_ = StoreKind::kPostgres;
  bool skip_ = false;
  testing_util::TempDir dir_;
  Limits limits_;  // the server's, for stores opened after it is set
  std::unique_ptr<StateStore> local_;  // the memory or file store (one process's)
  std::unique_ptr<StateStore> store_;
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
};
PostgresInstance* StoreTestBase::pg_ = nullptr;
absl::Status* StoreTestBase::start_error_ = nullptr;

// The contract, for each store.
class StateStoreContractTest : public StoreTestBase,
                               public ::testing::WithParamInterface<StoreKind> {
 protected:
  void SetUp() override {
    if (!OpenStore(GetParam())) {
      if (skip_) GTEST_SKIP() << *start_error_;
      FAIL() << "cannot open the store";
    }
  }
};
INSTANTIATE_TEST_SUITE_P(Stores, StateStoreContractTest,
                         ::testing::Values(StoreKind::kPostgres, StoreKind::kFile,
                                           StoreKind::kMemory),
                         [](const ::testing::TestParamInfo<StoreKind>& info) {
                           switch (info.param) {
                             case StoreKind::kPostgres: return "Postgres";
                             case StoreKind::kFile: return "File";
                             case StoreKind::kMemory: return "Memory";
                           }
                           return "";
                         });

// What only the PostgreSQL store has (schema, transactions, a database to restart).
class PostgresStoreTest : public StoreTestBase {
 protected:
  void SetUp() override {
    if (!OpenStore(StoreKind::kPostgres)) {
      if (skip_) GTEST_SKIP() << *start_error_;
      FAIL() << "cannot open the store";
    }
  }
};

TEST_F(PostgresStoreTest, ConcurrentOpensMigrateOnceAndAgreeOnTheVersion) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] { ok += Open(1) != nullptr ? 1 : 0; });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  PGconn* conn = PQconnectdb(pg_->uri().c_str());
  PGresult* r = PQexec(conn, "SELECT count(*), max(version) FROM caliper_schema_migrations");
  ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
  EXPECT_EQ(std::string(PQgetvalue(r, 0, 0)), absl::StrCat(kPostgresSchemaVersion));
  EXPECT_EQ(std::string(PQgetvalue(r, 0, 1)), absl::StrCat(kPostgresSchemaVersion));
  PQclear(r);
  // A database migrated by a newer release is refused, not written.
  PQclear(PQexec(conn, "INSERT INTO caliper_schema_migrations (version) VALUES (99)"));
  PostgresStoreOptions options;
  options.uri = pg_->uri();
  absl::StatusOr<std::unique_ptr<StateStore>> newer = OpenPostgresStore(options);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(newer.status().message(), "schema version 99")) << newer.status();
  PQclear(PQexec(conn, "DELETE FROM caliper_schema_migrations WHERE version = 99"));
  PQfinish(conn);
}

TEST_P(StateStoreContractTest, ReplicasMergingConcurrentlyEqualOneProcess) {
  std::shared_ptr<CalibrationSession> created = NewSession();
  std::unique_ptr<CalibrationSession> reference = created->EmptyLike();
  constexpr int kChunks = 600;
  for (int i = 0; i < kChunks; ++i) Observe(*reference, i, *backend_);

  // Two replicas (own pools), three streams each, chunks dealt round robin, merging every few
  // chunks: six partials racing on one session's rows.
  std::unique_ptr<StateStore> replica_b = Open();
  std::vector<std::thread> streams;
  std::atomic<int> failures{0};
  for (int stream = 0; stream < 6; ++stream) {
    streams.emplace_back([&, stream] {
      StateStore& store = stream % 2 == 0 ? *store_ : *replica_b;
      auto backend = MakeCpuBackend(1);
      absl::StatusOr<std::unique_ptr<CalibrationSession>> partial =
          store.LoadEmpty(created->id(), "");
      if (!partial.ok()) {
        ++failures;
        return;
      }
      uint64_t flush = 0;
      auto merge = [&] {
        SessionDelta delta = (*partial)->TakeDelta(nullptr);
        delta.partial_id = absl::StrCat("stream-", stream);
        delta.flush = ++flush;
        if (!store.Merge(created->id(), delta).ok()) ++failures;
      };
      for (int i = stream; i < kChunks; i += 6) {
        Observe(**partial, i, *backend);
        if ((i / 6) % 7 == 3) merge();
      }
      merge();
    });
  }
  for (std::thread& t : streams) t.join();
  ASSERT_EQ(failures.load(), 0);

  absl::StatusOr<std::unique_ptr<CalibrationSession>> a = store_->LoadSession(created->id(), "");
  absl::StatusOr<std::unique_ptr<CalibrationSession>> b = replica_b->LoadSession(created->id(), "");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ(SnapshotSession(**a).bytes, SnapshotSession(**b).bytes);  // every replica reads alike
  absl::StatusOr<SessionStatus> status = replica_b->GetStatus(created->id(), "");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->accepted_chunks, kChunks);
  EXPECT_EQ(status->modules_with_weights, kModules);
  EXPECT_EQ(status->modules_with_inputs, kModules);
  ExpectSameResults(*reference, **a);
}

// Every observer row of a committed session, encoded: equal maps are equal state bit for bit.
std::map<std::string, std::string> Rows(CalibrationSession& session) {
  SessionDelta delta = session.TakeDelta(nullptr);
  std::map<std::string, std::string> rows;
  for (const auto& [layer, o] : delta.kv_layers) {
    rows[absl::StrCat("kv ", layer)] = EncodeKvLayerObserver(o);
  }
  for (const auto& [key, o] : delta.kv_batches) {
    rows[absl::StrCat("kv ", key.first, " batch ", key.second)] = EncodeKvLayerObserver(o);
  }
  for (const auto& [module, o] : delta.weights) rows["w " + module] = EncodeWeightRow(o);
  for (const auto& [key, o] : delta.inputs) {
    rows[absl::StrCat("i ", key.first, " ", key.second)] = EncodeInputRow(o);
  }
  return rows;
}

TEST_P(StateStoreContractTest, MergeAllEqualsSeparateMergesInOneTransaction) {
  std::shared_ptr<CalibrationSession> batched = NewSession(), separate = NewSession();
  constexpr int kPartials = 6;
  std::vector<SessionDelta> deltas(kPartials);
  std::vector<OpenedProducer> opened(kPartials);
  for (int p = 0; p < kPartials; ++p) {
    std::unique_ptr<CalibrationSession> partial = batched->EmptyLike();
    const std::string producer = absl::StrCat("host/", p);
    for (const auto& s : {batched, separate}) {
      absl::StatusOr<OpenedProducer> o = store_->OpenProducer(s->id(), producer);
      ASSERT_TRUE(o.ok());
      opened[p] = *o;
    }
    partial->RestoreProducers({});
    absl::StatusOr<ProducerLedger::Stream> stream = partial->OpenProducerStream(producer);
    ASSERT_TRUE(stream.ok());
    for (int i = 0; i < 40; ++i) Observe(*partial, p + kPartials * i, *backend_, &*stream, i + 1);
    deltas[p] = partial->TakeDelta(&*stream);
    deltas[p].producer->epoch = opened[p].epoch;  // 1 in both sessions
    deltas[p].partial_id = absl::StrCat("partial-", p);
    deltas[p].flush = 1;
  }
  std::vector<const SessionDelta*> all;
  for (const SessionDelta& d : deltas) all.push_back(&d);
  for (const absl::Status& s : store_->MergeAll(batched->id(), all)) EXPECT_TRUE(s.ok()) << s;
  for (const SessionDelta& d : deltas) ASSERT_TRUE(store_->Merge(separate->id(), d).ok());

  // PostgreSQL: one transaction wrote every partial's mark (one xmin), against six.
  if (kind_ == StoreKind::kPostgres) {
    PGconn* conn = PQconnectdb(pg_->uri().c_str());
    auto transactions = [&](const std::string& id) {
      const std::string sql = absl::StrCat(
          "SELECT count(DISTINCT xmin::text) FROM caliper_partials WHERE session_id = '", id,
          "'");
      PGresult* r = PQexec(conn, sql.c_str());
      const std::string value = PQresultStatus(r) == PGRES_TUPLES_OK ? PQgetvalue(r, 0, 0) : "?";
      PQclear(r);
      return value;
    };
    EXPECT_EQ(transactions(batched->id()), "1");
    EXPECT_EQ(transactions(separate->id()), "6");
    PQfinish(conn);
  }

  absl::StatusOr<std::unique_ptr<CalibrationSession>> a = store_->LoadSession(batched->id(), "");
  absl::StatusOr<std::unique_ptr<CalibrationSession>> b = store_->LoadSession(separate->id(), "");
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  EXPECT_EQ((*a)->Status().accepted_chunks, kPartials * 40);
  EXPECT_EQ(*store_->CommittedSequence(batched->id(), "", "host/3"), 40u);
  ExpectSameResults(**b, **a);
  const std::map<std::string, std::string> rows = Rows(**a);
  EXPECT_EQ(rows, Rows(**b));
  // The minmax K/V observer's per-batch ranges came back from rows of their own.
  EXPECT_TRUE(std::any_of(rows.begin(), rows.end(),
                          [](const auto& row) { return absl::StrContains(row.first, " batch "); }));

  // Retried (the answer was lost): counts once. A fenced partial fails alone.
  for (const absl::Status& s : store_->MergeAll(batched->id(), all)) EXPECT_TRUE(s.ok()) << s;
  ASSERT_TRUE(store_->OpenProducer(batched->id(), "host/2").ok());
  for (SessionDelta& d : deltas) ++d.flush;
  std::vector<absl::Status> statuses = store_->MergeAll(batched->id(), all);
  for (int p = 0; p < kPartials; ++p) {
    EXPECT_EQ(statuses[p].code(), p == 2 ? absl::StatusCode::kAborted : absl::StatusCode::kOk)
        << p << statuses[p];
  }
  EXPECT_EQ(store_->GetStatus(batched->id(), "")->accepted_chunks, 2 * kPartials * 40 - 40);
  EXPECT_EQ(*store_->CommittedSequence(batched->id(), "", "host/2"), 40u);

  // The same partial twice is refused whole; a finalized session refuses every delta.
  std::vector<absl::Status> twice = store_->MergeAll(batched->id(), {all[0], all[0]});
  EXPECT_EQ(twice[0].code(), absl::StatusCode::kInvalidArgument) << twice[0];
  ASSERT_TRUE(store_->FinalizeSession(batched->id(), "").ok());
  for (SessionDelta& d : deltas) ++d.flush;
  for (const absl::Status& s : store_->MergeAll(batched->id(), all)) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  }
}

TEST_P(StateStoreContractTest, TwoReplicasFlushersMergingConcurrentlyEqualOneProcess) {
  // Two replicas (own pools and flushers, 5 ms interval), four producer streams each, folding
  // chunks while their flushers race to merge the session's partials in one transaction each.
  std::shared_ptr<CalibrationSession> created = NewSession();
  std::unique_ptr<CalibrationSession> reference = created->EmptyLike();
  constexpr int kChunks = 800, kStreams = 8;
  for (int i = 0; i < kChunks; ++i) Observe(*reference, i, *backend_);
  std::unique_ptr<StateStore> replica_b = Open();
  std::atomic<int> transactions{0};
  auto count = [&](const PartialFlusher::FlushEvent&) { ++transactions; };
  PartialFlusher flusher_a(store_.get(), absl::Milliseconds(5), count);
  PartialFlusher flusher_b(replica_b.get(), absl::Milliseconds(5), count);
  std::vector<std::thread> streams;
  std::atomic<int> failures{0};
  for (int stream = 0; stream < kStreams; ++stream) {
    streams.emplace_back([&, stream] {
      StateStore& store = stream % 2 == 0 ? *store_ : *replica_b;
      PartialFlusher& flusher = stream % 2 == 0 ? flusher_a : flusher_b;
      auto backend = MakeCpuBackend(1);
      absl::StatusOr<std::unique_ptr<CalibrationSession>> loaded =
          store.LoadEmpty(created->id(), "");
      const std::string producer = absl::StrCat("host/", stream);
      absl::StatusOr<OpenedProducer> opened = store.OpenProducer(created->id(), producer);
      if (!loaded.ok() || !opened.ok()) {
        ++failures;
        return;
      }
      std::shared_ptr<CalibrationSession> session = *std::move(loaded);
      session->RestoreProducers({{producer, opened->committed}});
      absl::StatusOr<ProducerLedger::Stream> ledger = session->OpenProducerStream(producer);
      auto partial = flusher.Register(session);
      flusher.BindProducer(partial, *ledger, opened->epoch);
      uint64_t sequence = 0;
      for (int i = stream; i < kChunks; i += kStreams) {
        Observe(*session, i, *backend, &*ledger, ++sequence);
        if (i % 50 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      std::promise<absl::Status> done;
      flusher.WhenCommitted(partial, [&](absl::Status s) { done.set_value(s); });
      if (!done.get_future().get().ok()) ++failures;
      flusher.Release(partial);
    });
  }
  for (std::thread& t : streams) t.join();
  flusher_a.Stop();
  flusher_b.Stop();
  ASSERT_EQ(failures.load(), 0);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> merged =
      replica_b->LoadSession(created->id(), "");
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ((*merged)->Status().accepted_chunks, kChunks);
  for (int stream = 0; stream < kStreams; ++stream) {
    EXPECT_EQ(*store_->CommittedSequence(created->id(), "", absl::StrCat("host/", stream)),
              static_cast<uint64_t>(kChunks / kStreams));
  }
  ExpectSameResults(*reference, **merged);
  EXPECT_GT(transactions.load(), 0);
}

TEST_P(StateStoreContractTest, AFencedStreamsLateFlushCountsNothing) {
  std::shared_ptr<CalibrationSession> created = NewSession();
  absl::StatusOr<OpenedProducer> first = store_->OpenProducer(created->id(), "host/file");
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->committed, 0u);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> partial = store_->LoadEmpty(created->id(), "");
  ASSERT_TRUE(partial.ok());
  (*partial)->RestoreProducers({});
  absl::StatusOr<ProducerLedger::Stream> stream = (*partial)->OpenProducerStream("host/file");
  ASSERT_TRUE(stream.ok());
  ProducerLedger::Stream fenced{stream->producer_id, first->epoch};
  for (int i = 0; i < 4; ++i) Observe(**partial, i, *backend_, &*stream, i + 1);
  SessionDelta delta = (*partial)->TakeDelta(&*stream);
  delta.producer->epoch = first->epoch;
  delta.partial_id = "a";
  delta.flush = 1;
  ASSERT_TRUE(store_->Merge(created->id(), delta).ok());
  EXPECT_EQ(*store_->CommittedSequence(created->id(), "", "host/file"), 4u);

  // The producer reconnects elsewhere: a new epoch from the committed 4.
  absl::StatusOr<OpenedProducer> second = store_->OpenProducer(created->id(), "host/file");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->committed, 4u);
  EXPECT_GT(second->epoch, first->epoch);
  for (int i = 4; i < 8; ++i) Observe(**partial, i, *backend_, &*stream, i + 1);
  SessionDelta late = (*partial)->TakeDelta(&*stream);
  late.producer->epoch = fenced.epoch;
  late.partial_id = "a";
  late.flush = 2;
  absl::Status refused = store_->Merge(created->id(), late);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
  EXPECT_EQ(*store_->CommittedSequence(created->id(), "", "host/file"), 4u);
  EXPECT_EQ(store_->GetStatus(created->id(), "")->accepted_chunks, 4);
}

// --max_modules_per_session holds across the session, whichever streams (replicas) bring the
// modules: a delta that would pass it fails alone, nothing of it merged.
TEST_P(StateStoreContractTest, TheModuleLimitHoldsAcrossPartials) {
  limits_.max_modules_per_session = 3;
  ASSERT_TRUE(OpenStore(GetParam()));
  absl::StatusOr<std::unique_ptr<CalibrationSession>> created = CalibrationSession::Create(
      TinyModel(), AllOn(), absl::StrCat("modules-", ::getpid()), "", "", limits_);
  ASSERT_TRUE(created.ok());
  ASSERT_TRUE(store_->CreateSession(**created, 0).ok());
  const std::string id = (*created)->id();
  std::unique_ptr<StateStore> other_replica = Open();
  // Weight chunks 2, 6, 10, 14, 22 name modules 2, 1, 0, 4 and 2 again.
  auto delta_of = [&](StateStore& store, std::vector<int> chunks, const std::string& partial) {
    std::unique_ptr<CalibrationSession> session = *store.LoadEmpty(id, "");
    for (int i : chunks) Observe(*session, i, *backend_);
    SessionDelta delta = session->TakeDelta(nullptr);
    delta.partial_id = partial;
    delta.flush = 1;
    return delta;
  };
  const SessionDelta first = delta_of(*store_, {2, 6}, "a");
  const SessionDelta second = delta_of(*other_replica, {10, 14}, "b");
  const SessionDelta known = delta_of(*other_replica, {22}, "c");
  ASSERT_TRUE(store_->Merge(id, first).ok());
  absl::Status over = other_replica->Merge(id, second);
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted) << over;
  EXPECT_TRUE(absl::StrContains(over.message(), "would be module 4 of this session, over the "
                                                "limit max_modules_per_session=3"))
      << over;
  EXPECT_TRUE(other_replica->Merge(id, known).ok());
  absl::StatusOr<SessionStatus> status = store_->GetStatus(id, "");
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->modules_with_weights, 2);
  EXPECT_EQ(status->accepted_chunks, 3);
  // In one MergeAll too: the delta that fits is merged, the other refused.
  const SessionDelta fits = delta_of(*store_, {10}, "d");
  const SessionDelta too_many = delta_of(*store_, {14}, "e");
  const std::vector<absl::Status> statuses = store_->MergeAll(id, {&fits, &too_many});
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kResourceExhausted) << statuses[1];
  EXPECT_EQ(store_->GetStatus(id, "")->modules_with_weights, 3);
}

TEST_P(StateStoreContractTest, ARetriedFlushIsAppliedOnce) {
  std::shared_ptr<CalibrationSession> created = NewSession();
  absl::StatusOr<std::unique_ptr<CalibrationSession>> partial = store_->LoadEmpty(created->id(), "");
  ASSERT_TRUE(partial.ok());
  for (int i = 0; i < 8; ++i) Observe(**partial, i, *backend_);
  SessionDelta delta = (*partial)->TakeDelta(nullptr);
  delta.partial_id = "p";
  delta.flush = 1;
  ASSERT_TRUE(store_->Merge(created->id(), delta).ok());
  ASSERT_TRUE(store_->Merge(created->id(), delta).ok());  // the answer was "lost": retried
  EXPECT_EQ(store_->GetStatus(created->id(), "")->accepted_chunks, 8);
  delta.flush = 2;  // a genuinely new flush counts
  ASSERT_TRUE(store_->Merge(created->id(), delta).ok());
  EXPECT_EQ(store_->GetStatus(created->id(), "")->accepted_chunks, 16);
  store_->ForgetPartial(created->id(), "p");
}

TEST_P(StateStoreContractTest, FinalizeAndDeleteStopLaterMerges) {
  std::shared_ptr<CalibrationSession> created = NewSession();
  absl::StatusOr<std::unique_ptr<CalibrationSession>> partial = store_->LoadEmpty(created->id(), "");
  ASSERT_TRUE(partial.ok());
  Observe(**partial, 0, *backend_);
  SessionDelta delta = (*partial)->TakeDelta(nullptr);
  delta.partial_id = "p";
  delta.flush = 1;
  ASSERT_TRUE(store_->FinalizeSession(created->id(), "").ok());
  ASSERT_TRUE(store_->FinalizeSession(created->id(), "").ok());  // idempotent
  EXPECT_EQ(store_->Merge(created->id(), delta).code(), absl::StatusCode::kFailedPrecondition);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> loaded =
      store_->LoadSession(created->id(), "");
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ((*loaded)->Status().state, SessionState::kFinalized);
  EXPECT_TRUE((*loaded)->Scales({}, Nvfp4Convention::kCompressedTensors).ok());
  // A stream of the finalized session had its chunks rejected: they are still counted.
  SessionDelta rejected;
  rejected.partial_id = "r";
  rejected.flush = 1;
  rejected.counters.rejected_chunks = 2;
  EXPECT_TRUE(store_->Merge(created->id(), rejected).ok());
  EXPECT_EQ(store_->GetStatus(created->id(), "")->rejected_chunks, 2);
  ASSERT_TRUE(store_->DeleteSession(created->id(), "").ok());
  EXPECT_EQ(store_->Merge(created->id(), delta).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->DeleteSession(created->id(), "").code(), absl::StatusCode::kNotFound);
}

TEST_P(StateStoreContractTest, TenantsAreIsolatedAndLimited) {
  std::shared_ptr<CalibrationSession> a = NewSession("tenant-a");
  std::shared_ptr<CalibrationSession> b = NewSession("tenant-b");
  std::unique_ptr<StateStore> other_replica = Open();
  for (StateStore* store : {store_.get(), other_replica.get()}) {
    absl::StatusOr<std::vector<SessionStatus>> listed = store->ListSessions("tenant-a");
    ASSERT_TRUE(listed.ok());
    ASSERT_EQ(listed->size(), 1u);
    EXPECT_EQ(listed->front().id, a->id());
    EXPECT_EQ(store->LoadSession(a->id(), "tenant-b").status().code(),
              absl::StatusCode::kNotFound);
    EXPECT_EQ(store->FinalizeSession(a->id(), "tenant-b").code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(store->CommittedSequence(a->id(), "tenant-b", "p").status().code(),
              absl::StatusCode::kNotFound);
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> second =
      CalibrationSession::Create(TinyModel(), AllOn(), "limit-2", "", "tenant-a");
  absl::Status limited = store_->CreateSession(**second, 1);
  EXPECT_EQ(limited.code(), absl::StatusCode::kResourceExhausted) << limited;
  EXPECT_TRUE(absl::StrContains(limited.message(), "max_sessions_per_tenant")) << limited;
  EXPECT_EQ(store_->CreateSession(*a, 0).code(), absl::StatusCode::kAlreadyExists);
}

TEST_P(StateStoreContractTest, ImportsAStateDirSessionWhole) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> local =
      CalibrationSession::Create(TinyModel(), AllOn(), "imported-1", "from-disk", "t");
  ASSERT_TRUE(local.ok());
  absl::StatusOr<ProducerLedger::Stream> stream = (*local)->OpenProducerStream("p");
  for (int i = 0; i < 40; ++i) Observe(**local, i, *backend_, &*stream, i + 1);
  ASSERT_TRUE(store_->ImportSession(**local).ok());
  EXPECT_EQ(store_->ImportSession(**local).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(*store_->CommittedSequence("imported-1", "t", "p"), 40u);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> loaded = store_->LoadSession("imported-1", "t");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->created_unix_ms(), (*local)->created_unix_ms());
  ExpectSameResults(**local, **loaded);
}

TEST_F(PostgresStoreTest, ADatabaseRestartIsUnavailableNamingTheStoreThenRecovers) {
  std::shared_ptr<CalibrationSession> created = NewSession();
  absl::StatusOr<std::unique_ptr<CalibrationSession>> partial = store_->LoadEmpty(created->id(), "");
  ASSERT_TRUE(partial.ok());
  for (int i = 0; i < 10; ++i) Observe(**partial, i, *backend_);
  SessionDelta committed = (*partial)->TakeDelta(nullptr);
  committed.partial_id = "p";
  committed.flush = 1;
  ASSERT_TRUE(store_->Merge(created->id(), committed).ok());

  ASSERT_TRUE(pg_->Stop().ok());
  for (int i = 10; i < 20; ++i) Observe(**partial, i, *backend_);
  SessionDelta pending = (*partial)->TakeDelta(nullptr);
  pending.partial_id = "p";
  pending.flush = 2;
  absl::Status down = store_->Merge(created->id(), pending);
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_TRUE(absl::StrContains(down.message(), "state store postgresql://caliper@127.0.0.1:"))
      << down;
  EXPECT_EQ(store_->Ping().code(), absl::StatusCode::kUnavailable);

  ASSERT_TRUE(pg_->Restart().ok());
  ASSERT_TRUE(store_->Ping().ok());
  ASSERT_TRUE(store_->Merge(created->id(), pending).ok());  // the same delta, retried
  EXPECT_EQ(store_->GetStatus(created->id(), "")->accepted_chunks, 20);
}

TEST(PostgresNameTest, HidesThePassword) {
  EXPECT_EQ(RedactedPostgresName("postgresql://u:secret@db.example:6432/cal?sslmode=require"),
            "postgresql://u@db.example:6432/cal");
  EXPECT_EQ(RedactedPostgresName("host=db user=u password=secret dbname=x"),
            "postgresql://u@db:5432/x");
}

}  // namespace
}  // namespace caliper
