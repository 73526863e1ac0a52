// caliper fleets create|list|show|delete and caliper versions list|show|diff|pin|unpin: fleets
// and their versions of scales on caliper-server (docs/fleets.md).
#include <algorithm>
#include <cmath>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli_args.h"
#include "client/command.h"
#include "client/file_io.h"
#include "client/remote_commands.h"
#include "client/rpc_error.h"
#include "client/server_connection.h"
#include "client/rpc_retry.h"
#include "core/calibration/model_config.h"

namespace caliper::cli {
namespace {

// One unary call with the command's retry policy; RpcError naming `method` when it fails.
absl::Status Call(const CliArgs& flags, absl::string_view command, absl::string_view method,
                  const std::function<grpc::Status(v1::Calibration::Stub&,
                                                   grpc::ClientContext&)>& rpc,
                  std::ostream& err) {
  absl::StatusOr<ServerConnection> server = Connect(*flags.Get("server"), flags);
  if (!server.ok()) return server.status();
  Backoff backoff(server->retry, &err, absl::StrCat("caliper ", command, ": ", method));
  grpc::Status status = CallWithRetry(
      backoff, [&](grpc::ClientContext& context) { return rpc(*server->stub, context); });
  return status.ok() ? absl::OkStatus() : RpcError(method, status);
}

absl::StatusOr<std::string> FleetName(const CliArgs& flags, absl::string_view action) {
  std::optional<std::string> name = flags.Get("fleet");
  if (!name.has_value() || name->empty()) {
    return UsageError(absl::StrCat(action, " needs the fleet's name"));
  }
  return *name;
}

std::string Time(int64_t unix_ms) {
  return unix_ms == 0 ? "-" : absl::FormatTime("%Y-%m-%d %H:%M:%S", absl::FromUnixMillis(unix_ms),
                                               absl::UTCTimeZone());
}

std::string EngineName(v1::EngineKind engine) {
  switch (engine) {
    case v1::ENGINE_KIND_VLLM: return "vllm";
    case v1::ENGINE_KIND_SGLANG: return "sglang";
    case v1::ENGINE_KIND_LIGHTLLM: return "lightllm";
    case v1::ENGINE_KIND_TRTLLM: return "trtllm";
    default: return "-";
  }
}

v1::EngineKind EngineFromFlag(const std::string& value) {
  if (value == "vllm") return v1::ENGINE_KIND_VLLM;
  if (value == "sglang") return v1::ENGINE_KIND_SGLANG;
  if (value == "lightllm") return v1::ENGINE_KIND_LIGHTLLM;
  if (value == "trtllm") return v1::ENGINE_KIND_TRTLLM;
  return v1::ENGINE_KIND_UNSPECIFIED;
}

std::string PolicyText(const v1::PublishPolicy& p) {
  return absl::StrCat("window_tokens=", p.window_tokens(), " window_seconds=", p.window_seconds(),
                      " min_tokens=", p.min_tokens(), " drift=", p.drift(),
                      " max_saturation=", p.max_saturation(), " retain=", p.retain());
}

absl::Status PolicyFromFlags(const CliArgs& flags, v1::PublishPolicy* policy) {
  for (const char* name : {"window-tokens", "window-seconds", "min-tokens", "retain"}) {
    auto value = flags.GetInt(name, 0, int64_t{1} << 62);
    if (!value.ok()) return UsageError(value.status().message());
    if (!value->has_value()) continue;
    const std::string n = name;
    if (n == "window-tokens") policy->set_window_tokens(**value);
    if (n == "window-seconds") policy->set_window_seconds(**value);
    if (n == "min-tokens") policy->set_min_tokens(**value);
    if (n == "retain") policy->set_retain(static_cast<int32_t>(std::min<int64_t>(**value, 1 << 30)));
  }
  for (const char* name : {"drift", "max-saturation"}) {
    std::optional<std::string> text = flags.Get(name);
    if (!text.has_value()) continue;
    double value;
    if (!absl::SimpleAtod(*text, &value) || !std::isfinite(value)) {
      return UsageError(absl::StrCat("--", name, ": \"", *text, "\" is not a number"));
    }
    if (std::string(name) == "drift") {
      policy->set_drift(value);
    } else {
      policy->set_max_saturation(value);
    }
  }
  return absl::OkStatus();
}

void PrintWindows(const v1::Fleet& fleet, std::ostream& out) {
  if (fleet.windows().empty()) {
    out << "windows   none\n";
    return;
  }
  out << absl::StrFormat("%-32s  %-16s  %-6s  %9s  %-20s  %-18s  %7s  %s\n", "WINDOW",
                         "WEIGHT_VERSION", "STATE", "TOKENS", "CLOSED_BY", "DECISION", "VERSION",
                         "DETAIL");
  for (const v1::FleetWindow& w : fleet.windows()) {
    out << absl::StrFormat("%-32s  %-16s  %-6s  %9d  %-20s  %-18s  %7s  %s\n", w.session_id(),
                           w.weight_version(), w.open() ? "open" : "closed", w.tokens(),
                           w.open() ? "-" : w.close_reason(), w.open() ? "-" : w.decision(),
                           w.version() == 0 ? "-" : absl::StrCat(w.version()), w.detail());
  }
}

absl::Status RunFleets(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const std::string action = flags.Get("action").value_or("");
  if (action == "list") {
    v1::ListFleetsResponse response;
    absl::Status s = Call(flags, "fleets", "ListFleets",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.ListFleets(&context, {}, &response);
                          }, err);
    if (!s.ok()) return s;
    if (response.fleets().empty()) {
      out << "no fleets\n";
      return absl::OkStatus();
    }
    out << absl::StrFormat("%-24s  %-8s  %7s  %6s  %6s  %-16s  %5s\n", "NAME", "ENGINE",
                           "CURRENT", "NEWEST", "PINNED", "WEIGHT_VERSION", "OPEN");
    for (const v1::Fleet& f : response.fleets()) {
      int open = 0;
      for (const v1::FleetWindow& w : f.windows()) open += w.open();
      out << absl::StrFormat("%-24s  %-8s  %7d  %6d  %6s  %-16s  %5d\n", f.name(),
                             EngineName(f.engine()), f.current_version(), f.newest_version(),
                             f.pinned_version() == 0 ? "-" : absl::StrCat(f.pinned_version()),
                             f.newest_weight_version().empty() ? "-" : f.newest_weight_version(),
                             open);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> name = FleetName(flags, absl::StrCat("fleets ", action));
  if (!name.ok()) return name.status();
  if (action == "create") {
    if (!flags.Has("model")) return UsageError("fleets create needs --model CONFIG");
    v1::CreateFleetRequest request;
    request.set_name(*name);
    const std::string model_path = *flags.Get("model");
    absl::StatusOr<std::string> config = ReadWholeFile(model_path);
    if (!config.ok()) return Annotate(config.status(), "--model ");
    if (absl::StatusOr<ModelConfig> model = ParseHfConfig(*config); !model.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--model: ", model_path, ": ", model.status().message()));
    }
    request.mutable_model()->set_hf_config_json(*config);
    absl::StatusOr<v1::Recipe> recipe = RecipeFromFlags(flags);
    if (!recipe.ok()) return recipe.status();
    *request.mutable_recipe() = *recipe;
    request.set_engine(EngineFromFlag(flags.Get("engine").value_or("")));
    if (absl::Status s = PolicyFromFlags(flags, request.mutable_policy()); !s.ok()) return s;
    v1::Fleet fleet;
    absl::Status s = Call(flags, "fleets", "CreateFleet",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.CreateFleet(&context, request, &fleet);
                          }, err);
    if (!s.ok()) return s;
    out << "fleet     " << fleet.name() << " created\npolicy    " << PolicyText(fleet.policy())
        << "\n";
    return absl::OkStatus();
  }
  if (action == "show") {
    v1::GetFleetRequest request;
    request.set_fleet(*name);
    v1::Fleet fleet;
    absl::Status s = Call(flags, "fleets", "GetFleet",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.GetFleet(&context, request, &fleet);
                          }, err);
    if (!s.ok()) return s;
    out << "fleet     " << fleet.name() << " (" << fleet.model().architecture() << ", "
        << fleet.model().num_layers() << " layers, engine " << EngineName(fleet.engine())
        << ")\npolicy    " << PolicyText(fleet.policy()) << "\ncurrent   "
        << fleet.current_version()
        << (fleet.pinned_version() != 0 ? absl::StrCat(" (pinned; newest ",
                                                       fleet.newest_version(), ")")
                                        : "")
        << "\nweights   "
        << (fleet.newest_weight_version().empty() ? "-" : fleet.newest_weight_version())
        << "\n";
    PrintWindows(fleet, out);
    if (fleet.in_use().empty()) {
      out << "engines   none reported\n";
    } else {
      // SAMPLED: K/V tokens between the engine's last two reports; 0 while a window is open
      // means this engine sends it nothing.
      out << absl::StrFormat("%-32s  %7s  %10s  %9s  %-19s  %s\n", "ENGINE", "VERSION",
                             "SATURATION", "SAMPLED", "REPORTED", "");
      for (const v1::InUse& u : fleet.in_use()) {
        out << absl::StrFormat("%-32s  %7d  %10.3g  %9d  %-19s  %s\n", u.producer_id(),
                               u.version(), u.saturation(), u.sampled_tokens(),
                               Time(u.unix_ms()), u.stale() ? "stale" : "current");
      }
    }
    return absl::OkStatus();
  }
  if (action == "delete") {
    v1::DeleteFleetRequest request;
    request.set_fleet(*name);
    v1::DeleteFleetResponse response;
    absl::Status s = Call(flags, "fleets", "DeleteFleet",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.DeleteFleet(&context, request, &response);
                          }, err);
    if (!s.ok()) return s;
    out << "fleet     " << *name << " deleted\n";
    return absl::OkStatus();
  }
  return UsageError(absl::StrCat("unknown action \"", action, "\""));
}

