// Durable sessions: snapshot/restore of a whole session and the session directory (the file
// store built on them: tests/core/state/file_state_store_test.cc).
#include "core/state/session_store.h"

#include <atomic>
#include <chrono>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/session/session_id.h"
#include "core/tensor/reduction_backend.h"
#include "core/state/session_state.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"
#include "tests/support/state_test_util.h"

namespace caliper {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing_util::FaultInjectionEnv;
using testing_util::SlurpFile;
using testing_util::SpitFile;
using testing_util::TempDir;

constexpr int kLayers = 3;
constexpr int kHeads = 4;
constexpr int kHeadDim = 8;

ModelConfig Model() { return testing::LlamaTestModel(kLayers, kHeads, kHeadDim, 8); }

Recipe EverythingOn() {
  Recipe r = testing::AllOnRecipe();
  r.activation_observer = ActivationObserverKind::kMinMax;  // order-dependent: per-batch state
  r.averaging_constant = 0.25;
  r.warmup_batches = 1;
  return r;
}

// One producer's deterministic chunk stream: K/V for every layer, weights and inputs.
struct Chunk {
  ChunkKind kind;
  int layer = 0;
  std::string module;
  int64_t batch = 0;
  std::vector<float> data;
  std::vector<int64_t> shape;
};

std::vector<Chunk> Stream(uint32_t seed, int batches) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = dist(rng);
    return v;
  };
  std::vector<Chunk> out;
  for (int batch = 0; batch < batches; ++batch) {
    for (int layer = 0; layer < kLayers; ++layer) {
      for (ChunkKind kind : {ChunkKind::kKey, ChunkKind::kValue}) {
        out.push_back({kind, layer, "", batch, random(3 * kHeads * kHeadDim), {3, kHeads, kHeadDim}});
      }
      const std::string prefix = "model.layers." + std::to_string(layer) + ".self_attn.";
      for (const char* proj : {"q_proj", "k_proj"}) {
        out.push_back({ChunkKind::kInput, 0, prefix + proj, batch, random(2 * 64), {2, 64}});
        if (batch == 0) {
          out.push_back({ChunkKind::kWeight, 0, prefix + proj, 0, random(16 * 64), {16, 64}});
        }
      }
    }
  }
  return out;
}

ChunkRef Ref(const Chunk& c, uint64_t sequence, absl::string_view producer) {
  ChunkRef ref;
  ref.kind = c.kind;
  ref.layer = c.layer;
  ref.module = c.module;
  ref.batch = c.batch;
  ref.dtype = DType::kF32;
  ref.shape = c.shape;
  ref.sequence = sequence;
  ref.producer_id = producer;
  ref.data = {reinterpret_cast<const uint8_t*>(c.data.data()), c.data.size() * sizeof(float)};
  return ref;
}

// Every engine file the session renders, for exact comparison.
std::vector<std::string> Outputs(CalibrationSession& session) {
  EXPECT_TRUE(session.Finalize().ok());
  Deployment tp2;
  tp2.tp_size = 2;
  absl::StatusOr<SessionScales> scales = session.Scales(tp2, Nvfp4Convention::kCompressedTensors);
  EXPECT_TRUE(scales.ok()) << scales.status();
  std::vector<ScaleWarning> warnings;
  absl::StatusOr<std::vector<RenderedFile>> files = RenderSessionOutputs(
      *scales, std::vector<std::string>{"lightllm", "compressed-tensors"}, &warnings);
  EXPECT_TRUE(files.ok()) << files.status();
  std::vector<std::string> out;
  for (const RenderedFile& f : *files) out.push_back(f.name + "\n" + f.content);
  return out;
}

class SessionStateTest : public ::testing::Test {
 protected:
  std::unique_ptr<CalibrationSession> NewSession() {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> s =
        CalibrationSession::Create(Model(), EverythingOn(), "sess01", "name", "team-a");
    EXPECT_TRUE(s.ok()) << s.status();
    return *std::move(s);
  }
  // Feeds chunks [from, to) of `stream` as producer `producer` (sequences from 1).
  void Feed(CalibrationSession& s, const std::vector<Chunk>& stream, size_t from, size_t to,
            const std::string& producer) {
    absl::StatusOr<ProducerLedger::Stream> handle = s.OpenProducerStream(producer);
    ASSERT_TRUE(handle.ok());
    for (size_t i = from; i < to; ++i) {
      StreamObserveResult r = s.Observe(Ref(stream[i], i + 1, producer), *backend_, &*handle);
      ASSERT_TRUE(r.status.ok()) << r.status;
    }
  }
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(1);
};

