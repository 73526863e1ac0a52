#include "core/session/session_delta.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/session/session.h"

namespace caliper {

void SessionCounters::Add(const SessionCounters& other) {
  accepted_chunks += other.accepted_chunks;
  accepted_bytes += other.accepted_bytes;
  rejected_chunks += other.rejected_chunks;
  skipped_warmup_chunks += other.skipped_warmup_chunks;
  duplicate_chunks += other.duplicate_chunks;
}

bool SessionCounters::empty() const {
  return accepted_chunks == 0 && accepted_bytes == 0 && rejected_chunks == 0 &&
         skipped_warmup_chunks == 0 && duplicate_chunks == 0;
}

bool SessionDelta::empty() const {
  return kv_layers.empty() && kv_batches.empty() && weights.empty() && inputs.empty() &&
         input_hists.empty() && counters.empty();
}

bool SessionDelta::OnlyRejections() const {
  SessionCounters rest = counters;
  rest.rejected_chunks = 0;
  return kv_layers.empty() && kv_batches.empty() && weights.empty() && inputs.empty() &&
         input_hists.empty() && rest.empty();
}

void SessionDelta::Merge(const SessionDelta& other) {
  for (const auto& [layer, observer] : other.kv_layers) {
    auto [it, inserted] = kv_layers.emplace(layer, observer);
    if (!inserted) it->second.Merge(observer);
  }
  for (const auto& [key, observer] : other.kv_batches) {
    auto [it, inserted] = kv_batches.emplace(key, observer);
    if (!inserted) it->second.Merge(observer);
  }
  for (const auto& [module, observer] : other.weights) weights[module].Merge(observer);
  for (const auto& [key, observer] : other.inputs) inputs[key].Merge(observer);
  for (const auto& [module, hist] : other.input_hists) input_hists[module].Merge(hist);
  counters.Add(other.counters);
  if (other.producer.has_value()) {
    const uint64_t before = producer.has_value() ? producer->sequence : 0;
    producer = other.producer;
    producer->sequence = std::max(producer->sequence, before);
  }
}

// ---- CalibrationSession's side (declared in core/session/session.h) ----

namespace {

bool Untouched(const KvLayerObserver& layer) {
  auto zero = [](const auto& values) {
    return std::all_of(values.begin(), values.end(), [](auto v) { return v == 0; });
  };
  return zero(layer.k_tokens) && zero(layer.v_tokens) && zero(layer.q_tokens) &&
         zero(layer.k_absmax) && zero(layer.v_absmax) && zero(layer.q_absmax) &&
         layer.k_rank0_tokens == 0 && layer.v_rank0_tokens == 0;
}

}  // namespace

SessionDelta CalibrationSession::TakeDelta(const ProducerLedger::Stream* producer) {
  SessionDelta delta;
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t layer = 0; layer < kv_layers_.size(); ++layer) {
    if (Untouched(kv_layers_[layer])) continue;
    KvLayerObserver& observer = kv_layers_[layer];
    const int l = static_cast<int>(layer);
    for (auto& [batch, ranges] : observer.k_batches) {
      delta.kv_batches[{l, batch}].k_batches.emplace(batch, std::move(ranges));
    }
    for (auto& [batch, ranges] : observer.v_batches) {
      delta.kv_batches[{l, batch}].v_batches.emplace(batch, std::move(ranges));
    }
    for (auto& [batch, ranges] : observer.q_batches) {
      delta.kv_batches[{l, batch}].q_batches.emplace(batch, std::move(ranges));
    }
    observer.k_batches.clear();
    observer.v_batches.clear();
    observer.q_batches.clear();
    delta.kv_layers.emplace(l, std::move(observer));
    kv_layers_[layer] = KvLayerObserver(model_.num_kv_heads, recipe_.ObservesQuery());
  }
  for (auto& [name, state] : modules_) {
    if (state.weight.observations > 0) delta.weights.emplace(name, state.weight);
    for (const auto& [batch, stats] : state.input.batches) {
      delta.inputs[{name, ActivationBlockOf(batch)}].batches.emplace(batch, stats);
    }
    if (!state.input_hist.empty()) delta.input_hists.emplace(name, std::move(state.input_hist));
    for (auto& [batch, ranges] : state.input.group_batches) {
      delta.inputs[{name, GroupRowOf(batch)}].group_batches.emplace(batch, std::move(ranges));
    }
  }
  // Module names stay (so max_modules_per_session keeps counting them), their state goes.
  for (auto& [name, state] : modules_) state = ModuleState{};
  delta.counters = {accepted_chunks_, accepted_bytes_, rejected_chunks_, skipped_warmup_chunks_,
                    duplicate_chunks_};
  accepted_chunks_ = accepted_bytes_ = rejected_chunks_ = skipped_warmup_chunks_ =
      duplicate_chunks_ = 0;
  if (producer != nullptr) {
    delta.producer = ProducerAdvance{producer->producer_id, producer->epoch,
                                     ledger_.ResumeFrom(producer->producer_id) - 1};
  }
  return delta;
}

