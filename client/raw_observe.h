// Observe requests written without copying the tensor payload. Protobuf fields may be
// concatenated, so the serialized TensorChunk header (every field but `data`) followed by the
// `data` field (proto/tensor_chunk_wire.h) as a slice over the caller's memory is a valid
// TensorChunk on the wire: the bytes the generated stub would send, minus its two copies of the
// payload (into the message, then into the serialized buffer). Sent through gRPC's public generic
// API (grpc::GenericStub over ByteBuffers).
#ifndef CALIPER_CLIENT_RAW_OBSERVE_H_
#define CALIPER_CLIENT_RAW_OBSERVE_H_

#include <cstddef>
#include <cstdint>
#include <memory>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "proto/caliper.pb.h"

namespace caliper::cli {

// A pre-serialized TensorChunk. The payload is referenced, not owned: it must stay valid until
// the Observe call that writes it has finished.
struct SerializedChunk {
  grpc::ByteBuffer buffer;
};

// `header` must not have `data` set; `data` is referenced as `bytes` bytes.
SerializedChunk SerializeChunk(const v1::TensorChunk& header, const uint8_t* data, size_t bytes);

// One caliper.v1.Calibration/Observe call, used as the generated stub's ClientWriter is: Write
// until it fails (the server ended the stream), WritesDone, then Finish for the status, with the
// ObserveSummary in the `summary` given to OpenObserveWriter. One thread at a time.
class ObserveWriter {
 public:
  ObserveWriter(const std::shared_ptr<grpc::ChannelInterface>& channel,
                grpc::ClientContext* context, v1::ObserveSummary* summary);
  ~ObserveWriter();
  ObserveWriter(const ObserveWriter&) = delete;
  ObserveWriter& operator=(const ObserveWriter&) = delete;

  bool Write(const SerializedChunk& chunk);
  bool WritesDone();
  grpc::Status Finish();

 private:
  bool Await();  // the one operation in flight

  grpc::GenericStub stub_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;
  v1::ObserveSummary* summary_;
  bool open_ = false;        // started, and no operation has failed since
  bool writes_done_ = false;
  bool finished_ = false;
};

std::unique_ptr<ObserveWriter> OpenObserveWriter(
    const std::shared_ptr<grpc::ChannelInterface>& channel, grpc::ClientContext* context,
    v1::ObserveSummary* summary);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_RAW_OBSERVE_H_
