#include "client/tensor_stream.h"

#include <algorithm>
#include <filesystem>
#include <ostream>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/formats/checkpoint.h"
#include "core/formats/moe_layout.h"
#include "core/tensor/dtype.h"
#include "client/raw_observe.h"

namespace caliper::cli {
namespace {

namespace fs = std::filesystem;

// "model.layers.12.self_attn.k" -> layer 12, kind KEY (".v": VALUE, ".q": QUERY). Other names
// -> false.
bool ParseKvName(const std::string& name, int* layer, v1::TargetKind* kind) {
  const std::string marker = "layers.";
  const size_t at = name.rfind(marker);
  if (at == std::string::npos) return false;
  const size_t digits = at + marker.size();
  size_t end = digits;
  while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
  if (end == digits) return false;
  const std::string rest = name.substr(end);
  if (rest == ".self_attn.k") {
    *kind = v1::KEY;
  } else if (rest == ".self_attn.v") {
    *kind = v1::VALUE;
  } else if (rest == ".self_attn.q") {
    *kind = v1::QUERY;
  } else {
    return false;
  }
  return absl::SimpleAtoi(name.substr(digits, end - digits), layer);
}

absl::StatusOr<int64_t> MetadataInt(const SafetensorsFile& file, const std::string& path,
                                    const std::string& key, int64_t fallback) {
  auto it = file.metadata().find(key);
  if (it == file.metadata().end()) return fallback;
  int64_t value = 0;
  if (!absl::SimpleAtoi(it->second, &value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__.", key,
                                                   ": expected a non-negative integer, got \"",
                                                   it->second, "\""));
  }
  return value;
}

// Splits one tensor along dim 0 into pieces of at most chunk_bytes (at least one row each).
void AddChunks(const SafetensorsFile& file, const SafetensorsEntry& entry, PlannedChunk base,
               int64_t chunk_bytes, StreamPlan* plan) {
  const auto data = file.Data(entry);
  base.dtype = entry.dtype;
  base.tensor = entry.name;
  const int64_t rows = entry.shape.empty() ? 0 : entry.shape[0];
  if (entry.shape.size() < 2 || rows <= 1 || static_cast<int64_t>(data.size()) <= chunk_bytes) {
    base.shape = entry.shape;
    base.data = data.data();
    base.bytes = data.size();
    plan->chunks.push_back(std::move(base));
    plan->bytes += static_cast<int64_t>(data.size());
    return;
  }
  const int64_t row_bytes = static_cast<int64_t>(data.size()) / rows;
  const int64_t rows_per_chunk = std::max<int64_t>(1, chunk_bytes / std::max<int64_t>(row_bytes, 1));
  for (int64_t row = 0; row < rows; row += rows_per_chunk) {
    const int64_t count = std::min(rows_per_chunk, rows - row);
    PlannedChunk chunk = base;
    chunk.shape = entry.shape;
    chunk.shape[0] = count;
    chunk.first_row = row;
    chunk.data = data.data() + row * row_bytes;
    chunk.bytes = static_cast<size_t>(count * row_bytes);
    plan->bytes += static_cast<int64_t>(chunk.bytes);
    plan->chunks.push_back(std::move(chunk));
  }
}

absl::Status CheckDType(const std::string& path, const SafetensorsEntry& entry) {
  auto dtype = ParseDType(entry.dtype, absl::StrCat(path, ": ", entry.name, ".dtype"));
  return dtype.ok() ? absl::OkStatus() : dtype.status();
}

}  // namespace

