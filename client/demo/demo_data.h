// Synthetic calibration data for a small Llama-like model, for the demo and end-to-end tests:
// config.json, a sharded HF-style BF16 checkpoint, and per-TP-rank, per-batch dumps named as
// `caliper calibrate` reads them. Heavy-tailed values with a few outlier heads and channels.
// Deterministic given the seed (own samplers over std::mt19937_64, no libstdc++ distributions).
#ifndef CALIPER_CLIENT_DEMO_DEMO_DATA_H_
#define CALIPER_CLIENT_DEMO_DEMO_DATA_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace caliper {

struct DemoOptions {
  int num_layers = 4;
  int hidden_size = 256;
  int num_attention_heads = 8;
  int num_kv_heads = 4;         // head_dim = hidden_size / num_attention_heads
  int intermediate_size = 688;
  int tp_size = 2;              // producers of the dumps; must divide heads and widths
  int batches = 3;              // forward passes, one file per rank and batch
  int tokens = 48;              // tokens per forward pass
  int checkpoint_shards = 2;    // 1: model.safetensors; >1: shards plus index json
  uint64_t seed = 1234;
};

struct DemoFiles {
  std::string config_json;              // <dir>/config.json
  std::string checkpoint_dir;           // <dir>/checkpoint (also holds a config.json)
  std::vector<std::string> dumps;       // <dir>/dumps/rank{r}_batch{b}.safetensors
  int64_t bytes_written = 0;
};

// Writes everything under `dir` (created if missing). Errors name the file or option.
absl::StatusOr<DemoFiles> WriteDemo(const DemoOptions& options, const std::string& dir);

// The HF config.json text of the demo model.
std::string DemoConfigJson(const DemoOptions& options);

// Linear modules of one decoder layer, as HF names them under model.layers.{L}.
const std::vector<std::string>& DemoLayerModules();

}  // namespace caliper

#endif  // CALIPER_CLIENT_DEMO_DEMO_DATA_H_