absl::StatusOr<int64_t> VersionFlag(const CliArgs& flags, const char* name, bool required) {
  auto value = flags.GetInt(name, 1, int64_t{1} << 62);
  if (!value.ok()) return UsageError(value.status().message());
  if (!value->has_value()) {
    if (required) return UsageError(absl::StrCat("needs the version (--", name, ")"));
    return 0;
  }
  return **value;
}

void PrintVersion(const v1::FleetVersion& v, std::ostream& out) {
  out << "version   " << v.id() << (v.current() ? " (current)" : "")
      << (v.pinned() ? " (pinned)" : "") << "\nparent    " << v.parent() << "\nweights   "
      << v.weight_version() << "\nreason    " << v.reason() << ": " << v.detail()
      << "\ncreated   " << Time(v.created_unix_ms()) << "\n";
  for (const v1::VersionSource& s : v.windows()) {
    out << "window    " << s.session_id() << " (" << s.tokens() << " K/V tokens)\n";
  }
  out << absl::StrFormat("%5s  %9s  %9s  %9s  %s\n", "LAYER", "K_RATIO", "V_RATIO", "Q_RATIO",
                         "");
  for (const v1::LayerChange& c : v.layers()) {
    out << absl::StrFormat("%5d  %9.4f  %9.4f  %9.4f  %s\n", c.layer(), c.k_ratio(), c.v_ratio(),
                           c.q_ratio(), c.kept() ? "kept from parent" : "");
  }
}

