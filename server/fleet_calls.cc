// CalibrationService's fleet calls (docs/fleets.md): transport over core/fleet. A window is a
// session named "fleet/NAME/WEIGHT_VERSION" (in the registry, or the state store with
// --state_dir) that producers stream into as into any session; its K/V token counts (TP rank 0)
// are the session's, committed with its statistics; a sweep copies them into the fleet's record
// and closes windows whose policy says so. Every decision (ordering, publish, retention) is core's.
#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "core/fleet/publish_policy.h"
#include "core/fleet/version_report.h"
#include "core/session/session_report.h"
#include "server/calibration_service.h"
#include "server/fleet_convert.h"
#include "server/proto_convert.h"
#include "server/rpc_timing.h"
#include "core/session/session_id.h"
#include "server/status_mapping.h"

namespace caliper {
namespace {

constexpr absl::string_view kWindowPrefix = "fleet/";

std::string WindowSessionName(absl::string_view fleet, absl::string_view weight_version) {
  return absl::StrCat(kWindowPrefix, fleet, "/", weight_version);
}

absl::Status Unavailable() {
  return absl::UnimplementedError("fleets: this server has no fleet store");
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

absl::Status CheckFleet(absl::string_view name, const FleetLimits& limits) {
  return ValidateFleetName("fleet", name, limits);
}

// The tenant's fleet a request names, its name checked first.
absl::StatusOr<FleetState> LoadFleet(FleetStore& fleets, const FleetLimits& limits,
                                     const std::string& tenant, absl::string_view name) {
  if (absl::Status s = CheckFleet(name, limits); !s.ok()) return s;
  return fleets.Get(tenant, name);
}

// FleetStore::Update of the fleet a request names, its name checked first.
absl::StatusOr<FleetStore::Updated> UpdateFleet(FleetStore& fleets, const FleetLimits& limits,
                                                const std::string& tenant,
                                                absl::string_view name,
                                                FleetStore::Change change) {
  if (absl::Status s = CheckFleet(name, limits); !s.ok()) return s;
  return fleets.Update(tenant, name, change);
}

// A fleet a request names and one of its retained versions.
struct FleetVersionRef {
  FleetState state;
  int64_t id = 0;
  const FleetVersion& version() const { return *state.Version(id); }
};

// The tenant's fleet `name` and its retained version `requested` (0: the current one);
// FailedPrecondition when it has none yet, NotFound naming a version not retained.
absl::StatusOr<FleetVersionRef> LoadVersion(FleetStore& fleets, const FleetLimits& limits,
                                            const std::string& tenant, absl::string_view name,
                                            int64_t requested) {
  absl::StatusOr<FleetState> state = LoadFleet(fleets, limits, tenant, name);
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

}  // namespace

// --- window accounting -------------------------------------------------------------------

FleetState CalibrationService::RecordWindowTokens(FleetState state) {
  const Fleet fleet = state.fleet();
  std::vector<std::pair<std::string, WindowTokens>> committed;
  for (const Window& window : state.windows()) {
    if (window.state != WindowState::kOpen) continue;
    absl::StatusOr<SessionStatus> status =
        options_.store->GetStatus(window.session_id, fleet.tenant);
    if (!status.ok()) continue;  // the next sweep reads it again
    WindowTokens tokens = WindowTokens::Committed(*status, fleet.model.num_layers);
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

// --- window sessions ---------------------------------------------------------------------

int64_t CalibrationService::NowMs() const {
  return options_.fleet_clock_ms ? options_.fleet_clock_ms() : absl::ToUnixMillis(absl::Now());
}

absl::StatusOr<std::string> CalibrationService::CreateWindowSession(
    const Fleet& fleet, absl::string_view weight_version) {
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      CalibrationSession::Create(fleet.model, fleet.recipe, NewSessionId(),
                                 WindowSessionName(fleet.name, weight_version), fleet.tenant,
                                 options_.limits);
  if (!session.ok()) return session.status();
  if (absl::Status s = options_.store->CreateSession(**session, SessionLimitFor(fleet.tenant));
      !s.ok()) {
    return s;
  }
  return (*session)->id();
}

int CalibrationService::SessionLimitFor(const std::string& tenant) {
  const int limit = options_.limits.max_sessions_per_tenant;
  if (limit <= 0 || options_.fleets == nullptr) return limit;
  // Closed windows are the fleets' (bounded by retain and max_refusals_kept per fleet), not
  // the tenant's sessions at work: they do not count.
  absl::StatusOr<std::vector<FleetState>> fleets = options_.fleets->List(tenant);
  if (!fleets.ok()) return limit;
  int64_t closed = 0;
  for (const FleetState& fleet : *fleets) {
    for (const Window& w : fleet.windows()) closed += w.state == WindowState::kClosed;
  }
  return static_cast<int>(std::min<int64_t>(limit + closed, std::numeric_limits<int>::max()));
}

void CalibrationService::DropSessions(const std::vector<std::string>& ids,
                                      absl::string_view tenant) {
  for (const std::string& id : ids) {
    absl::Status status = options_.store->DeleteSession(id, tenant);
    if (!status.ok() && !absl::IsNotFound(status)) {
      log_->Log(Severity::kWarning, "fleet_session_drop_failed",
                {{"session", id}, {"message", std::string(status.message())}});
    }
  }
}

absl::StatusOr<FinalScales> CalibrationService::FinalizeWindowSession(const std::string& id,
                                                                      const std::string& tenant,
                                                                      WindowTokens* tokens) {
  absl::Status status = options_.store->FinalizeSession(id, tenant);
  absl::StatusOr<std::unique_ptr<CalibrationSession>> session =
      status.ok() ? options_.store->LoadSession(id, tenant)
                  : absl::StatusOr<std::unique_ptr<CalibrationSession>>(status);
  if (session.ok()) {
    *tokens = WindowTokens::Committed((*session)->Status(), (*session)->model().num_layers);
  }
  absl::StatusOr<FinalScales> final =
      session.ok() ? (*session)->Final() : absl::StatusOr<FinalScales>(session.status());
  metrics_->Finalization(final.ok());
  return final;
}

absl::StatusOr<Window> CalibrationService::CloseFleetWindow(const std::string& tenant,
                                                            const std::string& fleet,
                                                            const std::string& session_id,
                                                            WindowCloseReason reason) {
  // What this replica's streams accepted into the window is committed first (the flusher
  // would take up to --state_flush_interval), so the window decides on it.
  if (options_.flusher != nullptr) {
    if (absl::Status flushed = options_.flusher->Flush(session_id); !flushed.ok()) {
      return flushed;
    }
  }
  {
    absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, fleet);
    if (!state.ok()) return state.status();
    const Window* window = state->FindWindow(session_id);
    if (window == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("session_id: ", session_id, " is not a window of fleet ", fleet));
    }
    if (window->state != WindowState::kOpen) {
      return absl::FailedPreconditionError(
          absl::StrCat("window ", session_id, " of fleet ", fleet, " is already closed"));
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
      return absl::FailedPreconditionError(
          absl::StrCat("window ", session_id, " of fleet ", fleet, " is already closed"));
    }
    const int64_t current = state->current();
    std::optional<FinalScales> current_scales;
    std::optional<PublishBase> base;
    if (current != 0) {
      absl::StatusOr<FinalScales> scales = options_.fleets->GetScales(tenant, fleet, current);
      if (!scales.ok()) return scales.status();
      current_scales = *std::move(scales);
      int layer = -1;
      const double saturation = state->SaturationUnderCurrent(&layer);
      base = PublishBase{state->Version(current)->weight_version, &*current_scales, saturation,
                         layer};
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
    fleet_metrics_->WindowClosed(WindowCloseReasonName(reason));
    fleet_metrics_->Decision(PublishReasonName(decision.reason), closed.tokens.Count());
    fleet_metrics_->CurrentVersion(fleet, updated->state.current());
    log_->Log(Publishes(decision.reason) ? Severity::kInfo : Severity::kWarning,
              "fleet_window_closed",
              {{"fleet", fleet},
               {"session", session_id},
               {"weight_version", closed.weight_version},
               {"close_reason", std::string(WindowCloseReasonName(reason))},
               {"decision", closed.decision},
               {"detail", closed.detail},
               {"version", absl::StrCat(closed.version)}});
    if (Publishes(decision.reason)) {
      fleet_metrics_->CloseToPublish(
          std::chrono::duration<double>(std::chrono::steady_clock::now() - closed_at).count());
      NotifyWatchers(tenant, fleet);
    }
    return closed;
  }
  return absl::AbortedError(
      absl::StrCat("fleet ", fleet, ": the current version kept moving while window ",
                   session_id, " closed; retry CloseWindow"));
}

void CalibrationService::FleetSweepLoop() {
  const auto period = absl::ToChronoMilliseconds(
      std::max(options_.fleet_sweep_interval, absl::Milliseconds(10)));
  // Each fleet's current version at the last sweep: watchers are poked when it moves.
  std::map<std::pair<std::string, std::string>, int64_t> current_seen;
  std::unique_lock<std::mutex> lock(fleet_mu_);
  while (!fleet_stopping_) {
    fleet_cv_.wait_for(lock, period);
    if (fleet_stopping_) break;
    lock.unlock();
    absl::StatusOr<std::vector<std::pair<std::string, std::string>>> fleets =
        options_.fleets->ListAll();
    if (!fleets.ok()) fleets.emplace();
    std::map<std::pair<std::string, std::string>, int64_t> seen;
    for (const auto& [tenant, name] : *fleets) {
      absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, name);
      if (!state.ok()) continue;
      state = RecordWindowTokens(*std::move(state));
      const std::pair<std::string, std::string> key(tenant, name);
      auto last = current_seen.find(key);
      const bool moved = last == current_seen.end() || last->second != state->current();
      seen[key] = state->current();
      for (const Window& window : state->windows()) {
        std::optional<WindowCloseReason> due = CloseDue(window, state->fleet().policy, NowMs());
        if (!due.has_value()) continue;
        absl::StatusOr<Window> closed = CloseFleetWindow(tenant, name, window.session_id, *due);
        if (!closed.ok() && !absl::IsFailedPrecondition(closed.status())) {
          log_->Log(Severity::kWarning, "fleet_window_close_failed",
                    {{"fleet", name},
                     {"session", window.session_id},
                     {"message", std::string(closed.status().message())}});
        }
      }
      // Versions another replica published (or pinned) reach this replica's watchers here,
      // within one sweep: polling the store the sweep reads anyway, rather than LISTEN/NOTIFY,
      // which would need a connection of its own and this poll still, for what a lost
      // connection missed.
      if (moved) NotifyWatchers(tenant, name);
    }
    current_seen = std::move(seen);
    lock.lock();
  }
}

// --- watchers ----------------------------------------------------------------------------

// Sends the versions a subscriber has not seen, one write at a time; Poke (under the service's
// fleet_mu_) asks it to look again. Deletes itself when done.
class CalibrationService::WatchReactor final
    : public grpc::ServerWriteReactor<v1::WatchScalesResponse> {
 public:
  WatchReactor(CalibrationService* service, v1::WatchScalesRequest request)
      : service_(service), request_(std::move(request)), last_sent_(request_.after_version()) {
    scales_request_.set_fleet(request_.fleet());
    *scales_request_.mutable_deployment() = request_.deployment();
    scales_request_.set_convention(request_.convention());
    *scales_request_.mutable_formats() = request_.formats();
  }

  void Start(std::string tenant) {
    std::lock_guard<std::mutex> lock(mu_);
    tenant_ = std::move(tenant);
  }
  const std::string& tenant() const { return tenant_; }
  const std::string& fleet() const { return request_.fleet(); }

  void Poke() {
    std::lock_guard<std::mutex> lock(mu_);
    pending_ = true;
    if (!writing_ && !finished_) SendNextLocked();
  }
  void Fail(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    FinishLocked(status);
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (finish_after_write_.has_value()) {
      Finish(ToGrpcStatus(*finish_after_write_));
      finish_after_write_.reset();
      return;
    }
    if (!ok) {
      FinishLocked(absl::CancelledError("the subscriber went away"));
      return;
    }
    if (pending_) SendNextLocked();
  }
  void OnCancel() override { Fail(absl::CancelledError("the subscriber cancelled")); }
  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(service_->fleet_mu_);
      service_->watchers_.erase(this);
      service_->fleet_metrics_->Watchers(static_cast<int64_t>(service_->watchers_.size()));
    }
    delete this;
  }

