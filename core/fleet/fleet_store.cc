#include "core/fleet/fleet_store.h"

#include <map>
#include <mutex>
#include <tuple>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/fleet/fleet_codec.h"

namespace caliper {
namespace {

constexpr absl::string_view kFleetSuffix = ".fleet";
constexpr absl::string_view kScalesSuffix = ".scales";

using Key = std::pair<std::string, std::string>;  // (tenant, name)

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(absl::StrCat("fleet \"", name, "\" not found"));
}

// One store for both: `dir` empty keeps everything in memory only.
class FleetStoreImpl final : public FleetStore {
 public:
  FleetStoreImpl(FleetLimits fleet_limits, Limits limits, std::string dir, Env* env)
      : fleet_limits_(fleet_limits), limits_(limits), dir_(std::move(dir)), env_(env) {}

  // Reads every fleet file of dir_ (the file store's start-up).
  void Load(std::vector<absl::Status>* errors) {
    absl::StatusOr<std::vector<std::string>> names = env_->ListDir(dir_);
    if (!names.ok()) {
      errors->push_back(names.status());
      return;
    }
    for (const std::string& file : *names) {
      if (absl::StrContains(file, kTempFileMarker)) {
        (void)env_->RemoveFile(absl::StrCat(dir_, "/", file));
        continue;
      }
      if (!absl::EndsWith(file, kFleetSuffix)) continue;
      const std::string path = absl::StrCat(dir_, "/", file);
      absl::StatusOr<std::string> bytes = env_->ReadFile(path);
      absl::StatusOr<FleetState> state =
          bytes.ok() ? DecodeFleetState(*bytes, fleet_limits_, limits_)
                     : absl::StatusOr<FleetState>(bytes.status());
      if (!state.ok()) {
        errors->push_back(Annotate(state.status(), absl::StrCat(path, ": ")));
        (void)env_->RenameFile(path, absl::StrCat(path, ".corrupt"));
        continue;
      }
      Entry entry{*std::move(state), {}};
      for (const FleetVersion& v : entry.state.versions()) {
        absl::StatusOr<std::string> scale_bytes = env_->ReadFile(ScalesPath(
            entry.state.fleet().tenant, entry.state.fleet().name, v.id));
        absl::StatusOr<FinalScales> scales =
            scale_bytes.ok() ? DecodeFinalScales(*scale_bytes, limits_)
                             : absl::StatusOr<FinalScales>(scale_bytes.status());
        if (!scales.ok()) {
          errors->push_back(Annotate(
              scales.status(), absl::StrCat(path, ": version ", v.id, " scales: ")));
          continue;  // GetScales answers NotFound for it
        }
        entry.scales.emplace(v.id, *std::move(scales));
      }
      const Fleet& fleet = entry.state.fleet();
      fleets_.emplace(Key{fleet.tenant, fleet.name}, std::move(entry));
    }
  }

  absl::Status Create(const FleetState& state) override {
    std::lock_guard<std::mutex> lock(mu_);
    const Fleet& fleet = state.fleet();
    const Key key{fleet.tenant, fleet.name};
    if (fleets_.count(key) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("fleet \"", fleet.name, "\" already exists"));
    }
    int64_t held = 0;
    for (const auto& [k, e] : fleets_) held += k.first == fleet.tenant;
    if (absl::Status s =
            CheckFleetRoom(fleet_limits_, static_cast<int64_t>(fleets_.size()), held);
        !s.ok()) {
      return s;
    }
    if (absl::Status s = Persist(state, {}); !s.ok()) return s;
    fleets_.emplace(key, Entry{state, {}});
    return absl::OkStatus();
  }

