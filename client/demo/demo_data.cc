#include "client/demo/demo_data.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/tensor/dtype.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

namespace fs = std::filesystem;

// SplitMix64 finalizer: decorrelates the per-tensor seeds derived from one user seed.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// One independent stream per (what, layer, batch), so a tensor never depends on generation order.
uint64_t StreamSeed(uint64_t seed, int what, int layer, int batch) {
  return Mix(Mix(Mix(Mix(seed) ^ static_cast<uint64_t>(what)) ^ static_cast<uint64_t>(layer)) ^
             static_cast<uint64_t>(batch));
}

// Samplers written out so the values are identical on every standard library.
class Sampler {
 public:
  explicit Sampler(uint64_t seed) : engine_(seed) {}
  // Uniform in the open interval (0, 1).
  double Uniform() { return (static_cast<double>(engine_() >> 11) + 0.5) * 0x1.0p-53; }
  double Normal() {
    return std::sqrt(-2.0 * std::log(Uniform())) * std::cos(6.283185307179586 * Uniform());
  }
  double Laplace(double scale) {
    const double u = Uniform() - 0.5;
    return (u < 0 ? 1.0 : -1.0) * scale * std::log(1.0 - 2.0 * std::fabs(u));
  }
  // Student-t with integer degrees of freedom: heavier tails the smaller `nu` is.
  double StudentT(int nu) {
    double chi2 = 0;
    for (int i = 0; i < nu; ++i) {
      const double z = Normal();
      chi2 += z * z;
    }
    return Normal() / std::sqrt(chi2 / nu);
  }

 private:
  std::mt19937_64 engine_;
};

enum Stream : int { kKeys = 1, kValues, kKeyHeadScale, kValueHeadScale, kAttnInput, kOInput,
                    kMlpInput, kDownInput, kWeight };

// A row-major [rows, cols] matrix of floats.
struct Matrix {
  int64_t rows = 0, cols = 0;
  std::vector<float> values;
  float& at(int64_t r, int64_t c) { return values[r * cols + c]; }
};

Matrix MakeMatrix(int64_t rows, int64_t cols) {
  return Matrix{rows, cols, std::vector<float>(static_cast<size_t>(rows * cols))};
}

std::string ToBF16Bytes(const float* values, size_t count) {
  std::string bytes(count * 2, '\0');
  for (size_t i = 0; i < count; ++i) {
    const uint16_t bits = FloatToBF16(values[i]);
    bytes[2 * i] = static_cast<char>(bits & 0xff);
    bytes[2 * i + 1] = static_cast<char>(bits >> 8);
  }
  return bytes;
}

// Columns [begin, begin + width) of `m` (a TP shard of a row-parallel input).
Matrix Columns(const Matrix& m, int64_t begin, int64_t width) {
  Matrix out = MakeMatrix(m.rows, width);
  for (int64_t r = 0; r < m.rows; ++r) {
    for (int64_t c = 0; c < width; ++c) out.values[r * width + c] = m.values[r * m.cols + begin + c];
  }
  return out;
}

int HeadDim(const DemoOptions& o) { return o.hidden_size / o.num_attention_heads; }

// Per-head magnitudes of one layer: most heads near 1, one outlier head much larger.
std::vector<double> HeadScales(const DemoOptions& o, int what, int layer, int outlier_head,
                               double outlier_factor) {
  Sampler s(StreamSeed(o.seed, what, layer, 0));
  std::vector<double> scales(o.num_kv_heads);
  for (int h = 0; h < o.num_kv_heads; ++h) scales[h] = 0.6 + 0.8 * s.Uniform();
  if (outlier_head >= 0) scales[outlier_head] *= outlier_factor;
  return scales;
}

