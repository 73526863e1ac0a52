// caliper merge: an HF checkpoint plus a scale file -> a new checkpoint directory engines load.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli_args.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "client/flag_terms.h"
#include "core/formats/checkpoint_merge.h"

namespace caliper::cli {
namespace {

const std::vector<FlagSpec>& MergeFlags() {
  static const std::vector<FlagSpec> flags = {
      {"checkpoint", "DIR", "Hugging Face checkpoint (config.json + safetensors shards)"},
      {"scales", "FILE", "compressed-tensors or ModelOpt scale file (caliper --format output)"},
      {"out", "DIR", "new checkpoint directory (must not exist, or be empty)"},
      {"kv-only", "", "merge only the KV cache scales, leaving NVFP4 global scales out"},
  };
  return flags;
}

constexpr absl::string_view kDescription =
    "Writes a new checkpoint directory: config.json with the quantization_config block added\n"
    "(and hf_quant_config.json for ModelOpt), the scale tensors in their own shard\n"
    "model-caliper-scales.safetensors, and model.safetensors.index.json listing it with the\n"
    "original shards. The weight shards are not rewritten: they are hard-linked (same\n"
    "filesystem; no copy, and the new directory survives deletion of the old one) or else\n"
    "symlinked by absolute path. Refuses scale tensors the checkpoint already holds, and NVFP4\n"
    "global scales beside unquantized weights (use --kv-only).\n"
    "Exit codes: 0 written, 2 usage or input error (nothing written), 3 I/O failure.";

int Fail(std::ostream& err, absl::string_view message, int code = kExitUsage) {
  err << "caliper merge: " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  return code;
}

}  // namespace

int RunMergeCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto flags = CliArgs::Parse(args, MergeFlags());
  if (!flags.ok()) {
    return Fail(err, absl::StrCat(flags.status().message(), " (see caliper merge --help)"));
  }
  if (flags->help()) {
    out << FormatHelp("merge", "--checkpoint DIR --scales FILE --out DIR [--kv-only]",
                      kDescription, MergeFlags());
    return kExitOk;
  }
  MergeOptions options;
  for (const auto& [flag, field] :
       {std::pair<const char*, std::string*>{"checkpoint", &options.checkpoint_dir},
        {"scales", &options.scales_path},
        {"out", &options.out_dir}}) {
    const std::optional<std::string> value = flags->Get(flag);
    if (!value || value->empty()) return Fail(err, absl::StrCat("--", flag, " is required"));
    *field = *value;
  }
  options.kv_only = flags->Has("kv-only");
  options.env = CliEnv();
  absl::StatusOr<MergeReport> report = MergeScalesIntoCheckpoint(options);
  if (!report.ok()) {
    const FieldFlags flag_names = {{"checkpoint_dir", "--checkpoint"},
                                   {"scales_path", "--scales"},
                                   {"out_dir", "--out"},
                                   {"kv_only", "--kv-only"}};
    return Fail(err, InFlagTerms(report.status().message(), flag_names),
                ExitCodeFor(report.status()));
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
  return kExitOk;
}

}  // namespace caliper::cli
