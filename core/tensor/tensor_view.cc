#include "core/tensor/tensor_view.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace caliper {
namespace {

// The element count of `shape` if `size` bytes of `dtype` fill it exactly.
absl::StatusOr<int64_t> CheckedElements(DType dtype, const std::vector<int64_t>& shape,
                                        size_t size, absl::string_view field) {
  absl::StatusOr<int64_t> elements = ShapeElements(shape, field);
  if (!elements.ok()) return elements.status();
  const uint64_t expected = static_cast<uint64_t>(*elements) * ItemSize(dtype);
  if (size != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ".data: ", size, " bytes, but shape [", absl::StrJoin(shape, ", "), "] of ",
        DTypeName(dtype), " needs ", expected));
  }
  return *elements;
}

}  // namespace

absl::StatusOr<int64_t> ShapeElements(const std::vector<int64_t>& shape, absl::string_view field) {
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
  return elements;
}

absl::StatusOr<TensorView> TensorView::Create(DType dtype, std::vector<int64_t> shape,
                                              absl::Span<const uint8_t> bytes,
                                              absl::string_view field) {
  absl::StatusOr<int64_t> elements = CheckedElements(dtype, shape, bytes.size(), field);
  if (!elements.ok()) return elements.status();
  return TensorView(dtype, std::move(shape), *elements, bytes);
}

std::string TensorView::ShapeString() const { return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]"); }

void ByteSpans::Append(absl::Span<const uint8_t> piece) {
  if (piece.empty()) return;
  pieces_.push_back(piece);
  size_ += piece.size();
}

absl::StatusOr<PiecewiseTensor> PiecewiseTensor::Create(DType dtype, std::vector<int64_t> shape,
                                                        ByteSpans bytes,
                                                        absl::string_view field) {
  absl::StatusOr<int64_t> elements = CheckedElements(dtype, shape, bytes.size(), field);
  if (!elements.ok()) return elements.status();
  return PiecewiseTensor(dtype, std::move(shape), *elements, std::move(bytes));
}

PiecewiseTensor::PiecewiseTensor(const TensorView& view)
    : PiecewiseTensor(view.dtype(), view.shape(), view.num_elements(), ByteSpans(view.bytes())) {}

std::string PiecewiseTensor::ShapeString() const {
  return absl::StrCat("[", absl::StrJoin(shape_, ", "), "]");
}

absl::Status PiecewiseTensor::ForEachRun(int64_t unit_elements,
                                         absl::FunctionRef<absl::Status(const TensorView&)> fn,
                                         int64_t min_run_bytes) const {
  if (unit_elements <= 0 || num_elements_ % unit_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unit_elements: ", unit_elements,
                                                   " does not divide the ", num_elements_,
                                                   " elements of ", ShapeString()));
  }
  const size_t unit_bytes = static_cast<size_t>(unit_elements) * ItemSize(dtype_);
  auto run = [&](const uint8_t* data, size_t units) -> absl::Status {
    absl::StatusOr<TensorView> view =
        TensorView::Create(dtype_, {static_cast<int64_t>(units), unit_elements},
                           absl::MakeConstSpan(data, units * unit_bytes));
    return view.ok() ? fn(*view) : view.status();
  };
  if (min_run_bytes > 0 && bytes_.pieces().size() > 1) {
    // Gather: runs of whole units, as many as fit in min_run_bytes (at least one).
    const size_t capacity =
        std::max<size_t>(1, static_cast<size_t>(min_run_bytes) / unit_bytes) * unit_bytes;
    std::vector<uint8_t> gathered(std::min(capacity, bytes_.size()));
    size_t filled = 0;
    for (absl::Span<const uint8_t> piece : bytes_.pieces()) {
      for (size_t done = 0; done < piece.size();) {
        const size_t take = std::min(piece.size() - done, gathered.size() - filled);
        std::memcpy(gathered.data() + filled, piece.data() + done, take);
        filled += take;
        done += take;
        if (filled < gathered.size()) continue;
        if (absl::Status s = run(gathered.data(), filled / unit_bytes); !s.ok()) return s;
        filled = 0;
      }
    }
    // Totals and capacity are whole units, so the rest is too.
    return filled > 0 ? run(gathered.data(), filled / unit_bytes) : absl::OkStatus();
  }
  std::vector<uint8_t> scratch;  // one unit split across pieces
  size_t carried = 0;            // bytes of it gathered so far
  for (absl::Span<const uint8_t> piece : bytes_.pieces()) {
    const uint8_t* p = piece.data();
    size_t left = piece.size();
    if (carried > 0) {
      const size_t take = std::min(left, unit_bytes - carried);
      std::memcpy(scratch.data() + carried, p, take);
      carried += take;
      p += take;
      left -= take;
      if (carried < unit_bytes) continue;
      carried = 0;
      if (absl::Status s = run(scratch.data(), 1); !s.ok()) return s;
    }
    if (const size_t units = left / unit_bytes; units > 0) {
      if (absl::Status s = run(p, units); !s.ok()) return s;
      p += units * unit_bytes;
      left -= units * unit_bytes;
    }
    if (left > 0) {
      scratch.resize(unit_bytes);
      std::memcpy(scratch.data(), p, left);
      carried = left;
    }
  }
  return absl::OkStatus();  // Create checked the total, so no unit is left half gathered
}

}  // namespace caliper
