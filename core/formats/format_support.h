// Pieces every engine renderer shares (KV row checks, checkpoint e4m3fn rows, ignore lists).
// Internal to core/formats: the engine files include it, callers use engine_formats.h.
#ifndef CALIPER_CORE_FORMATS_FORMAT_SUPPORT_H_
#define CALIPER_CORE_FORMATS_FORMAT_SUPPORT_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/calibration/kv_scales.h"
#include "core/calibration/model_config.h"
#include "core/calibration/nvfp4.h"
#include "core/calibration/warnings.h"
#include "core/formats/render_inputs.h"

namespace caliper::formats_internal {

inline constexpr float kE4M3FnMax = 448.0f;

std::string FloatBytes(absl::Span<const float> values);
// "<layers_prefix><layer>.self_attn."
std::string LayerPrefix(const RenderInputs& inputs, size_t layer);
// The compressed-tensors K / V scale tensor after LayerPrefix: "k_scale" / "v_scale", or for MLA
// models "k_proj.k_scale" / "v_proj.v_scale" (the names vLLM's MLA loader resolves).
std::string KvScaleLeaf(const RenderInputs& inputs, bool key);
// inputs.ignore, or the default: lm_head plus MoE router gates (in each toolkit's syntax).
std::vector<std::string> IgnoreList(const RenderInputs& inputs, bool modelopt);
// KV rows must cover every layer with one (per tensor) or num_kv_heads (per head) entries.
absl::Status CheckKv(const KvScales& kv, const ModelConfig& model);
// Checkpoints hold e4m3fn scales (absmax / 448); vLLM doubles them itself on e4m3fnuz GPUs.
std::vector<float> CheckpointKvRow(const KvScales& kv, bool key, size_t layer);
std::vector<float> CheckpointKvRow(const KvScales& kv, KvKind kind, size_t layer);
// Q rows, when the scales carry them, must match K's shape; InvalidArgument naming the layer.
absl::Status CheckQuery(const KvScales& kv);
// The formats that hold no query scale say so (one warning naming the format) when Q was
// calibrated.
void WarnQueryDropped(const KvScales& kv, absl::string_view format, absl::string_view why,
                      std::vector<ScaleWarning>* warnings);
void WarnFnuz(const KvScales& kv, absl::string_view format, std::vector<ScaleWarning>* warnings);
bool HasInputs(const Nvfp4Scales& scales);
bool HasWeights(const Nvfp4Scales& scales);

}  // namespace caliper::formats_internal

#endif  // CALIPER_CORE_FORMATS_FORMAT_SUPPORT_H_