absl::Status RunVersions(const CliArgs& flags, std::ostream& out, std::ostream& err) {
  const std::string action = flags.Get("action").value_or("");
  absl::StatusOr<std::string> name = FleetName(flags, absl::StrCat("versions ", action));
  if (!name.ok()) return name.status();
  if (action == "list") {
    v1::ListVersionsRequest request;
    request.set_fleet(*name);
    v1::ListVersionsResponse response;
    absl::Status s = Call(flags, "versions", "ListVersions",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.ListVersions(&context, request, &response);
                          }, err);
    if (!s.ok()) return s;
    out << absl::StrFormat("%7s  %6s  %-16s  %-18s  %9s  %-19s  %s\n", "VERSION", "PARENT",
                           "WEIGHT_VERSION", "REASON", "TOKENS", "CREATED", "");
    for (const v1::FleetVersion& v : response.versions()) {
      const int64_t tokens = v.windows().empty() ? 0 : v.windows(0).tokens();
      out << absl::StrFormat("%7d  %6d  %-16s  %-18s  %9d  %-19s  %s\n", v.id(), v.parent(),
                             v.weight_version(), v.reason(), tokens, Time(v.created_unix_ms()),
                             absl::StrCat(v.current() ? "current " : "",
                                          v.pinned() ? "pinned" : ""));
    }
    for (const v1::FleetWindow& w : response.refused()) {
      out << "not published: window " << w.session_id() << " (" << w.weight_version() << ", "
          << w.tokens() << " tokens): " << w.decision() << ": " << w.detail() << "\n";
    }
    return absl::OkStatus();
  }
  if (action == "show") {
    absl::StatusOr<int64_t> id = VersionFlag(flags, "version", false);
    if (!id.ok()) return id.status();
    v1::GetVersionRequest request;
    request.set_fleet(*name);
    request.set_version(*id);
    v1::FleetVersion version;
    absl::Status s = Call(flags, "versions", "GetVersion",
                          [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                            return stub.GetVersion(&context, request, &version);
                          }, err);
    if (!s.ok()) return s;
    PrintVersion(version, out);
    return absl::OkStatus();
  }
  if (action == "diff") {
    absl::StatusOr<int64_t> a = VersionFlag(flags, "version", true);
    if (!a.ok()) return a.status();
    absl::StatusOr<int64_t> b = VersionFlag(flags, "other", true);
    if (!b.ok()) return b.status();
    v1::ScalesResponse scales[2];
    for (int i = 0; i < 2; ++i) {
      v1::ScalesRequest request;
      request.set_fleet(*name);
      request.set_version(i == 0 ? *a : *b);
      absl::Status s = Call(flags, "versions", "GetScales",
                            [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                              return stub.GetScales(&context, request, &scales[i]);
                            }, err);
      if (!s.ok()) return s;
    }
    out << absl::StrFormat("%5s  %-4s  %s\n", "LAYER", "KV", absl::StrCat("SCALE ", *b, " / ", *a, " PER HEAD"));
    for (int l = 0; l < std::min(scales[0].kv_layers_size(), scales[1].kv_layers_size()); ++l) {
      for (int kind = 0; kind < 2; ++kind) {
        const auto& from = kind == 0 ? scales[0].kv_layers(l).k_scale() : scales[0].kv_layers(l).v_scale();
        const auto& to = kind == 0 ? scales[1].kv_layers(l).k_scale() : scales[1].kv_layers(l).v_scale();
        std::vector<std::string> ratios;
        for (int h = 0; h < std::min(from.size(), to.size()); ++h) {
          ratios.push_back(absl::StrFormat("%.4f", from[h] != 0 ? to[h] / from[h] : 0.0));
        }
        out << absl::StrFormat("%5d  %-4s  %s\n", scales[0].kv_layers(l).layer(),
                               kind == 0 ? "K" : "V", absl::StrJoin(ratios, " "));
      }
    }
    return absl::OkStatus();
  }
  if (action == "pin" || action == "unpin") {
    v1::Fleet fleet;
    absl::Status s;
    if (action == "pin") {
      absl::StatusOr<int64_t> id = VersionFlag(flags, "version", true);
      if (!id.ok()) return id.status();
      v1::PinVersionRequest request;
      request.set_fleet(*name);
      request.set_version(*id);
      s = Call(flags, "versions", "PinVersion",
               [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                 return stub.PinVersion(&context, request, &fleet);
               }, err);
    } else {
      v1::UnpinVersionRequest request;
      request.set_fleet(*name);
      s = Call(flags, "versions", "UnpinVersion",
               [&](v1::Calibration::Stub& stub, grpc::ClientContext& context) {
                 return stub.UnpinVersion(&context, request, &fleet);
               }, err);
    }
    if (!s.ok()) return s;
    out << "fleet     " << fleet.name() << ": current version " << fleet.current_version()
        << (fleet.pinned_version() != 0 ? " (pinned)" : " (the newest)") << "\n";
    return absl::OkStatus();
  }
  return UsageError(absl::StrCat("unknown action \"", action, "\""));
}

