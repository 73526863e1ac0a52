// `caliper merge`: a new checkpoint directory = an HF checkpoint + a compressed-tensors or
// ModelOpt scale file. The weight shards are never rewritten: they are hard-linked into the new
// directory (no copy, no extra space, and the new directory survives deletion of the old one),
// or symlinked by absolute path when a hard link is impossible (another filesystem). The scale
// tensors go into their own shard, listed with the originals in model.safetensors.index.json,
// and config.json gains the quantization block. Not thread-safe; the output appears whole or
// not at all (built in a staging directory, then renamed).
#ifndef CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_
#define CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/env/env.h"
#include "core/calibration/warnings.h"

namespace caliper {

inline constexpr char kMergedScalesShard[] = "model-caliper-scales.safetensors";
// A lone model.safetensors is linked under this name: loaders prefer model.safetensors over
// an index, which would hide the scale shard.
inline constexpr char kMergedSingleShard[] = "model-weights.safetensors";

struct MergeOptions {
  std::string checkpoint_dir;  // HF checkpoint (config.json + safetensors)
  std::string scales_path;     // compressed-tensors or ModelOpt scale safetensors
  std::string out_dir;         // must not exist, or be empty
  bool kv_only = false;        // merge only KV scales, dropping NVFP4 global scales
  Env* env = Env::Default();   // writes of the new files, the staging directory and its rename
};

struct MergeReport {
  std::string format;                  // "compressed-tensors" or "modelopt"
  int scale_tensors = 0;               // written to kMergedScalesShard
  std::vector<std::string> hard_linked, symlinked;  // file names in out_dir
  std::vector<ScaleWarning> warnings;
};

// FailedPrecondition when the checkpoint already holds any of the scale tensors (engines would
// load both), already has KV scales configured, uses another quant_method, or when NVFP4 scales
// meet unquantized weights (engines need packed FP4 weights; use kv_only). InvalidArgument for a
// scale file that does not match the model (or out_dir naming checkpoint_dir). Errors name the
// file and key; failed writes are the Env's I/O errors.
absl::StatusOr<MergeReport> MergeScalesIntoCheckpoint(const MergeOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_
