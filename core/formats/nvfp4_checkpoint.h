// `caliper quantize`: an HF checkpoint + a scale file -> a complete NVFP4 checkpoint engines serve
// as it is. Every Linear with a weight global scale gets packed FP4 weights and per-16 FP8 group
// scales computed after that (fused) global scale, in compressed-tensors form (weight_packed,
// weight_scale, weight_global_scale, input_global_scale + the full quantization_config) or ModelOpt
// form (weight, weight_scale, weight_scale_2, input_scale + hf_quant_config.json); K/V scales go
// beside them. Bounded memory: input shards are memory-mapped one at a time, one tensor is
// resident, output shards are streamed. The output appears whole or not at all (a
// StagedDirectory). Not thread-safe.
#ifndef CALIPER_CORE_FORMATS_NVFP4_CHECKPOINT_H_
#define CALIPER_CORE_FORMATS_NVFP4_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/warnings.h"
#include "core/env/env.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

struct QuantizeOptions {
  std::string checkpoint_dir;   // dense HF checkpoint (no quantization_config)
  std::string scales_path;      // compressed-tensors or ModelOpt scale file (either form)
  std::string out_dir;          // must not exist, or be empty
  std::string format = "compressed-tensors";  // output form: "compressed-tensors" | "modelopt"
  // llm-compressor's arithmetic: group scales amax_g / 6 in the weight's dtype (bf16 rounds).
  bool llm_compressor_compat = false;
  // Observer names written into the config (llm-compressor's spelling); empty: the names the
  // scale file's config says, else Caliper's defaults.
  std::string input_observer, kv_observer;
  ReductionBackend* backend = nullptr;  // packs; required
  // Called after each tensor: bytes of the input read so far, of the whole input, tensor name.
  std::function<void(uint64_t done, uint64_t total, const std::string& tensor)> progress;
  Env* env = Env::Default();  // every read of the directory and every write of the output
};

struct QuantizeReport {
  int quantized_modules = 0;              // packed to NVFP4
  int copied_tensors = 0;                 // written unchanged
  int kv_layers = 0;                      // layers given K/V scales
  std::vector<std::string> ignore;        // written into the config
  std::vector<std::string> routers;       // MoE routers found (kept unquantized, ignored)
  // Expert names mapped: scale file -> checkpoint, and checkpoint -> output (transformers 5
  // compressed-tensors loaders want experts.E.gate_proj/up_proj/down_proj).
  std::vector<std::pair<std::string, std::string>> renamed;
  uint64_t bytes_in = 0, bytes_out = 0;
  std::vector<ScaleWarning> warnings;
};

// FailedPrecondition for a checkpoint that is already quantized or an output that exists;
// InvalidArgument naming the tensor for a scale module the checkpoint lacks, a weight that is
// not 2-D with a multiple of 16 columns, or non-finite weights. Errors name the file and tensor.
absl::StatusOr<QuantizeReport> QuantizeCheckpoint(const QuantizeOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_NVFP4_CHECKPOINT_H_