 private:
  void SendNextLocked() {
    pending_ = false;
    absl::StatusOr<FleetState> state = service_->options_.fleets->Get(tenant_, request_.fleet());
    if (!state.ok()) {
      FinishLocked(state.status());
      return;
    }
    const FleetState::Catchup catchup = state->After(last_sent_);
    if (catchup.ids.empty()) return;
    const int64_t id = catchup.ids.front();
    const FleetVersion* version = state->Version(id);
    absl::StatusOr<FinalScales> final =
        service_->options_.fleets->GetScales(tenant_, request_.fleet(), id);
    if (version == nullptr || !final.ok()) {
      pending_ = true;  // dropped meanwhile: the next look finds what is current
      return;
    }
    message_.Clear();
    absl::Status built = service_->ScalesResponseFor(
        state->fleet().model, state->fleet().recipe, *final, VersionSession(*state, *version),
        scales_request_, message_.mutable_scales());
    if (!built.ok()) {
      FinishLocked(built);
      return;
    }
    message_.set_version(id);
    message_.set_weight_version(version->weight_version);
    message_.set_gap(catchup.gap);
    last_sent_ = id;
    pending_ = catchup.ids.size() > 1;
    writing_ = true;
    StartWrite(&message_);
  }

  void FinishLocked(const absl::Status& status) {
    if (finished_) return;
    finished_ = true;
    if (writing_) {
      finish_after_write_ = status;  // Finish waits for the write in flight
      return;
    }
    Finish(ToGrpcStatus(status));
  }

