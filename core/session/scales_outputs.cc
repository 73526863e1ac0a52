#include "core/session/scales_outputs.h"

#include <utility>

#include "core/formats/scales_json.h"

namespace caliper {
namespace {

const char* KvModeWord(KvMode mode) {
  switch (mode) {
    case KvMode::kPerHead: return "per_head";
    case KvMode::kPerTensor: return "per_tensor";
    case KvMode::kOff: break;
  }
  return "off";
}

}  // namespace

absl::StatusOr<ScalesOutputs> RenderScalesOutputs(const SessionStatus& status,
                                                  const SessionScales& scales,
                                                  absl::Span<const std::string> formats) {
  ScalesOutputs out;
  out.warnings = scales.warnings;
  absl::StatusOr<std::vector<RenderedFile>> files =
      RenderSessionOutputs(scales, formats, &out.warnings);
  if (!files.ok()) return files.status();
  out.files = *std::move(files);

  ScalesJsonInputs json;
  json.session_id = status.id;
  json.session_name = status.name;
  json.model = status.model;
  json.accepted_chunks = status.accepted_chunks;
  json.accepted_bytes = status.accepted_bytes;
  json.rejected_chunks = status.rejected_chunks;
  json.skipped_warmup_chunks = status.skipped_warmup_chunks;
  json.tp_size = scales.tp_size;
  json.deployed_total_kv_heads = scales.deployed_total_kv_heads;
  json.rank = scales.rank;
  json.kv_mode = KvModeWord(scales.kv);
  json.fp8_flavor = scales.fp8_flavor;
  json.nvfp4_kv_cache = scales.kv_cache_dtype == KvCacheDtype::kNvfp4;
  json.num_kv_heads = scales.num_kv_heads;
  if (scales.kv_scales.has_value()) json.kv = &*scales.kv_scales;
  json.rank_slices = scales.rank_slices;
  for (const RenderedFile& file : out.files) {
    if (file.format == kFormatLightLlm) json.lightllm_file = true;
  }
  json.modelopt = scales.convention == Nvfp4Convention::kModelOpt;
  json.nvfp4 = &scales.nvfp4;
  json.warnings = out.warnings;
  out.scales_json = RenderScalesJson(json);
  return out;
}

}  // namespace caliper