// K of one layer and batch over all original heads, [tokens, kv_heads * head_dim].
// Keys: Student-t(4), one outlier head per layer, and a RoPE-like pair of outlier channels.
Matrix KeysFor(const DemoOptions& o, int layer, int batch) {
  const int d = HeadDim(o);
  const auto heads = HeadScales(o, kKeyHeadScale, layer, (layer + 1) % o.num_kv_heads, 6.0);
  Sampler s(StreamSeed(o.seed, kKeys, layer, batch));
  Matrix m = MakeMatrix(o.tokens, static_cast<int64_t>(o.num_kv_heads) * d);
  const double layer_gain = (1.0 + 0.5 * layer) * (1.0 + 0.1 * batch);
  for (int t = 0; t < o.tokens; ++t) {
    for (int h = 0; h < o.num_kv_heads; ++h) {
      for (int c = 0; c < d; ++c) {
        const double channel = (c == 3 || c == 3 + d / 2) ? 4.0 : 1.0;
        m.at(t, h * d + c) = static_cast<float>(s.StudentT(4) * heads[h] * channel * layer_gain);
      }
    }
  }
  return m;
}

// V: Laplace, an outlier head in odd layers only (so per-head and per-tensor differ visibly).
Matrix ValuesFor(const DemoOptions& o, int layer, int batch) {
  const int d = HeadDim(o);
  const int outlier = layer % 2 == 1 ? (2 * layer) % o.num_kv_heads : -1;
  const auto heads = HeadScales(o, kValueHeadScale, layer, outlier, 5.0);
  Sampler s(StreamSeed(o.seed, kValues, layer, batch));
  Matrix m = MakeMatrix(o.tokens, static_cast<int64_t>(o.num_kv_heads) * d);
  for (int t = 0; t < o.tokens; ++t) {
    for (int h = 0; h < o.num_kv_heads; ++h) {
      for (int c = 0; c < d; ++c) m.at(t, h * d + c) = static_cast<float>(s.Laplace(0.25 * heads[h]));
    }
  }
  return m;
}

// Input of q/k/v: Student-t(5) hidden states with two outlier channels and a "massive
// activation" on the first token of every forward pass.
Matrix AttnInputFor(const DemoOptions& o, int layer, int batch) {
  Sampler s(StreamSeed(o.seed, kAttnInput, layer, batch));
  Matrix m = MakeMatrix(o.tokens, o.hidden_size);
  const int c1 = 17 % o.hidden_size, c2 = 200 % o.hidden_size;
  for (int t = 0; t < o.tokens; ++t) {
    for (int c = 0; c < o.hidden_size; ++c) {
      double v = s.StudentT(5) * 0.7;
      if (c == c1 || c == c2) v *= (t == 0 ? 50.0 : 8.0);
      m.at(t, c) = static_cast<float>(v);
    }
  }
  return m;
}

Matrix MlpInputFor(const DemoOptions& o, int layer, int batch) {
  Sampler s(StreamSeed(o.seed, kMlpInput, layer, batch));
  Matrix m = MakeMatrix(o.tokens, o.hidden_size);
  const int c1 = 93 % o.hidden_size;
  for (int t = 0; t < o.tokens; ++t) {
    for (int c = 0; c < o.hidden_size; ++c) {
      m.at(t, c) = static_cast<float>(s.StudentT(5) * (c == c1 ? 6.0 : 1.0));
    }
  }
  return m;
}

// Attention output (o_proj input): Laplace.
Matrix OInputFor(const DemoOptions& o, int layer, int batch) {
  Sampler s(StreamSeed(o.seed, kOInput, layer, batch));
  Matrix m = MakeMatrix(o.tokens, o.hidden_size);
  for (float& v : m.values) v = static_cast<float>(s.Laplace(0.4));
  return m;
}

