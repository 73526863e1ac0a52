// caliper quantize: an HF checkpoint plus a scale file -> a complete NVFP4 checkpoint.
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "client/cli_args.h"
#include "client/commands.h"
#include "core/formats/nvfp4_checkpoint.h"
#include "core/tensor/reduction_backend.h"

namespace caliper::cli {
namespace {

const std::vector<FlagSpec>& QuantizeFlags() {
  static const std::vector<FlagSpec> flags = {
      {"checkpoint", "DIR", "dense Hugging Face checkpoint (config.json + safetensors shards)"},
      {"scales", "FILE", "compressed-tensors or ModelOpt scale file (caliper --format output)"},
      {"out", "DIR", "new checkpoint directory (must not exist, or be empty)"},
      {"format", "NAME", "compressed-tensors (default) or modelopt"},
      {"compat", "NAME", "llm-compressor: group scales in the weight's dtype, as it computes them"},
      {"observer", "NAME", "NVFP4 input observer written into the config (default: the scale "
                           "file's, else static_minmax)"},
      {"kv-observer", "NAME", "KV observer written into the config (default: the scale file's, "
                              "else static_minmax)"},
      {"threads", "N", "packing threads (default: all cores)"},
      {"quiet", "", "no progress on stderr"},
  };
  return flags;
}

constexpr absl::string_view kDescription =
    "Writes a checkpoint engines serve as it is. Every Linear with a weight global scale in\n"
    "the scale file is packed: FP4 E2M1 two per byte and FP8 E4M3 scales per 16 columns,\n"
    "computed after the (fused) global scale. compressed-tensors: weight_packed, weight_scale,\n"
    "weight_global_scale, input_global_scale, k_scale/v_scale and the full quantization_config\n"
    "(ignore: lm_head, every MoE router, every Linear without scales). modelopt: weight (U8),\n"
    "weight_scale, weight_scale_2, input_scale, k_proj.k_scale/v_proj.v_scale and\n"
    "hf_quant_config.json. One tensor is resident at a time; shards are streamed.\n"
    "Exit codes: 0 written, 2 usage or input error (nothing written).";

int Fail(std::ostream& err, absl::string_view message) {
  err << "caliper quantize: " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  return kExitUsage;
}

}  // namespace

int RunQuantizeCommand(const std::vector<std::string>& args, std::ostream& out,
                       std::ostream& err) {
  auto flags = CliArgs::Parse(args, QuantizeFlags());
  if (!flags.ok()) {
    return Fail(err, absl::StrCat(flags.status().message(), " (see caliper quantize --help)"));
  }
  if (flags->help()) {
    out << FormatHelp("quantize",
                      "--checkpoint DIR --scales FILE --out DIR [--format compressed-tensors|"
                      "modelopt] [--compat llm-compressor]",
                      kDescription, QuantizeFlags());
    return kExitOk;
  }
  QuantizeOptions options;
  for (const auto& [flag, field] :
       {std::pair<const char*, std::string*>{"checkpoint", &options.checkpoint_dir},
        {"scales", &options.scales_path},
        {"out", &options.out_dir}}) {
    const std::optional<std::string> value = flags->Get(flag);
    if (!value || value->empty()) return Fail(err, absl::StrCat("--", flag, " is required"));
    *field = *value;
  }
  options.format = flags->Get("format").value_or("compressed-tensors");
  if (options.format != "compressed-tensors" && options.format != "modelopt") {
    return Fail(err, absl::StrCat("--format: \"", options.format,
                                  "\" (expected compressed-tensors or modelopt)"));
  }
  if (std::optional<std::string> compat = flags->Get("compat")) {
    if (*compat != "llm-compressor") {
      return Fail(err, absl::StrCat("--compat: \"", *compat, "\" (expected llm-compressor)"));
    }
    options.llm_compressor_compat = true;
  }
  options.input_observer = flags->Get("observer").value_or("");
  options.kv_observer = flags->Get("kv-observer").value_or("");
  auto threads = flags->GetInt("threads", 1, 1024);
  if (!threads.ok()) return Fail(err, threads.status().message());
  std::unique_ptr<ReductionBackend> backend = MakeCpuBackend(static_cast<int>(threads->value_or(0)));
  options.backend = backend.get();
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  int last_percent = -1;
  if (!flags->Has("quiet")) {
    options.progress = [&](uint64_t done, uint64_t total, const std::string& tensor) {
      const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
      if (percent == last_percent && done != total) return;
      last_percent = percent;
      const std::string line = absl::StrFormat(
          "caliper quantize: %3d%% %.1f/%.1f GiB %s", percent, done / 1073741824.0,
          total / 1073741824.0, tensor);
      if (tty) {
        err << "\r" << line.substr(0, 100) << "\033[K" << (done == total ? "\n" : "") << std::flush;
      } else if (percent % 10 == 0 || done == total) {
        err << line << "\n";
      }
    };
  }
  absl::StatusOr<QuantizeReport> report = QuantizeCheckpoint(options);
  if (!report.ok()) return Fail(err, report.status().message());
  for (const ScaleWarning& warning : report->warnings) {
    err << "caliper quantize: warning: " << warning.where << ": " << warning.message << "\n";
  }
  if (!report->renamed.empty()) {
    err << "caliper quantize: " << report->renamed.size() << " expert names mapped (e.g. "
        << report->renamed[0].first << " -> " << report->renamed[0].second << ")\n";
  }
  out << "caliper quantize: wrote " << options.out_dir << " (" << options.format << ", "
      << report->quantized_modules << " modules packed to NVFP4, " << report->copied_tensors
      << " tensors copied, " << report->kv_layers << " layers with K/V scales; ignore: "
      << absl::StrJoin(report->ignore, ", ") << ")\n";
  return kExitOk;
}

}  // namespace caliper::cli
