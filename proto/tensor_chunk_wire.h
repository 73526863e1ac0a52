// TensorChunk's wire layout that the zero-copy paths rely on: the CLI's writer appends `data` to
// the serialized header (client/raw_observe.h), the server reads it in place from the received
// slices (server/raw_tensor_chunk.h). Both take the field number from here.
#ifndef CALIPER_PROTO_TENSOR_CHUNK_WIRE_H_
#define CALIPER_PROTO_TENSOR_CHUNK_WIRE_H_

#include <cstdint>

#include "proto/caliper.pb.h"

namespace caliper::wire {

inline constexpr uint32_t kTensorChunkDataField = 15;  // TensorChunk.data, length-delimited
static_assert(kTensorChunkDataField == v1::TensorChunk::kDataFieldNumber,
              "TensorChunk.data moved: the zero-copy writer and reader must follow");

// Protobuf wire types.
inline constexpr uint32_t kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5;

}  // namespace caliper::wire

#endif  // CALIPER_PROTO_TENSOR_CHUNK_WIRE_H_
