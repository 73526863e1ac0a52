// An Observe request read as the raw bytes gRPC received: the TensorChunk's small fields are
// parsed into a message while its `data` field stays where it is, inside the received slices,
// so the payload is never copied. Not thread-safe; not copyable (the data points into it).
#ifndef CALIPER_SERVER_RAW_TENSOR_CHUNK_H_
#define CALIPER_SERVER_RAW_TENSOR_CHUNK_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "core/tensor/tensor_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "proto/caliper.pb.h"

namespace caliper {

class RawTensorChunk {
 public:
  RawTensorChunk() = default;
  RawTensorChunk(const RawTensorChunk&) = delete;
  RawTensorChunk& operator=(const RawTensorChunk&) = delete;

  // Takes references to `buffer`'s slices and parses them with protobuf's rules (any field
  // order, unknown fields kept, the last `data` wins). InvalidArgument naming "chunk" when the
  // bytes are not a TensorChunk; the object is then empty.
  absl::Status Parse(const grpc::ByteBuffer& buffer);
  // Drops the slices (and the payload memory with them).
  void Clear();

  // Every field but data (header().data() is empty).
  const v1::TensorChunk& header() const { return header_; }
  // The data field, in place inside the slices this object holds.
  const ByteSpans& data() const { return data_; }

 private:
  std::vector<grpc::Slice> slices_;
  v1::TensorChunk header_;
  ByteSpans data_;
  std::string header_bytes_;  // the wire bytes of every field but data; reused across chunks
};

}  // namespace caliper

#endif  // CALIPER_SERVER_RAW_TENSOR_CHUNK_H_
