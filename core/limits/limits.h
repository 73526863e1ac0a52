// Bounds on what one request, stream or state file can make the server hold or compute, so no
// single call exhausts memory (under a pod's memory limit the kernel kills the process before
// any bad_alloc, so every count is refused up front). Defaults cover the largest real models:
// 256 layers, 256 KV heads, head_dim 1024, TP 1024, 131072 modules (a 61-layer, 384-expert MoE
// has ~70k). Each field is named after the caliper-server flag that sets it. Refusals name the
// field, the value and the limit: InvalidArgument for a size one request asks for,
// ResourceExhausted for a count that accumulates (sessions, modules, producers, bytes in flight).
#ifndef CALIPER_CORE_LIMITS_LIMITS_H_
#define CALIPER_CORE_LIMITS_LIMITS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace caliper {

// What a model may declare (proto fields, hf_config_json and state files alike).
struct ModelLimits {
  int max_layers = 256;
  int max_attention_heads = 4096;
  int max_kv_heads = 256;
  int max_head_dim = 1024;
  int max_hidden_size = 1 << 20;
  size_t max_model_string_bytes = 256;         // architecture, model_type
  size_t max_hf_config_json_bytes = 1 << 20;   // real config.json files are 1-100 KiB
};

struct Limits {
  ModelLimits model;
  // Deployments a scales or adapt request may ask for: total heads are T * max(H / T, 1), so
  // at most max(max_tp_size, max_kv_heads).
  int max_tp_size = 1024;
  int max_total_kv_heads = 1024;
  int max_formats = 8;  // entries of ScalesRequest.formats, after de-duplication
  // Per session.
  int max_modules_per_session = 131072;
  int64_t max_batches_per_session = int64_t{1} << 24;  // (module or K/V layer, batch) entries
  int max_producers_per_session = 65536;  // the CLI uses one producer per dump file
  size_t max_producer_id_bytes = 256;
  size_t max_module_bytes = 1024;
  size_t max_name_bytes = 1024;            // session names, tenants
  size_t max_fused_groups_bytes = 65536;
  size_t max_lightllm_json_bytes = 16 << 20;  // Adapt input: 256 layers x 2048 heads fits
  // Server-wide.
  int max_sessions = 1024;
  int max_sessions_per_tenant = 0;  // 0: only max_sessions applies
};

// Longest session id accepted in a request (ids are 32 hex digits).
inline constexpr size_t kMaxSessionIdBytes = 128;
// Longest dtype name ("BF16", ...).
inline constexpr size_t kMaxDtypeBytes = 16;

// "FIELD: VALUE exceeds the limit LIMIT_NAME=LIMIT" with `code` when value > limit, else OK.
absl::Status CheckLimit(absl::string_view field, int64_t value, absl::string_view limit_name,
                        int64_t limit,
                        absl::StatusCode code = absl::StatusCode::kInvalidArgument);

// InvalidArgument for a string that is not UTF-8 or is longer than limit_name=max_bytes.
absl::Status CheckString(absl::string_view field, absl::string_view value,
                         absl::string_view limit_name, size_t max_bytes);

// InvalidArgument naming every field of `limits` that is not positive (max_sessions_per_tenant
// may be 0).
absl::Status ValidateLimits(const Limits& limits);

}  // namespace caliper

#endif  // CALIPER_CORE_LIMITS_LIMITS_H_
