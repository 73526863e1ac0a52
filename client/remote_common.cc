#include "client/remote_common.h"

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/strings/ascii.h"
#include "client/channel_credentials.h"
#include "client/file_io.h"
#include "client/rpc_retry.h"
#include "core/formats/engine_formats.h"
#include "grpcpp/support/client_interceptor.h"
#include "nlohmann/json.hpp"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// The shortest decimal that reads back as the same float, so scales.json shows 0.0123 rather
// than the float's exact double expansion.
double ShortFloat(float value) {
  char buffer[32];
  auto result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  double out = value;
  absl::SimpleAtod(absl::string_view(buffer, result.ptr - buffer), &out);
  return out;
}

ordered_json FloatList(const google::protobuf::RepeatedField<float>& values) {
  ordered_json list = ordered_json::array();
  for (float v : values) list.push_back(ShortFloat(v));
  return list;
}

std::string FlavorName(v1::Fp8Flavor flavor) {
  return flavor == v1::FP8_E4M3FNUZ ? "float8_e4m3fnuz" : "float8_e4m3fn";
}

// Adds "authorization: Bearer <token>" to every call. An interceptor rather than call
// credentials, so the token also reaches a plaintext test server (--allow_plaintext_tokens).
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(std::string header) : header_(std::move(header)) {}
  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->insert({"authorization", header_});
    }
    methods->Proceed();
  }

 private:
  std::string header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(std::string token) : header_("Bearer " + token) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo* /*info*/) override {
    return new BearerTokenInterceptor(header_);
  }

 private:
  std::string header_;
};

}  // namespace

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address) {
  ConnectionOptions security;
  security.token = TokenFromEnvironment();
  return *MakeChannel(address, security);  // no CA file: cannot fail
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> MakeChannel(const std::string& address,
                                                           const ConnectionOptions& security) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(kMaxMessageBytes);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  // Reconnect within a second of a server restart; gRPC's default backoff grows to two minutes,
  // longer than the CLI's own retries (client/rpc_retry.h) wait. Not
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC also takes it as the connect timeout, and 100 ms
  // cuts off a busy server's handshake.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // Any gRPC target: "host:port", "ipv4:H:P1,H:P2", "dns:///name:port". Streams and calls go
  // round robin over every resolved address (replicas over a shared --state_store), and a dead
  // one drops out of the rotation until it reconnects.
  args.SetLoadBalancingPolicyName("round_robin");
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!security.tls_ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadWholeFile(security.tls_ca_file);
    if (!ca.ok()) return Annotate(ca.status(), "--tls-ca: ");
    std::string cert, key;
    if (!security.tls_cert_file.empty()) {
      absl::StatusOr<std::string> cert_pem = ReadWholeFile(security.tls_cert_file);
      if (!cert_pem.ok()) return Annotate(cert_pem.status(), "--tls-cert: ");
      absl::StatusOr<std::string> key_pem = ReadWholeFile(security.tls_key_file);
      if (!key_pem.ok()) return Annotate(key_pem.status(), "--tls-key: ");
      cert = *std::move(cert_pem);
      key = *std::move(key_pem);
    }
    credentials = MakeTlsChannelCredentials(*ca, cert, key);
  }
  std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> interceptors;
  if (!security.token.empty()) {
    interceptors.push_back(std::make_unique<BearerTokenInterceptorFactory>(security.token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(address, credentials, args,
                                                                 std::move(interceptors));
}

absl::StatusOr<ServerConnection> Connect(const std::string& address,
                                         const ConnectionOptions& security) {
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, security);
  if (!channel.ok()) return UsageError(channel.status().message());
  ServerConnection connection;
  connection.channel = *std::move(channel);
  connection.stub = v1::Calibration::NewStub(connection.channel);
  connection.retry = RetryPolicyWithAttempts(security.attempts, connection.channel);
  return connection;
}

absl::StatusOr<ServerConnection> Connect(const std::string& address, const CliArgs& flags) {
  absl::StatusOr<ConnectionOptions> security = ConnectionOptionsFromArgs(flags);
  if (!security.ok()) return UsageError(security.status().message());
  return Connect(address, *security);
}

std::string StatusCodeName(grpc::StatusCode code) {
  switch (code) {
    case grpc::OK: return "OK";
    case grpc::CANCELLED: return "CANCELLED";
    case grpc::UNKNOWN: return "UNKNOWN";
    case grpc::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::NOT_FOUND: return "NOT_FOUND";
    case grpc::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::ABORTED: return "ABORTED";
    case grpc::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::INTERNAL: return "INTERNAL";
    case grpc::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::DATA_LOSS: return "DATA_LOSS";
    case grpc::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return absl::StrCat("CODE_", static_cast<int>(code));
  }
}

absl::Status RpcError(absl::string_view what, const grpc::Status& status) {
  return ServerError(absl::StrCat(what, " failed: ", StatusCodeName(status.error_code()), ": ",
                                  status.error_message()));
}

std::string KvModeName(v1::KvMode mode) {
  switch (mode) {
    case v1::KV_PER_HEAD: return "per_head";
    case v1::KV_PER_TENSOR: return "per_tensor";
    default: return "off";
  }
}

v1::KvMode KvModeFromFlag(const std::string& value) {
  if (value == "per-tensor") return v1::KV_PER_TENSOR;
  if (value == "off") return v1::KV_OFF;
  return v1::KV_PER_HEAD;
}

std::string KvModeFlagValue(v1::KvMode mode) {
  switch (mode) {
    case v1::KV_PER_HEAD: return "per-head";
    case v1::KV_PER_TENSOR: return "per-tensor";
    default: return "off";
  }
}

v1::Nvfp4Convention ConventionFromFlag(const std::string& value) {
  return value == "modelopt" ? v1::MODELOPT : v1::COMPRESSED_TENSORS;
}

FlagSpec KvFlag() {
  return {.name = "kv", .value_name = "MODE", .help = "FP8 KV-cache scales per head, per tensor, or none",
          .default_value = "per-head", .choices = {"per-head", "per-tensor", "off"},
          .value_aliases = {{"per_head", "per-head"}, {"per_tensor", "per-tensor"}}};
}

FlagSpec ConventionFlag() {
  return {.name = "convention", .value_name = "NAME",
          .help = "NVFP4 global-scale form: compressed-tensors (divisor) or modelopt (multiplier)",
          .default_value = "compressed-tensors", .choices = {"compressed-tensors", "modelopt"},
          .value_aliases = {{"compressed_tensors", "compressed-tensors"}}};
}

FlagSpec FormatFlag() {
  return {.name = "format", .value_name = "NAME",
          .help = "also write engine files: compressed-tensors, modelopt, vllm-legacy",
          .repeated = true};
}

std::string HumanBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, units[unit])
                   : absl::StrFormat("%.1f %s", bytes, units[unit]);
}

