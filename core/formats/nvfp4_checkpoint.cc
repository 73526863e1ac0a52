#include "core/formats/nvfp4_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/env/staged_directory.h"
#include "core/formats/checkpoint.h"
#include "core/formats/compressed_tensors_config.h"
#include "core/formats/engine_formats.h"
#include "core/formats/modelopt_format.h"
#include "core/formats/moe_layout.h"
#include "core/formats/render_inputs.h"
#include "core/formats/safetensors.h"
#include "core/formats/safetensors_stream_writer.h"
#include "core/tensor/dtype.h"
#include "core/tensor/nvfp4_pack.h"
#include "nlohmann/json.hpp"

namespace caliper {

namespace {

using ojson = nlohmann::ordered_json;

struct Target {
  float global_scale = 1.0f;           // divisor form, packs the weight
  float weight_multiplier = 1.0f;      // ModelOpt weight_scale_2
  std::optional<float> input_divisor;  // input_global_scale
  std::optional<float> input_multiplier;  // ModelOpt input_scale
};

// What one output tensor is made of.
struct Source {
  enum Kind { kCopy, kPacked, kGroupScales, kScalar } kind = kCopy;
  std::string input;  // input tensor (kCopy, kPacked)
  std::vector<float> values;  // kScalar payload
};

std::string StripWeight(const std::string& name) { return name.substr(0, name.size() - 7); }

// Observer names the scale file's own config block recorded, if any.
void ObserversFromMetadata(const SafetensorsFile& file, std::string* input, std::string* kv) {
  auto it = file.metadata().find(kMetaConfig);
  if (it == file.metadata().end()) return;
  nlohmann::json c = nlohmann::json::parse(it->second, nullptr, false);
  if (!c.is_object()) return;
  try {
    if (input->empty() && c.contains("config_groups")) {
      for (auto& [name, group] : c["config_groups"].items()) {
        if (group.contains("input_activations") && group["input_activations"].is_object() &&
            group["input_activations"]["observer"].is_string()) {
          *input = group["input_activations"]["observer"].get<std::string>();
        }
      }
    }
    if (kv->empty() && c.contains("kv_cache_scheme") && c["kv_cache_scheme"].is_object() &&
        c["kv_cache_scheme"]["observer"].is_string()) {
      *kv = c["kv_cache_scheme"]["observer"].get<std::string>();
    }
  } catch (const nlohmann::json::exception&) {
    // A block we cannot read just leaves the defaults.
  }
}

// Scalars as `dtype` bytes: F32 as is, BF16/F16 rounded to nearest even.
std::string ScalarBytes(const std::vector<float>& values, const std::string& dtype) {
  if (dtype == "BF16" || dtype == "F16") {
    std::string out;
    for (float v : values) {
      const uint16_t bits = dtype == "BF16" ? FloatToBF16(v) : FloatToF16(v);
      out.push_back(static_cast<char>(bits & 0xff));
      out.push_back(static_cast<char>(bits >> 8));
    }
    return out;
  }
  std::string out(values.size() * sizeof(float), '\0');
  if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}


// One quantize run, step by step: read the inputs, match the scale file's modules to the
// checkpoint's, check them and collect the ignore list, place the K/V scales, then write each
// output shard and the small files into a staged directory and commit it.
struct QuantizeJob {
  explicit QuantizeJob(const QuantizeOptions& o)
      : options(o), ct(o.format == kFormatCompressedTensors) {}

  absl::Status ReadInputs();
  absl::Status MatchTargets();
  absl::Status CheckTargetsAndIgnore();
  void PlaceKvScales();
  void NameOutputs();
  absl::Status WriteShard(const std::string& shard, const std::vector<std::string>& shard_names,
                          StagedDirectory& out);
  absl::Status WriteSmallFiles(StagedDirectory& out);

