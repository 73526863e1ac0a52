#include "core/formats/checkpoint_merge.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/env/staged_directory.h"
#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {

namespace {

using ojson = nlohmann::ordered_json;

absl::StatusOr<ojson> ParseObject(const std::string& text, const std::string& where) {
  ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  return parsed;
}

// The ignore list the scale file was rendered with, when it says.
std::vector<std::string> IgnoreFromMetadata(const SafetensorsFile& file) {
  auto it = file.metadata().find(kMetaConfig);
  if (it == file.metadata().end()) return {};
  nlohmann::json config = nlohmann::json::parse(it->second, nullptr, false);
  if (!config.is_object()) return {};
  const nlohmann::json* list = nullptr;
  if (config.contains("ignore")) list = &config["ignore"];
  if (config.contains("quantization") && config["quantization"].is_object() &&
      config["quantization"].contains("exclude_modules")) {
    list = &config["quantization"]["exclude_modules"];
  }
  std::vector<std::string> out;
  if (list == nullptr || !list->is_array()) return out;
  for (const auto& item : *list) {
    if (item.is_string()) out.push_back(item.get<std::string>());
  }
  return out;
}

// A file the merge does not change into the new directory: copied (a reflink where the
// filesystem offers one; symlinks in the checkpoint are read through), or with `link`
// hard-linked, else symlinked by absolute path (another filesystem). The report lists each
// under what it is.
absl::Status PlaceUnchanged(Env* env, const std::string& source, StagedDirectory& out,
                            const std::string& name, bool link, MergeReport* report) {
  if (!link) {
    absl::Status copied = out.CopyFile(source, name);
    if (absl::IsResourceExhausted(copied)) {
      return Annotate(copied, "the unchanged files are copied and need their space "
                              "(link_unchanged links them instead): ");
    }
    if (!copied.ok()) return copied;
    report->copied.push_back(name);
    return absl::OkStatus();
  }
  absl::Status hard = env->LinkFile(source, out.PathOf(name));
  if (hard.ok()) {
    report->hard_linked.push_back(name);
    return absl::OkStatus();
  }
  std::error_code ec;
  const std::string absolute = std::filesystem::absolute(source, ec).string();  // no I/O
  absl::Status soft = env->SymlinkFile(ec ? source : absolute, out.PathOf(name));
  if (!soft.ok()) {
    return absl::Status(soft.code(),
                        absl::StrCat(source, ": cannot hard-link (", hard.message(),
                                     ") or symlink (", soft.message(), ") into ", out.target()));
  }
  report->symlinked.push_back(name);
  return absl::OkStatus();
}

// What the merge reads: the checkpoint, its config (text, parsed, as a model) and the scales.
struct MergeInputs {
  std::unique_ptr<HfCheckpoint> checkpoint;
  ojson config;
  std::string config_where;  // dir/config.json, for messages
  ModelConfig model;
  std::unique_ptr<SafetensorsFile> scales_file;
  ImportedScales imported;
  bool ct = false;  // compressed-tensors (else ModelOpt)
  std::vector<std::string> names;  // every tensor of the checkpoint, sorted
};

absl::StatusOr<MergeInputs> ReadMergeInputs(const MergeOptions& options) {
  MergeInputs in;
  absl::StatusOr<std::unique_ptr<HfCheckpoint>> checkpoint =
      HfCheckpoint::Open(options.checkpoint_dir, options.env);
  if (!checkpoint.ok()) return checkpoint.status();
  in.checkpoint = *std::move(checkpoint);
  absl::StatusOr<std::string> config_text = in.checkpoint->ReadConfigText();
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> model = in.checkpoint->ReadConfig();
  if (!model.ok()) return model.status();
  in.model = *std::move(model);
  in.config_where = JoinPath(options.checkpoint_dir, "config.json");
  absl::StatusOr<ojson> config = ParseObject(*config_text, in.config_where);
  if (!config.ok()) return config.status();
  in.config = *std::move(config);

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> scales_file =
      SafetensorsFile::Open(options.scales_path);
  if (!scales_file.ok()) return scales_file.status();
  in.scales_file = *std::move(scales_file);
  absl::StatusOr<ImportedScales> imported = ImportScales(*in.scales_file, in.model);
  if (!imported.ok()) return imported.status();
  in.imported = *std::move(imported);
  in.ct = in.imported.format == kFormatCompressedTensors;
  if (options.kv_only) in.imported.nvfp4.modules.clear();
  if (!in.imported.kv.has_value() && in.imported.nvfp4.modules.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.scales_path, ": nothing to merge (no KV scales, and kv_only is set)"));
  }
  absl::StatusOr<std::vector<std::string>> names = in.checkpoint->TensorNames();
  if (!names.ok()) return names.status();
  in.names = *std::move(names);
  return in;
}

