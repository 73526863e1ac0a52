// A Hugging Face checkpoint directory: config.json plus either model.safetensors or shards listed
// in model.safetensors.index.json (weight_map), else every *.safetensors. Shards are memory-mapped
// only when first touched; ForEachTensor visits one tensor at a time and drops its pages after, so
// a checkpoint of any size needs no more RAM than its largest tensor. Not thread-safe.
#ifndef CALIPER_CORE_FORMATS_CHECKPOINT_H_
#define CALIPER_CORE_FORMATS_CHECKPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/model_config.h"
#include "core/env/env.h"
#include "core/formats/safetensors.h"

namespace caliper {

inline constexpr char kSafetensorsIndexName[] = "model.safetensors.index.json";
inline constexpr char kSingleSafetensorsName[] = "model.safetensors";

// True for the weights NVFP4 recipes quantize: 2-D float `{module}.weight` tensors except
// embeddings and lm_head (the same rule the client's weight streaming uses).
bool IsQuantizableLinearWeight(const SafetensorsEntry& entry);

// The prefix before the layer index in a checkpoint's tensor names: "model.layers." for text
// models, "model.language_model.layers." etc. for wrapped ones (the first attention tensor says).
std::string DetectLayersPrefix(const std::vector<std::string>& names);

class HfCheckpoint {
 public:
  // Reads the index (or lists the single file / *.safetensors). NotFound when `dir` has no
  // safetensors at all; InvalidArgument naming the index and key for a malformed weight_map or a
  // shard name that leaves the directory. Shard headers are not read yet. The index and
  // config.json are read through `env` (shards are mapped, see SafetensorsFile).
  static absl::StatusOr<std::unique_ptr<HfCheckpoint>> Open(const std::string& dir,
                                                            Env* env = Env::Default());

  const std::string& dir() const { return dir_; }
  // Shard file names relative to dir(), sorted.
  const std::vector<std::string>& shard_files() const { return shards_; }
  // True when the tensor list came from model.safetensors.index.json.
  bool indexed() const { return from_index_; }
  // Every tensor name, sorted. Without an index this opens every shard's header.
  absl::StatusOr<std::vector<std::string>> TensorNames();
  // The shard holding `name` (NotFound naming it if none).
  absl::StatusOr<std::string> ShardOf(absl::string_view name);

  // config.json text and its parsed form (errors name dir/config.json).
  absl::StatusOr<std::string> ReadConfigText() const;
  absl::StatusOr<ModelConfig> ReadConfig() const;

  struct Tensor {
    const SafetensorsFile* file = nullptr;  // valid until the next call on this checkpoint
    const SafetensorsEntry* entry = nullptr;
  };
  // Maps the tensor's shard (if not mapped yet) and finds it; NotFound names tensor and shard.
  absl::StatusOr<Tensor> Get(absl::string_view name);

  // Visits tensors accepted by `filter` (all when empty) shard by shard, in data order, with at
  // most one shard mapped at a time; each tensor's pages are released after `visit` returns.
  // Stops at and returns the first error of `visit`.
  absl::Status ForEachTensor(const std::function<bool(const SafetensorsEntry&)>& filter,
                             const std::function<absl::Status(const SafetensorsFile&,
                                                              const SafetensorsEntry&)>& visit);

 private:
  HfCheckpoint() = default;
  absl::StatusOr<const SafetensorsFile*> Shard(const std::string& shard);
  absl::Status IndexAllShards();  // builds name -> shard for unindexed checkpoints

  std::string dir_;
  Env* env_ = Env::Default();
  bool from_index_ = false;   // weight_map came from model.safetensors.index.json
  bool names_known_ = false;  // shard_of_ lists every tensor (index read, or all headers)
  std::vector<std::string> shards_;
  std::map<std::string, std::string> shard_of_;  // tensor -> shard (complete once indexed)
  std::string open_name_;                        // the one shard currently mapped
  std::unique_ptr<SafetensorsFile> open_file_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_CHECKPOINT_H_