// SiLU(gate) * up (down_proj input): a product of Gaussians, sharply peaked with long tails.
Matrix DownInputFor(const DemoOptions& o, int layer, int batch) {
  Sampler s(StreamSeed(o.seed, kDownInput, layer, batch));
  Matrix m = MakeMatrix(o.tokens, o.intermediate_size);
  for (float& v : m.values) {
    const double gate = s.Normal() * 1.5;
    v = static_cast<float>(gate / (1.0 + std::exp(-gate)) * s.Normal());
  }
  return m;
}

std::string ModulePath(int layer, const std::string& leaf) {
  const bool attn = leaf == "q_proj" || leaf == "k_proj" || leaf == "v_proj" || leaf == "o_proj";
  return absl::StrCat("model.layers.", layer, attn ? ".self_attn." : ".mlp.", leaf);
}

// Weight of one module, [out, in]: N(0, 0.02) with a few large elements. Layer 1's gate_proj is
// 5x larger than its up_proj so the fused gate/up group has something to share.
Matrix WeightFor(const DemoOptions& o, int layer, int module_index, int64_t out, int64_t in) {
  Sampler s(StreamSeed(o.seed, kWeight, layer, module_index));
  const std::string& leaf = DemoLayerModules()[module_index];
  double std_dev = 0.02;
  if (layer == 1 && leaf == "gate_proj") std_dev *= 5.0;
  if (layer == 0 && leaf == "k_proj") std_dev *= 3.0;
  Matrix m = MakeMatrix(out, in);
  for (float& v : m.values) v = static_cast<float>(s.Normal() * std_dev);
  for (int i = 0; i < 4; ++i) {
    const auto index = static_cast<size_t>(s.Uniform() * static_cast<double>(m.values.size()));
    m.values[index] *= 12.0f;
  }
  return m;
}

absl::Status AddBF16(SafetensorsWriter& writer, const std::string& name, const Matrix& m,
                     std::vector<int64_t> shape) {
  return writer.Add(name, "BF16", std::move(shape), ToBF16Bytes(m.values.data(), m.values.size()));
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

int64_t FileSize(const std::string& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

absl::Status Validate(const DemoOptions& o) {
  auto positive = [](int v, const char* name) -> absl::Status {
    if (v <= 0) return absl::InvalidArgumentError(absl::StrCat(name, ": must be positive, got ", v));
    return absl::OkStatus();
  };
  for (auto [v, name] : {std::pair{o.num_layers, "num_layers"}, {o.hidden_size, "hidden_size"},
                         {o.num_attention_heads, "num_attention_heads"},
                         {o.num_kv_heads, "num_kv_heads"},
                         {o.intermediate_size, "intermediate_size"}, {o.tp_size, "tp_size"},
                         {o.batches, "batches"}, {o.tokens, "tokens"},
                         {o.checkpoint_shards, "checkpoint_shards"}}) {
    if (auto st = positive(v, name); !st.ok()) return st;
  }
  if (o.hidden_size % o.num_attention_heads != 0 || o.num_attention_heads % o.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        "num_attention_heads: must divide hidden_size and be a multiple of num_kv_heads");
  }
  if (o.num_kv_heads % o.tp_size != 0 || o.hidden_size % o.tp_size != 0 ||
      o.intermediate_size % o.tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tp_size: ", o.tp_size, " must divide num_kv_heads, hidden_size and intermediate_size"));
  }
  return absl::OkStatus();
}

}  // namespace

const std::vector<std::string>& DemoLayerModules() {
  static const auto* names = new std::vector<std::string>{
      "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return *names;
}

std::string DemoConfigJson(const DemoOptions& o) {
  nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", o.hidden_size},
      {"intermediate_size", o.intermediate_size},
      {"num_hidden_layers", o.num_layers},
      {"num_attention_heads", o.num_attention_heads},
      {"num_key_value_heads", o.num_kv_heads},
      {"head_dim", HeadDim(o)},
      {"vocab_size", 512},
      {"max_position_embeddings", 2048},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", 10000.0},
      {"tie_word_embeddings", true},
      {"torch_dtype", "bfloat16"},
  };
  return config.dump(2) + "\n";
}

