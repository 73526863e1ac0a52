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
  options.link_unchanged = flags.Has("link-unchanged");
  options.env = CliEnv();
  absl::StatusOr<MergeReport> report = MergeScalesIntoCheckpoint(options);
  if (!report.ok()) {
    // Core names its options; say them as this command's flags (code and I/O mark kept).
    const FieldFlags names = {{"checkpoint_dir", "--checkpoint"},
                              {"scales_path", "--scales"},
                              {"out_dir", "--out"},
                              {"kv_only", "--kv-only"},
                              {"link_unchanged", "--link-unchanged"}};
    return InFlagTerms(report.status(), names);
  }
  for (const ScaleWarning& warning : report->warnings) {
    err << "caliper merge: warning: " << warning.where << ": " << warning.message << "\n";
  }
  const size_t unchanged =
      report->copied.size() + report->hard_linked.size() + report->symlinked.size();
  out << "caliper merge: wrote " << options.out_dir << " (" << report->format << ", "
      << report->scale_tensors << " scale tensors; " << unchanged << " files "
      << (options.link_unchanged ? "linked" : "copied") << ")\n";
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
  WarnOfFindings(options.out_dir, err);
  return absl::OkStatus();
}

}  // namespace

const CommandSpec& MergeCommand() {
  static const CommandSpec command{
      .name = "merge",
      .summary = "add a scale file to an HF checkpoint as a new shard + quantization_config",
      .synopsis = "--checkpoint DIR --scales FILE --out DIR [--kv-only] [--link-unchanged]",
      .description =
          "Writes a new checkpoint directory: config.json with the quantization_config block added\n"
          "(and hf_quant_config.json for ModelOpt), the scale tensors in their own shard\n"
          "model-caliper-scales.safetensors, and model.safetensors.index.json listing it with the\n"
          "original shards. The weight shards are not rewritten: they and the other files are\n"
          "copied (reflinked where the filesystem can), so writing into the new directory never\n"
          "changes the original; with --link-unchanged they are hard-linked to the original's\n"
          "(symlinked across filesystems), each one listed. Refuses scale tensors the checkpoint\n"
          "already holds, and NVFP4 global scales beside unquantized weights (use --kv-only).",
      .flags = {
          {.name = "checkpoint", .value_name = "DIR",
           .help = "Hugging Face checkpoint (config.json + safetensors shards)", .required = true},
          {.name = "scales", .value_name = "FILE",
           .help = "compressed-tensors or ModelOpt scale file (caliper --format output)",
           .required = true},
          {.name = "out", .value_name = "DIR",
           .help = "new checkpoint directory (must not exist, or be empty)", .required = true},
          {.name = "kv-only", .help = "merge only the KV cache scales, leaving NVFP4 global scales out"},
          {.name = "link-unchanged",
           .help = "hard-link (symlink across filesystems) the shards and files the merge does "
                   "not change instead of copying them: writing into one changes the original"},
      },
      .run = RunMerge,
  };
  return command;
}

int RunMergeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunCommand(MergeCommand(), args, out, err);
}

}  // namespace caliper::cli
