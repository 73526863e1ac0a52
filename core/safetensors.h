// safetensors files (domain.md 4): an 8-byte little-endian header length, a JSON header, then
// raw little-endian data. The reader memory-maps the file, so a tensor is read straight from the
// page cache and a checkpoint of any size needs no more RAM than the tensors being touched.
#ifndef CALIPER_CORE_SAFETENSORS_H_
#define CALIPER_CORE_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor_view.h"

namespace caliper {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;            // as written: "BF16", "F32", "F8_E4M3", "U8", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // relative to the end of the header
};

class SafetensorsFile {
 public:
  // Memory-maps `path`. Fails with a message naming the file on a truncated file, a header that is
  // not JSON, offsets out of range or overlapping, or a byte size that disagrees with dtype*shape.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Same checks over bytes held in memory (tests, fuzzing).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes);
  ~SafetensorsFile();

  // In data order (ascending begin).
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsEntry* Find(absl::string_view name) const;
  absl::Span<const uint8_t> Data(const SafetensorsEntry& entry) const;
  // A view for statistics; InvalidArgument for dtypes other than BF16/F16/F32.
  absl::StatusOr<TensorView> View(const SafetensorsEntry& entry) const;

 private:
  SafetensorsFile() = default;
  absl::Status ParseHeader(absl::string_view origin);

  std::string owned_;                 // FromBytes storage
  const uint8_t* base_ = nullptr;     // whole file
  size_t size_ = 0;
  void* mapping_ = nullptr;           // mmap result, or nullptr
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file in memory; tensors are laid out in insertion order, 8-byte aligned
// (the header is padded with spaces so the data section starts aligned, as the reference does).
class SafetensorsWriter {
 public:
  absl::Status Add(std::string name, std::string dtype, std::vector<int64_t> shape,
                   std::string bytes);
  void SetMetadata(std::string key, std::string value);
  std::string Serialize() const;
  absl::Status WriteFile(const std::string& path) const;  // atomic: temp file then rename

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

#endif  // CALIPER_CORE_SAFETENSORS_H_
