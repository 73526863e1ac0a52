#include "core/state/state_file.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/state/crc32c.h"

namespace caliper {
namespace {

void PutU32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
void PutU64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}
uint32_t GetU32(absl::string_view in, size_t at) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}
uint64_t GetU64(absl::string_view in, size_t at) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  return v;
}

// Header offsets.
constexpr size_t kVersionAt = 8;
constexpr size_t kLengthAt = 16;
constexpr size_t kPayloadCrcAt = 24;
constexpr size_t kHeaderCrcAt = 28;

}  // namespace

std::string FrameStatePayload(absl::string_view payload) {
  std::string out;
  out.reserve(kStateFileHeaderSize + payload.size());
  out.append(kStateFileMagic.data(), kStateFileMagic.size());
  PutU32(out, kStateFileFormatVersion);
  PutU32(out, 0);  // flags, reserved
  PutU64(out, payload.size());
  PutU32(out, Crc32c(payload));
  PutU32(out, Crc32c(out));
  out.append(payload.data(), payload.size());
  return out;
}

absl::StatusOr<std::string> UnframeStatePayload(absl::string_view bytes, absl::string_view origin) {
  if (bytes.size() < kStateFileHeaderSize) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": truncated header (",
                                            bytes.size(), " of ", kStateFileHeaderSize, " bytes)"));
  }
  if (bytes.substr(0, kStateFileMagic.size()) != kStateFileMagic) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": bad magic (not a ",
                                            kStateFileMagic, " file)"));
  }
  if (Crc32c(bytes.substr(0, kHeaderCrcAt)) != GetU32(bytes, kHeaderCrcAt)) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": header checksum mismatch"));
  }
  uint32_t version = GetU32(bytes, kVersionAt);
  if (version != kStateFileFormatVersion) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": format version ", version,
                                            " is not supported (expected ",
                                            kStateFileFormatVersion, ")"));
  }
  uint64_t length = GetU64(bytes, kLengthAt);
  uint64_t available = bytes.size() - kStateFileHeaderSize;
  if (length > available) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": truncated payload (",
                                            available, " of ", length, " bytes)"));
  }
  if (length < available) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": ", available - length,
                                            " unexpected bytes after the payload"));
  }
  absl::string_view payload = bytes.substr(kStateFileHeaderSize);
  if (Crc32c(payload) != GetU32(bytes, kPayloadCrcAt)) {
    return absl::DataLossError(absl::StrCat("state file ", origin, ": payload checksum mismatch"));
  }
  return std::string(payload);
}

absl::Status WriteStateFileAtomic(const std::string& path, absl::string_view payload,
                                  Env* env) {
  return Annotate(WriteFileAtomically(path, FrameStatePayload(payload), env),
                  absl::StrCat("writing state file ", path, ": "));
}

absl::StatusOr<std::string> ReadStateFile(const std::string& path, Env* env) {
  absl::StatusOr<std::string> bytes = env->ReadFile(path);
  if (!bytes.ok()) return bytes.status();
  return UnframeStatePayload(*bytes, path);
}

absl::Status RemoveStateFile(const std::string& path, Env* env) {
  absl::Status status = env->RemoveFile(path);
  if (absl::IsNotFound(status)) return absl::OkStatus();
  if (!status.ok()) return status;
  return env->SyncDir(DirName(path));
}

absl::StatusOr<std::vector<std::string>> ListStateFiles(const std::string& dir,
                                                        absl::string_view suffix,
                                                        Env* env) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  std::vector<std::string> out;
  for (std::string& name : *names) {
    if (absl::StrContains(name, kStateTempMarker)) continue;
    if (!absl::EndsWith(name, suffix)) continue;
    out.push_back(std::move(name));
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<int> RemoveLeftoverTempFiles(const std::string& dir, Env* env) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDir(dir);
  if (!names.ok()) return names.status();
  int removed = 0;
  for (const std::string& name : *names) {
    if (!absl::StrContains(name, kStateTempMarker)) continue;
    absl::Status status = env->RemoveFile(absl::StrCat(dir, "/", name));
    if (!status.ok() && !absl::IsNotFound(status)) return status;
    ++removed;
  }
  if (removed > 0) {
    absl::Status status = env->SyncDir(dir);
    if (!status.ok()) return status;
  }
  return removed;
}

}  // namespace caliper
