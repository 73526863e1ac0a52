// Durable small-state files: a 32-byte header (magic "CALIPER1", format version, payload length,
// CRC-32C of the payload, CRC-32C of the header) followed by the payload. Writes are atomic
// (temp file in the same directory, fsync, rename, fsync of the directory), so a reader sees
// the old file or the new one, never a torn mix; a corrupt or truncated file is a DataLoss
// error naming it, never wrong bytes. Every filesystem call goes through an Env (core/env/env.h)
// so tests can inject failures. All functions are thread-safe; one writer per path at a time.
#ifndef CALIPER_CORE_STATE_STATE_FILE_H_
#define CALIPER_CORE_STATE_STATE_FILE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/env/env.h"

namespace caliper {

inline constexpr absl::string_view kStateFileMagic = "CALIPER1";
inline constexpr uint32_t kStateFileFormatVersion = 1;
inline constexpr size_t kStateFileHeaderSize = 32;
// Temp files carry this marker in their name; ListStateFiles skips them.
inline constexpr absl::string_view kStateTempMarker = kTempFileMarker;

// Header + payload, the exact bytes WriteStateFileAtomic puts on disk.
std::string FrameStatePayload(absl::string_view payload);
// Inverse of FrameStatePayload. DataLoss naming `origin` on truncation, trailing bytes, bad
// magic, header or payload checksum mismatch, or an unknown format version.
absl::StatusOr<std::string> UnframeStatePayload(absl::string_view bytes, absl::string_view origin);

// Writes `payload` to `path` atomically and durably. On error `path` is unchanged (or, only when
// the final directory fsync fails, replaced but not known to be durable) and no temp file is
// left behind unless the process dies mid-write.
absl::Status WriteStateFileAtomic(const std::string& path, absl::string_view payload,
                                  Env* env = Env::Default());

// The payload last written to `path`. NotFound when there is none; DataLoss as for
// UnframeStatePayload.
absl::StatusOr<std::string> ReadStateFile(const std::string& path,
                                          Env* env = Env::Default());

// Removes `path` and makes the removal durable. OK when it does not exist.
absl::Status RemoveStateFile(const std::string& path,
                             Env* env = Env::Default());

// Sorted names in `dir` ending in `suffix`, excluding temp files left by a crash.
absl::StatusOr<std::vector<std::string>> ListStateFiles(
    const std::string& dir, absl::string_view suffix,
    Env* env = Env::Default());

// Deletes temp files a crash left in `dir`; call at start-up before any writer runs.
// Returns how many were removed.
absl::StatusOr<int> RemoveLeftoverTempFiles(const std::string& dir,
                                            Env* env = Env::Default());

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_STATE_FILE_H_
