// caliper-demo-gen: writes the synthetic demo model, checkpoint and dumps (see demo_data.h).
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "client/demo/demo_data.h"

ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(uint64_t, seed, 1234, "random seed; the same seed writes the same bytes");
ABSL_FLAG(int, layers, 4, "decoder layers");
ABSL_FLAG(int, tp, 2, "TP ranks producing the dumps (must divide the 4 KV heads)");
ABSL_FLAG(int, batches, 3, "forward passes (one dump per rank and batch)");
ABSL_FLAG(int, tokens, 48, "tokens per forward pass");
ABSL_FLAG(int, shards, 2, "checkpoint shards (1 writes a single model.safetensors)");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Writes a synthetic Llama-like calibration set: <out>/config.json, <out>/checkpoint/ "
      "(HF-style BF16 safetensors) and <out>/dumps/rank{r}_batch{b}.safetensors.\n"
      "Usage: caliper-demo-gen --out=DIR [--seed=N] [--tp=T] [--batches=B] [--tokens=N]");
  absl::ParseCommandLine(argc, argv);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) {
    std::fprintf(stderr, "caliper-demo-gen: --out is required\n");
    return 2;
  }
  caliper::DemoOptions options;
  options.seed = absl::GetFlag(FLAGS_seed);
  options.num_layers = absl::GetFlag(FLAGS_layers);
  options.tp_size = absl::GetFlag(FLAGS_tp);
  options.batches = absl::GetFlag(FLAGS_batches);
  options.tokens = absl::GetFlag(FLAGS_tokens);
  options.checkpoint_shards = absl::GetFlag(FLAGS_shards);
  auto files = caliper::WriteDemo(options, out);
  if (!files.ok()) {
    std::fprintf(stderr, "caliper-demo-gen: %s\n", std::string(files.status().message()).c_str());
    return 2;
  }
  std::printf("model      %s\ncheckpoint %s\ndumps      %zu files (%d ranks x %d batches)\n"
              "bytes      %lld\n",
              files->config_json.c_str(), files->checkpoint_dir.c_str(), files->dumps.size(),
              options.tp_size, options.batches, static_cast<long long>(files->bytes_written));
  return 0;
}
