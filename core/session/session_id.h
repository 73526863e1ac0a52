// Session ids: 128 random bits as 32 hex digits, so they cannot be guessed (another tenant's
// session is NotFound, and its id is no hint to find it).
#ifndef CALIPER_CORE_SESSION_SESSION_ID_H_
#define CALIPER_CORE_SESSION_SESSION_ID_H_

#include <string>

namespace caliper {

std::string NewSessionId();

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_ID_H_