absl::StatusOr<WrittenOutputs> WriteScalesOutputs(const std::string& dir,
                                                  const v1::ScalesResponse& scales,
                                                  const v1::Session& session,
                                                  const v1::Deployment& deployment) {
  if (absl::Status s = CliEnv()->CreateDirs(dir); !s.ok()) return Annotate(s, "--out ");
  WrittenOutputs written;

  // The LightLLM file is the server's rendering for this deployment (full rows of the deployed
  // total heads); an e4m3fn KV session without one is a server fault, not something to paper
  // over. e4m3fnuz sessions have none (LightLLM holds e4m3fn only): see FetchAndWriteScales.
  const v1::OutputFile* lightllm = nullptr;
  for (const auto& file : scales.files()) {
    if (file.format() == "lightllm") lightllm = &file;
  }
  if (scales.kv() != v1::KV_OFF && scales.fp8_flavor() == v1::FP8_E4M3FN) {
    if (lightllm == nullptr) {
      return absl::DataLossError("GetScales returned no \"lightllm\" file for a KV session");
    }
    written.kv_cache_calib = (fs::path(dir) / "kv_cache_calib.json").string();
    if (auto st = WriteFileAtomically(written.kv_cache_calib, lightllm->content()); !st.ok()) return st;
  }
  for (const auto& file : scales.files()) {
    if (file.format() == "lightllm") continue;
    // Names come from the server: keep them inside DIR.
    if (file.name().empty() || file.name().find('/') != std::string::npos || file.name()[0] == '.') {
      return absl::DataLossError(absl::StrCat("GetScales returned a file named \"", file.name(), "\""));
    }
    written.engine_files.push_back((fs::path(dir) / file.name()).string());
    if (auto st = WriteFileAtomically(written.engine_files.back(), file.content()); !st.ok()) return st;
  }

  ordered_json doc;
  doc["session_id"] = session.id();
  doc["session_name"] = session.name();
  const auto& model = session.model();
  doc["model"] = {{"architecture", model.architecture()}, {"model_type", model.model_type()},
                  {"num_layers", model.num_layers()},
                  {"num_attention_heads", model.num_attention_heads()},
                  {"num_kv_heads", model.num_kv_heads()}, {"head_dim", model.head_dim()},
                  {"hidden_size", model.hidden_size()}};
  ordered_json deploy = {{"tp_size", scales.tp_size()},
                         {"total_kv_heads", scales.deployed_total_kv_heads()}};
  if (deployment.has_rank()) deploy["rank"] = deployment.rank();
  doc["deployment"] = deploy;
  doc["progress"] = {{"accepted_chunks", session.accepted_chunks()},
                     {"accepted_bytes", session.accepted_bytes()},
                     {"rejected_chunks", session.rejected_chunks()},
                     {"skipped_warmup_chunks", session.skipped_warmup_chunks()}};

  ordered_json kv;
  kv["mode"] = KvModeName(scales.kv());
  kv["fp8_dtype"] = FlavorName(scales.fp8_flavor());
  kv["qmax"] = scales.fp8_flavor() == v1::FP8_E4M3FNUZ ? 240.0 : 448.0;
  kv["num_kv_heads"] = scales.num_kv_heads();
  kv["deployed_total_kv_heads"] = scales.deployed_total_kv_heads();
  kv["note"] = "scale = absmax / qmax (dequantization multiplier), over the model's original heads";
  ordered_json layers = ordered_json::array();
  for (const auto& layer : scales.kv_layers()) {
    layers.push_back({{"layer", layer.layer()}, {"k_absmax", FloatList(layer.k_absmax())},
                      {"v_absmax", FloatList(layer.v_absmax())},
                      {"k_scale", FloatList(layer.k_scale())},
                      {"v_scale", FloatList(layer.v_scale())}});
  }
  kv["layers"] = layers;
  if (!scales.rank_slices().empty()) {
    ordered_json slices = ordered_json::array();
    for (const auto& slice : scales.rank_slices()) {
      slices.push_back({{"layer", slice.layer()}, {"k_scale", FloatList(slice.k_scale())},
                        {"v_scale", FloatList(slice.v_scale())}});
    }
    kv["rank_slices"] = slices;
  }
  if (!written.kv_cache_calib.empty()) kv["lightllm_file"] = "kv_cache_calib.json";
  doc["kv_cache"] = kv;

  const bool divisor = scales.convention() == v1::COMPRESSED_TENSORS;
  ordered_json nvfp4;
  nvfp4["convention"] = divisor ? "compressed_tensors" : "modelopt";
  nvfp4["form"] = divisor ? "divisor: global_scale = 448 * 6 / amax"
                          : "multiplier: scale = amax / (448 * 6)";
  ordered_json modules = ordered_json::object();
  for (const auto& m : scales.modules()) {
    ordered_json entry;
    entry["fused_group"] = m.fused_group();
    if (m.has_weight_amax()) entry["weight_amax"] = ShortFloat(m.weight_amax());
    if (m.has_weight_global_scale()) {
      entry[divisor ? "weight_global_scale" : "weight_scale_2"] = ShortFloat(m.weight_global_scale());
    }
    if (m.has_input_amax()) entry["input_amax"] = ShortFloat(m.input_amax());
    if (m.has_input_global_scale()) {
      entry[divisor ? "input_global_scale" : "input_scale"] = ShortFloat(m.input_global_scale());
    }
    modules[m.module()] = entry;
  }
  nvfp4["modules"] = modules;
  doc["nvfp4"] = nvfp4;

  ordered_json warnings = ordered_json::array();
  for (const auto& w : scales.warnings()) {
    warnings.push_back({{"where", w.where()}, {"message", w.message()}});
  }
  doc["warnings"] = warnings;

  written.scales_json = (fs::path(dir) / "scales.json").string();
  if (auto st = WriteFileAtomically(written.scales_json, doc.dump(2) + "\n"); !st.ok()) return st;
  return written;
}

