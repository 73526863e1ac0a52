// caliper convert: an existing calibration (LightLLM JSON, a compressed-tensors / ModelOpt scale
// file, or a checkpoint holding such scales) rendered into other engines' formats.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

absl::Status RunConvert(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const std::string in = *flags.Get("in");
  const std::string out_dir = *flags.Get("out");
  const std::vector<std::string> formats = flags.GetAll("format");
  auto tp = flags.GetInt("tp", 1, 1 << 20);
  if (!tp.ok()) return UsageError(tp.status().message());

  std::error_code ec;
  const bool is_dir = fs::is_directory(in, ec);
  std::string config_path = flags.Get("model").value_or("");
  if (config_path.empty() && is_dir) config_path = (fs::path(in) / "config.json").string();
  if (config_path.empty()) return UsageError("--model CONFIG is required unless --in is a checkpoint");
  auto config_text = ReadWholeFile(config_path);
  if (!config_text.ok()) return Annotate(config_text.status(), "--model ");
  auto model = ParseHfConfig(*config_text);
  if (!model.ok()) return absl::InvalidArgumentError(absl::StrCat(config_path, ": ", model.status().message()));

  RenderInputs inputs;
  inputs.model = *model;
  inputs.tp_size = static_cast<int>(**tp);
  if (absl::EndsWith(in, ".json")) {
    auto text = ReadWholeFile(in);
    if (!text.ok()) return Annotate(text.status(), "--in ");
    auto calibration = ParseLightLlmCalibration(*text);
    if (!calibration.ok()) return absl::InvalidArgumentError(absl::StrCat(in, ": ", calibration.status().message()));
    auto kv = KvScalesFromLightLlm(*calibration, *model);
    if (!kv.ok()) return absl::InvalidArgumentError(absl::StrCat(in, ": ", kv.status().message()));
    inputs.kv = *std::move(kv);
  } else {
    absl::StatusOr<ImportedScales> imported;
    if (is_dir) {
      auto checkpoint = HfCheckpoint::Open(in);
      if (!checkpoint.ok()) return checkpoint.status();
      imported = ImportScalesFromCheckpoint(**checkpoint, *model);
    } else {
      auto file = SafetensorsFile::Open(in);
      if (!file.ok()) return file.status();
      imported = ImportScales(**file, *model);
    }
    if (!imported.ok()) return imported.status();
    inputs.kv = std::move(imported->kv);
    inputs.nvfp4 = std::move(imported->nvfp4);
  }

  std::vector<ScaleWarning> warnings;
  auto files = RenderOutputs(formats, inputs, &warnings);
  if (!files.ok()) return files.status();
  if (absl::Status s = CliEnv()->CreateDirs(out_dir); !s.ok()) return Annotate(s, "--out ");
  for (const ScaleWarning& warning : warnings) {
    err << "caliper convert: warning: " << warning.where << ": " << warning.message << "\n";
  }
  for (const RenderedFile& file : *files) {
    const std::string path = (fs::path(out_dir) / file.name).string();
    if (absl::Status s = WriteFileAtomically(path, file.content); !s.ok()) {
      return Annotate(s, "--out ");
    }
    out << "wrote     " << path << " (" << file.format << ")\n";
  }
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& ConvertCommand() {
  static const CommandSpec command{
      .name = "convert",
      .summary = "render an existing calibration in other engines' formats (offline)",
      .synopsis = "--in PATH --format NAME... --out DIR [--model CONFIG] [--tp T]",
      .description =
          "Reads an existing calibration and writes it in other engines' formats. Inputs: a LightLLM\n"
          "calibration JSON (rows mapped back to the model's original heads, replicas by group max),\n"
          "a compressed-tensors or ModelOpt scale file, or a checkpoint directory holding such scale\n"
          "tensors. NVFP4 global scales convert exactly between the divisor (compressed-tensors) and\n"
          "multiplier (ModelOpt) forms.",
      .flags = {
          {.name = "in", .value_name = "PATH",
           .help = "LightLLM .json, a scale .safetensors, or a checkpoint directory",
           .required = true},
          {.name = "format", .value_name = "NAME",
           .help = "lightllm, compressed-tensors, modelopt or vllm-legacy", .required = true,
           .repeated = true},
          {.name = "out", .value_name = "DIR", .help = "output directory (created)",
           .required = true},
          {.name = "model", .value_name = "CONFIG",
           .help = "the model's config.json (absent: the checkpoint's own)"},
          {.name = "tp", .value_name = "T",
           .help = "deployment TP size (lightllm and vllm-legacy)", .default_value = "1"},
      },
      .run = RunConvert,
  };
  return command;
}

int RunConvertCommand(const std::vector<std::string>& args, std::ostream& out,
                      std::ostream& err) {
  return RunCommand(ConvertCommand(), args, out, err);
}

}  // namespace caliper::cli
