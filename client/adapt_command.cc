// caliper adapt: rewrites a LightLLM FP8 KV calibration file for another head count / TP.
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/connection_options.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "client/flag_terms.h"
#include "core/calibration/kv_scales.h"
#include "core/formats/lightllm_adapt.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

RemoteAdaptFn remote_adapt = nullptr;

absl::Status RunAdapt(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const std::string in_path = *flags.Get("in");
  const std::string out_path = *flags.Get("out");
  auto total_kv_heads = flags.GetInt("total-kv-heads", 1, 1 << 20);
  if (!total_kv_heads.ok()) return UsageError(total_kv_heads.status().message());
  auto tp = flags.GetInt("tp", 1, 1 << 20);
  if (!tp.ok()) return UsageError(tp.status().message());
  const bool by_model = flags.Has("model");
  if (total_kv_heads->has_value() == by_model) {
    return UsageError("give either --total-kv-heads M or --model CONFIG --tp T");
  }
  if (by_model != tp->has_value()) return UsageError("--model and --tp go together");

  auto text = ReadWholeFile(in_path);
  if (!text.ok()) return Annotate(text.status(), "--in ");
  for (const FlagSpec& spec : ConnectionFlags()) {
    if (flags.Has(spec.name) && !flags.Has("server")) {
      return UsageError(absl::StrCat("--", spec.name, " only applies with --server"));
    }
  }
  if (flags.Has("server")) {
    if (remote_adapt == nullptr) return UsageError("--server: this caliper was built without gRPC");
    absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(flags);
    if (!security.ok()) return UsageError(security.status().message());
    std::string model_text;
    if (by_model) {
      auto config_text = ReadWholeFile(*flags.Get("model"));
      if (!config_text.ok()) {
        return Annotate(config_text.status(), "--model ");
      }
      model_text = *config_text;
    }
    absl::StatusOr<std::string> adapted =
        remote_adapt(*flags.Get("server"), *security, *text,
                     static_cast<int>(total_kv_heads->value_or(0)), model_text,
                     static_cast<int>(tp->value_or(0)), err);
    if (!adapted.ok()) return adapted.status();
    if (absl::Status s = WriteFileAtomically(out_path, *adapted); !s.ok()) {
      return Annotate(s, "--out ");
    }
    out << "caliper adapt: wrote " << out_path << " (adapted by " << *flags.Get("server") << ")\n";
    return absl::OkStatus();
  }
  auto calibration = ParseLightLlmCalibration(*text);
  if (!calibration.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(in_path, ": ", calibration.status().message()));
  }
  LightLlmTarget target;
  if (by_model) {
    auto config_text = ReadWholeFile(*flags.Get("model"));
    if (!config_text.ok()) {
      return Annotate(config_text.status(), "--model ");
    }
    auto model = ParseHfConfig(*config_text);
    if (!model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(*flags.Get("model"), ": ", model.status().message()));
    }
    target.model = *std::move(model);
    target.tp_size = static_cast<int>(**tp);
  } else {
    target.total_kv_heads = static_cast<int>(**total_kv_heads);
  }
  // Every check (FP8 range, the model's, the adapted file's) is core's, as for the Adapt RPC.
  auto adapted_or = AdaptLightLlmForDeployment(*calibration, target);
  if (!adapted_or.ok()) {
    const std::string message = InFlagTerms(
        adapted_or.status().message(), {{"total_kv_heads", "--total-kv-heads"}, {"tp_size", "--tp"}});
    // A target error names its flag; a file error names the file (and the model it failed).
    if (message.rfind("--", 0) == 0) return absl::InvalidArgumentError(message);
    return absl::InvalidArgumentError(absl::StrCat(
        in_path, by_model ? " vs " + *flags.Get("model") : "", ": ", message));
  }
  const LightLlmCalibration* adapted = &adapted_or->file;
  if (absl::Status s = WriteFileAtomically(out_path, SerializeLightLlmCalibration(*adapted));
      !s.ok()) {
    return Annotate(s, "--out ");
  }
  out << "caliper adapt: wrote " << out_path << " ("
      << (adapted->quant_type == KvGranularity::kPerHead ? "per_head" : "per_tensor")
      << ", num_head " << calibration->num_head << " -> " << adapted->num_head << ", "
      << adapted->num_layers << " layers)\n";
  return absl::OkStatus();
}

}  // namespace

void SetRemoteAdapt(RemoteAdaptFn fn) { remote_adapt = fn; }

const CommandSpec& AdaptCommand() {
  static const CommandSpec command{
      .name = "adapt",
      .summary = "adapt a LightLLM KV calibration file to another head count / TP (offline)",
      .synopsis = "--in FILE --out FILE (--total-kv-heads M | --model CONFIG --tp T) [--server ADDR]",
      .description =
          "Adapts a LightLLM FP8 KV calibration file to a deployment's total KV head count.\n"
          "per_head rows [K_0..K_{n-1} | V_0..V_{n-1}] go from n to m heads: group max when n is a\n"
          "multiple of m (replicated heads collapse), repeat in place when m is a multiple of n;\n"
          "otherwise the command refuses. per_tensor files keep their [layers, 2] scales. With\n"
          "--model the file is also checked the way LightLLM's loader checks it (architectures,\n"
          "num_layers, qmin/qmax). With --server the server adapts it (Adapt RPC).",
      .server = ServerUse::kWithServerFlag,
      .flags = WithConnectionFlags({
          {.name = "in", .value_name = "FILE",
           .help = "LightLLM calibration JSON to adapt (kv_cache_calib.json)", .required = true},
          {.name = "out", .value_name = "FILE",
           .help = "where to write the adapted file (written atomically)", .required = true},
          {.name = "total-kv-heads", .value_name = "M",
           .help = "total KV heads of the deployment, replicas included",
           .aliases = {"num-heads"}},
          {.name = "model", .value_name = "CONFIG",
           .help = "Hugging Face config.json of the served model (with --tp)"},
          {.name = "tp", .value_name = "T",
           .help = "deployment TP size; total KV heads = T * max(kv_heads / T, 1)"},
          {.name = "server", .value_name = "ADDR",
           .help = "adapt on caliper-server (Adapt RPC) instead of locally"},
      }),
      .run = RunAdapt,
  };
  return command;
}

int RunAdaptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  return RunCommand(AdaptCommand(), args, out, err);
}

}  // namespace caliper::cli
