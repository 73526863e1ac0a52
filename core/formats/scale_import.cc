#include "core/formats/scale_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <regex>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/formats/checkpoint.h"
#include "core/formats/format_support.h"
#include "core/formats/lightllm_format.h"
#include "core/formats/render_inputs.h"

namespace caliper {

using formats_internal::kE4M3FnMax;

namespace {

const std::regex& CtKvPattern() {
  static const std::regex pattern(R"(^(.*)layers\.(\d+)\.self_attn\.(k|v)_scale$)");
  return pattern;
}
// The query's scale (recipe attention q): [1], or [num_attention_heads(, 1, 1)] per head.
const std::regex& CtQueryPattern() {
  static const std::regex pattern(R"(^(.*)layers\.(\d+)\.self_attn\.q_scale$)");
  return pattern;
}
const std::regex& ModelOptKvPattern() {
  static const std::regex pattern(R"(^(.*)layers\.(\d+)\.self_attn\.(k|v)_proj\.(k|v)_scale$)");
  return pattern;
}

enum class NameKind {
  kNone, kCtKv, kCtQuery, kModelOptKv, kCtWeight, kCtInput, kMoWeight, kMoInput
};

NameKind Classify(const std::string& name, int* layer, bool* key, std::string* module) {
  std::smatch match;
  if (std::regex_match(name, match, ModelOptKvPattern()) && match[3] == match[4]) {
    *layer = std::stoi(match[2]);
    *key = match[3] == "k";
    return NameKind::kModelOptKv;
  }
  if (std::regex_match(name, match, CtKvPattern())) {
    *layer = std::stoi(match[2]);
    *key = match[3] == "k";
    return NameKind::kCtKv;
  }
  if (std::regex_match(name, match, CtQueryPattern())) {
    *layer = std::stoi(match[2]);
    return NameKind::kCtQuery;
  }
  auto strip = [&](absl::string_view suffix) {
    if (!absl::EndsWith(name, suffix) || name.size() == suffix.size()) return false;
    *module = name.substr(0, name.size() - suffix.size());
    return true;
  };
  if (strip(".weight_global_scale")) return NameKind::kCtWeight;
  if (strip(".input_global_scale")) return NameKind::kCtInput;
  if (strip(".weight_scale_2")) return NameKind::kMoWeight;
  if (strip(".input_scale")) return NameKind::kMoInput;
  return NameKind::kNone;
}

struct ScaleTensor {
  std::string where;  // "file: tensor \"name\""
  std::vector<int64_t> shape;
  std::vector<float> values;
};

absl::StatusOr<ScaleTensor> ReadScaleTensor(const SafetensorsFile& file,
                                            const SafetensorsEntry& entry) {
  ScaleTensor out;
  out.where = absl::StrCat(file.origin(), ": tensor \"", entry.name, "\"");
  out.shape = entry.shape;
  absl::StatusOr<TensorView> view = file.View(entry);
  if (!view.ok()) return view.status();
  const uint8_t* data = view->bytes().data();
  for (int64_t i = 0; i < view->num_elements(); ++i) {
    switch (view->dtype()) {
      case DType::kF32: {
        float v;
        std::memcpy(&v, data + 4 * i, 4);
        out.values.push_back(v);
        break;
      }
      case DType::kBF16:
      case DType::kF16: {
        uint16_t bits;
        std::memcpy(&bits, data + 2 * i, 2);
        out.values.push_back(view->dtype() == DType::kBF16 ? BF16ToFloat(bits) : F16ToFloat(bits));
        break;
      }
    }
  }
  return out;
}

// compressed-tensors q_scale rows onto `kv`'s entries: per tensor as is; per head one value per
// query head (the writer repeats each KV group's), reduced per KV group by max as vLLM's loader
// does. Every layer with K/V needs one once any layer has one.
absl::Status ImportQueryRows(const SafetensorsFile& file,
                             const std::map<int, std::vector<float>>& q_rows,
                             const std::map<int, std::string>& q_where,
                             const std::optional<ModelConfig>& model, KvScales& kv) {
  if (q_rows.empty()) return absl::OkStatus();
  const size_t entries = kv.k.empty() ? 1 : kv.k.front().size();
  for (size_t l = 0; l < kv.k.size(); ++l) {
    auto q = q_rows.find(static_cast<int>(l));
    if (q == q_rows.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.origin(), ": layer ", l, " has no q_scale, but ", q_where.begin()->second,
          " has one; every layer needs one"));
    }
    const std::string& where = q_where.at(q->first);
    const size_t n = q->second.size();
    if (model.has_value() && model->num_attention_heads > 0 && n > 1 &&
        n != static_cast<size_t>(model->num_attention_heads)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", n, " per-head values, but the "
                                                     "model has ", model->num_attention_heads,
                                                     " attention heads"));
    }
    if (n > 1 && (n % entries != 0 || n < entries)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", n, " values do not split over ",
                                                     entries, " K/V entries"));
    }
    // One value (a per-tensor query beside per-head K/V) serves every entry.
    const size_t group = n == 1 ? 0 : n / entries;
    std::vector<float> row, absmax;
    for (size_t e = 0; e < entries; ++e) {
      const auto first = q->second.begin() + static_cast<std::ptrdiff_t>(e * group);
      row.push_back(*std::max_element(first, first + static_cast<std::ptrdiff_t>(
                                                          std::max<size_t>(group, 1))));
      absmax.push_back(row.back() * kE4M3FnMax);
    }
    kv.q.push_back(std::move(row));
    kv.q_absmax.push_back(std::move(absmax));
  }
  for (const auto& [layer, unused] : q_rows) {
    if (static_cast<size_t>(layer) >= kv.k.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(q_where.at(layer), ": layer ", layer, " has no K/V scales"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

bool IsScaleTensorName(absl::string_view name) {
  int layer = 0;
  bool key = false;
  std::string module;
  return Classify(std::string(name), &layer, &key, &module) != NameKind::kNone;
}

absl::StatusOr<ImportedScales> ImportScales(const SafetensorsFile& file,
                                            const std::optional<ModelConfig>& model) {
  // Unambiguous names decide the format; ".input_scale" alone (FP8 checkpoints) does not.
  bool ct = false, modelopt = false;
  std::string first_ct, first_mo;
  for (const SafetensorsEntry& entry : file.tensors()) {
    int layer = 0;
    bool key = false;
    std::string module;
    const NameKind kind = Classify(entry.name, &layer, &key, &module);
    if (kind == NameKind::kCtKv || kind == NameKind::kCtQuery || kind == NameKind::kCtWeight ||
        kind == NameKind::kCtInput) {
      ct = true;
      if (first_ct.empty()) first_ct = entry.name;
    } else if (kind == NameKind::kModelOptKv || kind == NameKind::kMoWeight) {
      modelopt = true;
      if (first_mo.empty()) first_mo = entry.name;
    }
  }
  if (ct && modelopt) {
    return absl::InvalidArgumentError(absl::StrCat(
        file.origin(), ": mixes compressed-tensors (\"", first_ct, "\") and ModelOpt (\"",
        first_mo, "\") scale names"));
  }
  if (!ct && !modelopt) {
    return absl::NotFoundError(absl::StrCat(
        file.origin(), ": no compressed-tensors or ModelOpt scale tensors (k_scale, "
                       "weight_global_scale, weight_scale_2, ...)"));
  }
  ImportedScales out;
  out.format = ct ? kFormatCompressedTensors : kFormatModelOpt;
  out.nvfp4.form = ct ? ScaleForm::kDivisor : ScaleForm::kMultiplier;
  std::map<int, std::vector<float>> k_rows, v_rows, q_rows;
  std::map<int, std::string> q_where;
  std::optional<size_t> width;
  std::string width_where;
  for (const SafetensorsEntry& entry : file.tensors()) {
    int layer = 0;
    bool key = false;
    std::string module;
    const NameKind kind = Classify(entry.name, &layer, &key, &module);
    const bool wanted = ct ? (kind == NameKind::kCtKv || kind == NameKind::kCtQuery ||
                              kind == NameKind::kCtWeight || kind == NameKind::kCtInput)
                           : (kind == NameKind::kModelOptKv || kind == NameKind::kMoWeight ||
                              kind == NameKind::kMoInput);
    if (!wanted) continue;
    absl::StatusOr<ScaleTensor> tensor = ReadScaleTensor(file, entry);
    if (!tensor.ok()) return tensor.status();
    for (float v : tensor->values) {
      if (!std::isfinite(v) || v <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor->where, ": scale ", v, " is not a positive finite number"));
      }
    }
    if (kind == NameKind::kCtQuery) {
      const bool flat = tensor->shape.size() <= 1 ||
                        (tensor->shape.size() == 3 && tensor->shape[1] == 1 &&
                         tensor->shape[2] == 1);
      if (!flat) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensor->where, ": q_scale must be [1], [num_attention_heads] or "
            "[num_attention_heads, 1, 1], got rank ", tensor->shape.size()));
      }
      if (!q_rows.emplace(layer, tensor->values).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor->where, ": layer ", layer, " appears twice"));
      }
      q_where[layer] = tensor->where;
      continue;
    }
    if (kind == NameKind::kCtKv || kind == NameKind::kModelOptKv) {
      const bool scalar = tensor->shape.empty() ||
                          (tensor->shape.size() == 1 && tensor->shape[0] == 1);
      // [H] (vLLM) or [H, 1, 1] (llm-compressor's per-head shape).
      const bool vector = tensor->shape.size() == 1 ||
                          (tensor->shape.size() == 3 && tensor->shape[1] == 1 &&
                           tensor->shape[2] == 1);
      if (!scalar && !vector) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensor->where, ": KV scale must be a scalar, [num_kv_heads] or [num_kv_heads, 1, 1], "
            "got rank ", tensor->shape.size()));
      }
      const size_t n = tensor->values.size();
      if (!width.has_value()) {
        width = n;
        width_where = tensor->where;
      } else if (*width != n) {
        return absl::InvalidArgumentError(absl::StrCat(tensor->where, ": ", n,
                                                       " values, but ", width_where, " has ",
                                                       *width));
      }
      auto& rows = key ? k_rows : v_rows;
      if (!rows.emplace(layer, tensor->values).second) {
        return absl::InvalidArgumentError(
            absl::StrCat(tensor->where, ": layer ", layer, " appears twice"));
      }
      continue;
    }
    if (tensor->values.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          tensor->where, ": a global scale must hold one value, got ", tensor->values.size()));
    }
    ModuleNvfp4Scales& target = out.nvfp4.modules[module];
    const float value = tensor->values[0];
    const bool weight = kind == NameKind::kCtWeight || kind == NameKind::kMoWeight;
    (weight ? target.weight_scale : target.input_scale) = value;
    // amax = 2688 / divisor or 2688 * multiplier (derived, for display and re-sharing).
    const float amax = ct ? kFp4Max * kFp8E4M3Max / value : value * kFp4Max * kFp8E4M3Max;
    (weight ? target.weight_amax : target.input_amax) = amax;
  }
  FusedGroupTable groups = FusedGroupTable::Default();
  for (auto& [name, module] : out.nvfp4.modules) module.fused_group = groups.GroupOf(name);

  if (!k_rows.empty() || !v_rows.empty()) {
    KvScales kv;
    kv.flavor = Fp8Flavor::kE4M3FN;
    const int layers = std::max(k_rows.empty() ? 0 : k_rows.rbegin()->first,
                                v_rows.empty() ? 0 : v_rows.rbegin()->first) + 1;
    if (model.has_value() && model->num_layers > 0 && layers > model->num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(file.origin(), ": KV scales for layer ",
                                                     layers - 1, ", but the model has ",
                                                     model->num_layers, " layers"));
    }
    const int expected_layers = model.has_value() && model->num_layers > 0 ? model->num_layers
                                                                             : layers;
    const int model_heads = model.has_value() ? model->num_kv_heads : 0;
    // With one KV head, per head and per tensor are the same numbers: read as per tensor.
    const bool per_head = *width > 1;
    if (per_head && model_heads > 0 && static_cast<int>(*width) != model_heads) {
      return absl::InvalidArgumentError(absl::StrCat(width_where, ": ", *width,
                                                     " per-head values, but the model has ",
                                                     model_heads, " KV heads"));
    }
    kv.granularity = per_head ? KvGranularity::kPerHead : KvGranularity::kPerTensor;
    kv.num_kv_heads = per_head ? static_cast<int>(*width) : std::max(model_heads, 1);
    for (int l = 0; l < expected_layers; ++l) {
      auto k = k_rows.find(l);
      auto v = v_rows.find(l);
      if (k == k_rows.end() || v == v_rows.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file.origin(), ": layer ", l, " has ", k == k_rows.end() ? "no" : "a", " K and ",
            v == v_rows.end() ? "no" : "a", " V scale; every layer needs both"));
      }
      kv.k.push_back(k->second);
      kv.v.push_back(v->second);
      std::vector<float> ka, va;
      for (float s : k->second) ka.push_back(s * kE4M3FnMax);
      for (float s : v->second) va.push_back(s * kE4M3FnMax);
      kv.k_absmax.push_back(std::move(ka));
      kv.v_absmax.push_back(std::move(va));
    }
    if (absl::Status s = ImportQueryRows(file, q_rows, q_where, model, kv); !s.ok()) return s;
    out.kv = std::move(kv);
  } else if (!q_rows.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(q_where.begin()->second, ": a q_scale without K/V scales"));
  }
  return out;
}

