#include "core/formats/safetensors_stream_writer.h"


#include <algorithm>
#include <cstring>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/formats/safetensors.h"
#include "nlohmann/json.hpp"

namespace caliper {

absl::StatusOr<std::unique_ptr<SafetensorsStreamWriter>> SafetensorsStreamWriter::Plan(
    std::vector<Tensor> tensors, std::map<std::string, std::string> metadata) {
  std::unique_ptr<SafetensorsStreamWriter> writer(new SafetensorsStreamWriter());
  std::set<std::string> names;
  for (const Tensor& t : tensors) {
    if (t.name == "__metadata__" || t.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor name \"", t.name, "\" is reserved"));
    }
    if (!names.insert(t.name).second) {
      return absl::AlreadyExistsError(absl::StrCat(t.name, ": planned twice"));
    }
    absl::StatusOr<uint64_t> size = SafetensorsByteSize(t.dtype, t.shape, t.name);
    if (!size.ok()) return size.status();
  }
  std::stable_sort(tensors.begin(), tensors.end(), [](const Tensor& a, const Tensor& b) {
    return *SafetensorsDTypeBits(a.dtype) > *SafetensorsDTypeBits(b.dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const Tensor& t : tensors) {
    const uint64_t size = *SafetensorsByteSize(t.dtype, t.shape, t.name);
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + size}}};
    writer->sizes_.push_back(size);
    offset += size;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) writer->header_.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  writer->header_ += text;
  writer->data_bytes_ = offset;
  writer->order_ = std::move(tensors);
  return writer;
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;  // an unfinished file is closed

absl::Status SafetensorsStreamWriter::Open(const std::string& path, Env* env) {
  path_ = path;
  absl::StatusOr<std::unique_ptr<WritableFile>> file = env->NewWritableFile(path);
  if (!file.ok()) return file.status();
  file_ = *std::move(file);
  buffer_ = header_;
  // Skip tensors with no bytes at the front.
  while (current_ < sizes_.size() && sizes_[current_] == 0) ++current_;
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::Write(absl::string_view bytes) {
  // Small tensors (scalars, scales) gather in the buffer; big ones go straight through.
  if (buffer_.size() + bytes.size() <= kBufferBytes) {
    buffer_.append(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  if (absl::Status s = Flush(); !s.ok()) return s;
  if (bytes.size() < kBufferBytes) {
    buffer_.assign(bytes.data(), bytes.size());
    return absl::OkStatus();
  }
  return file_->Append(bytes);
}

absl::Status SafetensorsStreamWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  absl::Status s = file_->Append(buffer_);
  buffer_.clear();
  return s;
}

absl::Status SafetensorsStreamWriter::Append(absl::Span<const uint8_t> bytes) {
  if (file_ == nullptr) return absl::FailedPreconditionError("safetensors stream: not open");
  size_t done = 0;
  while (done < bytes.size()) {
    if (current_ >= sizes_.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat(path_, ": ", bytes.size() - done, " bytes beyond the last planned tensor"));
    }
    const uint64_t room = sizes_[current_] - written_;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(room, bytes.size() - done));
    if (absl::Status s =
            Write(absl::string_view(reinterpret_cast<const char*>(bytes.data()) + done, n));
        !s.ok()) {
      return s;
    }
    done += n;
    written_ += n;
    while (current_ < sizes_.size() && written_ == sizes_[current_]) {
      ++current_;
      written_ = 0;
    }
  }
  return absl::OkStatus();
}

absl::Status SafetensorsStreamWriter::Finish() {
  if (file_ == nullptr) return absl::FailedPreconditionError("safetensors stream: not open");
  if (current_ < sizes_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        path_, ": tensor ", order_[current_].name, " got ", written_, " of ", sizes_[current_],
        " bytes"));
  }
  absl::Status status = Flush();
  if (status.ok()) status = file_->Sync();
  absl::Status closed = file_->Close();
  file_.reset();
  return status.ok() ? closed : status;
}

}  // namespace caliper