// config.json's quantization block (fresh, or KV added to an existing block of the same
// method) and ModelOpt's side file when one is written.
absl::Status PlanQuantizationConfig(const MergeOptions& options, MergeInputs& in,
                                    const RenderInputs& inputs,
                                    std::optional<ojson>* hf_quant_config, MergeReport* report) {
  const std::set<std::string> existing(in.names.begin(), in.names.end());
  const bool ct = in.ct;
  const std::string method = ct ? "compressed-tensors" : "modelopt";
  auto existing_block = in.config.find("quantization_config");
  const bool already_quantized =
      existing_block != in.config.end() && !existing_block->is_null();
  if (!already_quantized) {
    // NVFP4 global scales only make sense beside packed FP4 weights.
    for (const auto& [module, scales] : inputs.nvfp4.modules) {
      const bool packed = ct ? existing.count(module + ".weight_packed") > 0
                             : existing.count(module + ".weight_scale") > 0;
      if (!packed) {
        return absl::FailedPreconditionError(absl::StrCat(
            options.checkpoint_dir, ": module ", module, " has unquantized weights (no ",
            ct ? "weight_packed" : "weight_scale",
            "); engines load NVFP4 global scales only beside packed FP4 weights. Quantize the "
            "weights first, or merge only the KV scales (kv_only)"));
      }
    }
    // ModelOpt KV scales beside dense weights: vLLM 0.32 refuses a modelopt block without a
    // weight quant_algo ("Missing 'quant_algo'") and reads config.json before
    // hf_quant_config.json, so config.json gets the compressed-tensors KV-only block it loads
    // (it maps k_proj.k_scale onto the attention layer); hf_quant_config.json keeps ModelOpt's
    // KV-only form for TensorRT-LLM.
    const bool modelopt_kv_only = !ct && inputs.nvfp4.modules.empty();
    if (modelopt_kv_only) {
      report->warnings.push_back(
          {kModelOptConfigFile, "KV-only ModelOpt scales: config.json carries a compressed-tensors "
                                "kv_cache_scheme (what vLLM loads; vLLM has no ModelOpt KV-only "
                                "form), hf_quant_config.json the ModelOpt one (TensorRT-LLM)"});
    }
    in.config["quantization_config"] =
        ojson::parse(ct || modelopt_kv_only ? CompressedTensorsQuantizationConfig(inputs)
                                            : ModelOptConfigJsonBlock(inputs));
    if (!ct) *hf_quant_config = ojson::parse(ModelOptHfQuantConfig(inputs));
    return absl::OkStatus();
  }
  const std::string where = absl::StrCat(in.config_where, ": quantization_config");
  if (!existing_block->is_object() || !existing_block->contains("quant_method") ||
      (*existing_block)["quant_method"] != method) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ".quant_method is not \"", method, "\" (the scale file's format)"));
  }
  if (!inputs.nvfp4.modules.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, ": the checkpoint is already quantized; only KV scales can be merged "
               "(set kv_only)"));
  }
  if (ct) {
    if (existing_block->contains("kv_cache_scheme") &&
        !(*existing_block)["kv_cache_scheme"].is_null()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ".kv_cache_scheme: KV cache scales are already configured"));
    }
    ojson fresh = ojson::parse(CompressedTensorsQuantizationConfig(inputs));
    (*existing_block)["kv_cache_scheme"] = fresh["kv_cache_scheme"];
    return absl::OkStatus();
  }
  for (const char* key : {"kv_cache_scheme", "kv_cache_quant_algo"}) {
    if (existing_block->contains(key) && !(*existing_block)[key].is_null()) {
      return absl::FailedPreconditionError(
          absl::StrCat(where, ".", key, ": KV cache scales are already configured"));
    }
  }
  // ModelOpt's config.json form: vLLM 0.32 reads kv_cache_scheme there.
  existing_block->erase("kv_cache_quant_algo");
  (*existing_block)["kv_cache_scheme"] = ojson::parse(kModelOptKvCacheScheme);
  const std::string hf_quant_path = JoinPath(options.checkpoint_dir, kModelOptConfigFile);
  absl::StatusOr<std::string> text = options.env->ReadFile(hf_quant_path);
  if (!text.ok()) return absl::IsNotFound(text.status()) ? absl::OkStatus() : text.status();
  absl::StatusOr<ojson> side = ParseObject(*text, hf_quant_path);
  if (!side.ok()) return side.status();
  if (!side->contains("quantization") || !(*side)["quantization"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(hf_quant_path, ": quantization: missing or not an object"));
  }
  (*side)["quantization"]["kv_cache_quant_algo"] = "FP8";
  *hf_quant_config = *std::move(side);
  return absl::OkStatus();
}

