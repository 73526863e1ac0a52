#include "client/raw_observe.h"

#include <string>

#include <grpcpp/impl/rpc_method.h>
#include <grpcpp/support/sync_stream.h>

namespace caliper::cli {

SerializedChunk SerializeChunk(const v1::TensorChunk& header, const uint8_t* data, size_t bytes) {
  constexpr uint32_t kDataField = 15;  // TensorChunk.data
  std::string prefix = header.SerializeAsString();
  prefix.push_back(static_cast<char>((kDataField << 3) | 2));  // length-delimited
  for (uint64_t v = bytes;; v >>= 7) {                       // varint length
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

std::unique_ptr<grpc::ClientWriter<SerializedChunk>> OpenObserveWriter(
    const std::shared_ptr<grpc::ChannelInterface>& channel, grpc::ClientContext* context,
    v1::ObserveSummary* summary) {
  const ::grpc::internal::RpcMethod method(
      "/caliper.v1.Calibration/Observe", ::grpc::internal::RpcMethod::CLIENT_STREAMING, channel);
  return std::unique_ptr<grpc::ClientWriter<SerializedChunk>>(
      ::grpc::internal::ClientWriterFactory<SerializedChunk>::Create(channel.get(), method,
                                                                     context, summary));
}

}  // namespace caliper::cli
