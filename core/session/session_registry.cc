#include "core/session/session_registry.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace caliper {
namespace {

absl::Status NoSession(absl::string_view id) {
  return absl::NotFoundError(absl::StrCat("session_id: no session \"", id, "\""));
}

}  // namespace

std::string SessionRegistry::NewId() {
  std::random_device rd;
  uint64_t hi = (static_cast<uint64_t>(rd()) << 32) | rd();
  uint64_t lo = (static_cast<uint64_t>(rd()) << 32) | rd();
  return absl::StrFormat("%016x%016x", hi, lo);
}

absl::StatusOr<std::shared_ptr<CalibrationSession>> SessionRegistry::CreateForTenant(
    ModelConfig model, Recipe recipe, std::string name, std::string tenant,
    const Limits& limits) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(sessions_.size()) >= limits.max_sessions) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sessions: the server holds ", sessions_.size(), ", the limit max_sessions=",
        limits.max_sessions, "; delete finished sessions first"));
  }
  if (limits.max_sessions_per_tenant > 0) {
    int owned = 0;
    for (const auto& [id, session] : sessions_) owned += session->tenant() == tenant ? 1 : 0;
    if (owned >= limits.max_sessions_per_tenant) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "tenant \"", tenant.empty() ? "anonymous" : tenant, "\" already has ", owned,
          " sessions, the limit max_sessions_per_tenant=", limits.max_sessions_per_tenant,
          "; delete finished sessions first"));
    }
  }
  std::string id;
  do {
    id = NewId();
  } while (sessions_.count(id) > 0);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session = CalibrationSession::Create(
      std::move(model), std::move(recipe), id, std::move(name), std::move(tenant), limits, env_);
  if (!session.ok()) return session.status();
  std::shared_ptr<CalibrationSession> shared = std::move(*session);
  sessions_.emplace(id, shared);
  return shared;
}

absl::StatusOr<std::shared_ptr<CalibrationSession>> SessionRegistry::GetForTenant(
    absl::string_view id, absl::string_view tenant) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->tenant() != tenant) return NoSession(id);
  return it->second;
}

std::vector<std::shared_ptr<CalibrationSession>> SessionRegistry::ListForTenant(
    absl::string_view tenant) const {
  std::vector<std::shared_ptr<CalibrationSession>> out = ListAllTenants();
  std::erase_if(out, [&](const auto& session) { return session->tenant() != tenant; });
  return out;
}

absl::Status SessionRegistry::DeleteForTenant(absl::string_view id, absl::string_view tenant) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = sessions_.find(id);
  if (it == sessions_.end() || it->second->tenant() != tenant) return NoSession(id);
  it->second->MarkDeleted();
  sessions_.erase(it);
  return absl::OkStatus();
}

absl::Status SessionRegistry::Insert(std::shared_ptr<CalibrationSession> session) {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string id = session->id();
  if (!sessions_.emplace(id, std::move(session)).second) {
    return absl::AlreadyExistsError(absl::StrCat("session_id: \"", id, "\" is already loaded"));
  }
  return absl::OkStatus();
}

std::vector<std::shared_ptr<CalibrationSession>> SessionRegistry::ListAllTenants() const {
  std::vector<std::shared_ptr<CalibrationSession>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [id, session] : sessions_) out.push_back(session);
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a->created_unix_ms() < b->created_unix_ms();
  });
  return out;
}

size_t SessionRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sessions_.size();
}

}  // namespace caliper