  const QuantizeOptions& options;
  const bool ct;  // compressed-tensors output (else ModelOpt)
  QuantizeReport report;
  std::unique_ptr<HfCheckpoint> checkpoint;
  HfCheckpoint* ckpt = nullptr;
  std::string config_where, config_text;
  ojson config;
  std::unique_ptr<SafetensorsFile> scales_file;
  ImportedScales imported;
  std::string input_observer, kv_observer;
  Nvfp4Scales divisors, multipliers;
  std::vector<std::string> names;  // the checkpoint's tensors, sorted
  std::set<std::string> modules, routers;
  std::map<std::string, Target> targets;  // checkpoint module -> its scales
  uint64_t total_bytes = 0;
  std::map<std::string, std::vector<std::string>> by_shard;  // shard -> its tensors
  std::set<std::string> ignore;
  // Tensors added to a shard (K/V scales), by shard.
  std::map<std::string, std::vector<std::pair<SafetensorsStreamWriter::Tensor, Source>>> extra;
  uint8_t zero_scale = 0;
  std::map<std::string, std::string> out_name;  // checkpoint module -> output module
  ojson weight_map = ojson::object();
  uint64_t done_bytes = 0;
};

absl::Status QuantizeJob::ReadInputs() {
  absl::StatusOr<std::unique_ptr<HfCheckpoint>> opened =
      HfCheckpoint::Open(options.checkpoint_dir, options.env);
  if (!opened.ok()) return opened.status();
  checkpoint = *std::move(opened);
  ckpt = checkpoint.get();
  config_where = JoinPath(options.checkpoint_dir, "config.json");
  absl::StatusOr<std::string> text = ckpt->ReadConfigText();
  if (!text.ok()) return text.status();
  config_text = *std::move(text);
  absl::StatusOr<ModelConfig> model = ckpt->ReadConfig();
  if (!model.ok()) return model.status();
  config = ojson::parse(config_text, nullptr, false);
  if (config.is_discarded() || !config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(config_where, ": not a JSON object"));
  }
  if (config.contains("quantization_config") && !config["quantization_config"].is_null()) {
    return absl::FailedPreconditionError(absl::StrCat(
        config_where, ": quantization_config: the checkpoint is already quantized; quantize "
                      "starts from the dense (bf16/f16/f32) checkpoint"));
  }

  absl::StatusOr<std::unique_ptr<SafetensorsFile>> scales = SafetensorsFile::Open(options.scales_path);
  if (!scales.ok()) return scales.status();
  scales_file = *std::move(scales);
  absl::StatusOr<ImportedScales> read = ImportScales(*scales_file, *model);
  if (!read.ok()) return read.status();
  imported = *std::move(read);
  input_observer = options.input_observer;
  kv_observer = options.kv_observer;
  ObserversFromMetadata(*scales_file, &input_observer, &kv_observer);
  if (input_observer.empty()) input_observer = "static_minmax";
  if (kv_observer.empty()) kv_observer = "static_minmax";
  divisors = ConvertNvfp4Form(imported.nvfp4, ScaleForm::kDivisor);
  multipliers = ConvertNvfp4Form(imported.nvfp4, ScaleForm::kMultiplier);

  absl::StatusOr<std::vector<std::string>> listed = ckpt->TensorNames();
  if (!listed.ok()) return listed.status();
  names = *std::move(listed);
  for (const std::string& name : names) {
    if (absl::EndsWith(name, ".weight")) modules.insert(StripWeight(name));
  }
  report.routers = DetectMoeRouters(names);
  routers.insert(report.routers.begin(), report.routers.end());
  return absl::OkStatus();
}

absl::Status QuantizeJob::MatchTargets() {
  for (const auto& [name, module] : divisors.modules) {
    if (!module.weight_scale.has_value()) {
      report.warnings.push_back({name, "input global scale without a weight global scale: the "
                                       "module stays unquantized"});
      continue;
    }
    std::optional<std::string> resolved = ResolveExpertModule(name, modules);
    if (!resolved.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          options.scales_path, ": ", name, ".weight_global_scale: the checkpoint has no tensor ",
          name, ".weight (nor an expert alias of it)"));
    }
    if (*resolved != name) report.renamed.emplace_back(name, *resolved);
    if (routers.count(*resolved) > 0) {
      report.warnings.push_back({*resolved, "MoE router: never an NVFP4 target, kept in high "
                                            "precision and ignored (its scales are dropped)"});
      continue;
    }
    Target target;
    target.global_scale = *module.weight_scale;
    target.weight_multiplier = *multipliers.modules.at(name).weight_scale;
    target.input_divisor = module.input_scale;
    target.input_multiplier = multipliers.modules.at(name).input_scale;
    if (!targets.emplace(*resolved, target).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(options.scales_path, ": two scale entries name module ", *resolved));
    }
  }
  if (targets.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        options.scales_path, ": no NVFP4 weight global scales; nothing to quantize (for KV "
                             "scales alone use caliper merge)"));
  }
  return absl::OkStatus();
}

