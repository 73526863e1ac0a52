// safetensors files (docs/formats.md): an 8-byte little-endian header length, a JSON header, then
// raw little-endian data. The reader memory-maps the file, so a tensor is read straight from the
// page cache and a checkpoint of any size needs no more RAM than the tensors being touched.
#ifndef CALIPER_CORE_FORMATS_SAFETENSORS_H_
#define CALIPER_CORE_FORMATS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/env/env.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

// Bits per element of a safetensors dtype string ("BF16" -> 16, "F4" -> 4), nullopt if unknown.
std::optional<int> SafetensorsDTypeBits(absl::string_view dtype);
// product(shape) * bits / 8; InvalidArgument naming `field` for an unknown dtype, a negative or
// overflowing shape, or sub-byte elements that do not fill whole bytes.
absl::StatusOr<uint64_t> SafetensorsByteSize(absl::string_view dtype,
                                             absl::Span<const int64_t> shape,
                                             absl::string_view field);

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // as written: "BF16", "F32", "F8_E4M3", "U8", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the end of the header
};

class SafetensorsFile {
 public:
  // Memory-maps `path`. Fails with a message naming the file (and the tensor) on a truncated file,
  // a header that is not a JSON object, an unknown dtype, offsets out of range, overlapping or
  // leaving gaps (the reference rejects those too), a byte size that disagrees with dtype*shape,
  // a duplicate name, or a __metadata__ that is not string -> string.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Same checks over bytes held in memory (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes);
  ~SafetensorsFile();

  // In data order (ascending begin).
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // O(log n) by name: `caliper check` and the merges look up thousands of names per file.
  const SafetensorsEntry* Find(absl::string_view name) const;
  absl::Span<const uint8_t> Data(const SafetensorsEntry& entry) const;
  // A view for statistics; InvalidArgument for dtypes other than BF16/F16/F32.
  // A scalar (shape []) is viewed as shape [1].
  absl::StatusOr<TensorView> View(const SafetensorsEntry& entry) const;
  // Drops the tensor's whole pages from this process's resident memory once read (mmap only),
  // so streaming a checkpoint keeps RSS near one tensor.
  void ReleasePages(const SafetensorsEntry& entry) const;
  const std::string& origin() const { return origin_; }  // path, or "<memory>"

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(absl::string_view origin);

  std::string origin_;                // for error messages
  std::string owned_;                 // FromBytes storage
  const uint8_t* base_ = nullptr;     // whole file
  size_t size_ = 0;
  void* mapping_ = nullptr;           // mmap result, or nullptr
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::vector<uint32_t> by_name_;     // indices into tensors_, sorted by name
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory. The header is padded with spaces so the data section starts
// 8-byte aligned; tensors are laid out widest dtype first (else insertion order) with no gaps, so
// each starts at a multiple of its item size, as the reference writer does.
class SafetensorsWriter {
 public:
  // InvalidArgument for an unknown dtype, a size that disagrees with shape, or a reserved name;
  // AlreadyExists for a name added twice.
  absl::Status Add(std::string name, std::string dtype, std::vector<int64_t> shape,
                   std::string bytes);
  void SetMetadata(std::string key, std::string value);
  std::string Serialize() const;
  // Serialize() written with WriteFileAtomically through `env`; errors are env's (I/O errors).
  absl::Status WriteFile(const std::string& path, Env* env = Env::Default()) const;

 private:
  struct Pending {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::string bytes;
  };
  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_FORMATS_SAFETENSORS_H_
