#include "tests/fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/formats/lightllm_format.h"
#include "core/calibration/model_config.h"
#include "core/state/observer_codec.h"
#include "core/calibration/observers.h"
#include "core/tensor/reduction_backend.h"
#include "core/formats/safetensors.h"
#include "core/session/session.h"
#include "core/state/state_file.h"
#include "core/tensor/tensor_view.h"

namespace caliper::fuzz {
namespace {

// A broken property is a crash the fuzzer should report, in both builds.
void Require(bool holds, const char* what) {
  if (holds) return;
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}

absl::string_view AsText(const uint8_t* data, size_t size) {
  return absl::string_view(reinterpret_cast<const char*>(data), size);
}

ReductionBackend& Backend() {
  static ReductionBackend* backend = MakeCpuBackend(1).release();
  return *backend;
}

// Consumes fields from the front of the input; returns zeros once it runs out.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t U8() { return pos_ < size_ ? data_[pos_++] : 0; }
  int64_t I64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(U8()) << (8 * i);
    return static_cast<int64_t>(v);
  }
  // Small values most of the time, anything (negative, huge) sometimes.
  int64_t Dim() {
    const uint8_t b = U8();
    if (b < 0xF0) return b % 9;
    return I64();
  }
  std::string Text(size_t max) {
    const size_t n = std::min<size_t>(U8() % (max + 1), size_ - pos_);
    std::string out(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return out;
  }
  absl::Span<const uint8_t> Rest() {
    auto out = absl::Span<const uint8_t>(data_ + pos_, size_ - pos_);
    pos_ = size_;
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace

int FuzzSafetensors(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::FromBytes(std::string(AsText(data, size)));
  if (!file.ok()) return 0;
  for (const SafetensorsEntry& entry : (*file)->tensors()) {
    Require(entry.begin <= entry.end, "safetensors entry begin <= end");
    absl::Span<const uint8_t> bytes = (*file)->Data(entry);
    Require(bytes.size() == entry.end - entry.begin, "safetensors Data() size");
    Require((*file)->Find(entry.name) != nullptr, "safetensors Find() of a listed tensor");
    uint8_t sink = 0;
    for (uint8_t b : bytes) sink ^= b;  // ASan checks every byte is inside the buffer
    (void)sink;
    auto view = (*file)->View(entry);
    if (view.ok()) ReduceRange(*view, Backend(), entry.name).status().IgnoreError();
  }
  return 0;
}

int FuzzLightLlm(const uint8_t* data, size_t size) {
  auto parsed = ParseLightLlmCalibration(AsText(data, size));
  if (!parsed.ok()) return 0;
  // What we accept we must be able to write back and read again.
  const std::string text = SerializeLightLlmCalibration(*parsed);
  auto again = ParseLightLlmCalibration(text);
  Require(again.ok(), "serialized LightLLM calibration re-parses");
  Require(again->scales.size() == parsed->scales.size(), "LightLLM round trip keeps rows");
  for (int heads : {1, 2, 4, 8, parsed->num_head * 2}) {
    AdaptLightLlmCalibration(*parsed, heads).status().IgnoreError();
  }
  return 0;
}

int FuzzHfConfig(const uint8_t* data, size_t size) {
  auto config = ParseHfConfig(AsText(data, size));
  if (config.ok()) ValidateModelConfig(*config).IgnoreError();
  return 0;
}

int FuzzObserverCodec(const uint8_t* data, size_t size) {
  const absl::string_view bytes = AsText(data, size);
  // Canonical encoding: anything that decodes re-encodes to exactly the same bytes (K/V and
  // activation blobs of version 1 decode too, and re-encode as the current version).
  // K/V layers: versions 3 (no query) and 4 (with one) are both current; activations: 3.
  const bool current = size > 1 && data[1] == 3;
  const bool current_kv = size > 1 && (data[1] == 3 || data[1] == kObserverCodecVersion);
  if (auto kv = DecodeKvLayerObserver(bytes); kv.ok()) {
    Require(!current_kv || EncodeKvLayerObserver(*kv) == bytes, "kv_layer canonical");
    Require(DecodeKvLayerObserver(EncodeKvLayerObserver(*kv)).ok(), "kv_layer round trip");
  }
  if (auto mm = DecodeMinMaxObserver(bytes); mm.ok()) {
    Require(EncodeMinMaxObserver(*mm) == bytes, "minmax canonical");
  }
  if (auto act = DecodeActivationObserver(bytes); act.ok()) {
    Require(!current || EncodeActivationObserver(*act) == bytes, "activation canonical");
    act->AbsMax(ActivationObserverKind::kMinMax, 0.01);
  }
  if (auto hist = DecodeHistogram(bytes); hist.ok()) {
    Require(EncodeHistogram(*hist) == bytes, "histogram canonical");
  }
  if (auto seqs = DecodeProducerSequences(bytes); seqs.ok()) {
    Require(EncodeProducerSequences(*seqs) == bytes, "producers canonical");
  }
  if (auto payload = UnframeStatePayload(bytes, "fuzz"); payload.ok()) {
    Require(FrameStatePayload(*payload) == bytes, "state frame canonical");
  }
  return 0;
}

int FuzzChunk(const uint8_t* data, size_t size) {
  ByteReader in(data, size);
  static const DType kDTypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  const DType dtype = kDTypes[in.U8() % 3];
  std::vector<int64_t> shape(in.U8() % 5);
  for (int64_t& dim : shape) dim = in.Dim();

  ModelConfig model;
  model.architecture = "LlamaForCausalLM";
  model.num_layers = 2;
  model.num_attention_heads = 4;
  model.num_kv_heads = 1 << (in.U8() % 3);  // 1, 2 or 4
  model.head_dim = 1 + in.U8() % 4;
  model.hidden_size = model.num_attention_heads * model.head_dim;
  Recipe recipe;
  const uint8_t flags = in.U8();
  recipe.kv = static_cast<KvMode>(flags % 3);
  recipe.nvfp4_weights = flags & 4;
  recipe.nvfp4_activations = flags & 8;
  recipe.activation_observer = (flags & 16) ? ActivationObserverKind::kMinMax
                                            : ActivationObserverKind::kStaticMinMax;
  recipe.warmup_batches = (flags & 32) ? 1 : 0;

  ChunkRef chunk;
  chunk.kind = static_cast<ChunkKind>(in.U8() % 4);
  chunk.layer = static_cast<int>(static_cast<int8_t>(in.U8()));
  const std::string module = in.Text(12);
  chunk.module = module;
  chunk.dtype = dtype;
  chunk.shape = shape;
  chunk.placement.tp_size = static_cast<int8_t>(in.U8());
  chunk.placement.tp_rank = static_cast<int8_t>(in.U8());
  chunk.batch = static_cast<int8_t>(in.U8());
  const absl::Span<const uint8_t> payload = in.Rest();
  chunk.data = payload;

  auto view = TensorView::Create(dtype, shape, payload, "chunk");
  if (view.ok()) {
    Require(view->bytes().size() == payload.size(), "view covers the payload");
    Require(static_cast<uint64_t>(view->num_elements()) * ItemSize(dtype) == payload.size(),
            "elements * itemsize == bytes");
  }
  auto session = CalibrationSession::Create(model, recipe, "fuzz");
  if (!session.ok()) return 0;
  const int64_t accepted_before = (*session)->Status().accepted_chunks;
  auto outcome = (*session)->Observe(chunk, Backend());
  if (std::getenv("CALIPER_FUZZ_VERBOSE") != nullptr) {  // to check that seeds reach the fold
    std::fprintf(stderr, "chunk: %s\n", outcome.status().ToString().c_str());
  }
  const int64_t accepted_after = (*session)->Status().accepted_chunks;
  if (!outcome.ok()) Require(accepted_after == accepted_before, "rejected chunk changes nothing");
  if ((*session)->Finalize().ok()) {
    for (int tp : {1, 2, 4}) {
      Deployment deployment;
      deployment.tp_size = tp;
      (*session)->Scales(deployment, Nvfp4Convention::kModelOpt).status().IgnoreError();
    }
  }
  return 0;
}

}  // namespace caliper::fuzz