absl::StatusOr<ImportedScales> ImportScalesFromCheckpoint(HfCheckpoint& checkpoint,
                                                          const std::optional<ModelConfig>& model) {
  SafetensorsWriter gathered;
  absl::Status status = checkpoint.ForEachTensor(
      [](const SafetensorsEntry& entry) { return IsScaleTensorName(entry.name); },
      [&](const SafetensorsFile& file, const SafetensorsEntry& entry) {
        absl::Span<const uint8_t> data = file.Data(entry);
        return gathered.Add(entry.name, entry.dtype, entry.shape,
                            std::string(reinterpret_cast<const char*>(data.data()), data.size()));
      });
  if (!status.ok()) return status;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(gathered.Serialize());
  if (!file.ok()) return file.status();
  absl::StatusOr<ImportedScales> imported = ImportScales(**file, model);
  if (!imported.ok()) {
    // Name the checkpoint rather than the in-memory gathering.
    std::string message(imported.status().message());
    if (message.rfind("<memory>", 0) == 0) message = checkpoint.dir() + message.substr(8);
    return absl::Status(imported.status().code(), message);
  }
  return imported;
}

absl::StatusOr<KvScales> KvScalesFromLightLlm(const LightLlmCalibration& calibration,
                                              const ModelConfig& model) {
  if (calibration.num_layers != model.num_layers ||
      calibration.scales.size() != static_cast<size_t>(model.num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers: the file has ",
                                                   calibration.num_layers, ", the model ",
                                                   model.num_layers));
  }
  if (model.num_kv_heads <= 0) {
    return absl::InvalidArgumentError("num_kv_heads: the model's KV head count is needed");
  }
  KvScales kv;
  kv.granularity = calibration.quant_type;
  kv.flavor = Fp8Flavor::kE4M3FN;
  kv.num_kv_heads = model.num_kv_heads;
  for (size_t l = 0; l < calibration.scales.size(); ++l) {
    std::vector<float> row = calibration.scales[l];
    size_t width = 1;
    if (calibration.quant_type == KvGranularity::kPerHead) {
      absl::StatusOr<std::vector<float>> adapted =
          AdaptHeadRow(row, calibration.num_head, model.num_kv_heads);
      if (!adapted.ok()) {
        return absl::Status(adapted.status().code(),
                            absl::StrCat("scales[", l, "]: ", adapted.status().message()));
      }
      row = *std::move(adapted);
      width = static_cast<size_t>(model.num_kv_heads);
    }
    if (row.size() != 2 * width) {
      return absl::InvalidArgumentError(
          absl::StrCat("scales[", l, "]: ", row.size(), " values, expected ", 2 * width));
    }
    kv.k.emplace_back(row.begin(), row.begin() + width);
    kv.v.emplace_back(row.begin() + width, row.end());
    kv.k_absmax.push_back({});
    kv.v_absmax.push_back({});
    for (float x : kv.k.back()) kv.k_absmax.back().push_back(x * kE4M3FnMax);
    for (float x : kv.v.back()) kv.v_absmax.back().push_back(x * kE4M3FnMax);
  }
  return kv;
}

}  // namespace caliper