  absl::StatusOr<FleetState> Get(absl::string_view tenant, absl::string_view name) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fleets_.find(Key{std::string(tenant), std::string(name)});
    if (it == fleets_.end()) return NotFound(name);
    return it->second.state;
  }

  absl::StatusOr<std::vector<FleetState>> List(absl::string_view tenant) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<FleetState> out;
    for (const auto& [key, entry] : fleets_) {
      if (key.first == tenant) out.push_back(entry.state);
    }
    return out;
  }

  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ListAll() override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto& [key, entry] : fleets_) out.push_back(key);
    return out;
  }

  absl::StatusOr<std::vector<std::string>> Delete(absl::string_view tenant,
                                                  absl::string_view name) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fleets_.find(Key{std::string(tenant), std::string(name)});
    if (it == fleets_.end()) return NotFound(name);
    std::vector<std::string> sessions;
    for (const Window& w : it->second.state.windows()) sessions.push_back(w.session_id);
    if (!dir_.empty()) {
      if (absl::Status s = env_->RemoveFile(FleetPath(tenant, name)); !s.ok()) return s;
      for (const auto& [id, scales] : it->second.scales) {
        (void)env_->RemoveFile(ScalesPath(tenant, name, id));
      }
      (void)env_->SyncDir(dir_);
    }
    fleets_.erase(it);
    return sessions;
  }

  absl::StatusOr<Updated> Update(absl::string_view tenant, absl::string_view name,
                                 Change change) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fleets_.find(Key{std::string(tenant), std::string(name)});
    if (it == fleets_.end()) return NotFound(name);
    Updated out{it->second.state, {}};
    if (absl::Status s = change(out.state, out.writes); !s.ok()) return s;
    if (absl::Status s = Persist(out.state, out.writes); !s.ok()) return s;
    it->second.state = out.state;
    for (auto& [id, scales] : out.writes.put) it->second.scales[id] = scales;
    for (int64_t id : out.writes.drop) it->second.scales.erase(id);
    return out;
  }

  absl::StatusOr<FinalScales> GetScales(absl::string_view tenant, absl::string_view name,
                                        int64_t version) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fleets_.find(Key{std::string(tenant), std::string(name)});
    if (it == fleets_.end()) return NotFound(name);
    auto s = it->second.scales.find(version);
    if (s == it->second.scales.end()) {
      return absl::NotFoundError(
          absl::StrCat("version ", version, " of fleet \"", name, "\" is not retained"));
    }
    return s->second;
  }

 private:
  struct Entry {
    FleetState state;
    std::map<int64_t, FinalScales> scales;
  };

  std::string Prefix(absl::string_view tenant, absl::string_view name) const {
    return absl::StrCat(dir_, "/", absl::BytesToHexString(tenant), "~", name);
  }
  std::string FleetPath(absl::string_view tenant, absl::string_view name) const {
    return absl::StrCat(Prefix(tenant, name), kFleetSuffix);
  }
  std::string ScalesPath(absl::string_view tenant, absl::string_view name, int64_t id) const {
    return absl::StrCat(Prefix(tenant, name), "~", id, kScalesSuffix);
  }

  // Scales first, then the fleet file that names them; dropped scales last (an orphan scales
  // file after a crash is harmless: nothing refers to it).
  absl::Status Persist(const FleetState& state, const VersionWrites& writes) {
    if (dir_.empty()) return absl::OkStatus();
    const Fleet& fleet = state.fleet();
    for (const auto& [id, scales] : writes.put) {
      if (absl::Status s = WriteFileAtomically(ScalesPath(fleet.tenant, fleet.name, id),
                                               EncodeFinalScales(scales), env_);
          !s.ok()) {
        return s;
      }
    }
    absl::StatusOr<std::string> bytes = EncodeFleetState(state);
    if (!bytes.ok()) return bytes.status();
    if (absl::Status s = WriteFileAtomically(FleetPath(fleet.tenant, fleet.name), *bytes, env_);
        !s.ok()) {
      return s;
    }
    for (int64_t id : writes.drop) (void)env_->RemoveFile(ScalesPath(fleet.tenant, fleet.name, id));
    return absl::OkStatus();
  }

  const FleetLimits fleet_limits_;
  const Limits limits_;
  const std::string dir_;
  Env* const env_;
  std::mutex mu_;
  std::map<Key, Entry> fleets_;
};

}  // namespace

absl::Status CheckFleetRoom(const FleetLimits& limits, int64_t fleets, int64_t tenant_fleets) {
  if (absl::Status s = CheckLimit("fleets", fleets + 1, "--max_fleets", limits.max_fleets,
                                  absl::StatusCode::kResourceExhausted);
      !s.ok()) {
    return s;
  }
  if (limits.max_fleets_per_tenant <= 0) return absl::OkStatus();
  return CheckLimit("fleets of this tenant", tenant_fleets + 1, "--max_fleets_per_tenant",
                    limits.max_fleets_per_tenant, absl::StatusCode::kResourceExhausted);
}

std::unique_ptr<FleetStore> NewMemoryFleetStore(const FleetLimits& limits) {
  return std::make_unique<FleetStoreImpl>(limits, Limits(), "", Env::Default());
}

absl::StatusOr<std::unique_ptr<FleetStore>> OpenFileFleetStore(
    std::string dir, const FleetLimits& fleet_limits, const Limits& limits,
    std::vector<absl::Status>* errors, Env* env) {
  if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  auto store = std::make_unique<FleetStoreImpl>(fleet_limits, limits, std::move(dir), env);
  store->Load(errors);
  return store;
}

}  // namespace caliper
