#include "core/tensor/reduction_backend.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace caliper {

absl::Status CheckAbsMaxPerHeadArgs(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                    absl::Span<const float> out, const int64_t* nonfinite) {
  if (num_heads <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads: must be positive, got ", num_heads));
  }
  if (head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("head_dim: must be positive, got ", head_dim));
  }
  if (num_heads > std::numeric_limits<int64_t>::max() / head_dim) {
    return absl::InvalidArgumentError("num_heads * head_dim: overflows");
  }
  if (static_cast<int64_t>(out.size()) != num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("out: has ", out.size(), " entries for ", num_heads, " heads"));
  }
  if (nonfinite == nullptr) return absl::InvalidArgumentError("nonfinite: must not be null");
  if (t.num_elements() % (num_heads * head_dim) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor.shape: ", t.ShapeString(), " (", t.num_elements(),
        " elements) is not whole rows of num_heads ", num_heads, " x head_dim ", head_dim));
  }
  return absl::OkStatus();
}

absl::Status ReductionBackend::PackNvfp4(const TensorView& weight, const Nvfp4PackParams& params,
                                         absl::Span<uint8_t> packed, absl::Span<uint8_t> scales) {
  return PackNvfp4Reference(weight, params, packed, scales);
}

}  // namespace caliper
