// Reducing a tensor held in pieces (network buffer slices cut at any byte) gives bit for bit the
// result of reducing it contiguously: K/V per-head absmax, min/max ranges, NaN/Inf counts, and a
// whole session fed sliced chunks.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/calibration/observers.h"
#include "core/session/session.h"
#include "core/tensor/tensor_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

using ::testing::HasSubstr;

uint32_t Bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// Random finite values of `dtype` (any sign, zeros and subnormals included), as raw bytes.
std::vector<uint8_t> RandomFinite(DType dtype, int64_t elements, std::mt19937& rng) {
  const size_t item = ItemSize(dtype);
  std::vector<uint8_t> out(elements * item);
  for (int64_t i = 0; i < elements; ++i) {
    uint32_t b = rng();
    switch (dtype) {
      case DType::kBF16:
        b &= 0xffff;
        if ((b & 0x7f80) == 0x7f80) b &= ~0x4000u;  // clear an exponent bit: finite
        break;
      case DType::kF16:
        b &= 0xffff;
        if ((b & 0x7c00) == 0x7c00) b &= ~0x4000u;
        break;
      case DType::kF32:
        if ((b & 0x7f800000u) == 0x7f800000u) b &= ~0x40000000u;
        break;
    }
    std::memcpy(&out[i * item], &b, item);
  }
  return out;
}

// `bytes` cut at the given ascending offsets (each in (0, size)).
ByteSpans CutAt(const std::vector<uint8_t>& bytes, const std::vector<size_t>& cuts) {
  ByteSpans out;
  size_t start = 0;
  for (size_t cut : cuts) {
    out.Append(absl::MakeConstSpan(bytes.data() + start, cut - start));
    start = cut;
  }
  out.Append(absl::MakeConstSpan(bytes.data() + start, bytes.size() - start));
  return out;
}

std::vector<size_t> RandomCuts(size_t size, int count, std::mt19937& rng) {
  std::vector<size_t> cuts;
  for (int i = 0; i < count && size > 1; ++i) cuts.push_back(1 + rng() % (size - 1));
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  return cuts;
}

std::vector<size_t> EveryByte(size_t size) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < size; ++i) cuts.push_back(i);
  return cuts;
}

// Cut sets for a buffer: random, one-byte pieces, and cuts at every offset inside one element
// and one row (but not at their starts).
std::vector<std::vector<size_t>> CutSets(size_t size, size_t item, size_t row_bytes,
                                         std::mt19937& rng) {
  std::vector<std::vector<size_t>> sets = {RandomCuts(size, 3, rng), RandomCuts(size, 40, rng),
                                           EveryByte(size)};
  for (size_t off = 1; off < item; ++off) sets.push_back({item + off});
  if (size > 2 * row_bytes) sets.push_back({row_bytes + 1, row_bytes + row_bytes / 2});
  return sets;
}

class PiecewiseReductionTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<ReductionBackend> backend_ = MakeCpuBackend(2);
};

TEST_P(PiecewiseReductionTest, KvAbsMaxPerHeadMatchesContiguousBitForBit) {
  const DType dtype = GetParam();
  std::mt19937 rng(11);
  constexpr int kHeads = 4, kHeadDim = 16;
  const std::vector<int64_t> shape = {37, kHeads, kHeadDim};
  const std::vector<uint8_t> bytes = RandomFinite(dtype, 37 * kHeads * kHeadDim, rng);
  const TensorView whole = *TensorView::Create(dtype, shape, bytes);
  const absl::StatusOr<KvChunkStats> expected =
      ReduceKvChunk(KvKind::kValue, whole, {1, 2}, 2 * kHeads, kHeadDim, *backend_);
  ASSERT_TRUE(expected.ok()) << expected.status();
  for (const std::vector<size_t>& cuts :
       CutSets(bytes.size(), ItemSize(dtype), kHeads * kHeadDim * ItemSize(dtype), rng)) {
    const PiecewiseTensor pieces = *PiecewiseTensor::Create(dtype, shape, CutAt(bytes, cuts));
    const absl::StatusOr<KvChunkStats> got =
        ReduceKvChunk(KvKind::kValue, pieces, {1, 2}, 2 * kHeads, kHeadDim, *backend_);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->heads, expected->heads);
    EXPECT_EQ(got->tokens, 37);
    ASSERT_EQ(got->absmax.size(), expected->absmax.size());
    for (size_t h = 0; h < got->absmax.size(); ++h) {
      EXPECT_EQ(Bits(got->absmax[h]), Bits(expected->absmax[h])) << "head " << h << ", "
                                                                 << cuts.size() << " cuts";
    }
  }
}