TEST_F(SessionStateTest, RestoreReproducesCountersLedgerAndScalesExactly) {
  const std::vector<Chunk> a = Stream(1, 3), b = Stream(2, 3);
  std::unique_ptr<CalibrationSession> original = NewSession();
  Feed(*original, a, 0, a.size(), "rank0");
  Feed(*original, b, 0, 10, "rank1");
  original->RecordRejected();

  const SessionSnapshot snapshot = SnapshotSession(*original);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> restored =
      RestoreSession(snapshot.bytes);
  ASSERT_TRUE(restored.ok()) << restored.status();
  CalibrationSession& r = **restored;
  EXPECT_EQ(r.id(), "sess01");
  EXPECT_EQ(r.tenant(), "team-a");
  EXPECT_EQ(r.created_unix_ms(), original->created_unix_ms());
  const SessionStatus before = original->Status(), after = r.Status();
  EXPECT_EQ(after.name, "name");
  EXPECT_EQ(after.accepted_chunks, before.accepted_chunks);
  EXPECT_EQ(after.accepted_bytes, before.accepted_bytes);
  EXPECT_EQ(after.rejected_chunks, 1);
  EXPECT_EQ(after.skipped_warmup_chunks, before.skipped_warmup_chunks);
  EXPECT_GT(after.skipped_warmup_chunks, 0);
  // Re-encoding the restored session gives the same bytes: nothing was lost or reordered.
  EXPECT_EQ(SnapshotSession(r).bytes, snapshot.bytes);
  // Everything restored is durable; producers resume after what they sent.
  EXPECT_EQ(r.DurableResumeFrom("rank0"), a.size() + 1);
  EXPECT_EQ(r.DurableResumeFrom("rank1"), 11u);
  EXPECT_EQ(r.DurableChangeCount(), r.ChangeCount());

  // Both finish the same way (rank1 resumes in both); the files are identical.
  Feed(*original, b, 10, b.size(), "rank1");
  Feed(r, b, 10, b.size(), "rank1");
  EXPECT_EQ(Outputs(r), Outputs(*original));
}

TEST_F(SessionStateTest, ResentChunksAfterRestoreAreDuplicates) {
  const std::vector<Chunk> a = Stream(3, 2);
  std::unique_ptr<CalibrationSession> s = NewSession();
  Feed(*s, a, 0, 8, "rank0");
  absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(SnapshotSession(*s).bytes);
  ASSERT_TRUE(r.ok());
  // The producer did not know how far it got and re-sends from 5.
  absl::StatusOr<ProducerLedger::Stream> handle = (*r)->OpenProducerStream("rank0");
  ASSERT_TRUE(handle.ok());
  for (size_t i = 4; i < a.size(); ++i) {
    StreamObserveResult outcome = (*r)->Observe(Ref(a[i], i + 1, "rank0"), *backend_, &*handle);
    ASSERT_TRUE(outcome.status.ok()) << outcome.status;
    EXPECT_EQ(outcome.outcome == ObserveOutcome::kDuplicate, i < 8) << i;
  }
  std::unique_ptr<CalibrationSession> uninterrupted = NewSession();
  Feed(*uninterrupted, a, 0, a.size(), "rank0");
  EXPECT_EQ((*r)->Status().duplicate_chunks, 4);
  EXPECT_EQ(Outputs(**r), Outputs(*uninterrupted));
}

TEST_F(SessionStateTest, FinalizedSessionComesBackFinalized) {
  std::unique_ptr<CalibrationSession> s = NewSession();
  const std::vector<Chunk> a = Stream(4, 2);
  Feed(*s, a, 0, a.size(), "rank0");
  const std::vector<std::string> expected = Outputs(*s);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(SnapshotSession(*s).bytes);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->Status().state, SessionState::kFinalized);
  EXPECT_TRUE((*r)->Scales({}, Nvfp4Convention::kModelOpt).ok());  // no Finalize call needed
  EXPECT_EQ(Outputs(**r), expected);
}

TEST_F(SessionStateTest, EveryTruncationAndCorruptFieldIsAnErrorNotACrash) {
  std::unique_ptr<CalibrationSession> s = NewSession();
  const std::vector<Chunk> a = Stream(5, 2);
  Feed(*s, a, 0, 12, "rank0");
  const std::string bytes = SnapshotSession(*s).bytes;
  for (size_t n = 0; n < bytes.size(); ++n) {
    absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(bytes.substr(0, n));
    ASSERT_FALSE(r.ok()) << "prefix " << n;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  }
  EXPECT_THAT(RestoreSession(bytes + "x").status().message(), HasSubstr("session"));
  std::string version = bytes;
  version[1] = 9;
  EXPECT_THAT(RestoreSession(version).status().message(),
              HasSubstr("session.version: unsupported version 9"));
}

