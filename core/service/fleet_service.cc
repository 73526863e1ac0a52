#include "core/service/fleet_service.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/fleet/version_report.h"
#include "core/session/session_id.h"

namespace caliper {
namespace {

constexpr absl::string_view kWindowPrefix = "fleet/";

std::string WindowSessionName(absl::string_view fleet, absl::string_view weight_version) {
  return absl::StrCat(kWindowPrefix, fleet, "/", weight_version);
}

// What scales.json says a version's scales come from: its window's session, named after the
// fleet and the version.
SessionStatus VersionSession(const FleetState& state, const FleetVersion& version) {
  SessionStatus status;
  if (!version.windows.empty()) status.id = version.windows.front().session_id;
  status.name = absl::StrCat(kWindowPrefix, state.fleet().name, "/", version.weight_version,
                             " version ", version.id);
  status.state = SessionState::kFinalized;
  status.model = state.fleet().model;
  status.recipe = state.fleet().recipe;
  status.created_unix_ms = version.created_unix_ms;
  return status;
}

absl::Status AlreadyClosed(absl::string_view session_id, absl::string_view fleet) {
  return absl::FailedPreconditionError(
      absl::StrCat("window ", session_id, " of fleet ", fleet, " is already closed"));
}

}  // namespace

FleetService::FleetService(Options options, FleetEvents* events)
    : options_(std::move(options)), events_(events) {
  if (options_.sweep_interval > absl::ZeroDuration()) {
    sweep_thread_ = std::thread([this] { SweepLoop(); });
  }
}

FleetService::~FleetService() {
  {
    std::lock_guard<std::mutex> lock(sweep_mu_);
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  if (sweep_thread_.joinable()) sweep_thread_.join();
}

int64_t FleetService::NowMs() const {
  return absl::ToUnixMillis(options_.env->Now());
}

// --- fleets ------------------------------------------------------------------------------

absl::StatusOr<FleetState> FleetService::Create(Fleet fleet) {
  fleet.created_unix_ms = NowMs();
  FleetState state(std::move(fleet));
  if (absl::Status s = options_.fleets->Create(state); !s.ok()) return s;
  events_->CurrentVersion(state.fleet().tenant, state.fleet().name, 0);
  return state;
}

absl::StatusOr<FleetState> FleetService::Get(const std::string& tenant, absl::string_view name) {
  if (absl::Status s = ValidateFleetName("fleet", name, options_.fleet_limits); !s.ok()) return s;
  return options_.fleets->Get(tenant, name);
}

absl::StatusOr<std::vector<FleetState>> FleetService::List(const std::string& tenant) {
  return options_.fleets->List(tenant);
}

absl::Status FleetService::Delete(const std::string& tenant, absl::string_view name) {
  if (absl::Status s = ValidateFleetName("fleet", name, options_.fleet_limits); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> sessions = options_.fleets->Delete(tenant, name);
  if (!sessions.ok()) return sessions.status();
  DropSessions(*sessions, tenant);
  events_->FleetDeleted(tenant, std::string(name));
  return absl::OkStatus();
}

int64_t FleetService::ClosedWindows(const std::string& tenant) {
  absl::StatusOr<std::vector<FleetState>> fleets = options_.fleets->List(tenant);
  if (!fleets.ok()) return 0;
  int64_t closed = 0;
  for (const FleetState& fleet : *fleets) {
    for (const Window& w : fleet.windows()) closed += w.state == WindowState::kClosed;
  }
  return closed;
}

// --- window sessions ---------------------------------------------------------------------

absl::StatusOr<std::string> FleetService::CreateWindowSession(const Fleet& fleet,
                                                              absl::string_view weight_version) {
  absl::StatusOr<SessionStatus> session = options_.sessions->Create(
      fleet.model, fleet.recipe, WindowSessionName(fleet.name, weight_version), fleet.tenant);
  if (!session.ok()) return session.status();
  return session->id;
}

void FleetService::DropSessions(const std::vector<std::string>& ids, const std::string& tenant) {
  for (const std::string& id : ids) {
    absl::Status status = options_.sessions->Delete(id, tenant);
    if (!status.ok() && !absl::IsNotFound(status)) {
      events_->Warning("fleet_session_drop_failed",
                       {{"session", id}, {"message", std::string(status.message())}});
    }
  }
}

absl::StatusOr<FinalScales> FleetService::FinalizeWindowSession(const std::string& id,
                                                                const std::string& tenant,
                                                                WindowTokens* tokens) {
  // Finalized in the store, then loaded once for both its scales and its counts.
  absl::Status finalized = options_.sessions->store().FinalizeSession(id, tenant);
  absl::StatusOr<SessionService::Finalized> done =
      finalized.ok() ? options_.sessions->Final(id, tenant)
                     : absl::StatusOr<SessionService::Finalized>(finalized);
  events_->Finalized(done.ok());
  if (!done.ok()) return done.status();
  *tokens = WindowTokens::Committed(done->session->Status(), done->session->model());
  return std::move(done->final);
}

// Raises the fleet's record of its open windows' counts to what their sessions committed;
// returns the state after (as given when nothing moved).
FleetState FleetService::RecordWindowTokens(FleetState state) {
  const Fleet fleet = state.fleet();
  std::vector<std::pair<std::string, WindowTokens>> committed;
  for (const Window& window : state.windows()) {
    if (window.state != WindowState::kOpen) continue;
    absl::StatusOr<SessionStatus> status = options_.sessions->Get(window.session_id, fleet.tenant);
    if (!status.ok()) continue;  // the next sweep reads it again
    WindowTokens tokens = WindowTokens::Committed(*status, fleet.model);
    WindowTokens raised = window.tokens;
    raised.Raise(tokens);
    if (!(raised == window.tokens)) committed.emplace_back(window.session_id, std::move(tokens));
  }
  if (committed.empty()) return state;
  absl::StatusOr<FleetStore::Updated> updated = options_.fleets->Update(
      fleet.tenant, fleet.name, [&](FleetState& s, VersionWrites&) {
        for (const auto& [id, tokens] : committed) s.RecordTokens(id, tokens);
        return absl::OkStatus();
      });
  return updated.ok() ? std::move(updated->state) : state;
}

// --- windows -----------------------------------------------------------------------------

absl::StatusOr<FleetService::OpenedWindow> FleetService::OpenWindow(
    const std::string& tenant, absl::string_view name, absl::string_view weight_version) {
  if (absl::Status s =
          ValidateWeightVersion("weight_version", weight_version, options_.fleet_limits);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<FleetState> state = Get(tenant, name);
  if (!state.ok()) return state.status();
  if (const Window* open = state->OpenWindowFor(weight_version); open != nullptr) {
    return OpenedWindow{*open, false};
  }
  // Refused before a session is made for it (the store's update decides again).
  FleetState probe = *state;
  if (absl::Status s =
          probe.OpenWindow(weight_version, "probe", NowMs(), options_.fleet_limits).status();
      !s.ok()) {
    if (absl::IsFailedPrecondition(s)) events_->OpenRefused();
    return s;
  }
  absl::StatusOr<std::string> session = CreateWindowSession(state->fleet(), weight_version);
  if (!session.ok()) return session.status();
  FleetState::Opened opened;
  absl::StatusOr<FleetStore::Updated> updated = options_.fleets->Update(
      tenant, name, [&](FleetState& s, VersionWrites&) -> absl::Status {
        absl::StatusOr<FleetState::Opened> o =
            s.OpenWindow(weight_version, *session, NowMs(), options_.fleet_limits);
        if (!o.ok()) return o.status();
        opened = *std::move(o);
        return absl::OkStatus();
      });
  // A racing replica made the window first: use its session, drop ours.
  if (!updated.ok() || !opened.created) DropSessions({*session}, tenant);
  if (!updated.ok()) {
    if (absl::IsFailedPrecondition(updated.status())) events_->OpenRefused();
    return updated.status();
  }
  if (opened.created) events_->WindowOpened();
  for (const std::string& older : opened.superseded) {
    CloseQuietly(tenant, std::string(name), older, WindowCloseReason::kNewerWeightVersion);
  }
  const Window* window = updated->state.FindWindow(opened.session_id);
  if (window == nullptr) return absl::InternalError("opened window vanished");
  return OpenedWindow{*window, opened.created};
}

absl::StatusOr<Window> FleetService::CloseWindow(const std::string& tenant,
                                                 absl::string_view name,
                                                 absl::string_view session_id,
                                                 absl::string_view weight_version) {
  if (absl::Status s = ValidateFleetName("fleet", name, options_.fleet_limits); !s.ok()) return s;
  std::string id(session_id);
  if (id.empty()) {
    if (!ValidateWeightVersion("weight_version", weight_version, options_.fleet_limits).ok()) {
      return absl::InvalidArgumentError(
          "session_id or weight_version: one is required to name the window");
    }
    absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, name);
    if (!state.ok()) return state.status();
    const Window* open = state->OpenWindowFor(weight_version);
    if (open == nullptr) {
      return absl::NotFoundError(absl::StrCat("fleet ", name,
                                              " has no open window of weight version \"",
                                              weight_version, "\""));
    }
    id = open->session_id;
  } else if (absl::Status s = CheckString("session_id", id, "session_id_bytes",
                                          kMaxSessionIdBytes);
             !s.ok()) {
    return s;
  }
  return CloseWindowSession(tenant, std::string(name), id, WindowCloseReason::kExplicit);
}

void FleetService::CloseQuietly(const std::string& tenant, const std::string& fleet,
                                const std::string& session_id, WindowCloseReason reason) {
  absl::StatusOr<Window> closed = CloseWindowSession(tenant, fleet, session_id, reason);
  if (!closed.ok() && !absl::IsFailedPrecondition(closed.status())) {
    events_->Warning("fleet_window_close_failed",
                     {{"fleet", fleet},
                      {"session", session_id},
                      {"message", std::string(closed.status().message())}});
  }
}

absl::StatusOr<Window> FleetService::CloseWindowSession(const std::string& tenant,
                                                        const std::string& fleet,
                                                        const std::string& session_id,
                                                        WindowCloseReason reason) {
  // The caller's fleet and an open window of it first: nothing is done to a session (not
  // even a flush) for a tenant whose fleet does not hold it.
  {
    absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, fleet);
    if (!state.ok()) return state.status();
    const Window* window = state->FindWindow(session_id);
    if (window == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("session_id: ", session_id, " is not a window of fleet ", fleet));
    }
    if (window->state != WindowState::kOpen) return AlreadyClosed(session_id, fleet);
  }
  // What this replica's streams accepted into the window is committed next (the flusher
  // would take up to --state_flush_interval), so the window decides on it.
  if (options_.flusher != nullptr) {
    if (absl::Status flushed = options_.flusher->Flush(session_id); !flushed.ok()) {
      return flushed;
    }
  }
  // Finalizing first stops every stream into it; its scales and its counts both come from
  // what the session committed, in the same transactions.
  WindowTokens tokens;
  absl::StatusOr<FinalScales> final = FinalizeWindowSession(session_id, tenant, &tokens);
  if (!final.ok()) return final.status();
  const int64_t closed_ms = NowMs();
  const auto closed_at = std::chrono::steady_clock::now();
  // The decision compares with the current version; if that moves meanwhile, decide again.
  for (int attempt = 0; attempt < 8; ++attempt) {
    absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, fleet);
    if (!state.ok()) return state.status();
    const Window* window = state->FindWindow(session_id);
    if (window == nullptr || window->state != WindowState::kOpen) {
      return AlreadyClosed(session_id, fleet);
    }
    const int64_t current = state->current();
    std::shared_ptr<const FinalScales> current_scales;
    std::optional<PublishBase> base;
    if (current != 0) {
      absl::StatusOr<std::shared_ptr<const FinalScales>> scales =
          VersionScales(tenant, fleet, *state->Version(current));
      if (!scales.ok()) return scales.status();
      current_scales = *std::move(scales);
      int layer = -1;
      const double saturation = state->SaturationUnderCurrent(&layer);
      base = PublishBase{state->Version(current)->weight_version, current_scales.get(),
                         saturation, layer};
    }
    WindowTokens counted = window->tokens;
    counted.Raise(tokens);
    const PublishDecision decision = DecidePublish(state->fleet().policy, *final, counted,
                                                   window->weight_version, base);
    bool raced = false;
    Window closed;
    absl::StatusOr<FleetStore::Updated> updated = options_.fleets->Update(
        tenant, fleet, [&](FleetState& s, VersionWrites& writes) -> absl::Status {
          if (s.current() != current) {
            raced = true;
            return absl::AbortedError("the current version moved");
          }
          s.RecordTokens(session_id, tokens);
          absl::StatusOr<const FleetVersion*> version = s.CloseWindow(
              session_id, reason, decision, closed_ms, options_.fleet_limits, &writes);
          if (!version.ok()) return version.status();
          closed = *s.FindWindow(session_id);
          return absl::OkStatus();
        });
    if (raced) continue;
    if (!updated.ok()) return updated.status();
    DropSessions(updated->writes.dropped_sessions, tenant);
    std::optional<double> publish_seconds;
    if (Publishes(decision.reason)) {
      publish_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - closed_at).count();
    }
    events_->WindowClosed(fleet, closed, reason, decision.reason, publish_seconds);
    events_->CurrentVersion(tenant, fleet, updated->state.current());
    return closed;
  }
  return absl::AbortedError(
      absl::StrCat("fleet ", fleet, ": the current version kept moving while window ",
                   session_id, " closed; retry CloseWindow"));
}

