#include "core/formats/lightllm_format.h"

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using nlohmann::json;

absl::Status Invalid(absl::string_view key, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("lightllm calibration: ", key, ": ", message));
}

absl::StatusOr<const json*> Require(const json& root, const char* key) {
  auto it = root.find(key);
  if (it == root.end()) return Invalid(key, "missing");
  return &*it;
}

absl::StatusOr<int> RequirePositiveInt(const json& root, const char* key) {
  auto value = Require(root, key);
  if (!value.ok()) return value.status();
  const json& v = **value;
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > (int64_t{1} << 24)) {
    return Invalid(key, absl::StrCat("must be a positive integer, got ", v.dump()));
  }
  return static_cast<int>(v.get<int64_t>());
}

absl::StatusOr<std::string> RequireString(const json& root, const char* key) {
  auto value = Require(root, key);
  if (!value.ok()) return value.status();
  if (!(*value)->is_string()) return Invalid(key, absl::StrCat("must be a string, got ", (*value)->dump()));
  return (*value)->get<std::string>();
}

absl::StatusOr<double> RequireNumber(const json& root, const char* key) {
  auto value = Require(root, key);
  if (!value.ok()) return value.status();
  if (!(*value)->is_number()) return Invalid(key, absl::StrCat("must be a number, got ", (*value)->dump()));
  return (*value)->get<double>();
}

// Python's repr(float): shortest round-trip digits, exponent form when exp < -4 or exp >= 16.
// Matching json.dump byte for byte keeps our files diffable against LightLLM's own.
std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, std::chars_format::scientific);
  (void)ec;
  std::string sci(buf, end);  // e.g. "-9.264265099773183e-05"
  const size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  const int exponent = std::atoi(sci.c_str() + e + 1);
  std::string sign;
  if (!mantissa.empty() && mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  if (exponent < -4 || exponent >= 16) {
    return absl::StrCat(sign, mantissa, "e", exponent < 0 ? "-" : "+",
                        std::abs(exponent) < 10 ? "0" : "", std::abs(exponent));
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits.push_back(c);
  }
  std::string text;
  if (exponent >= 0) {
    const size_t int_digits = exponent + 1;
    if (digits.size() <= int_digits) {
      text = digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      text = digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  } else {
    text = "0." + std::string(-exponent - 1, '0') + digits;
  }
  return sign + text;
}

const char* QuantTypeName(KvGranularity granularity) {
  return granularity == KvGranularity::kPerHead ? "per_head" : "per_tensor";
}

size_t ExpectedRowLength(const LightLlmCalibration& c) {
  return c.quant_type == KvGranularity::kPerHead ? 2 * static_cast<size_t>(c.num_head) : 2;
}

}  // namespace