  CalibrationService* const service_;
  const v1::WatchScalesRequest request_;
  v1::ScalesRequest scales_request_;
  std::mutex mu_;
  std::string tenant_;
  int64_t last_sent_;
  bool pending_ = false, writing_ = false, finished_ = false;
  std::optional<absl::Status> finish_after_write_;
  v1::WatchScalesResponse message_;
};

void CalibrationService::NotifyWatchers(absl::string_view tenant, absl::string_view fleet) {
  std::lock_guard<std::mutex> lock(fleet_mu_);
  for (WatchReactor* watcher : watchers_) {
    if (watcher->tenant() == tenant && watcher->fleet() == fleet) watcher->Poke();
  }
}

grpc::ServerWriteReactor<v1::WatchScalesResponse>* CalibrationService::WatchScales(
    grpc::CallbackServerContext* context, const v1::WatchScalesRequest* request) {
  auto* reactor = new WatchReactor(this, *request);
  absl::StatusOr<std::string> tenant = TenantOf(*context);
  absl::Status status = tenant.status();
  if (status.ok() && options_.fleets == nullptr) status = Unavailable();
  if (status.ok() && request->after_version() < 0) {
    status = absl::InvalidArgumentError("after_version: must not be negative");
  }
  if (status.ok()) {
    status = LoadFleet(*options_.fleets, options_.fleet_limits, *tenant, request->fleet()).status();
  }
  if (status.ok()) {
    status = DeploymentFromProto(request->deployment(), options_.limits).status();
  }
  if (!status.ok()) {
    reactor->Fail(status);
    return reactor;
  }
  reactor->Start(*tenant);
  std::lock_guard<std::mutex> lock(fleet_mu_);
  if (static_cast<int>(watchers_.size()) >= options_.fleet_limits.max_watchers) {
    reactor->Fail(absl::ResourceExhaustedError(
        absl::StrCat("watchers: ", watchers_.size(), " WatchScales streams are open, the "
                     "server's --max_watchers=", options_.fleet_limits.max_watchers)));
    return reactor;
  }
  watchers_.insert(reactor);
  fleet_metrics_->Watchers(static_cast<int64_t>(watchers_.size()));
  reactor->Poke();
  return reactor;
}

// --- unary calls -------------------------------------------------------------------------

grpc::ServerUnaryReactor* CalibrationService::FleetCall(
    grpc::CallbackServerContext* context, absl::string_view method,
    std::function<absl::Status(const std::string& tenant)> call) {
  return Answer(context, method, "", [this, call = std::move(call)](Call& answer) {
    if (options_.fleets == nullptr) return Unavailable();
    return call(answer.tenant);
  });
}

grpc::ServerUnaryReactor* CalibrationService::CreateFleet(grpc::CallbackServerContext* context,
                                                          const v1::CreateFleetRequest* request,
                                                          v1::Fleet* response) {
  return FleetCall(context, "CreateFleet",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<Fleet> fleet = FleetFromProto(
                         *request, tenant, options_.fleet_limits, options_.limits);
                     if (!fleet.ok()) return fleet.status();
                     fleet->created_unix_ms = NowMs();
                     FleetState state(*std::move(fleet));
                     if (absl::Status s = options_.fleets->Create(state); !s.ok()) return s;
                     fleet_metrics_->CurrentVersion(request->name(), 0);
                     *response = FleetToProto(state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::GetFleet(grpc::CallbackServerContext* context,
                                                       const v1::GetFleetRequest* request,
                                                       v1::Fleet* response) {
  return FleetCall(context, "GetFleet",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state = LoadFleet(
                         *options_.fleets, options_.fleet_limits, tenant, request->fleet());
                     if (!state.ok()) return state.status();
                     *response = FleetToProto(*state);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::ListFleets(grpc::CallbackServerContext* context,
                                                         const v1::ListFleetsRequest*,
                                                         v1::ListFleetsResponse* response) {
  return FleetCall(context, "ListFleets",
                   [this, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<std::vector<FleetState>> states =
                         options_.fleets->List(tenant);
                     if (!states.ok()) return states.status();
                     for (const FleetState& s : *states) *response->add_fleets() = FleetToProto(s);
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::DeleteFleet(grpc::CallbackServerContext* context,
                                                          const v1::DeleteFleetRequest* request,
                                                          v1::DeleteFleetResponse*) {
  return FleetCall(context, "DeleteFleet",
                   [this, request](const std::string& tenant) -> absl::Status {
                     if (absl::Status s = CheckFleet(request->fleet(), options_.fleet_limits);
                         !s.ok()) {
                       return s;
                     }
                     absl::StatusOr<std::vector<std::string>> sessions =
                         options_.fleets->Delete(tenant, request->fleet());
                     if (!sessions.ok()) return sessions.status();
                     DropSessions(*sessions, tenant);
                     fleet_metrics_->ForgetFleet(request->fleet());
                     NotifyWatchers(tenant, request->fleet());  // they end with NOT_FOUND
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::OpenWindow(grpc::CallbackServerContext* context,
                                                         const v1::OpenWindowRequest* request,
                                                         v1::FleetWindow* response) {
  return FleetCall(
      context, "OpenWindow",
      [this, request, response](const std::string& tenant) -> absl::Status {
        const std::string& name = request->fleet();
        const std::string& weight_version = request->weight_version();
        if (absl::Status s =
                ValidateWeightVersion("weight_version", weight_version, options_.fleet_limits);
            !s.ok()) {
          return s;
        }
        absl::StatusOr<FleetState> state =
            LoadFleet(*options_.fleets, options_.fleet_limits, tenant, name);
        if (!state.ok()) return state.status();
        if (const Window* open = state->OpenWindowFor(weight_version); open != nullptr) {
          *response = WindowToProto(*open);
          return absl::OkStatus();
        }
        // Refused before a session is made for it (the store's update decides again).
        FleetState probe = *state;
        if (absl::Status s = probe.OpenWindow(weight_version, "probe", NowMs(),
                                              options_.fleet_limits)
                                 .status();
            !s.ok()) {
          if (absl::IsFailedPrecondition(s)) fleet_metrics_->OpenRefused();
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
          if (absl::IsFailedPrecondition(updated.status())) fleet_metrics_->OpenRefused();
          return updated.status();
        }
        if (opened.created) fleet_metrics_->WindowOpened();
        for (const std::string& older : opened.superseded) {
          absl::StatusOr<Window> closed =
              CloseFleetWindow(tenant, name, older, WindowCloseReason::kNewerWeightVersion);
          if (!closed.ok() && !absl::IsFailedPrecondition(closed.status())) {
            log_->Log(Severity::kWarning, "fleet_window_close_failed",
                      {{"fleet", name},
                       {"session", older},
                       {"message", std::string(closed.status().message())}});
          }
        }
        const Window* window = updated->state.FindWindow(opened.session_id);
        if (window == nullptr) return absl::InternalError("opened window vanished");
        *response = WindowToProto(*window);
        response->set_created(opened.created);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CalibrationService::CloseWindow(grpc::CallbackServerContext* context,
                                                          const v1::CloseWindowRequest* request,
                                                          v1::FleetWindow* response) {
  return FleetCall(
      context, "CloseWindow",
      [this, request, response](const std::string& tenant) -> absl::Status {
        if (absl::Status s = CheckFleet(request->fleet(), options_.fleet_limits); !s.ok()) {
          return s;
        }
        std::string session_id = request->session_id();
        if (session_id.empty()) {
          if (absl::Status s = ValidateWeightVersion("weight_version", request->weight_version(),
                                                     options_.fleet_limits);
              !s.ok()) {
            return absl::InvalidArgumentError(
                "session_id or weight_version: one is required to name the window");
          }
          absl::StatusOr<FleetState> state = options_.fleets->Get(tenant, request->fleet());
          if (!state.ok()) return state.status();
          const Window* open = state->OpenWindowFor(request->weight_version());
          if (open == nullptr) {
            return absl::NotFoundError(absl::StrCat("fleet ", request->fleet(),
                                                    " has no open window of weight version \"",
                                                    request->weight_version(), "\""));
          }
          session_id = open->session_id;
        } else if (absl::Status s = CheckString("session_id", session_id, "session_id_bytes",
                                                kMaxSessionIdBytes);
                   !s.ok()) {
          return s;
        }
        absl::StatusOr<Window> closed = CloseFleetWindow(tenant, request->fleet(), session_id,
                                                         WindowCloseReason::kExplicit);
        if (!closed.ok()) return closed.status();
        *response = WindowToProto(*closed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CalibrationService::ListVersions(
    grpc::CallbackServerContext* context, const v1::ListVersionsRequest* request,
    v1::ListVersionsResponse* response) {
  return FleetCall(context, "ListVersions",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetState> state = LoadFleet(
                         *options_.fleets, options_.fleet_limits, tenant, request->fleet());
                     if (!state.ok()) return state.status();
                     for (const FleetVersion& v : state->versions()) {
                       *response->add_versions() = VersionToProto(*state, v);
                     }
                     for (const Window& w : state->windows()) {
                       if (w.state == WindowState::kClosed && w.version == 0) {
                         *response->add_refused() = WindowToProto(w);
                       }
                     }
                     return absl::OkStatus();
                   });
}

grpc::ServerUnaryReactor* CalibrationService::GetVersion(grpc::CallbackServerContext* context,
                                                         const v1::GetVersionRequest* request,
                                                         v1::FleetVersion* response) {
  return FleetCall(context, "GetVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     absl::StatusOr<FleetVersionRef> found =
                         LoadVersion(*options_.fleets, options_.fleet_limits, tenant,
                                     request->fleet(), request->version());
                     if (!found.ok()) return found.status();
                     *response = VersionToProto(found->state, found->version());
                     return absl::OkStatus();
                   });
}

absl::Status CalibrationService::MoveCurrent(const std::string& tenant,
                                             const std::string& fleet,
                                             FleetStore::Change change, v1::Fleet* response) {
  absl::StatusOr<FleetStore::Updated> updated =
      UpdateFleet(*options_.fleets, options_.fleet_limits, tenant, fleet, change);
  if (!updated.ok()) return updated.status();
  fleet_metrics_->CurrentVersion(fleet, updated->state.current());
  NotifyWatchers(tenant, fleet);
  *response = FleetToProto(updated->state);
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* CalibrationService::PinVersion(grpc::CallbackServerContext* context,
                                                         const v1::PinVersionRequest* request,
                                                         v1::Fleet* response) {
  return FleetCall(context, "PinVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     return MoveCurrent(tenant, request->fleet(),
                                        [&](FleetState& s, VersionWrites&) {
                                          return s.Pin(request->version());
                                        },
                                        response);
                   });
}

grpc::ServerUnaryReactor* CalibrationService::UnpinVersion(
    grpc::CallbackServerContext* context, const v1::UnpinVersionRequest* request,
    v1::Fleet* response) {
  return FleetCall(context, "UnpinVersion",
                   [this, request, response](const std::string& tenant) -> absl::Status {
                     return MoveCurrent(tenant, request->fleet(),
                                        [](FleetState& s, VersionWrites&) {
                                          s.Unpin();
                                          return absl::OkStatus();
                                        },
                                        response);
                   });
}

grpc::ServerUnaryReactor* CalibrationService::ReportInUse(
    grpc::CallbackServerContext* context, const v1::ReportInUseRequest* request,
    v1::ReportInUseResponse*) {
  return FleetCall(
      context, "ReportInUse",
      [this, request](const std::string& tenant) -> absl::Status {
        double saturation = 0;
        std::vector<double> layers;
        int64_t dropped = 0;
        absl::StatusOr<FleetStore::Updated> updated = UpdateFleet(
            *options_.fleets, options_.fleet_limits, tenant, request->fleet(),
            [&](FleetState& s, VersionWrites&) -> absl::Status {
              InUseReport report{request->producer_id(), request->version(),
                                 request->saturation(), NowMs(),
                                 {request->layer_saturation().begin(),
                                  request->layer_saturation().end()},
                                 request->dropped_statistics()};
              absl::StatusOr<int64_t> d = s.ReportInUse(std::move(report), options_.fleet_limits);
              if (!d.ok()) return d.status();
              dropped = *d;
              saturation = s.SaturationUnderCurrent();
              layers = s.LayerSaturationUnderCurrent();
              return absl::OkStatus();
            });
        if (!updated.ok()) return updated.status();
        fleet_metrics_->Saturation(request->fleet(), saturation);
        fleet_metrics_->LayerSaturation(request->fleet(), layers);
        fleet_metrics_->DroppedStatistics(request->fleet(), dropped);
        return absl::OkStatus();
      });
}

absl::Status CalibrationService::FleetScalesResponse(const std::string& tenant,
                                                     const v1::ScalesRequest& request,
                                                     v1::ScalesResponse* response) {
  if (!request.session_id().empty()) {
    return absl::InvalidArgumentError("session_id and fleet: give one");
  }
  absl::StatusOr<FleetVersionRef> found = LoadVersion(
      *options_.fleets, options_.fleet_limits, tenant, request.fleet(), request.version());
  if (!found.ok()) return found.status();
  absl::StatusOr<FinalScales> final =
      options_.fleets->GetScales(tenant, request.fleet(), found->id);
  if (!final.ok()) return final.status();
  const Fleet& fleet = found->state.fleet();
  return ScalesResponseFor(fleet.model, fleet.recipe, *final,
                           VersionSession(found->state, found->version()), request, response);
}

absl::Status CalibrationService::FleetReportResponse(const std::string& tenant,
                                                     const v1::ReportRequest& request,
                                                     v1::ReportResponse* response) {
  if (!request.session_id().empty()) {
    return absl::InvalidArgumentError("session_id and fleet: give one");
  }
  absl::StatusOr<FleetVersionRef> found = LoadVersion(
      *options_.fleets, options_.fleet_limits, tenant, request.fleet(), request.version());
  if (!found.ok()) return found.status();
  const FleetVersion& version = found->version();
  if (version.windows.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("version: ", version.id, " of fleet ", request.fleet(), " names no window"));
  }
  absl::StatusOr<std::unique_ptr<CalibrationSession>> window =
      options_.store->LoadSession(version.windows.front().session_id, tenant);
  if (!window.ok()) return window.status();
  absl::StatusOr<SessionObservations> observations = (*window)->Observations();
  if (!observations.ok()) return observations.status();
  absl::StatusOr<FinalScales> scales =
      options_.fleets->GetScales(tenant, request.fleet(), version.id);
  if (!scales.ok()) return scales.status();
  absl::StatusOr<std::string> report = VersionReportJson(BuildSessionReportJson(*observations),
                                                         found->state, version, *scales);
  if (!report.ok()) return report.status();
  response->set_report_json(*std::move(report));
  return absl::OkStatus();
}

}  // namespace caliper
