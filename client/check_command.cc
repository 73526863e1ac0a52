// caliper check: what in a quantized checkpoint's scales breaks or degrades each engine, before
// it is loaded (core/check/check_rules.h), and a repaired copy on request.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/commands.h"
#include "client/connection_options.h"
#include "client/file_io.h"
#include "client/flag_terms.h"
#include "core/check/checkpoint_repair.h"
#include "core/formats/render_inputs.h"
#include "core/formats/scale_import.h"
#include "core/tensor/reduction_backend.h"
#include "core/check/check_report.h"
#include "core/check/check_rules.h"
#include "core/check/scale_set.h"

namespace caliper::cli {
namespace {

// The finalized session's scales (its compressed-tensors scale file, GetScales).
absl::StatusOr<ScaleSet> SessionScales(const CliArgs& flags, const std::string& id,
                                       const ScaleSet& checkpoint, std::ostream& err) {
  if (!flags.Has("server")) return UsageError("a from-session:ID policy needs --server ADDR");
  RemoteScaleFileFn fetch = RemoteScaleFileHook();
  if (fetch == nullptr) return UsageError("--server: this caliper was built without gRPC");
  absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(flags);
  if (!security.ok()) return UsageError(security.status().message());
  absl::StatusOr<std::string> bytes =
      fetch(*flags.Get("server"), *security, id, "compressed-tensors", err);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::FromBytes(*bytes);
  if (!file.ok()) return Annotate(file.status(), absl::StrCat("session ", id, ": "));
  absl::StatusOr<ImportedScales> imported = ImportScales(**file, std::nullopt);
  if (!imported.ok()) return Annotate(imported.status(), absl::StrCat("session ", id, ": "));
  return ScaleSetFromFinalized(absl::StrCat("session ", id),
                               checkpoint.model.value_or(ModelConfig()), imported->kv,
                               imported->nvfp4);
}

// --repair ... --out DIR: writes the copy, lists each repair, checks the copy. Sets *clean to
// whether the copy has no finding that breaks or degrades a selected engine.
absl::Status RunRepairIfAsked(const CliArgs& flags, const ScaleSet& scales,
                              const CheckOptions& options, std::ostream& out, std::ostream& err,
                              bool* clean) {
  const bool repair = flags.Has("repair");
  if (repair != flags.Has("out")) return UsageError("--repair and --out go together");
  if (!repair) {
    if (flags.Has("weights-from")) return UsageError("--weights-from only applies with --repair");
    if (flags.Has("link-unchanged")) {
      return UsageError("--link-unchanged only applies with --repair");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<RepairPolicy> policy = ParseRepairPolicies(flags.GetAll("repair"), "--repair");
  if (!policy.ok()) return UsageError(policy.status().message());
  if (scales.format == kFormatLightLlm) {
    return UsageError("--repair: repairs checkpoint directories, not LightLLM files");
  }
  RepairOptions repair_options;
  repair_options.checkpoint_dir = scales.origin;
  repair_options.out_dir = *flags.Get("out");
  repair_options.weights_from = flags.Get("weights-from").value_or("");
  repair_options.policy = *policy;
  repair_options.link_unchanged = flags.Has("link-unchanged");
  repair_options.env = CliEnv();
  for (const std::string& id : {policy->experts_session, policy->kv_session}) {
    if (id.empty() || repair_options.sessions.count(id) > 0) continue;
    absl::StatusOr<ScaleSet> session = SessionScales(flags, id, scales, err);
    if (!session.ok()) return session.status();
    repair_options.sessions[id] = *std::move(session);
  }
  std::unique_ptr<ReductionBackend> backend = MakeCpuBackend();
  repair_options.backend = backend.get();
  absl::StatusOr<RepairReport> report = RepairCheckpoint(scales, repair_options);
  if (!report.ok()) {
    return InFlagTerms(report.status(), {{"out_dir", "--out"}, {"weights_from", "--weights-from"},
                                         {"link_unchanged", "--link-unchanged"},
                                         {"checkpoint_dir", "--checkpoint"}});
  }
  for (const RepairEntry& e : report->repairs) {
    out << "repaired  " << e.tensor << ": " << e.before << " -> " << e.after << " (" << e.policy
        << ", " << e.rule << ")" << (e.note.empty() ? "" : "; ") << e.note << "\n";
  }
  const size_t unchanged = report->copied.size() + report->hard_linked.size() +
                           report->symlinked.size();
  out << "caliper check: wrote " << repair_options.out_dir << " (" << report->repairs.size()
      << " repairs, " << report->rewritten.size() << " shards rewritten, " << unchanged
      << " files " << (repair_options.link_unchanged ? "linked" : "copied") << "; "
      << kRepairsFile << ")\n";
  if (!report->hard_linked.empty()) {
    out << "hard-linked to the original (--link-unchanged): "
        << absl::StrJoin(report->hard_linked, ", ") << "\n";
  }
  if (!report->symlinked.empty()) {
    out << "symlinked to the original (--link-unchanged): "
        << absl::StrJoin(report->symlinked, ", ") << "\n";
  }
  if (report->linked_any()) {
    out << "  these are the original's files: writing into one of them in place changes the "
           "original\n";
  }
  absl::StatusOr<ScaleSet> again = ReadScaleSet(repair_options.out_dir, {});
  if (!again.ok()) return again.status();
  const std::vector<CheckFinding> remaining = CheckScaleSet(*again, options);
  out << "repaired copy: " << CheckSummaryLine(remaining, options) << "\n";
  const CheckSummary counts = SummarizeFindings(remaining);
  *clean = counts.breaks + counts.degrades == 0;
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
  bool repaired_clean = false;
  if (absl::Status s = RunRepairIfAsked(flags, *scales, options, out, err, &repaired_clean);
      !s.ok()) {
    return s;
  }
  if (flags.Has("repair")) {
    return repaired_clean ? absl::OkStatus()
                          : FindingsError("the repaired copy still has findings (listed above)");
  }
  const CheckSummary counts = SummarizeFindings(findings);
  if (counts.breaks + counts.degrades > 0) return FindingsError(summary);
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& CheckCommand() {
  static const CommandSpec command{
      .name = "check",
      .summary = "find what in a quantized checkpoint's scales breaks or degrades each engine",
      .synopsis = "CHECKPOINT_DIR [--engine vllm|sglang|tensorrt-llm|lightllm|all] [--json FILE] "
                  "[--tp T] [--deep] [--repair POLICY... --out DIR [--weights-from DIR] "
                  "[--link-unchanged]]",
      .description =
          "Reads a compressed-tensors or ModelOpt checkpoint directory (any producer) with its\n"
          "config, or a LightLLM calibration JSON file: the safetensors headers first, then only\n"
          "the scale tensors (global, input and K/V scales; every block scale only with --deep).\n"
          "Reports each finding: the tensor, its value, the rule, and what each selected engine\n"
          "does with it (load error, NaN at run time, a warning and the value it uses, silent\n"
          "accuracy loss). Rules and the JSON schema: docs/check.md. With --repair and --out, a\n"
          "repaired copy is written (the original never changes) with caliper_repairs.json;\n"
          "the files the repair does not change are copied (reflinked where the filesystem\n"
          "can), or with --link-unchanged hard-linked to the original's, each one listed.",
      .server = ServerUse::kWithServerFlag,
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
          {.name = "link-unchanged",
           .help = "hard-link (symlink across filesystems) the files --repair does not change "
                   "instead of copying them: writing into one changes the original"},
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
