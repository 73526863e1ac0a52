// FileStateStore beyond the StateStore contract (tests/server/state_store_test.cc runs that
// against it too): every acknowledged change is in its file before the answer, so a store opened
// again on the directory (a kill -9 and restart) holds exactly what was acknowledged; a write
// that fails answers Unavailable naming the file and leaves the session as the file has it, and
// the same delta retried once the disk is back counts once; a corrupt file is set aside.
#include "core/state/file_state_store.h"

#include <fstream>
#include <random>

#include "core/tensor/reduction_backend.h"
#include "core/state/observer_codec.h"
#include "gtest/gtest.h"
#include "tests/support/numbered_chunks.h"
#include "tests/support/fault_injection_env.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

ModelConfig Model() { return testing::NumberedChunkModel(); }

// Chunk i: K of layer i % 2 or an input of module "m{i % 3}" at batch 70 * i.
void Observe(CalibrationSession& s, int i, ReductionBackend& backend,
             const ProducerLedger::Stream* producer = nullptr, uint64_t sequence = 0) {
  testing::ObserveNumberedChunk(s, i, backend, producer, sequence);
}

class FileStateStoreTest : public ::testing::Test {
 protected:
  std::unique_ptr<FileStateStore> Open(Env* env = Env::Default(),
                                       std::vector<absl::Status>* errors = nullptr) {
    absl::StatusOr<std::unique_ptr<FileStateStore>> store =
        FileStateStore::Open(dir_.path() + "/state", Limits(), env, errors);
    EXPECT_TRUE(store.ok()) << store.status();
    return store.ok() ? *std::move(store) : nullptr;
  }
  std::unique_ptr<CalibrationSession> Session() {
    Recipe recipe;
    recipe.nvfp4_activations = true;
    recipe.activation_observer = ActivationObserverKind::kMinMax;
    return *CalibrationSession::Create(Model(), recipe, "s1", "name", "t");
  }
  // Chunks [first, last) of producer "p" in one delta of `partial`.
  SessionDelta Delta(const CalibrationSession& like, int first, int last, uint64_t epoch,
                     uint64_t flush) {
    std::unique_ptr<CalibrationSession> partial = like.EmptyLike();
    partial->RestoreProducers({{"p", static_cast<uint64_t>(first)}});
    ProducerLedger::Stream stream = *partial->OpenProducerStream("p");
    for (int i = first; i < last; ++i) {
      Observe(*partial, i, *backend_, &stream, static_cast<uint64_t>(i) + 1);
    }
    SessionDelta delta = partial->TakeDelta(&stream);
    delta.producer->epoch = epoch;
    delta.partial_id = "partial";
    delta.flush = flush;
    return delta;
  }

  testing_util::TempDir dir_;
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
};

TEST_F(FileStateStoreTest, AStoreOpenedAgainHoldsEverythingAcknowledged) {
  std::unique_ptr<CalibrationSession> created = Session();
  std::unique_ptr<CalibrationSession> reference = created->EmptyLike();
  for (int i = 0; i < 12; ++i) Observe(*reference, i, *backend_);
  {
    std::unique_ptr<FileStateStore> store = Open();
    ASSERT_TRUE(store->CreateSession(*created, 0).ok());
    const uint64_t epoch = store->OpenProducer("s1", "p")->epoch;
    ASSERT_TRUE(store->Merge("s1", Delta(*created, 0, 5, epoch, 1)).ok());
    ASSERT_TRUE(store->Merge("s1", Delta(*created, 5, 12, epoch, 2)).ok());
    // Dropped without any shutdown: every answer above was already on disk.
  }
  std::unique_ptr<FileStateStore> again = Open();
  ASSERT_EQ(again->size(), 1u);
  EXPECT_EQ(*again->CommittedSequence("s1", "t", "p"), 12u);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> loaded = again->LoadSession("s1", "t");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->Status().accepted_chunks, 12);
  // Every observer row bit for bit.
  SessionDelta a = (*loaded)->TakeDelta(nullptr), b = reference->TakeDelta(nullptr);
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  for (const auto& [key, observer] : b.inputs) {
    EXPECT_EQ(EncodeInputRow(a.inputs.at(key)), EncodeInputRow(observer)) << key.first;
  }
  ASSERT_EQ(a.kv_layers.size(), b.kv_layers.size());
  for (const auto& [layer, observer] : b.kv_layers) {
    EXPECT_EQ(EncodeKvLayerObserver(a.kv_layers.at(layer)), EncodeKvLayerObserver(observer));
  }
  // A new epoch after the restart: the producer resumes at 13.
  absl::StatusOr<OpenedProducer> opened = again->OpenProducer("s1", "p");
  EXPECT_EQ(opened->committed, 12u);
}

