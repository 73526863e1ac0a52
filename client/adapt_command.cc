// caliper adapt: rewrites a LightLLM FP8 KV calibration file for another head count / TP.
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "client/connection_options.h"
#include "client/cli_args.h"
#include "client/commands.h"
#include "client/file_io.h"
#include "client/flag_terms.h"
#include "core/calibration/kv_scales.h"
#include "core/formats/lightllm_adapt.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

const std::vector<FlagSpec>& AdaptFlags() {
  static const std::vector<FlagSpec> flags = WithConnectionFlags({
      {"in", "FILE", "LightLLM calibration JSON to adapt (kv_cache_calib.json)"},
      {"out", "FILE", "where to write the adapted file (written atomically)"},
      {"num-heads", "M", "total KV heads of the deployment, replicas included"},
      {"model", "CONFIG", "Hugging Face config.json of the served model (with --tp)"},
      {"tp", "T", "tensor-parallel size; total heads = T * max(kv_heads / T, 1)"},
      {"server", "ADDR", "adapt on caliper-server (Adapt RPC) instead of locally"},
  });
  return flags;
}

constexpr absl::string_view kDescription =
    "Adapts a LightLLM FP8 KV calibration file to a deployment's total KV head count.\n"
    "per_head rows [K_0..K_{n-1} | V_0..V_{n-1}] go from n to m heads: group max when n is a\n"
    "multiple of m (replicated heads collapse), repeat in place when m is a multiple of n;\n"
    "otherwise the command refuses. per_tensor files keep their [layers, 2] scales. With\n"
    "--model the file is also checked the way LightLLM's loader checks it (architectures,\n"
    "num_layers, qmin/qmax). Exit codes: 0 written, 1 the server refused (--server), 2 usage or\n"
    "input error (nothing written), 3 I/O failure (a file could not be read or written).";

RemoteAdaptFn remote_adapt = nullptr;

int Fail(std::ostream& err, absl::string_view message, int code = kExitUsage) {
  // One line, whatever the message held, so scripts can grep it.
  err << "caliper adapt: " << absl::StrReplaceAll(message, {{"\n", " "}}) << "\n";
  return code;
}

// A failed read or write: exit code 3 for an I/O failure, 2 for a path that does not exist.
int FailFile(std::ostream& err, absl::string_view flag, const absl::Status& status) {
  return Fail(err, absl::StrCat(flag, " ", status.message()), ExitCodeFor(status));
}

// The core's target fields, in this command's flags.
const FieldFlags kTargetFlags = {{"total_heads", "--num-heads"}, {"tp_size", "--tp"}};

}  // namespace

void SetRemoteAdapt(RemoteAdaptFn fn) { remote_adapt = fn; }

int RunAdaptCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  auto flags = CliArgs::Parse(args, AdaptFlags());
  if (!flags.ok()) {
    return Fail(err, absl::StrCat(flags.status().message(), " (see caliper adapt --help)"));
  }
  if (flags->help()) {
    out << FormatHelp("adapt", "--in FILE --out FILE (--num-heads M | --model CONFIG --tp T)",
                      kDescription, AdaptFlags());
    return kExitOk;
  }
  const std::optional<std::string> in_path = flags->Get("in");
  const std::optional<std::string> out_path = flags->Get("out");
  if (!in_path || in_path->empty()) return Fail(err, "--in FILE is required");
  if (!out_path || out_path->empty()) return Fail(err, "--out FILE is required");
  auto num_heads = flags->GetInt("num-heads", 1, 1 << 20);
  if (!num_heads.ok()) return Fail(err, num_heads.status().message());
  auto tp = flags->GetInt("tp", 1, 1 << 20);
  if (!tp.ok()) return Fail(err, tp.status().message());
  const bool by_model = flags->Has("model");
  if (num_heads->has_value() == by_model) {
    return Fail(err, "give either --num-heads M or --model CONFIG --tp T");
  }
  if (by_model != tp->has_value()) return Fail(err, "--model and --tp go together");

  auto text = ReadWholeFile(*in_path);
  if (!text.ok()) return FailFile(err, "--in", text.status());
  for (const FlagSpec& spec : ConnectionFlags()) {
    if (flags->Has(spec.name) && !flags->Has("server")) {
      return Fail(err, absl::StrCat("--", spec.name, " only applies with --server"));
    }
  }
  if (flags->Has("server")) {
    if (remote_adapt == nullptr) return Fail(err, "--server: this caliper was built without gRPC");
    absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(*flags);
    if (!security.ok()) return Fail(err, security.status().message());
    std::string model_text;
    if (by_model) {
      auto config_text = ReadWholeFile(*flags->Get("model"));
      if (!config_text.ok()) return FailFile(err, "--model", config_text.status());
      model_text = *config_text;
    }
    std::string adapted;
    const int rc =
        remote_adapt(*flags->Get("server"), *security, *text,
                     static_cast<int>(num_heads->value_or(0)), model_text,
                     static_cast<int>(tp->value_or(0)), &adapted, err);
    if (rc != kExitOk) return rc;
    if (absl::Status s = WriteFileAtomically(*out_path, adapted); !s.ok()) {
      return FailFile(err, "--out", s);
    }
    out << "caliper adapt: wrote " << *out_path << " (adapted by " << *flags->Get("server") << ")\n";
    return kExitOk;
  }
  auto calibration = ParseLightLlmCalibration(*text);
  if (!calibration.ok()) return Fail(err, absl::StrCat(*in_path, ": ", calibration.status().message()));
  LightLlmTarget target;
  if (by_model) {
    auto config_text = ReadWholeFile(*flags->Get("model"));
    if (!config_text.ok()) return FailFile(err, "--model", config_text.status());
    auto model = ParseHfConfig(*config_text);
    if (!model.ok()) {
      return Fail(err, absl::StrCat(*flags->Get("model"), ": ", model.status().message()));
    }
    target.model = *std::move(model);
    target.tp_size = static_cast<int>(**tp);
  } else {
    target.total_heads = static_cast<int>(**num_heads);
  }
  auto adapted_or = AdaptLightLlmForDeployment(*calibration, target);
  if (!adapted_or.ok()) {
    const std::string message = InFlagTerms(adapted_or.status().message(), kTargetFlags);
    // A target error names its flag; a file error names the file (and the model it failed).
    if (message.rfind("--", 0) == 0) return Fail(err, message);
    return Fail(err, absl::StrCat(*in_path, by_model ? " vs " + *flags->Get("model") : "", ": ",
                                  message));
  }
  const LightLlmCalibration* adapted = &adapted_or->file;
  if (absl::Status s = WriteFileAtomically(*out_path, SerializeLightLlmCalibration(*adapted));
      !s.ok()) {
    return FailFile(err, "--out", s);
  }
  out << "caliper adapt: wrote " << *out_path << " ("
      << (adapted->quant_type == KvGranularity::kPerHead ? "per_head" : "per_tensor")
      << ", num_head " << calibration->num_head << " -> " << adapted->num_head << ", "
      << adapted->num_layers << " layers)\n";
  return kExitOk;
}

}  // namespace caliper::cli
