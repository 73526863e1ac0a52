#include "client/raw_observe.h"

#include <string>
#include <vector>

#include "proto/tensor_chunk_wire.h"

namespace caliper::cli {

SerializedChunk SerializeChunk(const v1::TensorChunk& header, const uint8_t* data, size_t bytes) {
  std::string prefix = header.SerializeAsString();
  prefix.push_back(static_cast<char>((wire::kTensorChunkDataField << 3) | wire::kLengthDelimited));
  for (uint64_t v = bytes;; v >>= 7) {  // varint length
    if (v < 0x80) {
      prefix.push_back(static_cast<char>(v));
      break;
    }
    prefix.push_back(static_cast<char>((v & 0x7f) | 0x80));
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix),
                           grpc::Slice(data, bytes, grpc::Slice::STATIC_SLICE)};
  return SerializedChunk{grpc::ByteBuffer(slices, 2)};
}

ObserveWriter::ObserveWriter(const std::shared_ptr<grpc::ChannelInterface>& channel,
                             grpc::ClientContext* context, v1::ObserveSummary* summary)
    : stub_(channel), summary_(summary) {
  call_ = stub_.PrepareCall(context, "/caliper.v1.Calibration/Observe", &cq_);
  call_->StartCall(this);
  open_ = Await();
}

ObserveWriter::~ObserveWriter() {
  if (!finished_) Finish();
  cq_.Shutdown();
  void* tag;
  bool ok;
  while (cq_.Next(&tag, &ok)) {
  }
}

bool ObserveWriter::Await() {
  void* tag = nullptr;
  bool ok = false;
  return cq_.Next(&tag, &ok) && ok;
}

bool ObserveWriter::Write(const SerializedChunk& chunk) {
  if (!open_ || writes_done_) return false;
  call_->Write(chunk.buffer, this);  // copies slice references, not the payload
  open_ = Await();
  return open_;
}

bool ObserveWriter::WritesDone() {
  if (!open_ || writes_done_) return false;
  writes_done_ = true;
  call_->WritesDone(this);
  open_ = Await();
  return open_;
}

grpc::Status ObserveWriter::Finish() {
  if (finished_) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "Finish called twice");
  finished_ = true;
  // A client-streaming call answers once, after the client's half-close.
  if (open_ && !writes_done_) WritesDone();
  grpc::ByteBuffer response;
  bool have_response = false;
  if (open_) {
    call_->Read(&response, this);
    have_response = Await();
  }
  grpc::Status status;
  call_->Finish(&status, this);
  Await();
  if (!status.ok()) return status;
  std::vector<grpc::Slice> slices;
  if (!have_response || !response.Dump(&slices).ok()) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "Observe ended OK without an ObserveSummary");
  }
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  if (!summary_->ParseFromString(bytes)) {
    return grpc::Status(grpc::StatusCode::INTERNAL, "Observe: the ObserveSummary does not parse");
  }
  return status;
}

std::unique_ptr<ObserveWriter> OpenObserveWriter(
    const std::shared_ptr<grpc::ChannelInterface>& channel, grpc::ClientContext* context,
    v1::ObserveSummary* summary) {
  return std::make_unique<ObserveWriter>(channel, context, summary);
}

}  // namespace caliper::cli