TEST_F(FileStateStoreTest, AFailedWriteIsUnavailableAndLeavesTheSessionAsItsFile) {
  testing_util::FaultInjectionEnv env;
  std::unique_ptr<FileStateStore> store = Open(&env);
  std::unique_ptr<CalibrationSession> created = Session();
  ASSERT_TRUE(store->CreateSession(*created, 0).ok());
  const uint64_t epoch = store->OpenProducer("s1", "p")->epoch;
  ASSERT_TRUE(store->Merge("s1", Delta(*created, 0, 4, epoch, 1)).ok());

  env.fail_append = true;  // disk full
  const SessionDelta pending = Delta(*created, 4, 8, epoch, 2);
  absl::Status full = store->Merge("s1", pending);
  EXPECT_EQ(full.code(), absl::StatusCode::kUnavailable) << full;
  EXPECT_NE(full.message().find("s1.session"), absl::string_view::npos) << full;
  EXPECT_EQ(store->GetStatus("s1", "t")->accepted_chunks, 4);
  EXPECT_EQ(*store->CommittedSequence("s1", "t", "p"), 4u);
  EXPECT_EQ(store->FinalizeSession("s1", "t").code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(store->GetStatus("s1", "t")->state, SessionState::kOpen);

  env.fail_append = false;
  ASSERT_TRUE(store->Merge("s1", pending).ok());  // the same delta, retried
  ASSERT_TRUE(store->Merge("s1", pending).ok());  // and its answer "lost": counted once
  EXPECT_EQ(store->GetStatus("s1", "t")->accepted_chunks, 8);
  EXPECT_EQ(Open()->GetStatus("s1", "t")->accepted_chunks, 8);
}

TEST_F(FileStateStoreTest, TheSessionsLimitsHoldAcrossStreams) {
  // Each stream stays within max_modules_per_session=2 (m0, m1 / m1, m2) but the session
  // would not: the second stream's delta fails alone, naming the limit; nothing of it counts.
  Limits limits;
  limits.max_modules_per_session = 2;
  Recipe recipe;
  recipe.nvfp4_activations = true;
  std::unique_ptr<CalibrationSession> created =
      *CalibrationSession::Create(Model(), recipe, "s1", "name", "t", limits);
  std::unique_ptr<FileStateStore> store = Open();
  ASSERT_TRUE(store->CreateSession(*created, 0).ok());
  auto delta = [&](std::vector<int> chunks, const std::string& partial) {
    std::unique_ptr<CalibrationSession> p = created->EmptyLike();
    for (int i : chunks) Observe(*p, i, *backend_, nullptr, static_cast<uint64_t>(i) + 1);
    SessionDelta d = p->TakeDelta(nullptr);
    d.partial_id = partial;
    d.flush = 1;
    return d;
  };
  const SessionDelta first = delta({1, 3}, "a");   // inputs of m1, m0
  const SessionDelta second = delta({5, 9}, "b");  // inputs of m2, m0
  std::vector<absl::Status> statuses = store->MergeAll("s1", {&first, &second});
  EXPECT_TRUE(statuses[0].ok()) << statuses[0];
  EXPECT_EQ(statuses[1].code(), absl::StatusCode::kResourceExhausted) << statuses[1];
  EXPECT_NE(statuses[1].message().find("max_modules_per_session=2"), absl::string_view::npos);
  EXPECT_EQ(store->GetStatus("s1", "t")->accepted_chunks, 2);
  EXPECT_EQ(store->GetStatus("s1", "t")->modules_with_inputs, 2);
}

TEST_F(FileStateStoreTest, ADeletedSessionsFileIsGoneAndNeverWrittenBack) {
  std::unique_ptr<FileStateStore> store = Open();
  std::unique_ptr<CalibrationSession> created = Session();
  ASSERT_TRUE(store->CreateSession(*created, 0).ok());
  const uint64_t epoch = store->OpenProducer("s1", "p")->epoch;
  ASSERT_TRUE(store->Merge("s1", Delta(*created, 0, 4, epoch, 1)).ok());
  const std::string path = dir_.path() + "/state/s1.session";
  ASSERT_TRUE(std::ifstream(path).good());
  ASSERT_TRUE(store->DeleteSession("s1", "t").ok());
  EXPECT_FALSE(std::ifstream(path).good());
  // A stream still open merges later: refused, and the file does not come back.
  EXPECT_EQ(store->Merge("s1", Delta(*created, 4, 6, epoch, 2)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_EQ(Open()->size(), 0u);
}

TEST_F(FileStateStoreTest, ACorruptFileIsSetAsideAndReported) {
  {
    std::unique_ptr<FileStateStore> store = Open();
    ASSERT_TRUE(store->CreateSession(*Session(), 0).ok());
  }
  {
    std::ofstream out(dir_.path() + "/state/s1.session", std::ios::binary | std::ios::trunc);
    out << "not a state file";
  }
  std::vector<absl::Status> errors;
  std::unique_ptr<FileStateStore> store = Open(Env::Default(), &errors);
  EXPECT_EQ(store->size(), 0u);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message().find("s1.session"), absl::string_view::npos) << errors[0];
  EXPECT_TRUE(std::ifstream(dir_.path() + "/state/s1.session.corrupt").good());
}

}  // namespace
}  // namespace caliper