TEST_P(PiecewiseReductionTest, RangeMatchesContiguousBitForBit) {
  const DType dtype = GetParam();
  std::mt19937 rng(12);
  const std::vector<int64_t> shape = {9, 31};
  const std::vector<uint8_t> bytes = RandomFinite(dtype, 9 * 31, rng);
  const RangeStats expected = *ReduceRange(*TensorView::Create(dtype, shape, bytes), *backend_);
  for (const std::vector<size_t>& cuts : CutSets(bytes.size(), ItemSize(dtype), 31, rng)) {
    const absl::StatusOr<RangeStats> got =
        ReduceRange(*PiecewiseTensor::Create(dtype, shape, CutAt(bytes, cuts)), *backend_);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(Bits(got->min), Bits(expected.min));
    EXPECT_EQ(Bits(got->max), Bits(expected.max));
  }
}

TEST_P(PiecewiseReductionTest, SignedZerosMergeLikeOneReduction) {
  // Only zeros: min is -0 and max is +0 whichever piece holds which.
  const DType dtype = GetParam();
  const size_t item = ItemSize(dtype);
  std::vector<uint8_t> bytes(8 * item, 0);
  bytes[item - 1] = 0x80;  // element 0 is -0
  bytes[8 * item - 1] = 0x80;  // element 7 is -0
  const std::vector<int64_t> shape = {8};
  const RangeStats expected = *ReduceRange(*TensorView::Create(dtype, shape, bytes), *backend_);
  EXPECT_TRUE(std::signbit(expected.min));
  EXPECT_FALSE(std::signbit(expected.max));
  std::mt19937 rng(13);
  for (const std::vector<size_t>& cuts : CutSets(bytes.size(), item, item, rng)) {
    const RangeStats got =
        *ReduceRange(*PiecewiseTensor::Create(dtype, shape, CutAt(bytes, cuts)), *backend_);
    EXPECT_EQ(Bits(got.min), Bits(expected.min));
    EXPECT_EQ(Bits(got.max), Bits(expected.max));
  }
}

TEST_P(PiecewiseReductionTest, NanSplitAcrossPiecesIsCountedOnce) {
  const DType dtype = GetParam();
  const size_t item = ItemSize(dtype);
  std::mt19937 rng(14);
  const std::vector<int64_t> shape = {6, 2, 4};
  std::vector<uint8_t> bytes = RandomFinite(dtype, 48, rng);
  const uint32_t nan = dtype == DType::kF32 ? 0x7fc00001u : dtype == DType::kF16 ? 0x7e01u : 0x7fc1u;
  std::memcpy(&bytes[21 * item], &nan, item);  // element 21: row 2, inside head 1
  const std::vector<size_t> inside_nan = {21 * item + item / 2};
  for (const std::vector<size_t>& cuts : {inside_nan, EveryByte(bytes.size())}) {
    const PiecewiseTensor pieces = *PiecewiseTensor::Create(dtype, shape, CutAt(bytes, cuts));
    const absl::StatusOr<KvChunkStats> kv =
        ReduceKvChunk(KvKind::kKey, pieces, {0, 1}, 2, 4, *backend_);
    ASSERT_FALSE(kv.ok());
    EXPECT_THAT(std::string(kv.status().message()), HasSubstr("chunk.data: 1 non-finite values"));
    const absl::StatusOr<RangeStats> range = ReduceRange(pieces, *backend_, "chunk");
    ASSERT_FALSE(range.ok());
    EXPECT_THAT(std::string(range.status().message()), HasSubstr("chunk.data: 1 non-finite"));
  }
}

