// The check's rules in the finalize path (CalibrationSession::Scales): an expert whose inputs
// far exceed its siblings' is a warning on the scales; an expert that got weights but no input
// while its siblings did refuses them, naming the rule and tensor.
#include <string>
#include <vector>

#include "core/session/session.h"
#include "core/tensor/reduction_backend.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/session_test_util.h"

namespace caliper {
namespace {

constexpr int kTokens = 4, kColumns = 32;

ChunkRef Chunk(ChunkKind kind, const std::vector<float>& data, std::vector<int64_t> shape,
               absl::string_view module) {
  ChunkRef c;
  c.kind = kind;
  c.module = module;
  c.dtype = DType::kF32;
  c.shape = std::move(shape);
  c.data = ByteSpans(reinterpret_cast<const uint8_t*>(data.data()), data.size() * sizeof(float));
  return c;
}

std::string Expert(int e) { return "model.layers.0.mlp.experts." + std::to_string(e) + ".down_proj"; }

std::unique_ptr<CalibrationSession> Session(const std::vector<float>& amax_per_expert,
                                            int weights_only_expert) {
  auto backend = MakeCpuBackend(1);
  Recipe recipe;
  recipe.nvfp4_weights = true;
  recipe.nvfp4_activations = true;
  recipe.kv = KvMode::kOff;  // (unobserved K/V would be 1.0 placeholders: a finding too)
  auto s = CalibrationSession::Create(testing::LlamaTestModel(1, 2, 8, 4), recipe, "s1");
  EXPECT_TRUE(s.ok()) << s.status();
  for (int e = 0; e < static_cast<int>(amax_per_expert.size()); ++e) {
    const std::string module = Expert(e);
    std::vector<float> w(kColumns * kColumns, 0.5f);
    EXPECT_TRUE((*s)->Observe(Chunk(ChunkKind::kWeight, w, {kColumns, kColumns}, module), *backend).ok());
    if (e == weights_only_expert) continue;
    std::vector<float> x(kTokens * kColumns, amax_per_expert[e] / 2);
    x[3] = amax_per_expert[e];
    EXPECT_TRUE((*s)->Observe(Chunk(ChunkKind::kInput, x, {kTokens, kColumns}, module), *backend).ok());
  }
  EXPECT_TRUE((*s)->Finalize().ok());
  return *std::move(s);
}

TEST(FinalizeCheckTest, OutlyingExpertIsAWarning) {
  auto s = Session({1.0f, 1.1f, 0.9f, 200.0f}, /*weights_only_expert=*/-1);
  absl::StatusOr<SessionScales> scales = s->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  ASSERT_TRUE(scales.ok()) << scales.status();
  bool warned = false;
  for (const ScaleWarning& w : scales->warnings) {
    if (w.where == Expert(3) + ".input_global_scale" &&
        w.message.find("check: expert-input-scale-outlier") == 0) {
      warned = true;
    }
  }
  EXPECT_TRUE(warned);
}

TEST(FinalizeCheckTest, ExpertWithoutInputsRefusesTheScales) {
  auto s = Session({1.0f, 1.1f, 0.9f, 1.2f}, /*weights_only_expert=*/2);
  absl::StatusOr<SessionScales> scales = s->Scales(Deployment{}, Nvfp4Convention::kCompressedTensors);
  EXPECT_EQ(scales.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(scales.status().message()),
              ::testing::HasSubstr("expert-input-scale-missing: " + Expert(2) +
                                   ".input_global_scale"));
}

TEST(FinalizeCheckTest, HealthyScalesGetNoCheckWarning) {
  auto s = Session({1.0f, 1.1f, 0.9f, 1.2f}, -1);
  absl::StatusOr<SessionScales> scales = s->Scales(Deployment{}, Nvfp4Convention::kModelOpt);
  ASSERT_TRUE(scales.ok()) << scales.status();
  for (const ScaleWarning& w : scales->warnings) {
    EXPECT_EQ(w.message.find("check:"), std::string::npos) << w.where << ": " << w.message;
  }
}

}  // namespace
}  // namespace caliper
