// What one replica folded into a session since its last flush, in the row layout a shared store
// keeps (core/state/state_store.h encodes the rows: core/state/observer_codec.h): K/V observers per layer (their per-batch ranges per (layer,
// batch)), weight observers per module, and
// activation observers per (module, block of kActivationBlockBatches batch ids; per-group ranges
// per (module, batch)), so a flush rewrites only the rows it touched. Every part merges associatively and commutatively
// (max/min/sum, per-batch min/max), so replicas merging in any order reach the same state.
#ifndef CALIPER_CORE_SESSION_SESSION_DELTA_H_
#define CALIPER_CORE_SESSION_SESSION_DELTA_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/calibration/observers.h"
#include "core/session/producer_ledger.h"

namespace caliper {

// Batch ids [b * 64, (b + 1) * 64) of a module share one row: a flush during ingestion (which
// goes batch by batch) touches one or two blocks per module, not the module's whole history.
inline constexpr int64_t kActivationBlockBatches = 64;
inline int64_t ActivationBlockOf(int64_t batch) { return batch / kActivationBlockBatches; }
// The moving-average observer's per-16-column-group ranges of one batch are large (hidden / 16
// groups x 8 bytes): each batch has a row of its own, keyed -3 - batch (blocks >= 0 hold the
// per-batch min/max, -1 a module's weight, -2 its input histogram), so a flush writes only the
// batches it saw.
constexpr int64_t GroupRowOf(int64_t batch) { return -3 - batch; }
constexpr bool IsGroupRow(int64_t block) { return block <= -3; }

// The session counters reported by GetSession; they add up across replicas.
struct SessionCounters {
  int64_t accepted_chunks = 0, accepted_bytes = 0;
  int64_t rejected_chunks = 0, skipped_warmup_chunks = 0, duplicate_chunks = 0;

  void Add(const SessionCounters& other);
  bool empty() const;
};

// A producer's ledger position carried by a delta: `sequence` is the producer's N after the
// delta; the store applies the delta only while `epoch` is the producer's current stream, so a
// fenced stream's late flush counts nothing.
struct ProducerAdvance {
  std::string producer_id;
  uint64_t epoch = 0;
  uint64_t sequence = 0;
};

struct SessionDelta {
  // Idempotence: one id per partial (a stream on one replica), flushes numbered 1, 2, ...; a
  // store applies each (partial_id, flush) once, so retrying a commit whose answer was lost
  // cannot count it twice.
  std::string partial_id;
  uint64_t flush = 0;
  std::map<int, KvLayerObserver> kv_layers;  // by layer: absmax, tokens, histograms
  // The minmax K/V observer's per-head ranges of one batch of a layer (only k_batches and
  // v_batches, keyed that batch): a row each, so a flush writes the batches it saw.
  std::map<std::pair<int, int64_t>, KvLayerObserver> kv_batches;  // by (layer, batch)
  std::map<std::string, MinMaxObserver> weights;              // by module
  // By (module, block), and (module, GroupRowOf(batch)) for per-group ranges.
  std::map<std::pair<std::string, int64_t>, ActivationObserver> inputs;
  std::map<std::string, MagnitudeHistogram> input_hists;  // by module (histogram recipes)
  SessionCounters counters;
  std::optional<ProducerAdvance> producer;

  // No observer or counter changed.
  bool empty() const;
  // Only chunks rejected (no statistics, nothing accepted, skipped or duplicate): what a stream
  // of a finalized session brings, which the finalized session still counts.
  bool OnlyRejections() const;
  // Folds `other` in (observers, counters, the later producer position).
  void Merge(const SessionDelta& other);
};

// The modules `delta` adds rows to (weights, inputs, input histograms).
std::set<std::string> ModulesOf(const SessionDelta& delta);
// ResourceExhausted naming max_modules_per_session: `module` would be module `modules` of the
// session, over `limit`. Every store refuses a delta so (its stream fails, nothing merged).
absl::Status TooManyModules(absl::string_view module, int64_t modules, int64_t limit);

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_SESSION_DELTA_H_
