#include "core/formats/engine_formats.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/formats/format_support.h"
#include "core/formats/lightllm_format.h"

namespace caliper {

std::vector<std::string> KnownOutputFormats() {
  return {kFormatLightLlm, kFormatCompressedTensors, kFormatModelOpt, kFormatVllmLegacy};
}

std::string DefaultKvFormat(Fp8Flavor flavor, KvCacheDtype cache) {
  return flavor == Fp8Flavor::kE4M3FN && cache == KvCacheDtype::kFp8 ? kFormatLightLlm
                                                                      : kFormatCompressedTensors;
}

absl::StatusOr<std::vector<RenderedFile>> RenderOutputs(absl::Span<const std::string> formats,
                                                        const RenderInputs& inputs,
                                                        std::vector<ScaleWarning>* warnings) {
  std::vector<RenderedFile> files;
  for (size_t i = 0; i < formats.size(); ++i) {
    const std::string& format = formats[i];
    const std::string field = absl::StrCat("formats[", i, "]");
    auto fail = [&](const absl::Status& status) {
      return absl::Status(status.code(),
                          absl::StrCat(field, " (", format, "): ", status.message()));
    };
    if (format == kFormatLightLlm) {
      if (!inputs.kv.has_value()) {
        return fail(absl::InvalidArgumentError("needs KV scales, but KV calibration is off"));
      }
      absl::StatusOr<LightLlmCalibration> file =
          LightLlmFromKvScales(*inputs.kv, inputs.model, inputs.tp_size);
      if (!file.ok()) return fail(file.status());
      formats_internal::WarnQueryDropped(*inputs.kv, kFormatLightLlm,
                       "LightLLM's calibration file holds K and V scales only", warnings);
      files.push_back({format, kLightLlmFile, SerializeLightLlmCalibration(*file)});
    } else if (format == kFormatCompressedTensors) {
      if (!inputs.kv.has_value() && inputs.nvfp4.modules.empty()) {
        return fail(absl::InvalidArgumentError("no KV or NVFP4 scales to write"));
      }
      absl::StatusOr<std::string> tensors = CompressedTensorsScalesFile(inputs, warnings);
      if (!tensors.ok()) return fail(tensors.status());
      files.push_back({format, kCtScalesFile, *std::move(tensors)});
      files.push_back({format, kCtConfigFile, CompressedTensorsQuantizationConfig(inputs)});
    } else if (format == kFormatModelOpt) {
      if (!inputs.kv.has_value() && inputs.nvfp4.modules.empty()) {
        return fail(absl::InvalidArgumentError("no KV or NVFP4 scales to write"));
      }
      absl::StatusOr<std::string> tensors = ModelOptScalesFile(inputs, warnings);
      if (!tensors.ok()) return fail(tensors.status());
      files.push_back({format, kModelOptScalesFile, *std::move(tensors)});
      files.push_back({format, kModelOptConfigFile, ModelOptHfQuantConfig(inputs)});
    } else if (format == kFormatVllmLegacy) {
      absl::StatusOr<std::string> json = VllmLegacyJson(inputs, warnings);
      if (!json.ok()) return fail(json.status());
      files.push_back({format, kVllmLegacyFile, *std::move(json)});
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ": unknown format \"", format, "\" (known: ",
          absl::StrJoin(KnownOutputFormats(), ", "), ")"));
    }
  }
  return files;
}

}  // namespace caliper
