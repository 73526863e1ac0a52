// Byte counts for people: "512 B", "1.5 MiB", "2.0 GiB" (powers of 1024, one decimal).
#ifndef CALIPER_CLIENT_HUMAN_BYTES_H_
#define CALIPER_CLIENT_HUMAN_BYTES_H_

#include <string>

namespace caliper::cli {

std::string HumanBytes(double bytes);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_HUMAN_BYTES_H_
