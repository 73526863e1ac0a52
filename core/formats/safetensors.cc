#include "core/formats/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace caliper {
namespace {

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

}  // namespace

std::optional<int> SafetensorsDTypeBits(absl::string_view dtype) {
  static const std::pair<const char*, int> kBits[] = {
      {"BOOL", 8},     {"U8", 8},       {"I8", 8},        {"F8_E5M2", 8},   {"F8_E4M3", 8},
      {"F8_E8M0", 8},  {"F4", 4},       {"F6_E2M3", 6},   {"F6_E3M2", 6},   {"I16", 16},
      {"U16", 16},     {"F16", 16},     {"BF16", 16},     {"I32", 32},      {"U32", 32},
      {"F32", 32},     {"F64", 64},     {"I64", 64},      {"U64", 64},      {"C64", 64},
  };
  for (const auto& [name, bits] : kBits) {
    if (dtype == name) return bits;
  }
  return std::nullopt;
}

absl::StatusOr<uint64_t> SafetensorsByteSize(absl::string_view dtype,
                                             absl::Span<const int64_t> shape,
                                             absl::string_view field) {
  const std::optional<int> bits = SafetensorsDTypeBits(dtype);
  if (!bits) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".dtype: unknown dtype \"", dtype, "\""));
  }
  uint64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "]: negative dimension ", shape[i]));
    }
    const uint64_t dim = static_cast<uint64_t>(shape[i]);
    if (dim != 0 && elements > std::numeric_limits<uint64_t>::max() / 64 / dim) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: element count overflows"));
    }
    elements *= dim;
  }
  const uint64_t total_bits = elements * static_cast<uint64_t>(*bits);
  if (total_bits % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": ", elements, " elements of ", dtype, " do not fill whole bytes"));
  }
  return total_bits / 8;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  // Read through an mmap, not the Env (tensors are read in place); errors are marked the same.
  if (fd < 0) return IoErrorFromErrno("open", path, errno);
  struct stat info;
  if (::fstat(fd, &info) != 0) {
    const int err = errno;
    ::close(fd);
    return IoErrorFromErrno("stat", path, err);
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(info.st_size);
  if (size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": truncated: ", size, " bytes, too short for the 8-byte header length"));
  }
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) return IoErrorFromErrno("mmap", path, map_err);
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->mapping_ = mapping;
  file->base_ = static_cast<const uint8_t*>(mapping);
  file->size_ = size;
  file->origin_ = path;
  if (absl::Status status = file->ParseHeader(path); !status.ok()) return status;
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->owned_ = std::move(bytes);
  file->base_ = reinterpret_cast<const uint8_t*>(file->owned_.data());
  file->size_ = file->owned_.size();
  file->origin_ = "<memory>";
  if (file->size_ < 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->origin_, ": truncated: ", file->size_,
        " bytes, too short for the 8-byte header length"));
  }
  if (absl::Status status = file->ParseHeader(file->origin_); !status.ok()) return status;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

