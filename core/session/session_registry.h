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
#include "core/env/env.h"
#include "core/limits/limits.h"
#include "core/session/session.h"

namespace caliper {

class SessionRegistry {
 public:
  // New sessions take their creation time from `env`'s clock.
  explicit SessionRegistry(Env* env = Env::Default()) : env_(env) {}

  // InvalidArgument for an invalid model or recipe (or one beyond `limits`); ResourceExhausted
  // naming max_sessions or max_sessions_per_tenant when the server or the tenant is full.
  absl::StatusOr<std::shared_ptr<CalibrationSession>> CreateForTenant(
      ModelConfig model, Recipe recipe, std::string name, std::string tenant,
      const Limits& limits = Limits());
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

  Env* const env_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<CalibrationSession>, std::less<>> sessions_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_REGISTRY_H_
