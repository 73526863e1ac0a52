#include "core/tensor_view.h"

#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace caliper {

absl::StatusOr<TensorView> TensorView::Create(DType dtype, std::vector<int64_t> shape,
                                              absl::Span<const uint8_t> bytes,
                                              absl::string_view field) {
  if (shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ".shape: must have at least one dimension"));
  }
  int64_t elements = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".shape[", i, "]: negative dimension ", shape[i]));
    }
    if (shape[i] != 0 && elements > std::numeric_limits<int64_t>::max() / 8 / shape[i]) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape: element count overflows"));
    }
    elements *= shape[i];
  }
  const uint64_t expected = static_cast<uint64_t>(elements) * ItemSize(dtype);
  if (bytes.size() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: ", bytes.size(), " bytes, but shape [", absl::StrJoin(shape, ", "), "] of ",
        DTypeName(dtype), " needs ", expected));
  }
  return TensorView(dtype, std::move(shape), elements, bytes);
}

std::string TensorView::ShapeString() const { return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]"); }

}  // namespace caliper