void PrintScalesSummary(const v1::ScalesResponse& scales, std::ostream& out) {
  if (scales.kv() != v1::KV_OFF) {
    out << "kv cache  " << KvModeName(scales.kv()) << ", " << FlavorName(scales.fp8_flavor()) << ", "
        << scales.num_kv_heads() << " original heads -> " << scales.deployed_total_kv_heads()
        << " deployed (TP " << scales.tp_size() << ")\n";
    for (const auto& layer : scales.kv_layers()) {
      auto range = [](const auto& values) {
        if (values.empty()) return std::string("-");
        auto [lo, hi] = std::minmax_element(values.begin(), values.end());
        return absl::StrFormat("%.4g..%.4g", *lo, *hi);
      };
      out << absl::StrFormat("  layer %-3d k_scale %-20s v_scale %s\n", layer.layer(),
                             range(layer.k_scale()), range(layer.v_scale()));
    }
  }
  if (!scales.modules().empty()) {
    const bool divisor = scales.convention() == v1::COMPRESSED_TENSORS;
    out << "nvfp4     " << scales.modules_size() << " modules, "
        << (divisor ? "compressed-tensors global_scale (divisor)" : "ModelOpt scale_2 (multiplier)")
        << "\n";
    int shown = 0;
    for (const auto& m : scales.modules()) {
      if (shown++ == 7) break;
      out << absl::StrFormat("  %-40s", m.module());
      if (m.has_weight_global_scale()) out << absl::StrFormat(" weight %-10.5g", m.weight_global_scale());
      if (m.has_input_global_scale()) out << absl::StrFormat(" input %-10.5g", m.input_global_scale());
      if (!m.fused_group().empty()) out << "  [" << m.fused_group() << "]";
      out << "\n";
    }
    if (scales.modules_size() > 7) out << "  ... (" << scales.modules_size() - 7 << " more in scales.json)\n";
  }
  out << "warnings  " << scales.warnings_size() << "\n";
  int shown = 0;
  for (const auto& w : scales.warnings()) {
    if (shown++ == 5) {
      out << "  ... (see scales.json)\n";
      break;
    }
    out << "  " << w.where() << ": " << w.message() << "\n";
  }
}