absl::StatusOr<LightLlmCalibration> ParseLightLlmCalibration(absl::string_view json_text) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("lightllm calibration: malformed JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("lightllm calibration: top level must be a JSON object");
  }
  LightLlmCalibration c;
  auto version = RequireString(root, "version");
  if (!version.ok()) return version.status();
  c.version = *version;
  auto arch = RequireString(root, "architectures");
  if (!arch.ok()) return arch.status();
  c.architectures = *arch;
  auto quant_type = RequireString(root, "quant_type");
  if (!quant_type.ok()) return quant_type.status();
  if (*quant_type == "per_head") {
    c.quant_type = KvGranularity::kPerHead;
  } else if (*quant_type == "per_tensor") {
    c.quant_type = KvGranularity::kPerTensor;
  } else {
    return Invalid("quant_type", absl::StrCat("\"", *quant_type,
                                              "\" is neither \"per_head\" nor \"per_tensor\""));
  }
  auto qmin = RequireNumber(root, "qmin");
  if (!qmin.ok()) return qmin.status();
  c.qmin = *qmin;
  auto qmax = RequireNumber(root, "qmax");
  if (!qmax.ok()) return qmax.status();
  c.qmax = *qmax;
  auto layers = RequirePositiveInt(root, "num_layers");
  if (!layers.ok()) return layers.status();
  c.num_layers = *layers;
  auto heads = RequirePositiveInt(root, "num_head");
  if (!heads.ok()) return heads.status();
  c.num_head = *heads;

  auto shape = Require(root, "scales_shape");
  if (!shape.ok()) return shape.status();
  const json& shape_json = **shape;
  if (!shape_json.is_array() || shape_json.size() != 2 || !shape_json[0].is_number_integer() ||
      !shape_json[1].is_number_integer()) {
    return Invalid("scales_shape", absl::StrCat("must be two integers, got ", shape_json.dump()));
  }
  auto scales = Require(root, "scales");
  if (!scales.ok()) return scales.status();
  const json& rows = **scales;
  if (!rows.is_array()) return Invalid("scales", "must be a list of rows");
  const size_t row_length = ExpectedRowLength(c);
  if (rows.size() != static_cast<size_t>(c.num_layers)) {
    return Invalid("scales", absl::StrCat(rows.size(), " rows, but num_layers is ", c.num_layers));
  }
  for (size_t l = 0; l < rows.size(); ++l) {
    const json& row = rows[l];
    const std::string key = absl::StrCat("scales[", l, "]");
    if (!row.is_array()) return Invalid(key, "must be a list of numbers");
    if (row.size() != row_length) {
      return Invalid(key, absl::StrCat(row.size(), " entries, expected ", row_length, " (",
                                       QuantTypeName(c.quant_type), ", num_head ", c.num_head, ")"));
    }
    std::vector<float> values;
    values.reserve(row.size());
    for (size_t i = 0; i < row.size(); ++i) {
      const std::string entry = absl::StrCat(key, "[", i, "]");
      if (!row[i].is_number()) return Invalid(entry, absl::StrCat("not a number: ", row[i].dump()));
      const double v = row[i].get<double>();
      const float f = static_cast<float>(v);
      if (!std::isfinite(f) || !(f > 0.0f)) {
        return Invalid(entry, absl::StrCat("scale must be finite and positive, got ", row[i].dump()));
      }
      values.push_back(f);
    }
    c.scales.push_back(std::move(values));
  }
  if (shape_json[0].get<int64_t>() != static_cast<int64_t>(rows.size()) ||
      shape_json[1].get<int64_t>() != static_cast<int64_t>(row_length)) {
    return Invalid("scales_shape", absl::StrCat(shape_json.dump(), " disagrees with scales of shape [",
                                                rows.size(), ", ", row_length, "]"));
  }
  return c;
}

absl::Status CheckLightLlmFp8Range(const LightLlmCalibration& calibration) {
  if (calibration.qmin != -448.0) {
    return Invalid("qmin", absl::StrCat(PythonFloatRepr(calibration.qmin),
                                        ", but LightLLM requires -448.0 (float8_e4m3fn)"));
  }
  if (calibration.qmax != 448.0) {
    return Invalid("qmax", absl::StrCat(PythonFloatRepr(calibration.qmax),
                                        ", but LightLLM requires 448.0 (float8_e4m3fn)"));
  }
  return absl::OkStatus();
}

absl::Status CheckLightLlmForModel(const LightLlmCalibration& calibration,
                                   const ModelConfig& model, int total_heads) {
  if (absl::Status s = CheckLightLlmFp8Range(calibration); !s.ok()) return s;
  if (calibration.architectures != model.architecture) {
    return Invalid("architectures", absl::StrCat("\"", calibration.architectures,
                                                 "\", but the model is \"", model.architecture, "\""));
  }
  if (calibration.num_layers != model.num_layers) {
    return Invalid("num_layers", absl::StrCat(calibration.num_layers, ", but the model has ",
                                              model.num_layers, " layers"));
  }
  if (total_heads <= 0) {
    return Invalid("total_heads", absl::StrCat("must be positive, got ", total_heads));
  }
  // LightLLM's loader applies this to per-tensor files too, although it never reads their heads.
  if (calibration.num_head % total_heads != 0 && total_heads % calibration.num_head != 0) {
    return Invalid("num_head", absl::StrCat(calibration.num_head, " and the deployment's ",
                                            total_heads, " total heads: neither divides the other"));
  }
  return absl::OkStatus();
}

