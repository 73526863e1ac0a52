// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as used by iSCSI, ext4 and LevelDB.
// Table-driven, portable, thread-safe (the table is built once). Detects every 1- and 2-bit
// error and every burst up to 32 bits, which is what a state file needs against torn writes.
#ifndef CALIPER_CORE_STATE_CRC32C_H_
#define CALIPER_CORE_STATE_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace caliper {

// CRC-32C of `data` continuing from `crc` (the CRC of the bytes before; 0 to start).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(absl::string_view data) { return Crc32cExtend(0, data.data(), data.size()); }

}  // namespace caliper

#endif  // CALIPER_CORE_STATE_CRC32C_H_
