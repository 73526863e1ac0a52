// The flags every scales-producing command declares alike (--kv, --convention, --format) and
// their values <-> proto. Values are kebab-case; the command table has checked them already.
#ifndef CALIPER_CLIENT_SCALES_FLAGS_H_
#define CALIPER_CLIENT_SCALES_FLAGS_H_

#include <string>

#include "client/command.h"
#include "proto/caliper.pb.h"

namespace caliper::cli {

FlagSpec KvFlag();
FlagSpec ConventionFlag();
FlagSpec FormatFlag();
FlagSpec KvCacheDtypeFlag();

v1::KvMode KvModeFromFlag(const std::string& value);
std::string KvModeFlagValue(v1::KvMode mode);
v1::Nvfp4Convention ConventionFromFlag(const std::string& value);
v1::KvCacheDtype KvCacheDtypeFromFlag(const std::string& value);

}  // namespace caliper::cli

#endif  // CALIPER_CLIENT_SCALES_FLAGS_H_