// --- versions ----------------------------------------------------------------------------

absl::StatusOr<FleetVersionRef> FleetService::Version(const std::string& tenant,
                                                      absl::string_view name,
                                                      int64_t requested) {
  absl::StatusOr<FleetState> state = Get(tenant, name);
  if (!state.ok()) return state.status();
  const int64_t id = requested != 0 ? requested : state->current();
  if (id == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("fleet ", name, " has no version yet: no window has published"));
  }
  if (state->Version(id) == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("version: ", id, " of fleet ", name, " is not retained"));
  }
  return FleetVersionRef{*std::move(state), id};
}

absl::StatusOr<FleetState> FleetService::MoveCurrent(const std::string& tenant,
                                                     absl::string_view name,
                                                     FleetStore::Change change) {
  if (absl::Status s = ValidateFleetName("fleet", name, options_.fleet_limits); !s.ok()) return s;
  absl::StatusOr<FleetStore::Updated> updated = options_.fleets->Update(tenant, name, change);
  if (!updated.ok()) return updated.status();
  events_->CurrentVersion(tenant, std::string(name), updated->state.current());
  return std::move(updated->state);
}

absl::StatusOr<FleetState> FleetService::Pin(const std::string& tenant, absl::string_view name,
                                             int64_t version) {
  return MoveCurrent(tenant, name,
                     [&](FleetState& s, VersionWrites&) { return s.Pin(version); });
}