absl::StatusOr<StreamPlan> PlanDumpFile(const std::string& path, const PlanOptions& options,
                                        int64_t default_batch) {
  StreamPlan plan;
  plan.path = path;
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  plan.file = std::move(*file);
  auto rank = MetadataInt(*plan.file, path, "tp_rank", 0);
  auto size = MetadataInt(*plan.file, path, "tp_size", 1);
  auto batch = MetadataInt(*plan.file, path, "batch", default_batch);
  for (const auto* st : {&rank.status(), &size.status(), &batch.status()}) {
    if (!st->ok()) return *st;
  }
  if (*size < 1 || *rank >= *size || *size > (1 << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": __metadata__.tp_rank ", *rank,
                                                   " must be below tp_size ", *size));
  }
  plan.tp_rank = static_cast<int>(*rank);
  plan.tp_size = static_cast<int>(*size);
  plan.batch = *batch;
  for (const SafetensorsEntry& entry : plan.file->tensors()) {
    PlannedChunk base;
    if (ParseKvName(entry.name, &base.layer, &base.kind)) {
      if (base.kind == v1::QUERY ? !options.query : !options.kv) {
        plan.skipped.push_back(entry.name);
        continue;
      }
    } else if (absl::EndsWith(entry.name, ".input") && entry.name.size() > 6) {
      if (!options.inputs) {
        plan.skipped.push_back(entry.name);
        continue;
      }
      base.kind = v1::INPUT_ACTIVATION;
      base.module = entry.name.substr(0, entry.name.size() - 6);
      if (IsMoeRouterModule(base.module)) {
        plan.ignored.push_back(base.module);
        continue;
      }
    } else {
      plan.skipped.push_back(entry.name);
      continue;
    }
    if (auto st = CheckDType(path, entry); !st.ok()) return st;
    AddChunks(*plan.file, entry, std::move(base), options.chunk_bytes, &plan);
  }
  return plan;
}

absl::StatusOr<std::vector<std::string>> CheckpointFiles(const std::string& dir) {
  auto checkpoint = HfCheckpoint::Open(dir);
  if (!checkpoint.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--weights: ", checkpoint.status().message()));
  }
  std::vector<std::string> files;
  for (const auto& shard : (*checkpoint)->shard_files()) files.push_back((fs::path(dir) / shard).string());
  return files;
}

absl::StatusOr<StreamPlan> PlanWeightFile(const std::string& path, int64_t chunk_bytes) {
  StreamPlan plan;
  plan.path = path;
  auto file = SafetensorsFile::Open(path);
  if (!file.ok()) return file.status();
  plan.file = std::move(*file);
  for (const SafetensorsEntry& entry : plan.file->tensors()) {
    if (!IsQuantizableLinearWeight(entry)) {
      plan.skipped.push_back(entry.name);
      continue;
    }
    PlannedChunk base;
    base.kind = v1::WEIGHT;
    base.module = entry.name.substr(0, entry.name.size() - 7);
    if (IsMoeRouterModule(base.module)) {
      plan.ignored.push_back(base.module);
      continue;
    }
    AddChunks(*plan.file, entry, std::move(base), chunk_bytes, &plan);
  }
  return plan;
}

v1::TensorChunk ChunkHeader(const StreamPlan& plan, size_t index, const std::string& session_id,
                            uint64_t sequence, const std::string& producer_id) {
  const PlannedChunk& chunk = plan.chunks[index];
  v1::TensorChunk header;
  header.set_session_id(session_id);
  header.set_kind(chunk.kind);
  header.set_layer(chunk.layer);
  header.set_module(chunk.module);
  header.set_dtype(chunk.dtype);
  for (int64_t d : chunk.shape) header.add_shape(d);
  header.set_tp_rank(plan.tp_rank);
  header.set_tp_size(plan.tp_size);
  header.set_batch(plan.batch);
  header.set_sequence(sequence);
  header.set_producer_id(producer_id);
  return header;
}