absl::Status FetchAndWriteScales(v1::Calibration::Stub& stub, absl::string_view command,
                        const RetryPolicy& retry,
                        const v1::Session& session, const v1::Deployment& deployment,
                        v1::Nvfp4Convention convention, const std::vector<std::string>& formats,
                        const std::string& out_dir, std::ostream& out, std::ostream& err) {
  v1::ScalesRequest request;
  request.set_session_id(session.id());
  *request.mutable_deployment() = deployment;
  request.set_convention(convention);
  // The session's default KV file first: LightLLM's, or compressed-tensors for e4m3fnuz.
  const std::string kv_format =
      DefaultKvFormat(session.recipe().fp8_flavor() == v1::FP8_E4M3FNUZ ? Fp8Flavor::kE4M3FNUZ
                                                                        : Fp8Flavor::kE4M3FN);
  if (session.recipe().kv() != v1::KV_OFF) request.add_formats(kv_format);
  for (const std::string& format : formats) {
    if (format != kv_format) request.add_formats(format);
  }
  v1::ScalesResponse scales;
  Backoff backoff(retry, &err, absl::StrCat("caliper ", command, ": GetScales"));
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return stub.GetScales(&context, request, &scales);
  });
  if (!status.ok()) return RpcError("GetScales", status);
  auto written = WriteScalesOutputs(out_dir, scales, session, deployment);
  if (!written.ok()) {
    // DataLoss: the server's answer was broken, not the user's input.
    return written.status().code() == absl::StatusCode::kDataLoss
               ? ServerError(written.status().message())
               : written.status();
  }
  PrintScalesSummary(scales, out);
  if (!written->kv_cache_calib.empty()) out << "wrote     " << written->kv_cache_calib << "\n";
  out << "wrote     " << written->scales_json << "\n";
  for (const std::string& path : written->engine_files) out << "wrote     " << path << "\n";
  return absl::OkStatus();
}

}  // namespace caliper::cli