std::string SerializeLightLlmCalibration(const LightLlmCalibration& c) {
  // Same layout as Python's json.dump(indent=4): LightLLM writes its files that way.
  const size_t cols = c.scales.empty() ? 0 : c.scales[0].size();
  std::string out = "{\n";
  absl::StrAppend(&out, "    \"version\": ", json(c.version).dump(), ",\n");
  absl::StrAppend(&out, "    \"architectures\": ", json(c.architectures).dump(), ",\n");
  absl::StrAppend(&out, "    \"quant_type\": \"", QuantTypeName(c.quant_type), "\",\n");
  absl::StrAppend(&out, "    \"qmin\": ", PythonFloatRepr(c.qmin), ",\n");
  absl::StrAppend(&out, "    \"qmax\": ", PythonFloatRepr(c.qmax), ",\n");
  absl::StrAppend(&out, "    \"num_layers\": ", c.num_layers, ",\n");
  absl::StrAppend(&out, "    \"num_head\": ", c.num_head, ",\n");
  absl::StrAppend(&out, "    \"scales_shape\": [\n        ", c.scales.size(), ",\n        ", cols,
                  "\n    ],\n");
  if (c.scales.empty()) {
    absl::StrAppend(&out, "    \"scales\": []\n}");
    return out;
  }
  absl::StrAppend(&out, "    \"scales\": [\n");
  for (size_t l = 0; l < c.scales.size(); ++l) {
    const std::vector<float>& row = c.scales[l];
    if (row.empty()) {
      absl::StrAppend(&out, "        []");
    } else {
      absl::StrAppend(&out, "        [\n");
      for (size_t i = 0; i < row.size(); ++i) {
        absl::StrAppend(&out, "            ", PythonFloatRepr(row[i]),
                        i + 1 < row.size() ? ",\n" : "\n");
      }
      absl::StrAppend(&out, "        ]");
    }
    absl::StrAppend(&out, l + 1 < c.scales.size() ? ",\n" : "\n");
  }
  absl::StrAppend(&out, "    ]\n}");
  return out;
}

absl::StatusOr<LightLlmCalibration> AdaptLightLlmCalibration(
    const LightLlmCalibration& calibration, int total_heads) {
  if (total_heads <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("total_heads: must be positive, got ", total_heads));
  }
  LightLlmCalibration out = calibration;
  out.num_head = total_heads;
  if (calibration.quant_type == KvGranularity::kPerTensor) return out;  // [L, 2] fits any heads
  if (calibration.num_head % total_heads != 0 && total_heads % calibration.num_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_head: the file has ", calibration.num_head, " heads and the deployment ", total_heads,
        ": neither divides the other, so per-head scales cannot be mapped"));
  }
  out.scales.clear();
  for (size_t l = 0; l < calibration.scales.size(); ++l) {
    auto row = AdaptHeadRow(calibration.scales[l], calibration.num_head, total_heads);
    if (!row.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("scales[", l, "]: ", row.status().message()));
    }
    out.scales.push_back(*std::move(row));
  }
  return out;
}

absl::StatusOr<LightLlmCalibration> LightLlmFromKvScales(const KvScales& scales,
                                                         const ModelConfig& model, int tp_size) {
  if (absl::Status s = ValidateModelConfig(model); !s.ok()) return s;
  if (scales.flavor != Fp8Flavor::kE4M3FN) {
    return absl::InvalidArgumentError(
        "flavor: LightLLM files hold float8_e4m3fn scales (qmax 448) only; this session's "
        "scales are e4m3fnuz (qmax 240)");
  }
  for (size_t l = 0; l < model.layer_attention.size(); ++l) {
    if (!HasKvCache(model.layer_attention[l])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.layer_types[", l, "]: layer ", l, " is ", LayerAttentionName(model.layer_attention[l]),
          " (no KV cache), and LightLLM's file holds one num_head and a [num_layers, 2*num_head] "
          "scales array with a row for every layer: it cannot hold a model whose layers lack a "
          "KV cache (use compressed-tensors)"));
    }
  }
  auto total = DeployedTotalKvHeads(model.num_kv_heads, tp_size);
  if (!total.ok()) return total.status();
  if (scales.k.size() != static_cast<size_t>(model.num_layers) ||
      scales.v.size() != scales.k.size()) {
    return absl::InvalidArgumentError(absl::StrCat("scales: ", scales.k.size(),
                                                   " layers, but the model has ", model.num_layers));
  }
  absl::StatusOr<std::vector<std::vector<float>>> rows =
      DeployedKvRows(scales, model.num_kv_heads, *total);
  if (!rows.ok()) return rows.status();
  LightLlmCalibration out;
  out.architectures = model.architecture;
  out.quant_type = scales.granularity;
  out.num_layers = model.num_layers;
  out.num_head = *total;
  out.scales = *std::move(rows);
  return out;
}

}  // namespace caliper
