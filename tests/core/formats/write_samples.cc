// Writes safetensors files with known contents plus DIR/manifest.json, for check_safetensors.py
// (an independent stdlib-only parser) to validate layout and decoded values.
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor/dtype.h"
#include "core/formats/engine_formats.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string out(values.size() * sizeof(T), '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

class Sample {
 public:
  explicit Sample(nlohmann::json* manifest, std::string file) : manifest_(manifest), file_(file) {
    (*manifest_)[file_] = nlohmann::json::object();
  }
  template <typename T>
  bool Add(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
           const std::vector<T>& values, const nlohmann::json& expected) {
    (*manifest_)[file_][name] = {{"dtype", dtype}, {"shape", shape}, {"values", expected}};
    absl::Status status = writer_.Add(name, dtype, std::move(shape), Bytes(values));
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return status.ok();
  }
  SafetensorsWriter& writer() { return writer_; }
  bool Write(const std::string& dir) {
    absl::Status status = writer_.WriteFile(dir + "/" + file_);
    if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return status.ok();
  }

 private:
  nlohmann::json* manifest_;
  std::string file_;
  SafetensorsWriter writer_;
};

// Writes `bytes` as DIR/name and records every tensor's dtype, shape and values as our reader
// sees them, so the Python parser checks the engine files against an independent decoding.
bool WriteRendered(const std::string& dir, const std::string& name, const std::string& bytes,
                   nlohmann::json* manifest) {
  auto file = SafetensorsFile::FromBytes(bytes);
  if (!file.ok()) {
    std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
    return false;
  }
  nlohmann::json& entries = (*manifest)[name] = nlohmann::json::object();
  for (const SafetensorsEntry& entry : (*file)->tensors()) {
    std::vector<float> values((entry.end - entry.begin) / 4);
    std::memcpy(values.data(), (*file)->Data(entry).data(), values.size() * 4);
    entries[entry.name] = {{"dtype", entry.dtype}, {"shape", entry.shape}, {"values", values}};
  }
  absl::Status status = WriteFileAtomically(dir + "/" + name, bytes);
  if (!status.ok()) std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return status.ok();
}

KvScales SampleKv(int layers, int heads, KvGranularity granularity) {
  KvScales kv;
  kv.granularity = granularity;
  kv.num_kv_heads = heads;
  const int width = granularity == KvGranularity::kPerHead ? heads : 1;
  for (int l = 0; l < layers; ++l) {
    std::vector<float> k, v;
    for (int h = 0; h < width; ++h) {
      k.push_back(0.01f * (l + 1) + 0.001f * h);
      v.push_back(0.02f * (l + 1) + 0.003f * h);
    }
    kv.k.push_back(k);
    kv.v.push_back(v);
    kv.k_absmax.push_back({});
    kv.v_absmax.push_back({});
    for (float x : k) kv.k_absmax.back().push_back(x * 448.0f);
    for (float x : v) kv.v_absmax.back().push_back(x * 448.0f);
  }
  return kv;
}

bool WriteEngineSamples(const std::string& dir, nlohmann::json* manifest) {
  bool ok = true;
  RenderInputs llama;
  llama.model = {"LlamaForCausalLM", "llama", 3, 8, 2, 16, 128};
  llama.kv = SampleKv(3, 2, KvGranularity::kPerHead);
  std::map<std::string, ModuleAmax> amax;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    float a = 1.0f + l;
    for (const char* m : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                          "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) {
      amax[p + m] = {a, 3.0f * a};
      a += 0.37f;
    }
  }
  llama.nvfp4 = ComputeNvfp4Scales(amax, Nvfp4Options());
  std::vector<ScaleWarning> warnings;
  auto ct = CompressedTensorsScalesFile(llama, &warnings);
  auto mo = ModelOptScalesFile(llama, &warnings);
  if (!ct.ok() || !mo.ok()) return false;
  ok &= WriteRendered(dir, "llama_ct.safetensors", *ct, manifest);
  ok &= WriteRendered(dir, "llama_modelopt.safetensors", *mo, manifest);

  RenderInputs moe;
  moe.model = {"Qwen3MoeForCausalLM", "qwen3_moe", 2, 8, 4, 16, 128};
  moe.kv = SampleKv(2, 4, KvGranularity::kPerTensor);
  amax.clear();
  for (int e = 0; e < 3; ++e) {
    const std::string p = "model.layers.1.mlp.experts." + std::to_string(e) + ".";
    amax[p + "gate_proj"] = {0.5f + e, 2.0f};
    amax[p + "up_proj"] = {5.0f + e, std::nullopt};
    amax[p + "down_proj"] = {1.5f, 7.0f};
  }
  moe.nvfp4 = ComputeNvfp4Scales(amax, Nvfp4Options());
  ct = CompressedTensorsScalesFile(moe, &warnings);
  mo = ModelOptScalesFile(moe, &warnings);
  if (!ct.ok() || !mo.ok()) return false;
  ok &= WriteRendered(dir, "qwen3moe_ct.safetensors", *ct, manifest);
  ok &= WriteRendered(dir, "qwen3moe_modelopt.safetensors", *mo, manifest);
  return ok;
}

bool WriteSamples(const std::string& dir, nlohmann::json* manifest) {
  bool ok = true;
  Sample mixed(manifest, "mixed.safetensors");
  // Odd sizes in insertion order force the writer to reorder for natural alignment.
  ok &= mixed.Add<uint8_t>("packed", "U8", {3}, {1, 2, 255}, {1, 2, 255});
  ok &= mixed.Add<float>("k_scale", "F32", {}, {0.03125f}, {0.03125});
  std::vector<uint16_t> bf16;
  for (float v : {1.0f, -2.5f, 448.0f}) bf16.push_back(FloatToBF16(v));
  ok &= mixed.Add<uint16_t>("weight", "BF16", {1, 3}, bf16, {1.0, -2.5, 448.0});
  ok &= mixed.Add<double>("wide", "F64", {2}, {0.1, -1e300}, {0.1, -1e300});
  std::vector<uint16_t> f16;
  for (float v : {0.5f, 65504.0f, -0.0f}) f16.push_back(FloatToF16(v));
  ok &= mixed.Add<uint16_t>("half", "F16", {3}, f16, {0.5, 65504.0, -0.0});
  ok &= mixed.Add<int64_t>("ids", "I64", {2}, {-1, 1LL << 40}, {-1, 1LL << 40});
  ok &= mixed.Add<float>("global", "F32", {1}, {2688.0f}, {2688.0});
  mixed.writer().SetMetadata("format", "pt");
  ok &= mixed.Write(dir);

  Sample empty(manifest, "empty.safetensors");
  ok &= empty.Write(dir);
  ok &= WriteEngineSamples(dir, manifest);
  return ok;
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  nlohmann::json manifest = nlohmann::json::object();
  if (!caliper::WriteSamples(dir, &manifest)) return 1;
  absl::Status status = caliper::WriteFileAtomically(dir + "/manifest.json", manifest.dump(1));
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
