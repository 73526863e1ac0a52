#include "core/formats/compressed_tensors_config.h"

#include "nlohmann/json.hpp"

namespace caliper {
namespace {

using ojson = nlohmann::ordered_json;

ojson Args(int bits, const char* strategy, std::optional<int> group, ojson dynamic,
           const std::string& observer, ojson scale_dtype) {
  ojson args = ojson::object();
  args["actorder"] = nullptr;
  args["block_structure"] = nullptr;
  args["dynamic"] = std::move(dynamic);
  args["group_size"] = group.has_value() ? ojson(*group) : ojson(nullptr);
  args["num_bits"] = bits;
  args["observer"] = observer;
  args["observer_kwargs"] = ojson::object();
  args["scale_dtype"] = std::move(scale_dtype);
  args["strategy"] = strategy;
  args["symmetric"] = true;
  args["type"] = "float";
  args["zp_dtype"] = nullptr;
  return args;
}

}  // namespace

std::string AttentionClassOf(const std::string& architecture) {
  const size_t at = architecture.find("For");
  if (at == std::string::npos || at == 0) return "";
  return architecture.substr(0, at) + "Attention";
}

std::string CompressedTensorsConfigBlock(const CtConfigOptions& options) {
  ojson config = ojson::object();
  ojson groups = ojson::object();
  if (options.weights) {
    ojson group = ojson::object();
    group["format"] = "nvfp4-pack-quantized";
    group["input_activations"] =
        options.inputs ? Args(4, "tensor_group", 16, "local", options.input_observer,
                              "torch.float8_e4m3fn")
                       : ojson(nullptr);
    group["output_activations"] = nullptr;
    group["targets"] = {"Linear"};
    group["weights"] =
        Args(4, "tensor_group", 16, false, options.weight_observer, "torch.float8_e4m3fn");
    groups["group_0"] = std::move(group);
  }
  if (options.attention_target.has_value() && options.kv_strategy.has_value()) {
    ojson group = ojson::object();
    group["input_activations"] = Args(8, options.kv_strategy->c_str(), std::nullopt, false,
                                      options.kv_observer, nullptr);
    group["output_activations"] = nullptr;
    group["targets"] = {*options.attention_target};
    group["weights"] = nullptr;
    groups["attention"] = std::move(group);
  }
  config["config_groups"] = std::move(groups);
  config["format"] = options.weights ? "nvfp4-pack-quantized" : "dense";
  config["global_compression_ratio"] = nullptr;
  config["ignore"] = options.ignore;
  if (options.kv_strategy.has_value()) {
    config["kv_cache_scheme"] = Args(8, options.kv_strategy->c_str(), std::nullopt, false,
                                     options.kv_observer, nullptr);
  } else {
    config["kv_cache_scheme"] = nullptr;
  }
  config["quant_method"] = "compressed-tensors";
  config["quantization_status"] = "compressed";
  config["sparsity_config"] = ojson::object();
  config["transform_config"] = ojson::object();
  config["version"] = kCompressedTensorsVersion;
  return config.dump(2);
}

}  // namespace caliper
