// Reading scales back: compressed-tensors / ModelOpt scale tensors from a safetensors file or a
// whole checkpoint, and LightLLM rows back to the model's original heads. Errors name the file
// and tensor.
#ifndef CALIPER_CORE_FORMATS_SCALE_IMPORT_H_
#define CALIPER_CORE_FORMATS_SCALE_IMPORT_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/formats/safetensors.h"

namespace caliper {

// Scales read back from a scale file or checkpoint.
struct ImportedScales {
  std::string format;                 // kFormatCompressedTensors or kFormatModelOpt
  std::optional<KvScales> kv;         // e4m3fn; absmax = scale * 448
  Nvfp4Scales nvfp4;                  // in the file's form
};

// Reads compressed-tensors or ModelOpt scale tensors (detected by name) from any safetensors
// file; F32/BF16/F16 values. `model` (when given) checks layer and head counts. Errors name the
// file and tensor: mixed formats, a layer with K but no V, a shape that is neither [] / [1] nor
// [num_kv_heads], or no scale tensors at all.
absl::StatusOr<ImportedScales> ImportScales(const SafetensorsFile& file,
                                            const std::optional<ModelConfig>& model);

struct LightLlmCalibration;
// LightLLM rows (over the heads deployed when calibrated, replicas included) back to the model's
// original heads: per head through AdaptHeadRow (group max over replicas), per tensor as is;
// absmax = scale * 448. InvalidArgument naming the count that disagrees with `model`.
absl::StatusOr<KvScales> KvScalesFromLightLlm(const LightLlmCalibration& calibration,
                                              const ModelConfig& model);

class HfCheckpoint;
// The same over a whole checkpoint: scale tensors are gathered from every shard (they are small;
// weights are never read). NotFound when the checkpoint holds none.
absl::StatusOr<ImportedScales> ImportScalesFromCheckpoint(HfCheckpoint& checkpoint,
                                                          const std::optional<ModelConfig>& model);

// True for a tensor name ImportScales reads (used to pick scale tensors out of a checkpoint).
bool IsScaleTensorName(absl::string_view name);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_SCALE_IMPORT_H_
