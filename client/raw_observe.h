// Observe requests written without copying the tensor payload. Protobuf fields may be
// concatenated, so the serialized TensorChunk header (every field but `data`) followed by field
// 15 (`data`) as a slice over the caller's memory is a valid TensorChunk on the wire: the bytes
// the generated stub would send, minus its two copies of the payload (into the message, then
// into the serialized buffer).
#ifndef CALIPER_CLIENT_RAW_OBSERVE_H_
#define CALIPER_CLIENT_RAW_OBSERVE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/codegen/serialization_traits.h>

#include "proto/caliper.grpc.pb.h"  // with the protobuf SerializationTraits

namespace caliper::cli {

// A pre-serialized TensorChunk. The payload is referenced, not owned: it must stay valid until
// the Observe call that writes it has finished.
struct SerializedChunk {
  grpc::ByteBuffer buffer;
};

// `header` must not have `data` set; `data` is referenced as `bytes` bytes.
SerializedChunk SerializeChunk(const v1::TensorChunk& header, const uint8_t* data, size_t bytes);

// Opens caliper.v1.Calibration/Observe on `channel` for SerializedChunk writes; the summary
// arrives in `summary` when Finish returns.
std::unique_ptr<grpc::ClientWriter<SerializedChunk>> OpenObserveWriter(
    const std::shared_ptr<grpc::ChannelInterface>& channel, grpc::ClientContext* context,
    v1::ObserveSummary* summary);

}  // namespace caliper::cli

template <>
class grpc::SerializationTraits<caliper::cli::SerializedChunk, void> {
 public:
  static grpc::Status Serialize(const caliper::cli::SerializedChunk& chunk, grpc::ByteBuffer* out,
                                bool* own_buffer) {
    *out = chunk.buffer;  // slice references: the payload is not copied
    *own_buffer = true;
    return grpc::Status::OK;
  }
  static grpc::Status Deserialize(grpc::ByteBuffer*, caliper::cli::SerializedChunk*) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "SerializedChunk is write-only");
  }
};

#endif  // CALIPER_CLIENT_RAW_OBSERVE_H_