absl::Status SafetensorsFile::ParseHeader(absl::string_view origin) {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base_[i];  // little-endian
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": header length ", header_len, " exceeds the ", kMaxHeaderBytes, " byte limit"));
  }
  if (header_len > size_ - 8) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": truncated: header length ", header_len, " but only ", size_ - 8,
        " bytes follow the length field"));
  }
  if (header_len < 2 || base_[8] != '{') {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": header is not a JSON object (must start with '{')"));
  }
  const char* text = reinterpret_cast<const char*>(base_ + 8);

  // Duplicate top-level names would make the file ambiguous; nlohmann keeps the last silently.
  // A SAX pass finds them; a parse callback would make the DOM parse quadratic in the tensor
  // count (nlohmann rescans the parent object at every end_object when a callback is set).
  struct TopLevelKeys : nlohmann::json_sax<nlohmann::json> {
    int depth = 0;
    std::set<std::string> seen;
    std::string duplicate;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return ++depth, true; }
    bool end_object() override { return --depth, true; }
    bool start_array(std::size_t) override { return ++depth, true; }
    bool end_array() override { return --depth, true; }
    bool key(string_t& key) override {
      if (depth == 1 && duplicate.empty() && !seen.insert(key).second) duplicate = key;
      return true;
    }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } keys;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_len);
    nlohmann::json::sax_parse(text, text + header_len, &keys);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": header is not valid JSON: ", e.what()));
  }
  const std::string& duplicate = keys.duplicate;
  if (!header.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(origin, ": header is not a JSON object"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(origin, ": tensor \"", duplicate, "\" appears twice in the header"));
  }

  data_start_ = 8 + header_len;
  const uint64_t data_size = size_ - data_start_;
  tensors_.clear();
  metadata_.clear();
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(
            absl::StrCat(origin, ": __metadata__ must be an object of strings"));
      }
      for (const auto& [key, item] : value.items()) {
        if (!item.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(origin, ": __metadata__.", key, " must be a string"));
        }
        metadata_[key] = item.get<std::string>();
      }
      continue;
    }
    const std::string where = absl::StrCat(origin, ": tensor \"", name, "\"");
    if (!value.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": entry must be an object"));
    }
    SafetensorsEntry entry;
    entry.name = name;
    auto dtype = value.find("dtype");
    if (dtype == value.end() || !dtype->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": dtype missing or not a string"));
    }
    entry.dtype = dtype->get<std::string>();
    auto shape = value.find("shape");
    if (shape == value.end() || !shape->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": shape missing or not an array"));
    }
    for (size_t i = 0; i < shape->size(); ++i) {
      const nlohmann::json& dim = (*shape)[i];
      if (!dim.is_number_unsigned() ||
          dim.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": shape[", i, "] must be a non-negative integer"));
      }
      entry.shape.push_back(dim.get<int64_t>());
    }
    auto offsets = value.find("data_offsets");
    if (offsets == value.end() || !offsets->is_array() || offsets->size() != 2 ||
        !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets must be an array of two non-negative integers"));
    }
    entry.begin = (*offsets)[0].get<uint64_t>();
    entry.end = (*offsets)[1].get<uint64_t>();
    if (entry.begin > entry.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets [", entry.begin, ", ", entry.end, "] has begin > end"));
    }
    if (entry.end > data_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": data_offsets [", entry.begin, ", ", entry.end,
          "] out of range: the data section holds ", data_size, " bytes"));
    }
    absl::StatusOr<uint64_t> expected = SafetensorsByteSize(entry.dtype, entry.shape, where);
    if (!expected.ok()) return expected.status();
    if (*expected != entry.end - entry.begin) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", entry.end - entry.begin, " bytes, but shape [",
          absl::StrJoin(entry.shape, ", "), "] of ", entry.dtype, " needs ", *expected));
    }
    tensors_.push_back(std::move(entry));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(),
                   [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
                     return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
                   });
  // As the reference does: tensors tile the data section exactly, no overlap, gap or tail.
  uint64_t cursor = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& entry : tensors_) {
    if (entry.begin < cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": tensor \"", entry.name, "\" data_offsets [", entry.begin, ", ", entry.end,
          "] overlap tensor \"", previous->name, "\" ending at ", cursor));
    }
    if (entry.begin > cursor) {
      return absl::InvalidArgumentError(absl::StrCat(
          origin, ": tensor \"", entry.name, "\" begins at ", entry.begin,
          ", leaving a gap of unowned bytes after offset ", cursor));
    }
    cursor = entry.end;
    previous = &entry;
  }
  if (cursor != data_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        origin, ": the data section holds ", data_size, " bytes but tensors cover only ", cursor));
  }
  by_name_.resize(tensors_.size());
  for (uint32_t i = 0; i < by_name_.size(); ++i) by_name_[i] = i;
  std::sort(by_name_.begin(), by_name_.end(),
            [this](uint32_t a, uint32_t b) { return tensors_[a].name < tensors_[b].name; });
  return absl::OkStatus();
}

