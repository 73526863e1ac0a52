#include "core/formats/checkpoint_merge.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace fs = std::filesystem;

namespace {

using ojson = nlohmann::ordered_json;

absl::StatusOr<ojson> ParseObject(const std::string& text, const std::string& where) {
  ojson parsed = ojson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": not a JSON object"));
  }
  return parsed;
}

// "model.layers." for text models, "model.language_model.layers." etc. for wrapped ones.
std::string DetectLayersPrefix(const std::vector<std::string>& names) {
  static const std::regex pattern(R"(^(.*layers\.)\d+\.self_attn\..*)");
  std::smatch match;
  for (const std::string& name : names) {
    if (std::regex_match(name, match, pattern)) return match[1];
  }
  return "model.layers.";
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

absl::Status LinkInto(const fs::path& source, const fs::path& target, MergeReport* report) {
  std::error_code ec;
  fs::create_hard_link(source, target, ec);
  if (!ec) {
    report->hard_linked.push_back(target.filename().string());
    return absl::OkStatus();
  }
  const std::string hard_error = ec.message();
  fs::create_symlink(fs::absolute(source), target, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        source.string(), ": cannot hard-link (", hard_error, ") or symlink (", ec.message(),
        ") into ", target.parent_path().string()));
  }
  report->symlinked.push_back(target.filename().string());
  return absl::OkStatus();
}

absl::Status WriteText(Env* env, const fs::path& path, const std::string& text) {
  return WriteFileAtomically(path.string(), text, env);
}

}  // namespace

