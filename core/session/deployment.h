// The deployment a caller asks scales for (TP size and/or total KV heads, optionally one rank),
// resolved against the model's KV heads, and the per-rank K/V slices of finalized scales.
// Pure functions; InvalidArgument naming the deployment.* field a deployment cannot have.
#ifndef CALIPER_CORE_SESSION_DEPLOYMENT_H_
#define CALIPER_CORE_SESSION_DEPLOYMENT_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "core/calibration/kv_scales.h"

namespace caliper {

// A deployment asks for scales at TP `tp_size` (0: unset) or with `total_kv_heads` counted
// across ranks (0: unset; a multiple of the model's heads, since T * max(H / T, 1) always is);
// both unset means TP 1. `rank` also returns that rank's K/V slice and needs tp_size.
struct Deployment {
  int tp_size = 0;
  int total_kv_heads = 0;
  std::optional<int> rank;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFp8;
};

struct ResolvedDeployment {
  // As given, or inferred from total_kv_heads: total / H replicas > 1 means TP = total; total ==
  // H gives the same files for every TP that divides H, and 1 is reported.
  int tp_size = 1;
  int total_kv_heads = 0;   // heads counted across ranks, replicas included
  std::optional<int> rank;  // in [0, tp_size) when set
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kFp8;
};

absl::StatusOr<ResolvedDeployment> ResolveDeployment(const Deployment& deployment,
                                                     int num_kv_heads);

// Rank `deployment.rank`'s K/V slice of every layer of `scales` (over `num_kv_heads` original
// heads), cut from the rows over the deployed heads (DeployedKvRows); per tensor: the layer's one
// K and one V value. Any FP8 flavor. Empty when no rank is set.
absl::StatusOr<std::vector<RankSlice>> RankSlices(const KvScales& scales, int num_kv_heads,
                                                  const ResolvedDeployment& deployment);

}  // namespace caliper

#endif  // CALIPER_CORE_SESSION_DEPLOYMENT_H_