// The scale shard's bytes; FailedPrecondition when the checkpoint already holds one of them.
absl::StatusOr<std::string> RenderScaleShard(const MergeOptions& options, const MergeInputs& in,
                                             const RenderInputs& inputs, uint64_t* scale_bytes,
                                             MergeReport* report) {
  absl::StatusOr<std::string> shard = in.ct
                                          ? CompressedTensorsScalesFile(inputs, &report->warnings)
                                          : ModelOptScalesFile(inputs, &report->warnings);
  if (!shard.ok()) return shard.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> view = SafetensorsFile::FromBytes(*shard);
  if (!view.ok()) return view.status();
  const std::set<std::string> existing(in.names.begin(), in.names.end());
  std::vector<std::string> clashes;
  *scale_bytes = 0;
  for (const SafetensorsEntry& entry : (*view)->tensors()) {
    if (existing.count(entry.name) > 0) clashes.push_back(entry.name);
    *scale_bytes += entry.end - entry.begin;
  }
  if (!clashes.empty()) {
    if (clashes.size() > 3) clashes.resize(3);
    return absl::FailedPreconditionError(absl::StrCat(
        options.checkpoint_dir, ": already holds scale tensors (", absl::StrJoin(clashes, ", "),
        ", ...); engines would load both copies"));
  }
  report->scale_tensors = static_cast<int>((*view)->tensors().size());
  return shard;
}