// Every target must be packable; every other Linear (and lm_head, routers) is ignored.
absl::Status QuantizeJob::CheckTargetsAndIgnore() {
  for (const std::string& name : names) {
    absl::StatusOr<std::string> shard = ckpt->ShardOf(name);
    if (!shard.ok()) return shard.status();
    by_shard[*shard].push_back(name);
  }
  if (modules.count("lm_head") > 0 || ct) ignore.insert("lm_head");
  for (const auto& [shard, shard_names] : by_shard) {
    for (const std::string& name : shard_names) {
      absl::StatusOr<HfCheckpoint::Tensor> t = ckpt->Get(name);
      if (!t.ok()) return t.status();
      total_bytes += t->entry->end - t->entry->begin;
      if (!absl::EndsWith(name, ".weight")) continue;
      const std::string module = StripWeight(name);
      if (targets.count(module) > 0) {
        const SafetensorsEntry& e = *t->entry;
        if (e.shape.size() != 2 || e.shape[1] % kNvfp4GroupSize != 0 || !ParseDType(e.dtype).ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              t->file->origin(), ": ", name, ": NVFP4 needs a 2-D BF16/F16/F32 weight with a "
              "multiple of 16 columns, got ", e.dtype, " of rank ", e.shape.size()));
        }
      } else if (routers.count(module) > 0 || IsQuantizableLinearWeight(*t->entry) ||
                 module == "lm_head") {
        ignore.insert(module);
      }
    }
  }
  report.ignore.assign(ignore.begin(), ignore.end());
  for (const std::string& module : report.ignore) {
    if (module != "lm_head" && routers.count(module) == 0) {
      report.warnings.push_back({module, "Linear without NVFP4 scales in the scale file: left "
                                         "unquantized and added to the ignore list"});
    }
  }
  return absl::OkStatus();
}

// K/V scale tensors, placed in the shard holding their layer's k_proj.
void QuantizeJob::PlaceKvScales() {
  const std::string layers_prefix = DetectLayersPrefix(names);
  if (imported.kv.has_value()) {
    const KvScales& kv = *imported.kv;
    const bool per_head = kv.granularity == KvGranularity::kPerHead;
    if (!ct && per_head) {
      report.warnings.push_back({"modelopt", "ModelOpt stores one K and one V scale per layer: "
                                             "per-head scales reduced to their max over heads"});
    }
    for (size_t l = 0; l < kv.k.size(); ++l) {
      const std::string attn = absl::StrCat(layers_prefix, l, ".self_attn");
      absl::StatusOr<std::string> shard = ckpt->ShardOf(attn + ".k_proj.weight");
      const std::string home = shard.ok() ? *shard : by_shard.rbegin()->first;
      // llm-compressor stores K/V scales in the observed (model) dtype; Caliper in F32.
      std::string dtype = "F32";
      if (options.llm_compressor_compat) {
        absl::StatusOr<HfCheckpoint::Tensor> k_proj = ckpt->Get(attn + ".k_proj.weight");
        if (k_proj.ok() && ParseDType(k_proj->entry->dtype).ok()) dtype = k_proj->entry->dtype;
      }
      for (bool key : {true, false}) {
        std::vector<float> row = key ? kv.k[l] : kv.v[l];
        SafetensorsStreamWriter::Tensor t;
        t.dtype = dtype;
        Source src;
        src.kind = Source::kScalar;
        if (ct) {
          t.name = absl::StrCat(attn, key ? ".k_scale" : ".v_scale");
          // llm-compressor's shapes: [1] per tensor, [H, 1, 1] per head.
          t.shape = per_head ? std::vector<int64_t>{static_cast<int64_t>(row.size()), 1, 1}
                             : std::vector<int64_t>{1};
          src.values = row;
        } else {
          t.name = absl::StrCat(attn, key ? ".k_proj.k_scale" : ".v_proj.v_scale");
          float m = 0.0f;
          for (float v : row) m = std::max(m, v);
          src.values = {m};
        }
        extra[home].emplace_back(std::move(t), std::move(src));
      }
    }
    report.kv_layers = static_cast<int>(kv.k.size());
    for (const ScaleWarning& w : kv.warnings) report.warnings.push_back(w);
  }
}

void QuantizeJob::NameOutputs() {
  zero_scale = ct ? kE4M3Eighth : kE4M3One;
  // Output module names: the checkpoint's, except experts renamed to what the loaders of the
  // transformers version that wrote it expect.
  const int transformers_major = TransformersMajor(config_text);
  for (const auto& [module, target] : targets) {
    out_name[module] = ct ? CompressedTensorsExpertName(module, transformers_major) : module;
    if (out_name[module] != module) report.renamed.emplace_back(module, out_name[module]);
  }
}