absl::StatusOr<FleetState> FleetService::Unpin(const std::string& tenant,
                                               absl::string_view name) {
  return MoveCurrent(tenant, name, [](FleetState& s, VersionWrites&) {
    s.Unpin();
    return absl::OkStatus();
  });
}

absl::Status FleetService::ReportInUse(const std::string& tenant, absl::string_view name,
                                       InUseReport report) {
  if (absl::Status s = ValidateFleetName("fleet", name, options_.fleet_limits); !s.ok()) return s;
  report.unix_ms = NowMs();
  double saturation = 0;
  std::vector<double> layers;
  int64_t dropped = 0;
  absl::StatusOr<FleetStore::Updated> updated = options_.fleets->Update(
      tenant, name, [&](FleetState& s, VersionWrites&) -> absl::Status {
        absl::StatusOr<int64_t> d = s.ReportInUse(report, options_.fleet_limits);
        if (!d.ok()) return d.status();
        dropped = *d;
        saturation = s.SaturationUnderCurrent();
        layers = s.LayerSaturationUnderCurrent();
        return absl::OkStatus();
      });
  if (!updated.ok()) return updated.status();
  events_->InUse(std::string(name), saturation, layers, dropped, report.sampled_tokens);
  return absl::OkStatus();
}

absl::StatusOr<ScalesAnswer> FleetService::Scales(const std::string& tenant,
                                                  absl::string_view name, int64_t version,
                                                  const ScalesQuery& query) {
  absl::StatusOr<FleetVersionRef> found = Version(tenant, name, version);
  if (!found.ok()) return found.status();
  absl::StatusOr<std::shared_ptr<const FinalScales>> final =
      VersionScales(tenant, name, found->version());
  if (!final.ok()) return final.status();
  const Fleet& fleet = found->state.fleet();
  return AnswerScales(fleet.model, fleet.recipe, **final,
                      VersionSession(found->state, found->version()), query);
}

