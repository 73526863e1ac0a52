// A read-only view of one dense, row-major, little-endian tensor held elsewhere.
// Create() checks the dtype and that bytes == product(shape) * itemsize; a view never owns
// or copies its data, so the caller keeps the bytes alive while the view is used.
#ifndef CALIPER_CORE_TENSOR_VIEW_H_
#define CALIPER_CORE_TENSOR_VIEW_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/dtype.h"

namespace caliper {

class TensorView {
 public:
  // Fails (InvalidArgument, message names `field`) on an empty shape dimension list, a negative
  // dimension, an overflowing element count, or a byte length that does not match.
  static absl::StatusOr<TensorView> Create(DType dtype, std::vector<int64_t> shape,
                                           absl::Span<const uint8_t> bytes,
                                           absl::string_view field = "tensor");

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t num_elements() const { return num_elements_; }
  absl::Span<const uint8_t> bytes() const { return bytes_; }
  const void* data() const { return bytes_.data(); }

  // "[4, 8, 128]"
  std::string ShapeString() const;

 private:
  TensorView(DType dtype, std::vector<int64_t> shape, int64_t num_elements,
             absl::Span<const uint8_t> bytes)
      : dtype_(dtype), shape_(std::move(shape)), num_elements_(num_elements), bytes_(bytes) {}

  DType dtype_;
  std::vector<int64_t> shape_;
  int64_t num_elements_;
  absl::Span<const uint8_t> bytes_;
};

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_VIEW_H_