// One output shard, streamed: the planned tensors, packed or copied one at a time.
absl::Status QuantizeJob::WriteShard(const std::string& shard,
                                     const std::vector<std::string>& shard_names,
                                     StagedDirectory& out) {
  std::vector<SafetensorsStreamWriter::Tensor> plan;
  std::map<std::string, Source> sources;
  auto add = [&](SafetensorsStreamWriter::Tensor t, Source s) {
    sources[t.name] = std::move(s);
    plan.push_back(std::move(t));
  };
  for (const std::string& name : shard_names) {
    absl::StatusOr<HfCheckpoint::Tensor> t = ckpt->Get(name);
    if (!t.ok()) return t.status();
    const SafetensorsEntry& e = *t->entry;
    const bool packed = absl::EndsWith(name, ".weight") && targets.count(StripWeight(name)) > 0;
    if (!packed) {
      add({name, e.dtype, e.shape}, {Source::kCopy, name, {}});
      continue;
    }
    const std::string& m = out_name.at(StripWeight(name));
    const Target& target = targets.at(StripWeight(name));
    const int64_t rows = e.shape[0], cols = e.shape[1];
    add({m + (ct ? ".weight_packed" : ".weight"), "U8", {rows, cols / 2}},
        {Source::kPacked, name, {}});
    add({m + ".weight_scale", "F8_E4M3", {rows, cols / kNvfp4GroupSize}},
        {Source::kGroupScales, name, {}});
    if (ct) {
      add({m + ".weight_global_scale", "F32", {1}}, {Source::kScalar, "", {target.global_scale}});
      if (target.input_divisor.has_value()) {
        add({m + ".input_global_scale", "F32", {1}},
            {Source::kScalar, "", {*target.input_divisor}});
      }
    } else {
      add({m + ".weight_scale_2", "F32", {}}, {Source::kScalar, "", {target.weight_multiplier}});
      if (target.input_multiplier.has_value()) {
        add({m + ".input_scale", "F32", {}}, {Source::kScalar, "", {*target.input_multiplier}});
      }
    }
  }
  if (auto it = extra.find(shard); it != extra.end()) {
    for (auto& [t, s] : it->second) add(t, s);
  }
  absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> writer =
      SafetensorsStreamWriter::Plan(plan, {{"format", "pt"}});
  if (!writer.ok()) return writer.status();
  const std::string out_path = out.PathOf(shard);
  if (absl::Status s = (*writer)->Open(out_path, options.env); !s.ok()) return s;
  std::vector<uint8_t> packed_bytes, scale_bytes;
  for (const SafetensorsStreamWriter::Tensor& t : (*writer)->order()) {
    weight_map[t.name] = shard;
    const Source& src = sources.at(t.name);
    absl::Status s;
    if (src.kind == Source::kScalar) {
      const std::string bytes = ScalarBytes(src.values, t.dtype);
      s = (*writer)->Append(absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
    } else if (src.kind == Source::kGroupScales) {
      s = (*writer)->Append(scale_bytes);  // computed with the packed tensor just before
      scale_bytes.clear();
      scale_bytes.shrink_to_fit();
    } else {
      absl::StatusOr<HfCheckpoint::Tensor> in = ckpt->Get(src.input);
      if (!in.ok()) return in.status();
      const SafetensorsEntry& e = *in->entry;
      if (src.kind == Source::kCopy) {
        s = (*writer)->Append(in->file->Data(e));
      } else {
        absl::StatusOr<TensorView> view = in->file->View(e);
        if (!view.ok()) return view.status();
        Nvfp4PackParams params;
        params.global_scale = targets.at(StripWeight(src.input)).global_scale;
        params.group_scale_in_weight_dtype = options.llm_compressor_compat;
        params.zero_group_scale = zero_scale;
        packed_bytes.assign(view->num_elements() / 2, 0);
        scale_bytes.assign(view->num_elements() / kNvfp4GroupSize, 0);
        s = options.backend->PackNvfp4(*view, params, absl::MakeSpan(packed_bytes),
                                       absl::MakeSpan(scale_bytes));
        if (!s.ok()) {
          return absl::Status(s.code(), absl::StrCat(in->file->origin(), ": ", src.input, ": ",
                                                     s.message()));
        }
        s = (*writer)->Append(packed_bytes);
        packed_bytes.clear();
        packed_bytes.shrink_to_fit();
        ++report.quantized_modules;
      }
      in->file->ReleasePages(e);
      if (src.kind == Source::kCopy) ++report.copied_tensors;
      done_bytes += e.end - e.begin;
      if (options.progress) options.progress(done_bytes, total_bytes, src.input);
    }
    if (!s.ok()) return s;
  }
  if (absl::Status s = (*writer)->Finish(); !s.ok()) return s;
  absl::StatusOr<FileInfo> written = options.env->Stat(out_path);
  if (!written.ok()) return written.status();
  report.bytes_out += written->size;
  return absl::OkStatus();
}

// Small files (tokenizer, generation config, ...), the index, config.json, ModelOpt's side file.
absl::Status QuantizeJob::WriteSmallFiles(StagedDirectory& out) {
  absl::StatusOr<std::vector<std::string>> listed = options.env->ListDir(options.checkpoint_dir);
  if (!listed.ok()) return listed.status();
  std::sort(listed->begin(), listed->end());
  for (const std::string& name : *listed) {
    if (by_shard.count(name) > 0 || name == "config.json" || name == kSafetensorsIndexName ||
        name == kModelOptConfigFile || absl::EndsWith(name, ".safetensors")) {
      continue;
    }
    const std::string source = JoinPath(options.checkpoint_dir, name);
    absl::StatusOr<FileInfo> info = options.env->Stat(source);
    if (!info.ok()) return info.status();
    if (!info->regular) continue;
    if (absl::Status s = out.CopyFile(source, name); !s.ok()) return s;
  }
  if (ckpt->indexed() || by_shard.size() > 1) {
    ojson index = ojson::object();
    index["metadata"] = {{"total_size", report.bytes_out}};
    index["weight_map"] = std::move(weight_map);
    if (absl::Status s = out.WriteFile(kSafetensorsIndexName, index.dump(2) + "\n");
        !s.ok()) {
      return s;
    }
  }
  bool has_inputs = false;
  for (const auto& [m, t] : targets) has_inputs = has_inputs || t.input_divisor.has_value();
  const std::optional<KvScales>& kv = imported.kv;
  if (ct) {
    CtConfigOptions c;
    c.weights = true;
    c.inputs = has_inputs;
    c.input_observer = input_observer;
    if (kv.has_value()) {
      c.kv_strategy = kv->granularity == KvGranularity::kPerHead ? "attn_head" : "tensor";
    }
    c.kv_observer = kv_observer;
    c.ignore = report.ignore;
    config["quantization_config"] = ojson::parse(CompressedTensorsConfigBlock(c));
  } else {
    ojson q = ojson::object();
    q["quant_algo"] = "NVFP4";
    if (kv.has_value()) q["kv_cache_quant_algo"] = "FP8";
    q["group_size"] = 16;
    q["exclude_modules"] = report.ignore;
    ojson producer = {{"name", "caliper"}, {"version", CaliperVersion()}};
    ojson side = {{"producer", producer}, {"quantization", q}};
    config["quantization_config"] = ojson::parse(ModelOptConfigJsonFromHfQuant(side.dump()));
    if (absl::Status s = out.WriteFile(kModelOptConfigFile, side.dump(4) + "\n");
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = out.WriteFile("config.json", config.dump(2) + "\n");
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<QuantizeReport> QuantizeCheckpoint(const QuantizeOptions& options) {
  if (options.format != kFormatCompressedTensors && options.format != kFormatModelOpt) {
    return absl::InvalidArgumentError(absl::StrCat(
        "format: \"", options.format, "\" (expected compressed-tensors or modelopt)"));
  }
  if (options.backend == nullptr) return absl::InvalidArgumentError("backend: required");
  QuantizeJob job(options);
  if (absl::Status s = job.ReadInputs(); !s.ok()) return s;
  if (absl::Status s = job.MatchTargets(); !s.ok()) return s;
  if (absl::Status s = job.CheckTargetsAndIgnore(); !s.ok()) return s;
  job.PlaceKvScales();
  absl::StatusOr<std::unique_ptr<StagedDirectory>> out =
      StagedDirectory::Create(options.out_dir, options.env);
  if (!out.ok()) return out.status();
  job.NameOutputs();
  for (const auto& [shard, shard_names] : job.by_shard) {
    if (absl::Status s = job.WriteShard(shard, shard_names, **out); !s.ok()) return s;
  }
  job.report.bytes_in = job.total_bytes;
  if (absl::Status s = job.WriteSmallFiles(**out); !s.ok()) return s;
  if (absl::Status s = (*out)->Commit(); !s.ok()) return s;
  return std::move(job.report);
}

}  // namespace caliper
