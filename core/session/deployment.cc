#include "core/session/deployment.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace caliper {

absl::StatusOr<ResolvedDeployment> ResolveDeployment(const Deployment& deployment,
                                                     int num_kv_heads) {
  const int H = num_kv_heads;
  if (deployment.tp_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("deployment.tp_size: must be >= 0, got ", deployment.tp_size));
  }
  if (deployment.total_kv_heads < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "deployment.total_kv_heads: must be >= 0, got ", deployment.total_kv_heads));
  }
  int tp = deployment.tp_size;
  int total = 0;
  if (tp > 0) {
    absl::StatusOr<int> deployed = DeployedTotalKvHeads(H, tp);
    if (!deployed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("deployment.tp_size: ", deployed.status().message()));
    }
    total = *deployed;
    if (deployment.total_kv_heads > 0 && deployment.total_kv_heads != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "deployment.total_kv_heads: ", deployment.total_kv_heads, " disagrees with tp_size ",
          tp, ", which deploys ", total, " total KV heads for a model with ", H));
    }
  } else if (deployment.total_kv_heads > 0) {
    total = deployment.total_kv_heads;
    if (total % H != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "deployment.total_kv_heads: ", total, " is not a multiple of the model's ", H,
          " KV heads (a TP deployment counts T * max(H / T, 1) heads)"));
    }
    if (deployment.rank.has_value()) {
      return absl::InvalidArgumentError(
          "deployment.rank: needs deployment.tp_size (heads per rank are not known from "
          "total_kv_heads alone)");
    }
    tp = total > H ? total : 1;
  } else {
    tp = 1;
    total = H;
  }
  ResolvedDeployment out;
  out.tp_size = tp;
  out.total_kv_heads = total;
  out.kv_cache_dtype = deployment.kv_cache_dtype;
  if (deployment.rank.has_value()) {
    if (*deployment.rank < 0 || *deployment.rank >= tp) {
      return absl::InvalidArgumentError(absl::StrCat("deployment.rank: ", *deployment.rank,
                                                     " is outside [0, tp_size=", tp, ")"));
    }
    out.rank = deployment.rank;
  }
  return out;
}

absl::StatusOr<std::vector<RankSlice>> RankSlices(const KvScales& scales, int num_kv_heads,
                                                  const ResolvedDeployment& deployment) {
  std::vector<RankSlice> out;
  if (!deployment.rank.has_value()) return out;
  absl::StatusOr<std::vector<std::vector<float>>> rows =
      DeployedKvRows(scales, num_kv_heads, deployment.total_kv_heads);
  if (!rows.ok()) return rows.status();
  const int heads_per_rank = deployment.total_kv_heads / deployment.tp_size;
  for (const std::vector<float>& row : *rows) {
    if (row.empty()) {  // a layer without a KV cache
      out.emplace_back();
      continue;
    }
    if (scales.granularity == KvGranularity::kPerTensor) {
      out.push_back(RankSlice{{row[0]}, {row[1]}});
      continue;
    }
    absl::StatusOr<RankSlice> slice =
        SliceRowForRank(row, deployment.total_kv_heads, *deployment.rank, heads_per_rank);
    if (!slice.ok()) return slice.status();
    out.push_back(*std::move(slice));
  }
  return out;
}

}  // namespace caliper
