#include "core/limits/limits.h"

#include "absl/strings/str_cat.h"
#include "core/limits/utf8.h"

namespace caliper {

absl::Status CheckLimit(absl::string_view field, int64_t value, absl::string_view limit_name,
                        int64_t limit, absl::StatusCode code) {
  if (value <= limit) return absl::OkStatus();
  return absl::Status(code, absl::StrCat(field, ": ", value, " exceeds the limit ", limit_name,
                                         "=", limit));
}

absl::Status CheckString(absl::string_view field, absl::string_view value,
                         absl::string_view limit_name, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", value.size(),
                                                   " bytes exceeds the limit ", limit_name, "=",
                                                   max_bytes));
  }
  return CheckUtf8(field, value);
}

absl::Status ValidateLimits(const Limits& limits) {
  struct Field {
    const char* name;
    int64_t value;
  };
  const Field fields[] = {
      {"max_layers", limits.model.max_layers},
      {"max_attention_heads", limits.model.max_attention_heads},
      {"max_kv_heads", limits.model.max_kv_heads},
      {"max_head_dim", limits.model.max_head_dim},
      {"max_hidden_size", limits.model.max_hidden_size},
      {"max_model_string_bytes", static_cast<int64_t>(limits.model.max_model_string_bytes)},
      {"max_hf_config_json_bytes", static_cast<int64_t>(limits.model.max_hf_config_json_bytes)},
      {"max_tp_size", limits.max_tp_size},
      {"max_total_kv_heads", limits.max_total_kv_heads},
      {"max_formats", limits.max_formats},
      {"max_modules_per_session", limits.max_modules_per_session},
      {"max_batches_per_session", limits.max_batches_per_session},
      {"max_producers_per_session", limits.max_producers_per_session},
      {"max_producer_id_bytes", static_cast<int64_t>(limits.max_producer_id_bytes)},
      {"max_module_bytes", static_cast<int64_t>(limits.max_module_bytes)},
      {"max_name_bytes", static_cast<int64_t>(limits.max_name_bytes)},
      {"max_fused_groups_bytes", static_cast<int64_t>(limits.max_fused_groups_bytes)},
      {"max_lightllm_json_bytes", static_cast<int64_t>(limits.max_lightllm_json_bytes)},
      {"max_sessions", limits.max_sessions},
  };
  for (const Field& field : fields) {
    if (field.value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field.name, ": must be positive, got ", field.value));
    }
  }
  if (limits.max_sessions_per_tenant < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_sessions_per_tenant: must be >= 0 (0: max_sessions only), got ",
        limits.max_sessions_per_tenant));
  }
  return absl::OkStatus();
}

}  // namespace caliper
