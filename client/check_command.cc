// caliper check: what in a quantized checkpoint's scales breaks or degrades each engine, before
// it is loaded (core/check/check_rules.h), and a repaired copy on request.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "core/check/check_report.h"
#include "core/check/check_rules.h"
#include "core/check/scale_set.h"

namespace caliper::cli {
namespace {

absl::Status RunRepairIfAsked(const CliArgs& flags, const ScaleSet& scales,
                              const std::vector<CheckFinding>& findings,
                              const CheckOptions& options, std::ostream& out, std::ostream& err) {
  (void)scales; (void)findings; (void)options; (void)out; (void)err;
  if (flags.Has("repair") || flags.Has("out")) return UsageError("--repair: not built yet");
  return absl::OkStatus();
}

absl::Status RunCheck(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  CheckOptions options;
  absl::StatusOr<std::vector<CheckEngine>> engines = ParseCheckEngines(*flags.Get("engine"),
                                                                       "--engine");
  if (!engines.ok()) return UsageError(engines.status().message());
  options.engines = *engines;
  absl::StatusOr<std::optional<int64_t>> tp = flags.GetInt("tp", 1, 4096);
  if (!tp.ok()) return UsageError(tp.status().message());
  options.tp_size = static_cast<int>(tp->value_or(0));
  ScaleSetReadOptions read;
  read.deep = flags.Has("deep");
  read.model_config_path = flags.Get("model").value_or("");
  const std::string path = *flags.Get("checkpoint");
  absl::StatusOr<ScaleSet> scales = ReadScaleSet(path, read);
  if (!scales.ok()) return scales.status();
  const std::vector<CheckFinding> findings = CheckScaleSet(*scales, options);
  if (flags.Has("json")) {
    if (absl::Status s = WriteFileAtomically(*flags.Get("json"),
                                             CheckReportJson(*scales, options, findings));
        !s.ok()) {
      return s;
    }
  }
  out << CheckReportText(*scales, findings);
  const std::string summary = CheckSummaryLine(findings, options);
  out << summary << "\n";
  if (absl::Status s = RunRepairIfAsked(flags, *scales, findings, options, out, err); !s.ok()) {
    return s;
  }
  const CheckSummary counts = SummarizeFindings(findings);
  if (counts.breaks + counts.degrades > 0 && !flags.Has("out")) {
    return FindingsError(summary);
  }
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& CheckCommand() {
  static const CommandSpec command{
      .name = "check",
      .summary = "find what in a quantized checkpoint's scales breaks or degrades each engine",
      .synopsis = "CHECKPOINT_DIR [--engine vllm|sglang|tensorrt-llm|lightllm|all] [--json FILE] "
                  "[--tp T] [--deep] [--repair POLICY... --out DIR [--weights-from DIR]]",
      .description =
          "Reads a compressed-tensors or ModelOpt checkpoint directory (any producer) with its\n"
          "config, or a LightLLM calibration JSON file: the safetensors headers first, then only\n"
          "the scale tensors (global, input and K/V scales; every block scale only with --deep).\n"
          "Reports each finding: the tensor, its value, the rule, and what each selected engine\n"
          "does with it (load error, NaN at run time, a warning and the value it uses, silent\n"
          "accuracy loss). Rules and the JSON schema: docs/check.md. With --repair and --out, a\n"
          "repaired copy is written (the original never changes) with caliper_repairs.json.",
      .reports_findings = true,
      .flags = WithConnectionFlags({
          {.name = "checkpoint", .value_name = "DIR",
           .help = "checkpoint directory or LightLLM JSON (also the first bare word)",
           .required = true, .positional = true},
          {.name = "engine", .value_name = "NAME", .help = "engines whose behaviour is reported",
           .default_value = "all",
           .choices = {"vllm", "sglang", "tensorrt-llm", "lightllm", "all"}},
          {.name = "json", .value_name = "FILE", .help = "also write every finding as JSON"},
          {.name = "tp", .value_name = "T",
           .help = "deployment TP size for the KV head checks (absent: not checked)"},
          {.name = "deep", .help = "also read every block (group) scale tensor"},
          {.name = "model", .value_name = "CONFIG",
           .help = "config.json of the model a LightLLM file is for (layers, heads)"},
          {.name = "repair", .value_name = "POLICY",
           .help = "experts=max-of-layer|median-of-layer|from-session:ID, fused=min, "
                   "kv-missing=from-session:ID|refuse",
           .repeated = true},
          {.name = "out", .value_name = "DIR", .help = "where --repair writes the repaired copy"},
          {.name = "weights-from", .value_name = "DIR",
           .help = "unquantized checkpoint to requantize from when a global scale changes"},
          {.name = "server", .value_name = "ADDR",
           .help = "caliper-server holding the sessions a from-session:ID policy names"},
      }),
      .run = RunCheck,
  };
  return command;
}

int RunCheckCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunCommand(CheckCommand(), args, out, err);
}

}  // namespace caliper::cli