absl::StatusOr<std::string> FleetService::ReportJson(const std::string& tenant,
                                                     absl::string_view name, int64_t version) {
  absl::StatusOr<FleetVersionRef> found = Version(tenant, name, version);
  if (!found.ok()) return found.status();
  const FleetVersion& v = found->version();
  if (v.windows.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("version: ", v.id, " of fleet ", name, " names no window"));
  }
  absl::StatusOr<std::string> window =
      options_.sessions->ReportJson(v.windows.front().session_id, tenant);
  if (!window.ok()) return window.status();
  absl::StatusOr<std::shared_ptr<const FinalScales>> scales = VersionScales(tenant, name, v);
  if (!scales.ok()) return scales.status();
  return VersionReportJson(*window, found->state, v, **scales);
}

absl::StatusOr<WatchStep> FleetService::NextForWatcher(const std::string& tenant,
                                                       absl::string_view name, int64_t after,
                                                       const ScalesQuery& query) {
  absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, name);
  if (!state.ok()) return state.status();
  const FleetState::Catchup catchup = state->After(after);
  WatchStep step;
  if (catchup.ids.empty()) return step;
  const int64_t id = catchup.ids.front();
  const FleetVersion* version = state->Version(id);
  absl::StatusOr<std::shared_ptr<const FinalScales>> final =
      version == nullptr ? absl::NotFoundError("version") : VersionScales(tenant, name, *version);
  if (!final.ok()) {
    step.retry = true;  // dropped meanwhile: the next look finds what is current
    return step;
  }
  absl::StatusOr<ScalesAnswer> answer =
      AnswerScales(state->fleet().model, state->fleet().recipe, **final,
                   VersionSession(*state, *version), query);
  if (!answer.ok()) return answer.status();
  step.version = id;
  step.weight_version = version->weight_version;
  step.gap = catchup.gap;
  step.more = catchup.ids.size() > 1;
  step.answer = *std::move(answer);
  return step;
}