absl::Status CalibrationSession::ApplyDelta(const SessionDelta& delta) {
  const size_t heads = static_cast<size_t>(model_.num_kv_heads);
  for (const auto& [layer, observer] : delta.kv_layers) {
    if (layer < 0 || static_cast<size_t>(layer) >= kv_layers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_layers[", layer, "]: outside the session's ", kv_layers_.size(), " K/V layers"));
    }
    if (observer.k_absmax.size() != heads || observer.v_absmax.size() != heads ||
        observer.k_tokens.size() != heads || observer.v_tokens.size() != heads) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_layers[", layer, "]: per-head arrays must have num_kv_heads=", heads, " entries"));
    }
    const size_t q_heads = recipe_.ObservesQuery() ? heads : 0;
    if (observer.q_absmax.size() != q_heads || observer.q_tokens.size() != q_heads ||
        (!observer.q_hist.empty() && observer.q_hist.size() != q_heads)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_layers[", layer, "]: query arrays must have ", q_heads,
          " entries (recipe.attention ", AttentionScalesName(recipe_.attention), ")"));
    }
    for (const auto* batches : {&observer.k_batches, &observer.v_batches, &observer.q_batches}) {
      for (const auto& [batch, ranges] : *batches) {
        if (ranges.min.size() > heads) {
          return absl::InvalidArgumentError(absl::StrCat("kv_layers[", layer, "]: batch ", batch,
                                                         " has more than num_kv_heads=", heads,
                                                         " heads"));
        }
      }
    }
  }
  for (const auto& [key, observer] : delta.kv_batches) {
    const auto [layer, batch] = key;
    if (layer < 0 || static_cast<size_t>(layer) >= kv_layers_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_batches[", layer, "]: outside the session's ", kv_layers_.size(), " K/V layers"));
    }
    if (!recipe_.ObservesQuery() && !observer.q_batches.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "kv_batches[", layer, ", ", batch, "]: query ranges, but recipe.attention is off"));
    }
    for (const auto* batches : {&observer.k_batches, &observer.v_batches, &observer.q_batches}) {
      for (const auto& [b, ranges] : *batches) {
        if (b != batch || ranges.min.size() > heads) {
          return absl::InvalidArgumentError(absl::StrCat(
              "kv_batches[", layer, ", ", batch, "]: holds batch ", b, " with ",
              ranges.min.size(), " heads (one batch, at most num_kv_heads=", heads, ")"));
        }
      }
    }
  }
  if (!delta.weights.empty() && !recipe_.nvfp4_weights) {
    return absl::InvalidArgumentError("weights: the session's recipe has nvfp4_weights off");
  }
  if ((!delta.inputs.empty() || !delta.input_hists.empty()) && !recipe_.nvfp4_activations) {
    return absl::InvalidArgumentError("inputs: the session's recipe has nvfp4_activations off");
  }
  if (!delta.input_hists.empty() && !recipe_.NeedsHistograms()) {
    return absl::InvalidArgumentError("input_hists: the session's recipe keeps no histograms");
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [layer, observer] : delta.kv_layers) kv_layers_[layer].Merge(observer);
  for (const auto& [key, observer] : delta.kv_batches) kv_layers_[key.first].Merge(observer);
  for (const auto& [module, observer] : delta.weights) modules_[module].weight.Merge(observer);
  for (const auto& [key, observer] : delta.inputs) {
    ActivationObserver& input = modules_[key.first].input;
    const size_t before = input.batches.size();
    input.Merge(observer);
    batch_entries_ += static_cast<int64_t>(input.batches.size() - before);
  }
  for (const auto& [module, hist] : delta.input_hists) modules_[module].input_hist.Merge(hist);
  accepted_chunks_ += delta.counters.accepted_chunks;
  accepted_bytes_ += delta.counters.accepted_bytes;
  rejected_chunks_ += delta.counters.rejected_chunks;
  skipped_warmup_chunks_ += delta.counters.skipped_warmup_chunks;
  duplicate_chunks_ += delta.counters.duplicate_chunks;
  return absl::OkStatus();
}

std::set<std::string> ModulesOf(const SessionDelta& delta) {
  std::set<std::string> modules;
  for (const auto& [module, observer] : delta.weights) modules.insert(module);
  for (const auto& [key, observer] : delta.inputs) modules.insert(key.first);
  for (const auto& [module, hist] : delta.input_hists) modules.insert(module);
  return modules;
}

absl::Status TooManyModules(absl::string_view module, int64_t modules, int64_t limit) {
  return absl::ResourceExhaustedError(absl::StrCat("module \"", module, "\" would be module ",
                                                   modules, " of this session, over the limit "
                                                   "max_modules_per_session=", limit));
}

absl::Status CalibrationSession::CheckDeltaFits(const SessionDelta& delta) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<absl::string_view> new_modules;
  for (const auto& [module, observer] : delta.weights) {
    if (modules_.count(module) == 0) new_modules.insert(module);
  }
  int64_t new_entries = 0;
  for (const auto& [key, observer] : delta.inputs) {
    auto it = modules_.find(key.first);
    if (it == modules_.end()) new_modules.insert(key.first);
    for (const auto& [batch, stats] : observer.batches) {
      if (it == modules_.end() || it->second.input.batches.count(batch) == 0) ++new_entries;
    }
  }
  const int64_t modules = static_cast<int64_t>(modules_.size() + new_modules.size());
  if (!new_modules.empty() && modules > limits_.max_modules_per_session) {
    return TooManyModules(*new_modules.begin(), modules, limits_.max_modules_per_session);
  }
  if (new_entries > 0 && batch_entries_ + new_entries > limits_.max_batches_per_session) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "inputs: ", batch_entries_ + new_entries,
        " (module, batch) entries of this session, over the limit max_batches_per_session=",
        limits_.max_batches_per_session));
  }
  return absl::OkStatus();
}

void CalibrationSession::RestoreProducers(const ProducerSequences& committed) {
  std::lock_guard<std::mutex> lock(mu_);
  ledger_.Restore(committed);
}

std::unique_ptr<CalibrationSession> CalibrationSession::EmptyLike() const {
  std::unique_ptr<CalibrationSession> empty(
      new CalibrationSession(model_, recipe_, id_, name_, tenant_, limits_, created_unix_ms_));
  return empty;
}

}  // namespace caliper
