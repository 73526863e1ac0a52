// Exit codes every `caliper` subcommand returns (scripts and CI key on them).
#ifndef CALIPER_CLIENT_EXIT_CODES_H_
#define CALIPER_CLIENT_EXIT_CODES_H_

namespace caliper::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitServer = 1;  // the server refused or failed the request
inline constexpr int kExitUsage = 2;   // bad flags or bad input; nothing was written
inline constexpr int kExitIo = 3;      // a file could not be read or written (disk full, ...)

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_EXIT_CODES_H_