absl::StatusOr<std::shared_ptr<const FinalScales>> FleetService::VersionScales(
    const std::string& tenant, absl::string_view name, const FleetVersion& version) {
  constexpr size_t kCachedVersions = 32;
  const std::string key =
      absl::StrCat(tenant.size(), ":", tenant, name.size(), ":", name, "/", version.id, "/",
                   version.created_unix_ms, "/",
                   version.windows.empty() ? "" : version.windows.front().session_id);
  {
    std::lock_guard<std::mutex> lock(scales_mu_);
    auto hit = scales_cache_.find(key);
    if (hit != scales_cache_.end()) return hit->second;
  }
  absl::StatusOr<FinalScales> read = options_.fleets->GetScales(tenant, name, version.id);
  if (!read.ok()) return read.status();
  auto scales = std::make_shared<const FinalScales>(*std::move(read));
  std::lock_guard<std::mutex> lock(scales_mu_);
  if (scales_cache_.emplace(key, scales).second) {
    scales_cache_order_.push_back(key);
    if (scales_cache_order_.size() > kCachedVersions) {
      scales_cache_.erase(scales_cache_order_.front());
      scales_cache_order_.pop_front();
    }
  }
  return scales;
}

// --- the sweep ---------------------------------------------------------------------------

void FleetService::SweepOnce() {
  std::lock_guard<std::mutex> pass(pass_mu_);
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> fleets =
      options_.fleets->ListAll();
  if (!fleets.ok()) fleets.emplace();
  std::map<std::pair<std::string, std::string>, int64_t> seen;
  for (const auto& [tenant, name] : *fleets) {
    absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, name);
    if (!state.ok()) continue;
    state = RecordWindowTokens(*std::move(state));
    const std::pair<std::string, std::string> key(tenant, name);
    auto last = current_seen_.find(key);
    const bool moved = last == current_seen_.end() || last->second != state->current();
    seen[key] = state->current();
    for (const Window& window : state->windows()) {
      if (std::optional<WindowCloseReason> due =
              CloseDue(window, state->fleet().policy, NowMs());
          due.has_value()) {
        CloseQuietly(tenant, name, window.session_id, *due);
      }
    }
    // Versions another replica published (or pinned) reach this replica's watchers here,
    // within one sweep: polling the store the sweep reads anyway, rather than LISTEN/NOTIFY,
    // which would need a connection of its own and this poll still, for what a lost
    // connection missed.
    if (moved) events_->CurrentVersion(tenant, name, state->current());
  }
  current_seen_ = std::move(seen);
}

void FleetService::SweepLoop() {
  const auto period =
      absl::ToChronoMilliseconds(std::max(options_.sweep_interval, absl::Milliseconds(10)));
  std::unique_lock<std::mutex> lock(sweep_mu_);
  while (!stopping_) {
    sweep_cv_.wait_for(lock, period);
    if (stopping_) break;
    lock.unlock();
    SweepOnce();
    lock.lock();
  }
}

}  // namespace caliper