namespace {

// One Observe call sending chunks [first, end) of `plan` as sequences first+1, ... The payload
// goes out as a slice over the plan's mapping (client/raw_observe.h), never copied.
StreamResult StreamChunksOnce(const std::shared_ptr<grpc::Channel>& channel,
                              const std::string& session_id, const StreamPlan& plan, size_t first,
                              const std::string& producer_id, std::atomic<int64_t>* sent_bytes) {
  StreamResult result;
  grpc::ClientContext context;
  auto writer = OpenObserveWriter(channel, &context, &result.summary);
  for (size_t i = first; i < plan.chunks.size(); ++i) {
    const PlannedChunk& chunk = plan.chunks[i];
    // Producer sequences count from 1.
    const v1::TensorChunk header = ChunkHeader(plan, i, session_id, i + 1, producer_id);
    // The server ended the stream when Write fails; Finish says why.
    if (!writer->Write(SerializeChunk(header, chunk.data, chunk.bytes))) break;
    if (sent_bytes != nullptr) sent_bytes->fetch_add(static_cast<int64_t>(chunk.bytes));
  }
  writer->WritesDone();
  result.status = writer->Finish();  // after this gRPC holds no reference to the mapping
  return result;
}

// The stream broke rather than the server refusing it (DEADLINE_EXCEEDED cannot happen: no
// deadline on Observe).
bool IsConnectionLoss(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAVAILABLE ||
         status.error_code() == grpc::StatusCode::CANCELLED ||
         status.error_code() == grpc::StatusCode::ABORTED;
}

void AddSummary(const v1::ObserveSummary& from, v1::ObserveSummary* to) {
  to->set_accepted_chunks(to->accepted_chunks() + from.accepted_chunks());
  to->set_rejected_chunks(to->rejected_chunks() + from.rejected_chunks());
  to->set_accepted_bytes(to->accepted_bytes() + from.accepted_bytes());
  to->set_rejected_bytes(to->rejected_bytes() + from.rejected_bytes());
  to->set_skipped_warmup_chunks(to->skipped_warmup_chunks() + from.skipped_warmup_chunks());
  to->set_duplicate_chunks(to->duplicate_chunks() + from.duplicate_chunks());
  for (const auto& e : from.errors()) *to->add_errors() = e;
}

}  // namespace

StreamResult StreamPlanToSession(const std::shared_ptr<grpc::Channel>& channel,
                                 const std::string& session_id, const StreamPlan& plan,
                                 const std::string& producer_id,
                                 std::atomic<int64_t>* sent_bytes) {
  RetryPolicy no_retries;
  no_retries.max_attempts = 1;
  return StreamPlanWithResume(channel, session_id, plan, producer_id, sent_bytes, no_retries,
                              nullptr);
}

StreamResult StreamPlanWithResume(const std::shared_ptr<grpc::Channel>& channel,
                                  const std::string& session_id, const StreamPlan& plan,
                                  const std::string& producer_id,
                                  std::atomic<int64_t>* sent_bytes, const RetryPolicy& policy,
                                  std::ostream* log) {
  StreamResult total;
  const std::unique_ptr<v1::Calibration::Stub> stub = v1::Calibration::NewStub(channel);
  Backoff backoff(policy, log, plan.path);
  size_t first = 0;
  for (;;) {
    StreamResult result =
        StreamChunksOnce(channel, session_id, plan, first, producer_id, sent_bytes);
    AddSummary(result.summary, &total.summary);
    total.status = result.status;
    if (result.status.ok() || !IsConnectionLoss(result.status) ||
        !backoff.Wait("connection lost")) {
      return total;
    }
    // Where this producer goes on; the server may still be restarting, so Resume retries too.
    v1::ResumeRequest request;
    request.set_session_id(session_id);
    request.set_producer_id(producer_id);
    v1::ResumeResponse response;
    grpc::Status status = CallWithRetry(backoff, [&](grpc::ClientContext& context) {
      return stub->Resume(&context, request, &response);
    });
    if (!status.ok()) {
      total.status = status;  // e.g. NOT_FOUND: the session is gone
      return total;
    }
    const size_t next = static_cast<size_t>(std::max<uint64_t>(response.next_sequence(), 1) - 1);
    if (next > first) backoff.Reset();  // the server counted more: a fresh budget
    first = next;
    if (first >= plan.chunks.size()) {
      total.status = grpc::Status::OK;  // everything was counted before the connection dropped
      return total;
    }
    if (log != nullptr) {
      *log << "resuming " << plan.path << " from sequence " << first + 1 << "\n" << std::flush;
    }
  }
}

}  // namespace caliper::cli
