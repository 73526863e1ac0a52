// caliper convert: an existing calibration (LightLLM JSON, a compressed-tensors / ModelOpt scale
// file, or a checkpoint holding such scales) rendered into other engines' formats.
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/cli_args.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "core/formats/checkpoint.h"
#include "core/formats/engine_formats.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

const std::vector<FlagSpec>& ConvertFlags() {
  static const std::vector<FlagSpec> flags = {
      {"in", "PATH", "LightLLM .json, a scale .safetensors, or a checkpoint directory"},
      {"format", "NAME", "lightllm, compressed-tensors, modelopt or vllm-legacy (repeatable)",
       true},
      {"out", "DIR", "output directory (created)"},
      {"model", "CONFIG", "the model's config.json (default: the checkpoint's own)"},
      {"tp", "T", "TP size of the deployment (default 1; lightllm and vllm-legacy)"},
  };
  return flags;
}

constexpr absl::string_view kDescription =
    "Reads an existing calibration and writes it in other engines' formats. Inputs: a LightLLM\n"
    "calibration JSON (rows mapped back to the model's original heads, replicas by group max),\n"
    "a compressed-tensors or ModelOpt scale file, or a checkpoint directory holding such scale\n"
    "tensors. NVFP4 global scales convert exactly between the divisor (compressed-tensors) and\n"
    "multiplier (ModelOpt) forms. Exit codes: 0 written, 2 usage or input error, 3 I/O failure.";

int Fail(std::ostream& err, absl::string_view message, int code = kExitUsage) {
  err << "caliper convert: " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  return code;
}

// A core or file error: exit code 3 when it is an I/O failure (core/env/env.h), else 2.
int Fail(std::ostream& err, const absl::Status& status, absl::string_view prefix = "") {
  return Fail(err, absl::StrCat(prefix, status.message()), ExitCodeFor(status));
}

}  // namespace

int RunConvertCommand(const std::vector<std::string>& args, std::ostream& out,
                      std::ostream& err) {
  auto flags = CliArgs::Parse(args, ConvertFlags());
  if (!flags.ok()) {
    return Fail(err, absl::StrCat(flags.status().message(), " (see caliper convert --help)"));
  }
  if (flags->help()) {
    out << FormatHelp("convert", "--in PATH --format NAME... --out DIR [--model CONFIG] [--tp T]",
                      kDescription, ConvertFlags());
    return kExitOk;
  }
  const std::string in = flags->Get("in").value_or("");
  const std::string out_dir = flags->Get("out").value_or("");
  const std::vector<std::string> formats = flags->GetAll("format");
  if (in.empty()) return Fail(err, "--in PATH is required");
  if (out_dir.empty()) return Fail(err, "--out DIR is required");
  if (formats.empty()) return Fail(err, "--format NAME is required");
  auto tp = flags->GetInt("tp", 1, 1 << 20);
  if (!tp.ok()) return Fail(err, tp.status());

  std::error_code ec;
  const bool is_dir = fs::is_directory(in, ec);
  std::string config_path = flags->Get("model").value_or("");
  if (config_path.empty() && is_dir) config_path = (fs::path(in) / "config.json").string();
  if (config_path.empty()) return Fail(err, "--model CONFIG is required unless --in is a checkpoint");
  auto config_text = ReadWholeFile(config_path);
  if (!config_text.ok()) return Fail(err, config_text.status(), "--model ");
  auto model = ParseHfConfig(*config_text);
  if (!model.ok()) return Fail(err, absl::StrCat(config_path, ": ", model.status().message()));

  RenderInputs inputs;
  inputs.model = *model;
  inputs.tp_size = static_cast<int>(tp->value_or(1));
  if (absl::EndsWith(in, ".json")) {
    auto text = ReadWholeFile(in);
    if (!text.ok()) return Fail(err, text.status(), "--in ");
    auto calibration = ParseLightLlmCalibration(*text);
    if (!calibration.ok()) return Fail(err, absl::StrCat(in, ": ", calibration.status().message()));
    auto kv = KvScalesFromLightLlm(*calibration, *model);
    if (!kv.ok()) return Fail(err, absl::StrCat(in, ": ", kv.status().message()));
    inputs.kv = *std::move(kv);
  } else {
    absl::StatusOr<ImportedScales> imported;
    if (is_dir) {
      auto checkpoint = HfCheckpoint::Open(in);
      if (!checkpoint.ok()) return Fail(err, checkpoint.status());
      imported = ImportScalesFromCheckpoint(**checkpoint, *model);
    } else {
      auto file = SafetensorsFile::Open(in);
      if (!file.ok()) return Fail(err, file.status());
      imported = ImportScales(**file, *model);
    }
    if (!imported.ok()) return Fail(err, imported.status());
    inputs.kv = std::move(imported->kv);
    inputs.nvfp4 = std::move(imported->nvfp4);
  }

  std::vector<ScaleWarning> warnings;
  auto files = RenderOutputs(formats, inputs, &warnings);
  if (!files.ok()) return Fail(err, files.status());
  if (absl::Status s = CliEnv()->CreateDirs(out_dir); !s.ok()) return Fail(err, s, "--out ");
  for (const ScaleWarning& warning : warnings) {
    err << "caliper convert: warning: " << warning.where << ": " << warning.message << "\n";
  }
  for (const RenderedFile& file : *files) {
    const std::string path = (fs::path(out_dir) / file.name).string();
    if (absl::Status s = WriteFileAtomically(path, file.content); !s.ok()) {
      return Fail(err, s, "--out ");
    }
    out << "wrote     " << path << " (" << file.format << ")\n";
  }
  return kExitOk;
}

}  // namespace caliper::cli