const SafetensorsEntry* SafetensorsFile::Find(absl::string_view name) const {
  auto it = std::lower_bound(
      by_name_.begin(), by_name_.end(), name,
      [this](uint32_t index, absl::string_view key) { return tensors_[index].name < key; });
  if (it == by_name_.end() || tensors_[*it].name != name) return nullptr;
  return &tensors_[*it];
}

absl::Span<const uint8_t> SafetensorsFile::Data(const SafetensorsEntry& entry) const {
  return absl::Span<const uint8_t>(base_ + data_start_ + entry.begin, entry.end - entry.begin);
}

absl::StatusOr<TensorView> SafetensorsFile::View(const SafetensorsEntry& entry) const {
  const std::string field = absl::StrCat(origin_, ": tensor \"", entry.name, "\"");
  absl::StatusOr<DType> dtype = ParseDType(entry.dtype, absl::StrCat(field, ".dtype"));
  if (!dtype.ok()) return dtype.status();
  std::vector<int64_t> shape = entry.shape;
  if (shape.empty()) shape.push_back(1);  // a scalar is one element
  return TensorView::Create(*dtype, std::move(shape), Data(entry), field);
}

void SafetensorsFile::ReleasePages(const SafetensorsEntry& entry) const {
  if (mapping_ == nullptr || entry.end == entry.begin) return;
  const long page = ::sysconf(_SC_PAGESIZE);
  const uintptr_t first = reinterpret_cast<uintptr_t>(base_ + data_start_ + entry.begin);
  const uintptr_t last = reinterpret_cast<uintptr_t>(base_ + data_start_ + entry.end);
  // Only whole pages inside the tensor: neighbours sharing a page stay resident.
  const uintptr_t start = (first + page - 1) / page * page;
  const uintptr_t stop = last / page * page;
  if (stop > start) {
    ::madvise(reinterpret_cast<void*>(start), stop - start, MADV_DONTNEED);
  }
}

absl::Status SafetensorsWriter::Add(std::string name, std::string dtype,
                                    std::vector<int64_t> shape, std::string bytes) {
  const std::string where = absl::StrCat("tensor \"", name, "\"");
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat(where, ": reserved or empty name"));
  }
  for (const Pending& pending : tensors_) {
    if (pending.name == name) {
      return absl::AlreadyExistsError(absl::StrCat(where, ": added twice"));
    }
  }
  absl::StatusOr<uint64_t> expected = SafetensorsByteSize(dtype, shape, where);
  if (!expected.ok()) return expected.status();
  if (*expected != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": ", bytes.size(), " bytes, but shape [", absl::StrJoin(shape, ", "), "] of ",
        dtype, " needs ", *expected));
  }
  tensors_.push_back({std::move(name), std::move(dtype), std::move(shape), std::move(bytes)});
  return absl::OkStatus();
}

void SafetensorsWriter::SetMetadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

std::string SafetensorsWriter::Serialize() const {
  // Widest dtypes first (stable, so insertion order otherwise): every tensor then starts at a
  // multiple of its own item size with no padding between tensors, which the reference reader
  // requires (it rejects gaps).
  std::vector<const Pending*> order;
  for (const Pending& pending : tensors_) order.push_back(&pending);
  std::stable_sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    return *SafetensorsDTypeBits(a->dtype) > *SafetensorsDTypeBits(b->dtype);
  });
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json metadata = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata_) metadata[key] = value;
    header["__metadata__"] = std::move(metadata);
  }
  uint64_t offset = 0;
  for (const Pending* pending : order) {
    header[pending->name] = {{"dtype", pending->dtype},
                             {"shape", pending->shape},
                             {"data_offsets", {offset, offset + pending->bytes.size()}}};
    offset += pending->bytes.size();
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((length >> (8 * i)) & 0xff));
  out += text;
  for (const Pending* pending : order) out += pending->bytes;
  return out;
}

absl::Status SafetensorsWriter::WriteFile(const std::string& path, Env* env) const {
  return WriteFileAtomically(path, Serialize(), env);
}

}  // namespace caliper
