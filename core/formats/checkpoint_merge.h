// `caliper merge`: a new checkpoint directory = an HF checkpoint + a compressed-tensors or
// ModelOpt scale file. The weight shards are never rewritten: they and the checkpoint's other
// files (tokenizer, generation config, ...) are copied into the new directory, as a reflink
// where the filesystem offers one (copy-on-write: no extra space until written), so writing
// into the new directory in place never changes the original. With `link_unchanged` they are
// hard-linked instead (symlinked by absolute path across filesystems) and the report names each
// one. The scale tensors go into their own shard, listed with the originals in
// model.safetensors.index.json, and config.json gains the quantization block. Not thread-safe;
// the output appears whole or not at all (built in a staging directory, then renamed).
#ifndef CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_
#define CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/env/env.h"
#include "core/calibration/warnings.h"

namespace caliper {

inline constexpr char kMergedScalesShard[] = "model-caliper-scales.safetensors";
// A lone model.safetensors is carried under this name: loaders prefer model.safetensors over
// an index, which would hide the scale shard.
inline constexpr char kMergedSingleShard[] = "model-weights.safetensors";

struct MergeOptions {
  std::string checkpoint_dir;  // HF checkpoint (config.json + safetensors)
  std::string scales_path;     // compressed-tensors or ModelOpt scale safetensors
  std::string out_dir;         // must not exist, or be empty
  bool kv_only = false;        // merge only KV scales, dropping NVFP4 global scales
  // Hard-link the shards and other files the merge does not change (symlink by absolute path
  // across filesystems) instead of copying them: no space and no copy time, but writing into
  // one of them in place (as json.dump(open(path, "w")) does) changes the original.
  // `caliper merge --link-unchanged`.
  bool link_unchanged = false;
  Env* env = Env::Default();   // writes of the new files, the staging directory and its rename
};

struct MergeReport {
  std::string format;                  // "compressed-tensors" or "modelopt"
  int scale_tensors = 0;               // written to kMergedScalesShard
  // File names in out_dir of the files carried over unchanged (shards, tokenizer, ...):
  // copied (the default), or hard-linked / symlinked to the original's (link_unchanged only).
  std::vector<std::string> copied, hard_linked, symlinked;
  bool linked_any() const { return !hard_linked.empty() || !symlinked.empty(); }
  std::vector<ScaleWarning> warnings;
};

// FailedPrecondition when the checkpoint already holds any of the scale tensors (engines would
// load both), already has KV scales configured, uses another quant_method, or when NVFP4 scales
// meet unquantized weights (engines need packed FP4 weights; use kv_only). InvalidArgument for a
// scale file that does not match the model (or out_dir naming checkpoint_dir). Errors name the
// file and key; failed writes are the Env's I/O errors (a full disk while copying the unchanged
// files says link_unchanged would link them).
absl::StatusOr<MergeReport> MergeScalesIntoCheckpoint(const MergeOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_CHECKPOINT_MERGE_H_
