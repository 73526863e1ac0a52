// Writes safetensors files with known contents plus DIR/manifest.json, for check_safetensors.py
// (an independent stdlib-only parser) to validate layout and decoded values.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/safetensors.h"
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