absl::StatusOr<DemoFiles> WriteDemo(const DemoOptions& o, const std::string& dir) {
  if (auto st = Validate(o); !st.ok()) return st;
  DemoFiles files;
  files.checkpoint_dir = (fs::path(dir) / "checkpoint").string();
  const fs::path dumps_dir = fs::path(dir) / "dumps";
  std::error_code ec;
  fs::create_directories(files.checkpoint_dir, ec);
  if (!ec) fs::create_directories(dumps_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": cannot create directories: ", ec.message()));

  const std::string config = DemoConfigJson(o);
  files.config_json = (fs::path(dir) / "config.json").string();
  if (auto st = WriteText(files.config_json, config); !st.ok()) return st;
  if (auto st = WriteText((fs::path(files.checkpoint_dir) / "config.json").string(), config);
      !st.ok()) {
    return st;
  }

  // Checkpoint: layers spread evenly over the shards; embeddings first, final norm last.
  const int head_dim = HeadDim(o);
  const int64_t kv_width = static_cast<int64_t>(o.num_kv_heads) * head_dim;
  std::vector<SafetensorsWriter> shards(o.checkpoint_shards);
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> shard_names;
  for (int i = 0; i < o.checkpoint_shards; ++i) {
    shard_names.push_back(o.checkpoint_shards == 1
                              ? std::string("model.safetensors")
                              : absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1,
                                                o.checkpoint_shards));
    shards[i].SetMetadata("format", "pt");
  }
  auto add = [&](int shard, const std::string& name, const Matrix& m,
                 std::vector<int64_t> shape) -> absl::Status {
    weight_map[name] = shard_names[shard];
    return AddBF16(shards[shard], name, m, std::move(shape));
  };
  {
    Sampler s(StreamSeed(o.seed, kWeight, -1, 0));
    Matrix embed = MakeMatrix(512, o.hidden_size);
    for (float& v : embed.values) v = static_cast<float>(s.Normal() * 0.02);
    if (auto st = add(0, "model.embed_tokens.weight", embed, {512, o.hidden_size}); !st.ok()) return st;
  }
  Matrix ones = MakeMatrix(1, o.hidden_size);
  for (float& v : ones.values) v = 1.0f;
  for (int layer = 0; layer < o.num_layers; ++layer) {
    const int shard = layer * o.checkpoint_shards / o.num_layers;
    const std::map<std::string, std::pair<int64_t, int64_t>> shapes = {
        {"q_proj", {o.hidden_size, o.hidden_size}}, {"k_proj", {kv_width, o.hidden_size}},
        {"v_proj", {kv_width, o.hidden_size}},      {"o_proj", {o.hidden_size, o.hidden_size}},
        {"gate_proj", {o.intermediate_size, o.hidden_size}},
        {"up_proj", {o.intermediate_size, o.hidden_size}},
        {"down_proj", {o.hidden_size, o.intermediate_size}}};
    for (int i = 0; i < static_cast<int>(DemoLayerModules().size()); ++i) {
      const std::string& leaf = DemoLayerModules()[i];
      const auto [out, in] = shapes.at(leaf);
      if (auto st = add(shard, ModulePath(layer, leaf) + ".weight", WeightFor(o, layer, i, out, in),
                        {out, in});
          !st.ok()) {
        return st;
      }
    }
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"}) {
      if (auto st = add(shard, absl::StrCat("model.layers.", layer, ".", norm, ".weight"), ones,
                        {o.hidden_size});
          !st.ok()) {
        return st;
      }
    }
  }
  if (auto st = add(o.checkpoint_shards - 1, "model.norm.weight", ones, {o.hidden_size}); !st.ok()) {
    return st;
  }
  int64_t checkpoint_bytes = 0;
  for (int i = 0; i < o.checkpoint_shards; ++i) {
    const std::string path = (fs::path(files.checkpoint_dir) / shard_names[i]).string();
    if (auto st = shards[i].WriteFile(path); !st.ok()) return st;
    checkpoint_bytes += FileSize(path);
    files.bytes_written += FileSize(path);
  }
  if (o.checkpoint_shards > 1) {
    nlohmann::ordered_json index = {{"metadata", {{"total_size", checkpoint_bytes}}},
                                    {"weight_map", weight_map}};
    if (auto st = WriteText((fs::path(files.checkpoint_dir) / "model.safetensors.index.json").string(),
                            index.dump(2) + "\n");
        !st.ok()) {
      return st;
    }
  }

  // Dumps: every rank sees the same forward pass; K/V and row-parallel inputs are its shard.
  const int local_heads = o.num_kv_heads / o.tp_size;
  for (int batch = 0; batch < o.batches; ++batch) {
    std::vector<SafetensorsWriter> ranks(o.tp_size);
    for (int r = 0; r < o.tp_size; ++r) {
      ranks[r].SetMetadata("format", "pt");
      ranks[r].SetMetadata("tp_rank", std::to_string(r));
      ranks[r].SetMetadata("tp_size", std::to_string(o.tp_size));
      ranks[r].SetMetadata("batch", std::to_string(batch));
    }
    for (int layer = 0; layer < o.num_layers; ++layer) {
      const Matrix keys = KeysFor(o, layer, batch), values = ValuesFor(o, layer, batch);
      const Matrix attn_in = AttnInputFor(o, layer, batch), mlp_in = MlpInputFor(o, layer, batch);
      const Matrix o_in = OInputFor(o, layer, batch), down_in = DownInputFor(o, layer, batch);
      const std::string attn = absl::StrCat("model.layers.", layer, ".self_attn.");
      const std::string mlp = absl::StrCat("model.layers.", layer, ".mlp.");
      for (int r = 0; r < o.tp_size; ++r) {
        SafetensorsWriter& w = ranks[r];
        const int64_t kv_begin = static_cast<int64_t>(r) * local_heads * head_dim;
        const int64_t kv_local = static_cast<int64_t>(local_heads) * head_dim;
        const std::vector<int64_t> kv_shape = {o.tokens, local_heads, head_dim};
        const int64_t o_width = o.hidden_size / o.tp_size;
        const int64_t down_width = o.intermediate_size / o.tp_size;
        for (auto st : {AddBF16(w, attn + "k", Columns(keys, kv_begin, kv_local), kv_shape),
                        AddBF16(w, attn + "v", Columns(values, kv_begin, kv_local), kv_shape),
                        AddBF16(w, attn + "q_proj.input", attn_in, {o.tokens, o.hidden_size}),
                        AddBF16(w, attn + "k_proj.input", attn_in, {o.tokens, o.hidden_size}),
                        AddBF16(w, attn + "v_proj.input", attn_in, {o.tokens, o.hidden_size}),
                        AddBF16(w, attn + "o_proj.input", Columns(o_in, r * o_width, o_width),
                                {o.tokens, o_width}),
                        AddBF16(w, mlp + "gate_proj.input", mlp_in, {o.tokens, o.hidden_size}),
                        AddBF16(w, mlp + "up_proj.input", mlp_in, {o.tokens, o.hidden_size}),
                        AddBF16(w, mlp + "down_proj.input",
                                Columns(down_in, r * down_width, down_width),
                                {o.tokens, down_width})}) {
          if (!st.ok()) return st;
        }
      }
    }
    for (int r = 0; r < o.tp_size; ++r) {
      const std::string path =
          (dumps_dir / absl::StrCat("rank", r, "_batch", batch, ".safetensors")).string();
      if (auto st = ranks[r].WriteFile(path); !st.ok()) return st;
      files.dumps.push_back(path);
      files.bytes_written += FileSize(path);
    }
  }
  return files;
}

}  // namespace caliper
