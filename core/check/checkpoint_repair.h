// `caliper check --repair`: a repaired copy of a checkpoint (the original never changes), with
// explicit, combinable policies; every repair is listed in the report and in
// caliper_repairs.json inside the copy. Never invents a KV scale of 1.0. When a weight global
// scale changes, the tensors it covers are requantized from the unquantized weights
// (`weights_from`) with caliper quantize's packing, or their group scales are rescaled to the
// new global scale and the added error is stated per tensor. Files without a change (shards,
// config.json, tokenizer files, ...) are copied (a reflink where the filesystem offers one), so
// nothing written into the copy ever reaches the original; with `link_unchanged` they are
// hard-linked instead (symlinked across filesystems) and the report names each one. The copy
// appears whole or not at all.
#ifndef CALIPER_CORE_CHECK_CHECKPOINT_REPAIR_H_
#define CALIPER_CORE_CHECK_CHECKPOINT_REPAIR_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/check/scale_set.h"
#include "core/env/env.h"
#include "core/tensor/reduction_backend.h"

namespace caliper {

inline constexpr char kRepairsFile[] = "caliper_repairs.json";

struct RepairPolicy {
  enum class Experts { kNone, kMaxOfLayer, kMedianOfLayer, kFromSession };
  enum class KvMissing { kNone, kFromSession, kRefuse };
  Experts experts = Experts::kNone;
  bool fused_min = false;
  KvMissing kv_missing = KvMissing::kNone;
  std::string experts_session, kv_session;  // from-session:ID
};

// "experts=max-of-layer", "experts=median-of-layer", "experts=from-session:ID", "fused=min",
// "kv-missing=from-session:ID", "kv-missing=refuse"; each key once. InvalidArgument naming
// `field` and the spec otherwise.
absl::StatusOr<RepairPolicy> ParseRepairPolicies(absl::Span<const std::string> specs,
                                                 absl::string_view field = "repair");

struct RepairOptions {
  std::string checkpoint_dir;  // the ScaleSet's directory
  std::string out_dir;         // must not exist, or be empty
  std::string weights_from;    // unquantized checkpoint; empty: rescale group scales instead
  RepairPolicy policy;
  // The scales of each session a from-session:ID policy names (the caller fetches them).
  std::map<std::string, ScaleSet> sessions;
  ReductionBackend* backend = nullptr;  // packs requantized weights; required with weights_from
  // Hard-link the unchanged files into the copy (symlink by absolute path across filesystems)
  // instead of copying them: no space, but writing into one of them in place (as
  // json.dump(open(path, "w")) does) changes the original. `caliper check --link-unchanged`.
  bool link_unchanged = false;
  Env* env = Env::Default();
};

struct RepairEntry {
  std::string tensor;
  std::string rule;    // the finding it repairs
  std::string policy;  // "experts=max-of-layer", ...
  std::string before, after;  // values as text; "missing" when the tensor was added
  // Rescaled group scales: the largest relative change of a dequantized weight the FP8 rounding
  // of the new group scales added (0 when exact).
  std::optional<double> added_error;
  std::string note;
};

struct RepairReport {
  std::vector<RepairEntry> repairs;
  // File names in out_dir: shards rewritten with repairs; unchanged files copied (the
  // default); unchanged files hard-linked or symlinked to the original's (link_unchanged only).
  std::vector<std::string> rewritten, copied, hard_linked, symlinked;
  bool linked_any() const { return !hard_linked.empty() || !symlinked.empty(); }
};

// `scales` must be ReadScaleSet(options.checkpoint_dir). FailedPrecondition for kv-missing=refuse
// with layers missing scales (naming them), a from-session policy whose session lacks a value
// (naming the tensor), or an output that exists; InvalidArgument for weights_from without the
// module's weight. Errors name the file and tensor; I/O errors are the Env's.
absl::StatusOr<RepairReport> RepairCheckpoint(const ScaleSet& scales, const RepairOptions& options);

// caliper_repairs.json's text (also written into the copy): the repairs, the files rewritten,
// and how the unchanged ones got there ("unchanged_files": "copied" or "linked", with
// `copied`, `hard_linked` and `symlinked` naming them).
std::string RepairReportJson(const RepairReport& report, const RepairOptions& options);

}  // namespace caliper

#endif  // CALIPER_CORE_CHECK_CHECKPOINT_REPAIR_H_
