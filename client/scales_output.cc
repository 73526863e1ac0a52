#include "client/scales_output.h"

#include <algorithm>
#include <filesystem>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/command.h"
#include "client/file_io.h"
#include "client/rpc_error.h"
#include "core/formats/engine_formats.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

// LightLLM's quant_type words, as scales.json writes them.
std::string KvModeName(v1::KvMode mode) {
  switch (mode) {
    case v1::KV_PER_HEAD: return "per_head";
    case v1::KV_PER_TENSOR: return "per_tensor";
    default: return "off";
  }
}

std::string FlavorName(v1::Fp8Flavor flavor) {
  return flavor == v1::FP8_E4M3FNUZ ? "float8_e4m3fnuz" : "float8_e4m3fn";
}

}  // namespace

absl::StatusOr<WrittenOutputs> WriteScalesOutputs(const std::string& dir,
                                                  const v1::ScalesResponse& scales) {
  if (scales.scales_json().empty()) {
    return absl::DataLossError("GetScales returned no scales.json (a caliper-server before 0.2.0?)");
  }
  // The LightLLM file is the server's rendering for this deployment (full rows of the deployed
  // total heads); an e4m3fn KV session without one is a server fault, not something to paper
  // over. e4m3fnuz sessions have none (LightLLM holds e4m3fn only): see FetchAndWriteScales.
  const v1::OutputFile* lightllm = nullptr;
  for (const auto& file : scales.files()) {
    if (file.format() == "lightllm") lightllm = &file;
  }
  if (scales.kv() != v1::KV_OFF && scales.fp8_flavor() == v1::FP8_E4M3FN &&
      scales.kv_cache_dtype() != v1::KV_CACHE_NVFP4 && lightllm == nullptr) {
    return absl::DataLossError("GetScales returned no \"lightllm\" file for a KV session");
  }
  for (const auto& file : scales.files()) {
    // Names come from the server: keep them inside DIR.
    if (file.format() != "lightllm" &&
        (file.name().empty() || file.name().find('/') != std::string::npos || file.name()[0] == '.')) {
      return absl::DataLossError(absl::StrCat("GetScales returned a file named \"", file.name(), "\""));
    }
  }
  if (absl::Status s = CliEnv()->CreateDirs(dir); !s.ok()) return Annotate(s, "--out ");
  WrittenOutputs written;
  if (lightllm != nullptr) {
    written.kv_cache_calib = (fs::path(dir) / kLightLlmFile).string();
    if (auto st = WriteFileAtomically(written.kv_cache_calib, lightllm->content()); !st.ok()) return st;
  }
  for (const auto& file : scales.files()) {
    if (file.format() == "lightllm") continue;
    written.engine_files.push_back((fs::path(dir) / file.name()).string());
    if (auto st = WriteFileAtomically(written.engine_files.back(), file.content()); !st.ok()) return st;
  }
  written.scales_json = (fs::path(dir) / "scales.json").string();
  if (auto st = WriteFileAtomically(written.scales_json, scales.scales_json()); !st.ok()) return st;
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
                        v1::ScalesRequest request, const v1::Recipe& recipe,
                        const v1::Deployment& deployment,
                        v1::Nvfp4Convention convention, const std::vector<std::string>& formats,
                        const std::string& out_dir, std::ostream& out, std::ostream& err) {
  *request.mutable_deployment() = deployment;
  request.set_convention(convention);
  // The session's default KV file first (DefaultKvFormat: LightLLM's, or compressed-tensors).
  const std::string kv_format = DefaultKvFormat(
      recipe.fp8_flavor() == v1::FP8_E4M3FNUZ ? Fp8Flavor::kE4M3FNUZ : Fp8Flavor::kE4M3FN,
      deployment.kv_cache_dtype() == v1::KV_CACHE_NVFP4 ? KvCacheDtype::kNvfp4
                                                        : KvCacheDtype::kFp8);
  if (recipe.kv() != v1::KV_OFF) request.add_formats(kv_format);
  for (const std::string& format : formats) {
    if (format != kv_format) request.add_formats(format);
  }
  v1::ScalesResponse scales;
  Backoff backoff(retry, &err, absl::StrCat("caliper ", command, ": GetScales"));
  grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
    return stub.GetScales(&context, request, &scales);
  });
  if (!status.ok()) return RpcError("GetScales", status);
  auto written = WriteScalesOutputs(out_dir, scales);
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
