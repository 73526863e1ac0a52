// caliper quantize: an HF checkpoint plus a scale file -> a complete NVFP4 checkpoint.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/commands.h"
#include "client/connection_options.h"
#include "client/file_io.h"
#include "core/formats/nvfp4_checkpoint.h"
#include "core/tensor/reduction_backend.h"

namespace caliper::cli {
namespace {

RemoteScaleFileFn remote_scale_file = nullptr;

// Removes the fetched scale file however the command ends.
struct TemporaryFile {
  std::string path;
  ~TemporaryFile() {
    if (!path.empty()) std::remove(path.c_str());
  }
};

absl::Status RunQuantize(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  QuantizeOptions options;
  options.checkpoint_dir = *flags.Get("checkpoint");
  TemporaryFile fetched;
  if (flags.Has("scales") == flags.Has("session")) {
    return UsageError("give either --scales FILE or --server ADDR --session ID");
  }
  for (const FlagSpec& spec : ConnectionFlags()) {
    if (flags.Has(spec.name) && !flags.Has("server")) {
      return UsageError(absl::StrCat("--", spec.name, " only applies with --server"));
    }
  }
  if (flags.Has("session")) {
    if (!flags.Has("server")) return UsageError("--session needs --server");
    if (remote_scale_file == nullptr) {
      return UsageError("--server: this caliper was built without gRPC");
    }
    absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(flags);
    if (!security.ok()) return UsageError(security.status().message());
    absl::StatusOr<std::string> bytes = remote_scale_file(
        *flags.Get("server"), *security, *flags.Get("session"), *flags.Get("format"), err);
    if (!bytes.ok()) return bytes.status();
    fetched.path = (std::filesystem::temp_directory_path() /
                    absl::StrCat("caliper-quantize-", ::getpid(), "-scales.safetensors"))
                       .string();
    if (absl::Status s = WriteFileAtomically(fetched.path, *bytes); !s.ok()) return s;
    options.scales_path = fetched.path;
  } else {
    if (flags.Has("server")) return UsageError("--server needs --session (or drop it for --scales)");
    options.scales_path = *flags.Get("scales");
  }
  options.out_dir = *flags.Get("out");
  options.format = *flags.Get("format");
  options.llm_compressor_compat = flags.Get("compat") == std::optional<std::string>("llm-compressor");
  options.input_observer = flags.Get("observer").value_or("");
  options.kv_observer = flags.Get("kv-observer").value_or("");
  absl::StatusOr<std::optional<int64_t>> threads = flags.GetInt("threads", 1, 1024);
  if (!threads.ok()) return UsageError(threads.status().message());
  std::unique_ptr<ReductionBackend> backend =
      MakeCpuBackend(static_cast<int>(threads->value_or(0)));
  options.backend = backend.get();
  options.env = CliEnv();
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  int last_percent = -1;
  if (!flags.Has("quiet")) {
    options.progress = [&](uint64_t done, uint64_t total, const std::string& tensor) {
      const int percent = total == 0 ? 100 : static_cast<int>(done * 100 / total);
      if (percent == last_percent && done != total) return;
      last_percent = percent;
      const std::string line =
          absl::StrFormat("caliper quantize: %3d%% %.2f/%.2f GiB %s", percent,
                          done / 1073741824.0, total / 1073741824.0, tensor);
      if (tty) {
        err << "\r" << line.substr(0, 110) << "\033[K" << (done == total ? "\n" : "")
            << std::flush;
      } else if (percent % 10 == 0 || done == total) {
        err << line << "\n";
      }
    };
  }
  absl::StatusOr<QuantizeReport> report = QuantizeCheckpoint(options);
  if (!report.ok()) return report.status();
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
  return absl::OkStatus();
}

}  // namespace

void SetRemoteScaleFile(RemoteScaleFileFn fn) { remote_scale_file = fn; }
RemoteScaleFileFn RemoteScaleFileHook() { return remote_scale_file; }

const CommandSpec& QuantizeCommand() {
  static const CommandSpec command{
      .name = "quantize",
      .summary = "pack an HF checkpoint to NVFP4 with a scale file's global scales",
      .synopsis = "--checkpoint DIR (--scales FILE | --server ADDR --session ID) --out DIR "
                  "[--format compressed-tensors|modelopt] [--compat llm-compressor]",
      .description =
          "Writes a checkpoint engines serve as it is. Every Linear with a weight global scale in\n"
          "the scale file is packed: FP4 E2M1 two per byte and FP8 E4M3 scales per 16 columns,\n"
          "computed after the (fused) global scale. compressed-tensors: weight_packed,\n"
          "weight_scale, weight_global_scale, input_global_scale, k_scale/v_scale and the full\n"
          "quantization_config (ignore: lm_head, every MoE router, every Linear without scales).\n"
          "modelopt: weight (U8), weight_scale, weight_scale_2, input_scale,\n"
          "k_proj.k_scale/v_proj.v_scale and hf_quant_config.json. One tensor is resident at a\n"
          "time; input shards are memory-mapped, output shards streamed. With --server and\n"
          "--session the finalized session's scales are fetched (GetScales) instead of a file.",
      .server = ServerUse::kWithServerFlag,
      .flags = WithConnectionFlags({
          {.name = "checkpoint", .value_name = "DIR",
           .help = "dense Hugging Face checkpoint (config.json + safetensors shards)",
           .required = true},
          {.name = "scales", .value_name = "FILE",
           .help = "compressed-tensors or ModelOpt scale file (caliper --format output)"},
          {.name = "server", .value_name = "ADDR",
           .help = "caliper-server holding the finalized --session (instead of --scales)"},
          {.name = "session", .value_name = "ID",
           .help = "finalized session whose scales to pack (GetScales in --format's form)"},
          {.name = "out", .value_name = "DIR",
           .help = "new checkpoint directory (must not exist, or be empty)", .required = true},
          {.name = "format", .value_name = "NAME", .help = "checkpoint form to write",
           .default_value = "compressed-tensors", .choices = {"compressed-tensors", "modelopt"}},
          {.name = "compat", .value_name = "NAME",
           .help = "llm-compressor: group scales and K/V scale dtype as it computes them "
                   "(absent: Caliper's float32)",
           .choices = {"llm-compressor"}},
          {.name = "observer", .value_name = "NAME",
           .help = "NVFP4 input observer named in the config (absent: the scale file's, else "
                   "static_minmax)"},
          {.name = "kv-observer", .value_name = "NAME",
           .help = "KV observer named in the config (absent: the scale file's, else "
                   "static_minmax)"},
          {.name = "threads", .value_name = "N", .help = "packing threads (absent: all cores)"},
          {.name = "quiet", .help = "no progress lines on stderr"},
      }),
      .run = RunQuantize,
  };
  return command;
}

int RunQuantizeCommand(const std::vector<std::string>& args, std::ostream& out,
                       std::ostream& err) {
  return RunCommand(QuantizeCommand(), args, out, err);
}

}  // namespace caliper::cli