// The CPU backend asking for gathered runs, as a device backend does; records each run's bytes.
class GatheringBackend : public ReductionBackend {
 public:
  explicit GatheringBackend(int64_t min_run_bytes) : min_run_bytes_(min_run_bytes) {}
  absl::string_view name() const override { return "gathering"; }
  int64_t min_run_bytes() const override { return min_run_bytes_; }
  std::vector<size_t> runs;

 protected:
  absl::Status CheckedRange(const TensorView& t, RangeStats* out) override {
    runs.push_back(t.bytes().size());
    return cpu_->Range(t, out);
  }
  absl::Status CheckedAbsMaxPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                    absl::Span<float> out, int64_t* nonfinite) override {
    runs.push_back(t.bytes().size());
    return cpu_->AbsMaxPerHead(t, num_heads, head_dim, out, nonfinite);
  }

 private:
  std::unique_ptr<ReductionBackend> cpu_ = MakeCpuBackend(1);
  const int64_t min_run_bytes_;
};

TEST_P(PiecewiseReductionTest, GatheredRunsMatchContiguousBitForBit) {
  const DType dtype = GetParam();
  const size_t row_bytes = 2 * 8 * ItemSize(dtype);
  std::mt19937 rng(16);
  const std::vector<int64_t> shape = {23, 2, 8};
  const std::vector<uint8_t> bytes = RandomFinite(dtype, 23 * 16, rng);
  const TensorView whole = *TensorView::Create(dtype, shape, bytes);
  const KvChunkStats expected = *ReduceKvChunk(KvKind::kKey, whole, {0, 1}, 2, 8, *backend_);
  const RangeStats expected_range = *ReduceRange(whole, *backend_);
  GatheringBackend gathering(static_cast<int64_t>(5 * row_bytes + 3));  // 5 rows per run
  const PiecewiseTensor pieces =
      *PiecewiseTensor::Create(dtype, shape, CutAt(bytes, RandomCuts(bytes.size(), 30, rng)));
  const KvChunkStats got = *ReduceKvChunk(KvKind::kKey, pieces, {0, 1}, 2, 8, gathering);
  for (size_t h = 0; h < 2; ++h) EXPECT_EQ(Bits(got.absmax[h]), Bits(expected.absmax[h]));
  EXPECT_THAT(gathering.runs, ::testing::ElementsAre(5 * row_bytes, 5 * row_bytes, 5 * row_bytes,
                                                      5 * row_bytes, 3 * row_bytes));
  const RangeStats range = *ReduceRange(pieces, gathering);
  EXPECT_EQ(Bits(range.min), Bits(expected_range.min));
  EXPECT_EQ(Bits(range.max), Bits(expected_range.max));
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, PiecewiseReductionTest,
                         ::testing::Values(DType::kBF16, DType::kF16, DType::kF32),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

TEST(PiecewiseTensorTest, SizeMismatchNamesTheFieldLikeTensorView) {
  std::vector<uint8_t> bytes(10);
  const absl::StatusOr<PiecewiseTensor> t =
      PiecewiseTensor::Create(DType::kF32, {3}, CutAt(bytes, {3, 7}), "chunk");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "chunk.data: 10 bytes, but shape [3] of F32 needs 12");
}

TEST(PiecewiseTensorTest, RunsAreInPlaceExceptStraddlingUnits) {
  std::vector<uint8_t> bytes(5 * 8);  // 5 units of 2 F32
  const PiecewiseTensor t = *PiecewiseTensor::Create(DType::kF32, {5, 2}, CutAt(bytes, {12, 20}));
  std::vector<std::pair<int64_t, bool>> runs;  // units, in place
  ASSERT_TRUE(t.ForEachRun(2, [&](const TensorView& run) {
                 const auto* p = static_cast<const uint8_t*>(run.data());
                 runs.emplace_back(run.shape()[0], p >= bytes.data() && p < bytes.data() + 40);
                 return absl::OkStatus();
               }).ok());
  // [0,12): unit 0 in place, unit 1 straddles 8..16; [12,20): rest of it, then unit 2 straddles
  // 16..24; [20,40): units 3 and 4 in place.
  EXPECT_THAT(runs, ::testing::ElementsAre(std::pair<int64_t, bool>{1, true},
                                           std::pair<int64_t, bool>{1, false},
                                           std::pair<int64_t, bool>{1, false},
                                           std::pair<int64_t, bool>{2, true}));
  EXPECT_FALSE(t.ForEachRun(3, [](const TensorView&) { return absl::OkStatus(); }).ok());
}

