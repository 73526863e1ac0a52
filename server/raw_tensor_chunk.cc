#include "server/raw_tensor_chunk.h"

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "proto/tensor_chunk_wire.h"

namespace caliper {
namespace {

using wire::kFixed32;
using wire::kFixed64;
using wire::kLengthDelimited;
using wire::kVarint;
constexpr uint32_t kDataField = wire::kTensorChunkDataField;

// Reads protobuf wire format sequentially across slices.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) {}

  bool AtEnd() {
    SkipEmpty();
    return index_ == slices_.size();
  }

  // Appends the varint's bytes to `copy` when it is not null.
  bool ReadVarint(uint64_t* value, std::string* copy) {
    *value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (AtEnd()) return false;
      const uint8_t byte = slices_[index_].begin()[offset_++];
      if (copy != nullptr) copy->push_back(static_cast<char>(byte));
      *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return true;
    }
    return false;  // more than 10 bytes
  }

  // Moves past n bytes, appending them to `copy` and/or their pieces to `spans` (no copy).
  bool Skip(uint64_t n, std::string* copy, ByteSpans* spans) {
    while (n > 0) {
      if (AtEnd()) return false;
      const grpc::Slice& slice = slices_[index_];
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, slice.size() - offset_));
      const uint8_t* p = slice.begin() + offset_;
      if (copy != nullptr) copy->append(reinterpret_cast<const char*>(p), take);
      if (spans != nullptr) spans->Append(absl::MakeConstSpan(p, take));
      offset_ += take;
      n -= take;
    }
    return true;
  }

 private:
  void SkipEmpty() {
    while (index_ < slices_.size() && offset_ == slices_[index_].size()) {
      ++index_;
      offset_ = 0;
    }
  }

  const std::vector<grpc::Slice>& slices_;
  size_t index_ = 0;
  size_t offset_ = 0;
};

}  // namespace

absl::Status RawTensorChunk::Parse(const grpc::ByteBuffer& buffer) {
  Clear();
  if (!buffer.Valid()) return absl::OkStatus();  // no bytes: an empty message
  if (grpc::Status s = buffer.Dump(&slices_); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk: unreadable message: ", s.error_message()));
  }
  // Spans into slices_ stay valid from here on: the vector is not resized again until Clear.
  SliceCursor cursor(slices_);
  const char* error = nullptr;
  while (error == nullptr && !cursor.AtEnd()) {
    const size_t field_start = header_bytes_.size();
    uint64_t tag = 0, value = 0;
    if (!cursor.ReadVarint(&tag, &header_bytes_)) {
      error = "truncated field tag";
    } else if (tag >> 3 == kDataField && (tag & 7) == kLengthDelimited) {
      header_bytes_.resize(field_start);
      data_.Clear();  // protobuf keeps the last occurrence
      if (!cursor.ReadVarint(&value, nullptr) || !cursor.Skip(value, nullptr, &data_)) {
        error = "truncated data field";
      }
    } else {
      bool ok = false;
      switch (tag & 7) {
        case kVarint:
          ok = cursor.ReadVarint(&value, &header_bytes_);
          break;
        case kFixed64:
          ok = cursor.Skip(8, &header_bytes_, nullptr);
          break;
        case kLengthDelimited:
          ok = cursor.ReadVarint(&value, &header_bytes_) &&
               cursor.Skip(value, &header_bytes_, nullptr);
          break;
        case kFixed32:
          ok = cursor.Skip(4, &header_bytes_, nullptr);
          break;
        default:
          break;  // groups and reserved wire types
      }
      if (!ok) error = "truncated or unsupported field";
    }
  }
  if (error == nullptr && !header_.ParseFromString(header_bytes_)) {
    error = "invalid header fields";
  }
  if (error != nullptr) {
    Clear();
    return absl::InvalidArgumentError(
        absl::StrCat("chunk: not a valid caliper.v1.TensorChunk message (", error, ")"));
  }
  return absl::OkStatus();
}

void RawTensorChunk::Clear() {
  data_.Clear();
  header_.Clear();
  header_bytes_.clear();
  slices_.clear();
}

}  // namespace caliper