absl::StatusOr<MergeReport> MergeScalesIntoCheckpoint(const MergeOptions& options) {
  MergeReport report;
  absl::StatusOr<std::unique_ptr<HfCheckpoint>> checkpoint =
      HfCheckpoint::Open(options.checkpoint_dir);
  if (!checkpoint.ok()) return checkpoint.status();
  HfCheckpoint& ckpt = **checkpoint;
  const fs::path source_dir(options.checkpoint_dir);
  absl::StatusOr<std::string> config_text = ckpt.ReadConfigText();
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> model = ckpt.ReadConfig();
  if (!model.ok()) return model.status();
  const std::string config_where = (source_dir / "config.json").string();
  absl::StatusOr<ojson> config = ParseObject(*config_text, config_where);
  if (!config.ok()) return config.status();

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> scales_file =
      SafetensorsFile::Open(options.scales_path);
  if (!scales_file.ok()) return scales_file.status();
  absl::StatusOr<ImportedScales> imported = ImportScales(**scales_file, *model);
  if (!imported.ok()) return imported.status();
  report.format = imported->format;
  const bool ct = imported->format == kFormatCompressedTensors;
  if (options.kv_only) imported->nvfp4.modules.clear();
  if (!imported->kv.has_value() && imported->nvfp4.modules.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.scales_path, ": nothing to merge (no KV scales, and kv_only is set)"));
  }

  absl::StatusOr<std::vector<std::string>> names = ckpt.TensorNames();
  if (!names.ok()) return names.status();
  const std::set<std::string> existing(names->begin(), names->end());

  // The quantization block: fresh, or KV added to an existing block of the same method.
  RenderInputs inputs;
  inputs.model = *model;
  inputs.kv = imported->kv;
  inputs.nvfp4 = imported->nvfp4;
  inputs.ignore = IgnoreFromMetadata(**scales_file);
  inputs.layers_prefix = DetectLayersPrefix(*names);
  const std::string method = ct ? "compressed-tensors" : "modelopt";
  auto existing_block = config->find("quantization_config");
  const bool already_quantized = existing_block != config->end() && !existing_block->is_null();
  std::optional<ojson> hf_quant_config;  // ModelOpt's side file, when written
  const fs::path hf_quant_path = source_dir / kModelOptConfigFile;
  if (already_quantized) {
    const std::string where = absl::StrCat(config_where, ": quantization_config");
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
    } else {
      if (existing_block->contains("kv_cache_quant_algo") &&
          !(*existing_block)["kv_cache_quant_algo"].is_null()) {
        return absl::FailedPreconditionError(
            absl::StrCat(where, ".kv_cache_quant_algo: KV cache scales are already configured"));
      }
      (*existing_block)["kv_cache_quant_algo"] = "FP8";
      std::error_code ec;
      if (fs::exists(hf_quant_path, ec)) {
        std::ifstream in(hf_quant_path);
        std::stringstream text;
        text << in.rdbuf();
        absl::StatusOr<ojson> side = ParseObject(text.str(), hf_quant_path.string());
        if (!side.ok()) return side.status();
        if (!side->contains("quantization") || !(*side)["quantization"].is_object()) {
          return absl::InvalidArgumentError(
              absl::StrCat(hf_quant_path.string(), ": quantization: missing or not an object"));
        }
        (*side)["quantization"]["kv_cache_quant_algo"] = "FP8";
        hf_quant_config = *std::move(side);
      }
    }
  } else {
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
    (*config)["quantization_config"] =
        ojson::parse(ct ? CompressedTensorsQuantizationConfig(inputs)
                        : ModelOptConfigJsonBlock(inputs));
    if (!ct) hf_quant_config = ojson::parse(ModelOptHfQuantConfig(inputs));
  }

  absl::StatusOr<std::string> shard = ct ? CompressedTensorsScalesFile(inputs, &report.warnings)
                                         : ModelOptScalesFile(inputs, &report.warnings);
  if (!shard.ok()) return shard.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> shard_view = SafetensorsFile::FromBytes(*shard);
  if (!shard_view.ok()) return shard_view.status();
  std::vector<std::string> clashes;
  uint64_t scale_bytes = 0;
  for (const SafetensorsEntry& entry : (*shard_view)->tensors()) {
    if (existing.count(entry.name) > 0) clashes.push_back(entry.name);
    scale_bytes += entry.end - entry.begin;
  }
  if (!clashes.empty()) {
    if (clashes.size() > 3) clashes.resize(3);
    return absl::FailedPreconditionError(absl::StrCat(
        options.checkpoint_dir, ": already holds scale tensors (", absl::StrJoin(clashes, ", "),
        ", ...); engines would load both copies"));
  }
  report.scale_tensors = static_cast<int>((*shard_view)->tensors().size());

  // Build everything in a staging directory beside the output, then rename it into place.
  const fs::path out_dir(options.out_dir);
  std::error_code ec;
  if (fs::exists(out_dir, ec) && !(fs::is_directory(out_dir, ec) && fs::is_empty(out_dir, ec))) {
    return absl::FailedPreconditionError(
        absl::StrCat(options.out_dir, ": exists and is not an empty directory"));
  }
  if (fs::equivalent(out_dir, source_dir, ec)) {
    return absl::InvalidArgumentError("out_dir: must differ from checkpoint_dir");
  }
  const fs::path staging = out_dir.string() + ".partial-" + std::to_string(::getpid());
  fs::remove_all(staging, ec);
  if (absl::Status s = options.env->CreateDirs(staging.string()); !s.ok()) return s;
  auto build = [&]() -> absl::Status {
    std::map<std::string, std::string> renamed;  // source shard -> name in out_dir
    const bool lone_single =
        !ckpt.indexed() && ckpt.shard_files().size() == 1 &&
        ckpt.shard_files()[0] == kSingleSafetensorsName;
    uint64_t weight_bytes = 0;
    for (const std::string& name : ckpt.shard_files()) {
      const std::string target = lone_single ? kMergedSingleShard : name;
      renamed[name] = target;
      if (absl::Status s = LinkInto(source_dir / name, staging / target, &report); !s.ok()) {
        return s;
      }
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
          SafetensorsFile::Open((source_dir / name).string());
      if (!file.ok()) return file.status();
      for (const SafetensorsEntry& entry : (*file)->tensors()) weight_bytes += entry.end - entry.begin;
    }
    // Tokenizer, generation config and the rest come along unchanged.
    for (const auto& item : fs::directory_iterator(source_dir)) {
      const std::string name = item.path().filename().string();
      if (renamed.count(name) > 0 || name == "config.json" || name == kSafetensorsIndexName ||
          (hf_quant_config.has_value() && name == kModelOptConfigFile)) {
        continue;
      }
      if (!item.is_regular_file()) {
        report.warnings.push_back(
            {item.path().string(), "not a regular file; not carried into the merged checkpoint"});
        continue;
      }
      if (absl::Status s = LinkInto(item.path(), staging / name, &report); !s.ok()) return s;
    }
    if (absl::Status s = WriteText(options.env, staging / kMergedScalesShard, *shard); !s.ok()) return s;
    ojson weight_map = ojson::object();
    for (const std::string& name : *names) {
      absl::StatusOr<std::string> owner = ckpt.ShardOf(name);
      if (!owner.ok()) return owner.status();
      weight_map[name] = renamed[*owner];
    }
    for (const SafetensorsEntry& entry : (*shard_view)->tensors()) {
      weight_map[entry.name] = kMergedScalesShard;
    }
    ojson index = ojson::object();
    index["metadata"] = {{"total_size", weight_bytes + scale_bytes}};
    index["weight_map"] = std::move(weight_map);
    if (absl::Status s = WriteText(options.env, staging / kSafetensorsIndexName, index.dump(2) + "\n"); !s.ok()) {
      return s;
    }
    if (absl::Status s = WriteText(options.env, staging / "config.json", config->dump(2) + "\n"); !s.ok()) {
      return s;
    }
    if (hf_quant_config.has_value()) {
      if (absl::Status s = WriteText(options.env, staging / kModelOptConfigFile, hf_quant_config->dump(4) + "\n");
          !s.ok()) {
        return s;
      }
    }
    std::error_code rename_ec;
    if (fs::exists(out_dir, rename_ec)) fs::remove(out_dir, rename_ec);  // empty, checked above
    if (absl::Status s = options.env->RenameFile(staging.string(), options.out_dir); !s.ok()) {
      return Annotate(s, "moving the merged checkpoint into place: ");
    }
    fs::path placed = fs::absolute(out_dir).lexically_normal();
    if (!placed.has_filename()) placed = placed.parent_path();  // "out/" -> "out"
    return options.env->SyncDir(placed.parent_path().string());
  };
  absl::Status status;
  try {
    status = build();
  } catch (const fs::filesystem_error& e) {
    status = absl::FailedPreconditionError(e.what());
  }
  if (!status.ok()) {
    fs::remove_all(staging, ec);
    return status;
  }
  return report;
}

}  // namespace caliper
