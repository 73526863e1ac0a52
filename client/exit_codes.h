// Exit codes every `caliper` subcommand returns (scripts and CI key on them). Statuses become
// these in one place: ExitCodeFor (client/command.h).
#ifndef CALIPER_CLIENT_EXIT_CODES_H_
#define CALIPER_CLIENT_EXIT_CODES_H_

namespace caliper::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitServer = 1;  // the server refused or failed the request
inline constexpr int kExitUsage = 2;   // bad flags or bad input; nothing was written
inline constexpr int kExitIo = 3;      // a read or write of a local file failed (disk full, ...)
inline constexpr int kExitFindings = 4;  // `caliper check`: findings break or degrade an engine

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_EXIT_CODES_H_
