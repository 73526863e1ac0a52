// Benchmark: `caliper check` on a checkpoint whose scales number ~100k tensors (synthetic shards
// of a 64-layer, 256-expert NVFP4 MoE: every expert projection's global and input scale, K/V
// scales, and the packed weights / block scales beside them, kept tiny so the files are small),
// as a ratio to reading every shard's safetensors header in the same run. Each phase runs in a
// child process so its peak RSS is its own.
//   check_bench [--layers=64] [--experts=256] [--shards=16] [--reps=3] [--dir=DIR]
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/check/check_rules.h"
#include "core/check/scale_set.h"
#include "core/formats/compressed_tensors_config.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

namespace fs = std::filesystem;

int Flag(int argc, char** argv, const char* name, int fallback) {
  const std::string prefix = absl::StrCat("--", name, "=");
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoi(argv[i] + prefix.size());
  }
  return fallback;
}

std::string F32(float v) { return std::string(reinterpret_cast<const char*>(&v), 4); }

// Writes the checkpoint; returns the number of scale tensors.
int64_t Generate(const fs::path& dir, int layers, int experts, int shards) {
  fs::create_directories(dir);
  nlohmann::ordered_json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                                   {"model_type", "qwen3_moe"},
                                   {"num_hidden_layers", layers},
                                   {"hidden_size", 32},
                                   {"num_attention_heads", 4},
                                   {"num_key_value_heads", 2},
                                   {"head_dim", 8},
                                   {"num_experts", experts}};
  CtConfigOptions options;
  options.weights = options.inputs = true;
  options.kv_strategy = "tensor";
  options.ignore = {"lm_head", "re:.*mlp\\.gate$"};
  config["quantization_config"] = nlohmann::ordered_json::parse(CompressedTensorsConfigBlock(options));
  std::ofstream(dir / "config.json") << config.dump(2);
  nlohmann::json map = nlohmann::json::object();  // std::map-backed: ordered_json finds linearly
  int64_t scales = 0;
  const int per_shard = (layers + shards - 1) / shards;
  for (int s = 0; s < shards; ++s) {
    SafetensorsWriter writer;
    const std::string shard = absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards);
    auto add = [&](const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
                   std::string bytes) {
      (void)writer.Add(name, dtype, std::move(shape), std::move(bytes));
      map[name] = shard;
    };
    for (int l = s * per_shard; l < std::min(layers, (s + 1) * per_shard); ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".");
      add(p + "self_attn.k_scale", "F32", {1}, F32(0.05f));
      add(p + "self_attn.v_scale", "F32", {1}, F32(0.04f));
      scales += 2;
      for (int e = 0; e < experts; ++e) {
        for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
          const std::string m = absl::StrCat(p, "mlp.experts.", e, ".", proj);
          add(m + ".weight_packed", "U8", {1, 8}, std::string(8, '\x22'));
          add(m + ".weight_scale", "F8_E4M3", {1, 1}, std::string(1, '\x38'));
          add(m + ".weight_global_scale", "F32", {1}, F32(1000.0f + e));
          add(m + ".input_global_scale", "F32", {1}, F32(600.0f + (e % 7)));
          scales += 2;
        }
      }
    }
    (void)writer.WriteFile((dir / shard).string());
  }
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", std::move(map)}};
  std::ofstream(dir / "model.safetensors.index.json") << index.dump();
  return scales;
}

struct Measured {
  double seconds = 0;
  long max_rss_kib = 0;
  long result = 0;
};

// Runs `body` in a child; its wall time (measured in the child) and peak RSS (wait4).
template <typename F>
Measured InChild(F body) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) std::abort();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    const auto start = std::chrono::steady_clock::now();
    const long result = body();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string line = absl::StrCat(seconds, " ", result);
    (void)!::write(pipefd[1], line.data(), line.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  char buffer[128] = {0};
  const ssize_t n = ::read(pipefd[0], buffer, sizeof(buffer) - 1);
  ::close(pipefd[0]);
  int status = 0;
  struct rusage usage;
  ::wait4(pid, &status, 0, &usage);
  Measured m;
  if (n > 0) std::sscanf(buffer, "%lf %ld", &m.seconds, &m.result);
  m.max_rss_kib = usage.ru_maxrss;
  return m;
}

}  // namespace
}  // namespace caliper

int main(int argc, char** argv) {
  using namespace caliper;
  const int layers = Flag(argc, argv, "layers", 64), experts = Flag(argc, argv, "experts", 256),
            shards = Flag(argc, argv, "shards", 16), reps = Flag(argc, argv, "reps", 3);
  const fs::path dir = fs::temp_directory_path() / ("caliper-check-bench-" + std::to_string(::getpid()));
  const int64_t scales = Generate(dir, layers, experts, shards);
  std::vector<std::string> files;
  for (const auto& item : fs::directory_iterator(dir)) {
    if (item.path().extension() == ".safetensors") files.push_back(item.path().string());
  }
  uint64_t bytes = 0;
  for (const std::string& f : files) bytes += fs::file_size(f);
  std::printf("checkpoint: %d layers x %d experts, %zu shards, %.1f MiB, %lld scale tensors\n",
              layers, experts, files.size(), bytes / 1048576.0, static_cast<long long>(scales));
  std::vector<double> ratios, rss_ratios;
  for (int r = 0; r < reps; ++r) {
    const Measured headers = InChild([&] {
      long tensors = 0;
      for (const std::string& f : files) {
        auto file = SafetensorsFile::Open(f);
        if (!file.ok()) std::abort();
        tensors += static_cast<long>((*file)->tensors().size());
      }
      return tensors;
    });
    const Measured check = InChild([&] {
      absl::StatusOr<ScaleSet> set = ReadScaleSet(dir.string(), {});
      if (!set.ok()) std::abort();
      const std::vector<CheckFinding> findings = CheckScaleSet(*set, {});
      return static_cast<long>(set->scale_tensors * 1000 + static_cast<long>(findings.size()));
    });
    ratios.push_back(check.seconds / headers.seconds);
    rss_ratios.push_back(static_cast<double>(check.max_rss_kib) / headers.max_rss_kib);
    std::printf("rep %d: headers %.3f s (%ld tensors, peak RSS %.1f MiB); check %.3f s (%ld scale "
                "tensors read, %ld findings, peak RSS %.1f MiB); time ratio %.2f, RSS ratio %.2f\n",
                r, headers.seconds, headers.result, headers.max_rss_kib / 1024.0, check.seconds,
                check.result / 1000, check.result % 1000, check.max_rss_kib / 1024.0, ratios.back(),
                rss_ratios.back());
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(rss_ratios.begin(), rss_ratios.end());
  std::printf("median: check / headers time ratio %.2f, peak RSS ratio %.2f\n",
              ratios[ratios.size() / 2], rss_ratios[rss_ratios.size() / 2]);
  fs::remove_all(dir);
  return 0;
}