// The new directory: shards and other files carried (copied, or linked with link_unchanged),
// the scale shard, the index, config.json and the side file written, all in staging, then
// committed.
absl::Status WriteMergedCheckpoint(const MergeOptions& options, MergeInputs& in,
                                   const std::string& shard, uint64_t scale_bytes,
                                   const std::optional<ojson>& hf_quant_config,
                                   MergeReport* report) {
  Env* env = options.env;
  HfCheckpoint& ckpt = *in.checkpoint;
  absl::StatusOr<std::unique_ptr<StagedDirectory>> staged =
      StagedDirectory::Create(options.out_dir, env);
  if (!staged.ok()) return staged.status();
  StagedDirectory& out = **staged;
  std::map<std::string, std::string> renamed;  // source shard -> name in out_dir
  const bool lone_single = !ckpt.indexed() && ckpt.shard_files().size() == 1 &&
                           ckpt.shard_files()[0] == kSingleSafetensorsName;
  uint64_t weight_bytes = 0;
  for (const std::string& name : ckpt.shard_files()) {
    const std::string target = lone_single ? kMergedSingleShard : name;
    renamed[name] = target;
    const std::string source = JoinPath(options.checkpoint_dir, name);
    if (absl::Status s =
            PlaceUnchanged(env, source, out, target, options.link_unchanged, report);
        !s.ok()) {
      return s;
    }
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(source);
    if (!file.ok()) return file.status();
    for (const SafetensorsEntry& entry : (*file)->tensors()) weight_bytes += entry.end - entry.begin;
  }
  // Tokenizer, generation config and the rest come along unchanged.
  absl::StatusOr<std::vector<std::string>> listed = env->ListDir(options.checkpoint_dir);
  if (!listed.ok()) return listed.status();
  std::sort(listed->begin(), listed->end());
  for (const std::string& name : *listed) {
    if (renamed.count(name) > 0 || name == "config.json" || name == kSafetensorsIndexName ||
        (hf_quant_config.has_value() && name == kModelOptConfigFile)) {
      continue;
    }
    const std::string source = JoinPath(options.checkpoint_dir, name);
    absl::StatusOr<FileInfo> info = env->Stat(source);
    if (!info.ok()) return info.status();
    if (!info->regular) {
      report->warnings.push_back(
          {source, "not a regular file; not carried into the merged checkpoint"});
      continue;
    }
    if (absl::Status s = PlaceUnchanged(env, source, out, name, options.link_unchanged, report);
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = out.WriteFile(kMergedScalesShard, shard); !s.ok()) return s;
  ojson weight_map = ojson::object();
  for (const std::string& name : in.names) {
    absl::StatusOr<std::string> owner = ckpt.ShardOf(name);
    if (!owner.ok()) return owner.status();
    weight_map[name] = renamed[*owner];
  }
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> view = SafetensorsFile::FromBytes(shard);
  if (!view.ok()) return view.status();
  for (const SafetensorsEntry& entry : (*view)->tensors()) weight_map[entry.name] = kMergedScalesShard;
  ojson index = ojson::object();
  index["metadata"] = {{"total_size", weight_bytes + scale_bytes}};
  index["weight_map"] = std::move(weight_map);
  if (absl::Status s = out.WriteFile(kSafetensorsIndexName, index.dump(2) + "\n"); !s.ok()) {
    return s;
  }
  if (absl::Status s = out.WriteFile("config.json", in.config.dump(2) + "\n"); !s.ok()) return s;
  if (hf_quant_config.has_value()) {
    if (absl::Status s = out.WriteFile(kModelOptConfigFile, hf_quant_config->dump(4) + "\n");
        !s.ok()) {
      return s;
    }
  }
  return out.Commit();
}

}  // namespace

absl::StatusOr<MergeReport> MergeScalesIntoCheckpoint(const MergeOptions& options) {
  MergeReport report;
  absl::StatusOr<MergeInputs> in = ReadMergeInputs(options);
  if (!in.ok()) return in.status();
  report.format = in->imported.format;

  RenderInputs inputs;
  inputs.model = in->model;
  inputs.kv = in->imported.kv;
  inputs.nvfp4 = in->imported.nvfp4;
  inputs.ignore = IgnoreFromMetadata(*in->scales_file);
  inputs.layers_prefix = DetectLayersPrefix(in->names);
  std::optional<ojson> hf_quant_config;
  if (absl::Status s = PlanQuantizationConfig(options, *in, inputs, &hf_quant_config, &report);
      !s.ok()) {
    return s;
  }
  uint64_t scale_bytes = 0;
  absl::StatusOr<std::string> shard =
      RenderScaleShard(options, *in, inputs, &scale_bytes, &report);
  if (!shard.ok()) return shard.status();
  if (absl::Status s =
          WriteMergedCheckpoint(options, *in, *shard, scale_bytes, hf_quant_config, &report);
      !s.ok()) {
    return s;
  }
  return report;
}

}  // namespace caliper