// A whole session fed sliced chunks ends with bit-identical scales.
TEST(PiecewiseSessionTest, SlicedChunksGiveTheSameScalesAsContiguous) {
  const ModelConfig model = testing::LlamaTestModel(2, 4, 16, 8);
  const Recipe recipe = testing::AllOnRecipe();
  auto contiguous = CalibrationSession::Create(model, recipe);
  auto sliced = CalibrationSession::Create(model, recipe);
  ASSERT_TRUE(contiguous.ok()) << contiguous.status();
  ASSERT_TRUE(sliced.ok());
  std::unique_ptr<ReductionBackend> backend = MakeCpuBackend(1);
  std::mt19937 rng(15);
  std::vector<std::vector<uint8_t>> keep;
  for (int i = 0; i < 12; ++i) {
    const DType dtype = static_cast<DType>(i % 3);
    ChunkRef chunk;
    chunk.kind = static_cast<ChunkKind>(i % 4);
    chunk.layer = (i / 4) % 2;
    chunk.module = "model.layers.0.self_attn.q_proj";
    chunk.dtype = dtype;
    chunk.batch = i / 4;
    chunk.shape = chunk.kind == ChunkKind::kKey || chunk.kind == ChunkKind::kValue
                      ? std::vector<int64_t>{21, 4, 16}
                      : std::vector<int64_t>{7, 48};
    const int64_t n = chunk.shape[0] * chunk.shape[1] * (chunk.shape.size() == 3 ? 16 : 1);
    keep.push_back(RandomFinite(dtype, n, rng));
    chunk.data = absl::MakeConstSpan(keep.back());
    ASSERT_TRUE((*contiguous)->Observe(chunk, *backend).ok());
    chunk.data = CutAt(keep.back(), RandomCuts(keep.back().size(), 9, rng));
    ASSERT_TRUE((*sliced)->Observe(chunk, *backend).ok());
  }
  ASSERT_TRUE((*contiguous)->Finalize().ok());
  ASSERT_TRUE((*sliced)->Finalize().ok());
  const SessionScales a = *(*contiguous)->Scales({}, Nvfp4Convention::kModelOpt);
  const SessionScales b = *(*sliced)->Scales({}, Nvfp4Convention::kModelOpt);
  ASSERT_TRUE(a.kv_scales.has_value() && b.kv_scales.has_value());
  for (int layer = 0; layer < 2; ++layer) {
    for (int h = 0; h < 4; ++h) {
      EXPECT_EQ(Bits(a.kv_scales->k_absmax[layer][h]), Bits(b.kv_scales->k_absmax[layer][h]));
      EXPECT_EQ(Bits(a.kv_scales->v_absmax[layer][h]), Bits(b.kv_scales->v_absmax[layer][h]));
      EXPECT_GT(a.kv_scales->k_absmax[layer][h], 0.0f);
    }
  }
  const ModuleNvfp4Scales& ma = a.nvfp4.modules.at("model.layers.0.self_attn.q_proj");
  const ModuleNvfp4Scales& mb = b.nvfp4.modules.at("model.layers.0.self_attn.q_proj");
  ASSERT_TRUE(ma.weight_amax.has_value() && ma.input_amax.has_value());
  EXPECT_EQ(Bits(*ma.weight_amax), Bits(*mb.weight_amax));
  EXPECT_EQ(Bits(*ma.input_amax), Bits(*mb.input_amax));
}

}  // namespace
}  // namespace caliper
