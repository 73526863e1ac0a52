// caliper merge: an HF checkpoint plus a scale file -> a new checkpoint directory engines load.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/file_io.h"
#include "client/flag_terms.h"
#include "client/commands.h"
#include "core/check/check_rules.h"
#include "core/check/scale_set.h"
#include "core/formats/checkpoint_merge.h"

namespace caliper::cli {
namespace {

// The check rules on the checkpoint as written, so a merge that engines will load badly says so
// at once (`caliper check DIR` gives each engine's effect). Never fails the merge.
void WarnOfFindings(const std::string& dir, std::ostream& err) {
  constexpr int kMaxLines = 20;
  absl::StatusOr<ScaleSet> merged = ReadScaleSet(dir, {});
  if (!merged.ok()) {
    err << "caliper merge: warning: the new checkpoint was not checked: "
        << merged.status().message() << "\n";
    return;
  }
  int shown = 0, more = 0;
  for (const CheckFinding& f : CheckScaleSet(*merged, CheckOptions())) {
    if (f.severity == CheckSeverity::kNone) continue;  // info: no engine is affected
    if (shown == kMaxLines) {
      ++more;
      continue;
    }
    err << "caliper merge: warning: check: " << f.rule << ": " << f.tensor << ": " << f.message
        << "\n";
    ++shown;
  }
  if (more > 0) err << "caliper merge: warning: " << more << " more findings\n";
  if (shown > 0) {
    err << "caliper merge: `caliper check " << dir << "` says what each engine does with them\n";
  }
}

absl::Status RunMerge(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  MergeOptions options;
  options.checkpoint_dir = *flags.Get("checkpoint");
  options.scales_path = *flags.Get("scales");
  options.out_dir = *flags.Get("out");
  options.kv_only = flags.Has("kv-only");
  options.env = CliEnv();
  absl::StatusOr<MergeReport> report = MergeScalesIntoCheckpoint(options);
  if (!report.ok()) {
    // Core names its options; say them as this command's flags (code and I/O mark kept).
    const FieldFlags names = {{"checkpoint_dir", "--checkpoint"},
                              {"scales_path", "--scales"},
                              {"out_dir", "--out"},
                              {"kv_only", "--kv-only"}};
    return InFlagTerms(report.status(), names);
  }
  for (const ScaleWarning& warning : report->warnings) {
    err << "caliper merge: warning: " << warning.where << ": " << warning.message << "\n";
  }
  out << "caliper merge: wrote " << options.out_dir << " (" << report->format << ", "
      << report->scale_tensors << " scale tensors; " << report->hard_linked.size()
      << " files hard-linked";
  if (!report->symlinked.empty()) {
    out << ", " << report->symlinked.size() << " symlinked: "
        << absl::StrJoin(report->symlinked, ", ");
  }
  out << ")\n";
  WarnOfFindings(options.out_dir, err);
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& MergeCommand() {
  static const CommandSpec command{
      .name = "merge",
      .summary = "add a scale file to an HF checkpoint as a new shard + quantization_config",
      .synopsis = "--checkpoint DIR --scales FILE --out DIR [--kv-only]",
      .description =
          "Writes a new checkpoint directory: config.json with the quantization_config block added\n"
          "(and hf_quant_config.json for ModelOpt), the scale tensors in their own shard\n"
          "model-caliper-scales.safetensors, and model.safetensors.index.json listing it with the\n"
          "original shards. The weight shards are not rewritten: they are hard-linked (same\n"
          "filesystem; no copy, and the new directory survives deletion of the old one) or else\n"
          "symlinked by absolute path. Refuses scale tensors the checkpoint already holds, and NVFP4\n"
          "global scales beside unquantized weights (use --kv-only).",
      .flags = {
          {.name = "checkpoint", .value_name = "DIR",
           .help = "Hugging Face checkpoint (config.json + safetensors shards)", .required = true},
          {.name = "scales", .value_name = "FILE",
           .help = "compressed-tensors or ModelOpt scale file (caliper --format output)",
           .required = true},
          {.name = "out", .value_name = "DIR",
           .help = "new checkpoint directory (must not exist, or be empty)", .required = true},
          {.name = "kv-only", .help = "merge only the KV cache scales, leaving NVFP4 global scales out"},
      },
      .run = RunMerge,
  };
  return command;
}

int RunMergeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunCommand(MergeCommand(), args, out, err);
}

}  // namespace caliper::cli