FlagSpec ServerFlag() {
  return {.name = "server", .value_name = "ADDR",
          .help = "caliper-server address, e.g. localhost:50051", .required = true};
}

}  // namespace

const CommandSpec& FleetsCommand() {
  static const CommandSpec command{
      .name = "fleets",
      .summary = "create, list, show or delete fleets (windows of live traffic into versions)",
      .synopsis = "create|list|show|delete [NAME] --server ADDR [--model CONFIG] [recipe and "
                  "policy flags]",
      .description =
          "A fleet is a model, a recipe and a publish policy on caliper-server: producers stream\n"
          "windows of live traffic per weight version, and the policy decides which windows become\n"
          "versions of scales (docs/fleets.md).\n"
          "  create NAME --model CONFIG   the recipe flags as `caliper calibrate` spells them, the\n"
          "                               policy flags (--window-tokens ... --retain), --engine\n"
          "  list                         every fleet: current, newest and pinned version\n"
          "  show NAME                    policy, windows (and why each closed as it did), and\n"
          "                               which engines run which version (stale ones marked)\n"
          "  delete NAME                  the fleet, its versions and its windows' sessions",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags(WithRecipeFlags({
          {.name = "action", .value_name = "ACTION",
           .help = "what to do (also the first word)",
           .choices = {"create", "list", "show", "delete"}, .required = true},
          {.name = "fleet", .value_name = "NAME", .help = "the fleet (also the second word)"},
          ServerFlag(),
          {.name = "model", .value_name = "CONFIG",
           .help = "create: the model's Hugging Face config.json"},
          {.name = "engine", .value_name = "NAME", .help = "create: the engine its replicas run",
           .choices = {"vllm", "sglang", "lightllm", "trtllm"}},
          {.name = "window-tokens", .value_name = "N",
           .help = "create: close a window at N K/V tokens per layer (absent: not on tokens)"},
          {.name = "window-seconds", .value_name = "S",
           .help = "create: close a window S seconds after it opened (absent: not on time)"},
          {.name = "min-tokens", .value_name = "N",
           .help = "create: never publish a window with fewer K/V tokens in a layer (server "
                   "default 4096)"},
          {.name = "drift", .value_name = "F",
           .help = "create: publish when a scale moved by more than F (relative; server "
                   "default 0.05)"},
          {.name = "max-saturation", .value_name = "F",
           .help = "create: publish when engines report more saturation than F (server "
                   "default 1e-4)"},
          {.name = "retain", .value_name = "N",
           .help = "create: versions kept (server default 64)"},
      })),
      .run = RunFleets,
      .positionals = {"action", "fleet"},
  };
  return command;
}

