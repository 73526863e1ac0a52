// What `caliper calibrate` streams from checkpoints and dumps: MoE routers are never streamed
// (no scale is written for them, as the Python hooks and `caliper quantize` treat them), and
// the planner says so instead of silently dropping them.
#include "client/tensor_stream.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "core/formats/safetensors.h"
#include "gtest/gtest.h"

namespace caliper::cli {
namespace {

std::string Zeros(int64_t floats) { return std::string(static_cast<size_t>(floats) * 4, '\0'); }

std::vector<std::string> Modules(const StreamPlan& plan) {
  std::vector<std::string> out;
  for (const PlannedChunk& c : plan.chunks) out.push_back(c.module);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

TEST(TensorStreamTest, RoutersAreNeverStreamed) {
  const std::string dir = ::testing::TempDir() + "/tensor_stream_test";
  std::filesystem::create_directories(dir);
  struct RemoveAll {
    std::string dir;
    ~RemoveAll() { std::filesystem::remove_all(dir); }
  } remove_at_end{dir};
  SafetensorsWriter weights;
  ASSERT_TRUE(weights.Add("model.layers.0.block_sparse_moe.gate.weight", "F32", {4, 16}, Zeros(64)).ok());
  ASSERT_TRUE(weights.Add("model.layers.0.block_sparse_moe.experts.0.w1.weight", "F32", {8, 16},
                          Zeros(128)).ok());
  ASSERT_TRUE(weights.Add("model.layers.0.self_attn.q_proj.weight", "F32", {16, 16}, Zeros(256)).ok());
  ASSERT_TRUE(weights.Add("lm_head.weight", "F32", {32, 16}, Zeros(512)).ok());
  ASSERT_TRUE(weights.WriteFile(dir + "/model.safetensors").ok());
  auto plan = PlanWeightFile(dir + "/model.safetensors", 1 << 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Modules(*plan), (std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.0.w1",
                                                      "model.layers.0.self_attn.q_proj"}));
  EXPECT_EQ(plan->ignored, std::vector<std::string>{"model.layers.0.block_sparse_moe.gate"});

  SafetensorsWriter dump;
  ASSERT_TRUE(dump.Add("model.layers.0.block_sparse_moe.gate.input", "F32", {2, 16}, Zeros(32)).ok());
  ASSERT_TRUE(dump.Add("model.layers.0.mlp.gate_proj.input", "F32", {2, 16}, Zeros(32)).ok());
  ASSERT_TRUE(dump.WriteFile(dir + "/dump.safetensors").ok());
  PlanOptions options;
  options.inputs = true;
  auto inputs = PlanDumpFile(dir + "/dump.safetensors", options, 0);
  ASSERT_TRUE(inputs.ok()) << inputs.status();
  EXPECT_EQ(Modules(*inputs), std::vector<std::string>{"model.layers.0.mlp.gate_proj"});
  EXPECT_EQ(inputs->ignored, std::vector<std::string>{"model.layers.0.block_sparse_moe.gate"});
}

}  // namespace
}  // namespace caliper::cli
