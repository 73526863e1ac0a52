// Read-only views of one dense, row-major, little-endian tensor held elsewhere.
// TensorView is contiguous (what a ReductionBackend reads); PiecewiseTensor is the same tensor
// whose bytes may be split into pieces at any byte offset (e.g. the slices of a network buffer),
// walked as contiguous TensorViews. Create() checks the dtype and that bytes == product(shape) *
// itemsize; a view never owns or copies its data, so the caller keeps the bytes alive.
#ifndef CALIPER_CORE_TENSOR_TENSOR_VIEW_H_
#define CALIPER_CORE_TENSOR_TENSOR_VIEW_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "core/tensor/dtype.h"

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

// Bytes in order, in one or more pieces; a contiguous buffer is one piece. Owns only the list.
class ByteSpans {
 public:
  ByteSpans() = default;
  ByteSpans(absl::Span<const uint8_t> bytes) { Append(bytes); }  // NOLINT: one piece
  ByteSpans(const uint8_t* data, size_t size) : ByteSpans(absl::MakeConstSpan(data, size)) {}

  void Append(absl::Span<const uint8_t> piece);  // empty pieces are dropped
  void Clear() {
    pieces_.clear();
    size_ = 0;
  }
  size_t size() const { return size_; }
  absl::Span<const absl::Span<const uint8_t>> pieces() const { return pieces_; }

 private:
  std::vector<absl::Span<const uint8_t>> pieces_;
  size_t size_ = 0;
};

class PiecewiseTensor {
 public:
  // Same checks and errors as TensorView::Create, on the total size of `bytes`.
  static absl::StatusOr<PiecewiseTensor> Create(DType dtype, std::vector<int64_t> shape,
                                                ByteSpans bytes,
                                                absl::string_view field = "tensor");
  PiecewiseTensor(const TensorView& view);  // NOLINT: a contiguous tensor is one piece

  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t num_elements() const { return num_elements_; }
  std::string ShapeString() const;

  // Calls fn on consecutive runs covering the tensor in order, each of shape [units,
  // unit_elements]: whole units lying inside one piece are viewed in place; a unit that straddles
  // pieces is copied (alone) into a scratch buffer. With min_run_bytes > 0 and several pieces,
  // pieces are instead copied into runs of about min_run_bytes. Returns fn's first error, or
  // InvalidArgument when unit_elements does not divide num_elements().
  absl::Status ForEachRun(int64_t unit_elements,
                          absl::FunctionRef<absl::Status(const TensorView&)> fn,
                          int64_t min_run_bytes = 0) const;

 private:
  PiecewiseTensor(DType dtype, std::vector<int64_t> shape, int64_t num_elements, ByteSpans bytes)
      : dtype_(dtype), shape_(std::move(shape)), num_elements_(num_elements),
        bytes_(std::move(bytes)) {}

  DType dtype_;
  std::vector<int64_t> shape_;
  int64_t num_elements_;
  ByteSpans bytes_;
};

// The element count of `shape` (at least one dimension, none negative, no overflow);
// InvalidArgument naming `field`.shape otherwise.
absl::StatusOr<int64_t> ShapeElements(const std::vector<int64_t>& shape, absl::string_view field);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_TENSOR_VIEW_H_