const CommandSpec& VersionsCommand() {
  static const CommandSpec command{
      .name = "versions",
      .summary = "list, show, diff, pin or unpin a fleet's versions of scales",
      .synopsis = "list|show|diff|pin|unpin FLEET [V1 [V2]] --server ADDR",
      .description =
          "A fleet's versions (docs/fleets.md):\n"
          "  list FLEET          retained versions, and the windows that did not publish with why\n"
          "  show FLEET [V]      one version (absent: the current one): parent, weights, reason,\n"
          "                      windows and tokens, per-layer ratios to the parent\n"
          "  diff FLEET V1 V2    per layer and head, V2's K/V scales over V1's\n"
          "  pin FLEET V         roll back: V is current (watchers get it) until unpin\n"
          "  unpin FLEET         the newest version is current again",
      .server = ServerUse::kAlways,
      .flags = WithConnectionFlags({
          {.name = "action", .value_name = "ACTION",
           .help = "what to do (also the first word)",
           .choices = {"list", "show", "diff", "pin", "unpin"}, .required = true},
          {.name = "fleet", .value_name = "NAME", .help = "the fleet (also the second word)"},
          {.name = "version", .value_name = "V", .help = "the version (also the third word)"},
          {.name = "other", .value_name = "V2", .help = "diff: the second version (fourth word)"},
          ServerFlag(),
      }),
      .run = RunVersions,
      .positionals = {"action", "fleet", "version", "other"},
  };
  return command;
}

}  // namespace caliper::cli