// Crafted state files (valid framing) once aborted start-up (num_layers 2^30: bad_alloc),
// cost 2.4 GiB (10^7) or loaded invalid UTF-8 that made replies undecodable: all refused up
// front, naming the field and the limit, before anything is sized by them.
TEST_F(SessionStateTest, CraftedCountsAndStringsAreRefusedBeforeAllocating) {
  std::unique_ptr<CalibrationSession> s = NewSession();
  const std::string bytes = SnapshotSession(*s).bytes;
  // Layout: tag, version, id, name, tenant (u32 length + bytes each), created (i64),
  // architecture, model_type, then num_layers (i64).
  auto string_at = [&](size_t offset) {
    uint32_t n = 0;
    for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
    return offset + 4 + n;
  };
  size_t offset = 2;
  offset = string_at(offset);  // id
  const size_t name_offset = offset;
  offset = string_at(offset);  // name
  offset = string_at(offset);  // tenant
  offset += 8;                 // created_unix_ms
  offset = string_at(offset);  // architecture
  offset = string_at(offset);  // model_type
  for (int64_t layers : {int64_t{1} << 30, int64_t{10'000'000}}) {
    std::string crafted = bytes;
    for (int i = 0; i < 8; ++i) crafted[offset + i] = static_cast<char>((layers >> (8 * i)) & 0xff);
    absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(crafted);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(r.status().message(),
              absl::StrCat("num_layers: ", layers, " exceeds the limit max_layers=256"));
  }
  std::string bad_name = bytes;
  bad_name[name_offset + 4] = static_cast<char>(0xff);  // first byte of "name"
  absl::StatusOr<std::unique_ptr<CalibrationSession>> r = RestoreSession(bad_name);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "session.name: invalid UTF-8 at byte 0");
  // A server started with smaller limits than the file needs refuses it as well.
  Limits small;
  small.model.max_layers = 1;
  EXPECT_THAT(RestoreSession(bytes, small).status().message(),
              HasSubstr("exceeds the limit max_layers=1"));
}

class SessionStoreTest : public SessionStateTest {
 protected:
  TempDir dir_;
};

TEST_F(SessionStoreTest, CorruptFileIsReportedAndSetAsideOthersLoad) {
  absl::StatusOr<std::unique_ptr<SessionStore>> store = SessionStore::Open(dir_.path() + "/state");
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    auto s = CalibrationSession::Create(Model(), EverythingOn(), NewSessionId());
    ASSERT_TRUE(s.ok());
    ids.push_back((*s)->id());
    ASSERT_TRUE((*store)->Write((*s)->id(), SnapshotSession(**s).bytes).ok());
  }
  // Flip one payload bit in the second file.
  const std::string victim = (*store)->PathOf(ids[1]);
  std::string raw = SlurpFile(victim);
  raw[raw.size() - 3] ^= 0x10;
  SpitFile(victim, raw);

  SessionStore::Loaded loaded = (*store)->LoadAll();
  ASSERT_EQ(loaded.sessions.size(), 2u);
  ASSERT_EQ(loaded.errors.size(), 1u);
  EXPECT_EQ(loaded.errors[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(loaded.errors[0].message(), HasSubstr(victim));
  EXPECT_THAT(loaded.errors[0].message(), HasSubstr("checksum"));
  EXPECT_FALSE(fs::exists(victim));
  EXPECT_TRUE(fs::exists(victim + ".corrupt"));
  // A second start-up no longer sees it.
  EXPECT_TRUE((*store)->LoadAll().errors.empty());
}

TEST_F(SessionStoreTest, FileNamedForAnotherIdIsRefused) {
  absl::StatusOr<std::unique_ptr<SessionStore>> store = SessionStore::Open(dir_.path());
  ASSERT_TRUE(store.ok());
  std::unique_ptr<CalibrationSession> s = NewSession();
  ASSERT_TRUE((*store)->Write("other", SnapshotSession(*s).bytes).ok());
  SessionStore::Loaded loaded = (*store)->LoadAll();
  EXPECT_TRUE(loaded.sessions.empty());
  ASSERT_EQ(loaded.errors.size(), 1u);
  EXPECT_THAT(loaded.errors[0].message(), HasSubstr("does not match the file name"));
}

}  // namespace
}  // namespace caliper
