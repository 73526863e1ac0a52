// Turns safetensors files into Observe streams: K/V, query and activation dumps (tensor names
// `model.layers.{L}.self_attn.k|v|q`, `{module}.input`; `__metadata__` tp_rank/tp_size/batch) and
// HF checkpoint weights (`{module}.weight`). Tensors are split along their first dimension into
// chunks of at most `chunk_bytes`; each file is one producer (exactly-once, docs/durability.md):
// chunk i goes out as sequence i + 1, so a resumed stream re-sends only what the server has not
// counted.
#ifndef CALIPER_CLIENT_TENSOR_STREAM_H_
#define CALIPER_CLIENT_TENSOR_STREAM_H_

#include <atomic>
#include <cstdint>
#include <ostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/rpc_retry.h"
#include "core/formats/safetensors.h"
#include "grpcpp/grpcpp.h"
#include "proto/caliper.grpc.pb.h"

namespace caliper::cli {

struct PlannedChunk {
  v1::TargetKind kind = v1::TARGET_UNSPECIFIED;
  int layer = 0;
  std::string module;
  std::string dtype;
  std::vector<int64_t> shape;  // of this chunk
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  std::string tensor;          // source tensor name, for error reports
  int64_t first_row = 0;       // rows [first_row, first_row + shape[0]) of the tensor
};

struct StreamPlan {
  std::string path;
  std::unique_ptr<SafetensorsFile> file;  // owns the mapping the chunks point into
  int tp_rank = 0, tp_size = 1;
  int64_t batch = 0;
  std::vector<PlannedChunk> chunks;  // index == sequence number
  int64_t bytes = 0;
  std::vector<std::string> skipped;  // tensors with names or dtypes this recipe does not stream
  // Modules every recipe ignores (MoE routers: never quantized, as the hooks and `caliper
  // quantize` treat them), so no scale is ever written for them.
  std::vector<std::string> ignored;
};

struct PlanOptions {
  bool kv = true;              // stream K/V
  bool query = false;          // stream the query after RoPE (recipe attention q)
  bool inputs = false;         // stream {module}.input
  int64_t chunk_bytes = 4 << 20;
};

// A dump file. `default_batch` is used when the metadata has no batch. Errors (unreadable file,
// bad metadata, a dtype other than BF16/F16/F32 on a streamed tensor) name the file and field.
absl::StatusOr<StreamPlan> PlanDumpFile(const std::string& path, const PlanOptions& options,
                                        int64_t default_batch);

// The safetensors files of an HF checkpoint directory (core/checkpoint.h: the shards of
// model.safetensors.index.json, else model.safetensors, else every *.safetensors).
absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir);

// Weights of one checkpoint file that IsQuantizableLinearWeight accepts (2-D float
// `{module}.weight`, not embeddings or lm_head), routers aside (`ignored`).
absl::StatusOr<StreamPlan> PlanWeightFile(const std::string& path, int64_t chunk_bytes);

// Chunk `index` of `plan` as a TensorChunk with every field but `data`.
v1::TensorChunk ChunkHeader(const StreamPlan& plan, size_t index, const std::string& session_id,
                            uint64_t sequence, const std::string& producer_id);

struct StreamResult {
  grpc::Status status;
  v1::ObserveSummary summary;
};

// Streams every chunk of `plan` into `session_id` on one Observe call. `sent_bytes` grows as
// chunks are written (for progress). `producer_id` identifies the stream for de-duplication.
// The payload is written without a copy (client/raw_observe.h).
StreamResult StreamPlanToSession(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& session_id, const StreamPlan& plan,
                                 const std::string& producer_id,
                                 std::atomic<int64_t>* sent_bytes);

// As StreamPlanToSession, but after a lost connection (UNAVAILABLE, CANCELLED, ABORTED) asks the
// server (Resume) where the producer goes on and re-sends the rest, printing
// "<file>: connection lost, retrying in 200ms (attempt k/M)" and "resuming <file> from sequence N"
// to `log` (may be null). The retry budget starts over whenever the server has counted more of
// the stream, so a long run survives many drops but a chunk that keeps breaking the connection
// does not loop forever. The summary adds up every attempt that ended with one; chunks
// acknowledged by a stream that broke are counted by the server only.
StreamResult StreamPlanWithResume(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& session_id, const StreamPlan& plan,
                                  const std::string& producer_id,
                                  std::atomic<int64_t>* sent_bytes, const RetryPolicy& policy,
                                  std::ostream* log);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_TENSOR_STREAM_H_
