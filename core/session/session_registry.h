// Sessions by id, scoped by tenant. Thread-safe. Ids are 128-bit random hex, so they are not
// guessable. Every request-facing call takes the tenant: another tenant's session is NotFound,
// exactly like a missing one, so its existence is not revealed ("" is the anonymous tenant).
#ifndef CALIPER_CORE_SESSION_SESSION_REGISTRY_H_
#define CALIPER_CORE_SESSION_SESSION_REGISTRY_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/calibration/model_config.h"
#include "core/session/session.h"

namespace caliper {

// Per-tenant bounds applied by SessionRegistry::CreateForTenant (0: unbounded).
struct SessionLimits {
  int max_sessions_per_tenant = 0;
  int max_modules_per_session = 0;
};

class SessionRegistry {
 public:
  // InvalidArgument for an invalid model or recipe; ResourceExhausted naming
  // limits.max_sessions_per_tenant when the tenant is at its limit.
  absl::StatusOr<std::shared_ptr<CalibrationSession>> CreateForTenant(
      ModelConfig model, Recipe recipe, std::string name, std::string tenant,
      const SessionLimits& limits = {});
  // NotFound naming the id (also for another tenant's session).
  absl::StatusOr<std::shared_ptr<CalibrationSession>> GetForTenant(
      absl::string_view id, absl::string_view tenant) const;
  // The tenant's sessions, by creation order.
  std::vector<std::shared_ptr<CalibrationSession>> ListForTenant(absl::string_view tenant) const;
  // Marks the session deleted (open streams get NotFound) and drops it.
  absl::Status DeleteForTenant(absl::string_view id, absl::string_view tenant);

  // Not request-facing: restore at start-up and the persister, which see every tenant.
  // Insert adds a restored session under its own id; AlreadyExists when the id is taken.
  absl::Status Insert(std::shared_ptr<CalibrationSession> session);
  std::vector<std::shared_ptr<CalibrationSession>> ListAllTenants() const;  // by creation order
  size_t size() const;

 private:
  std::string NewId();

  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<CalibrationSession>, std::less<>> sessions_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_REGISTRY_H_
