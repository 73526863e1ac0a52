// A safetensors file written as a stream: every tensor's name, dtype and shape is declared first
// (Plan), the header goes out, then each tensor's bytes are appended in the planned order, in as
// many pieces as the caller likes. Memory stays at one piece whatever the file size. Tensors are
// laid out widest dtype first (stable), as SafetensorsWriter does, so each starts at a multiple of
// its item size without gaps. Not thread-safe; the file is complete only after Finish().
#ifndef CALIPER_CORE_FORMATS_SAFETENSORS_STREAM_WRITER_H_
#define CALIPER_CORE_FORMATS_SAFETENSORS_STREAM_WRITER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/env/env.h"

namespace caliper {

class SafetensorsStreamWriter {
 public:
  struct Tensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
  };
  // Validates names (unique, not __metadata__), dtypes and shapes; the write order is order().
  static absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> Plan(
      std::vector<Tensor> tensors, std::map<std::string, std::string> metadata);
  ~SafetensorsStreamWriter();

  // Tensors in the order their bytes must be appended.
  const std::vector<Tensor>& order() const { return order_; }
  uint64_t data_bytes() const { return data_bytes_; }

  // Creates `path` (through `env`) and writes the header. Errors are the Env's, naming the path.
  absl::Status Open(const std::string& path, Env* env = Env::Default());
  // Appends bytes of the current tensor; FailedPrecondition when they overrun it.
  absl::Status Append(absl::Span<const uint8_t> bytes);
  // Checks that every tensor got exactly its bytes, fsyncs and closes.
  absl::Status Finish();

 private:
  SafetensorsStreamWriter() = default;

  std::vector<Tensor> order_;
  std::vector<uint64_t> sizes_;
  std::string header_;
  uint64_t data_bytes_ = 0;
  // Appends through a buffer of kBufferBytes, so scalars are not one write(2) each.
  absl::Status Write(absl::string_view bytes);
  absl::Status Flush();

  static constexpr size_t kBufferBytes = 1 << 20;
  std::string path_;
  std::unique_ptr<WritableFile> file_;
  std::string buffer_;
  size_t current_ = 0;       // tensor being written
  uint64_t written_ = 0;     // bytes of the current tensor so far
};

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_SAFETENSORS_STREAM_WRITER_H_
