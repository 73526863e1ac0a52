#include "core/tensor/reduction_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/tensor/dtype.h"

namespace caliper {
namespace {

// Element i of a little-endian buffer of `dtype`, as float (the reference loops' one load).
float ElementAt(DType dtype, const uint8_t* p, int64_t i) {
  if (dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return dtype == DType::kBF16 ? BF16ToFloat(b) : F16ToFloat(b);
}

}  // namespace

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

absl::Status CheckAbsMaxHistogramPerHeadArgs(const TensorView& t, int64_t num_heads,
                                             int64_t head_dim, absl::Span<const float> absmax,
                                             absl::Span<const MagnitudeHistogram> hists,
                                             const int64_t* nonfinite) {
  if (absl::Status args = CheckAbsMaxPerHeadArgs(t, num_heads, head_dim, absmax, nonfinite);
      !args.ok()) {
    return args;
  }
  if (static_cast<int64_t>(hists.size()) != num_heads) {
    return absl::InvalidArgumentError(
        absl::StrCat("hists: has ", hists.size(), " entries for ", num_heads, " heads"));
  }
  return absl::OkStatus();
}

absl::Status CheckRangePerGroupArgs(const TensorView& t, int64_t row_width, int64_t group_width,
                                    absl::Span<const float> min, absl::Span<const float> max,
                                    const int64_t* nonfinite) {
  if (row_width <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("row_width: must be positive, got ", row_width));
  }
  if (group_width <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("group_width: must be positive, got ", group_width));
  }
  const int64_t groups = (row_width + group_width - 1) / group_width;
  if (static_cast<int64_t>(min.size()) != groups || static_cast<int64_t>(max.size()) != groups) {
    return absl::InvalidArgumentError(absl::StrCat("min/max: have ", min.size(), "/", max.size(),
                                                   " entries for ", groups, " groups"));
  }
  if (nonfinite == nullptr) return absl::InvalidArgumentError("nonfinite: must not be null");
  if (t.num_elements() % row_width != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor.shape: ", t.ShapeString(), " (",
                                                   t.num_elements(),
                                                   " elements) is not whole rows of ", row_width));
  }
  return absl::OkStatus();
}

void AbsMaxHistogramPerHeadReference(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                     absl::Span<float> absmax,
                                     absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite) {
  for (int64_t h = 0; h < num_heads; ++h) {
    hists[h] = MagnitudeHistogram();
    hists[h].counts.assign(MagnitudeHistogram::kSlots, 0);
    absmax[h] = 0.0f;
  }
  *nonfinite = 0;
  const uint8_t* p = t.bytes().data();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const float v = ElementAt(t.dtype(), p, i);
    const int64_t h = (i / head_dim) % num_heads;
    if (!std::isfinite(v)) {
      ++*nonfinite;
      ++hists[h].counts[MagnitudeHistogram::kOverflowSlot];
      continue;
    }
    ++hists[h].counts[MagnitudeHistogram::SlotOf(v)];
    MergeMaxCount(std::fabs(v), 1, &hists[h].max, &hists[h].max_count);
  }
  for (int64_t h = 0; h < num_heads; ++h) {
    absmax[h] = hists[h].max;
  }
}

void RangePerGroupReference(const TensorView& t, int64_t row_width, int64_t group_width,
                            absl::Span<float> min, absl::Span<float> max, int64_t* nonfinite) {
  std::fill(min.begin(), min.end(), std::numeric_limits<float>::infinity());
  std::fill(max.begin(), max.end(), -std::numeric_limits<float>::infinity());
  *nonfinite = 0;
  const uint8_t* p = t.bytes().data();
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const float v = ElementAt(t.dtype(), p, i);
    if (!std::isfinite(v)) {
      ++*nonfinite;
      continue;
    }
    const int64_t g = (i % row_width) / group_width;
    if (v < min[g] || (v == min[g] && std::signbit(v))) min[g] = v;
    if (v > max[g] || (v == max[g] && !std::signbit(v))) max[g] = v;
  }
}

absl::Status ReductionBackend::Range(const TensorView& t, RangeStats* out) {
  if (out == nullptr) return absl::InvalidArgumentError("out: must not be null");
  return CheckedRange(t, out);
}

absl::Status ReductionBackend::AbsMaxPerHead(const TensorView& t, int64_t num_heads,
                                             int64_t head_dim, absl::Span<float> out,
                                             int64_t* nonfinite) {
  if (absl::Status args = CheckAbsMaxPerHeadArgs(t, num_heads, head_dim, out, nonfinite);
      !args.ok()) {
    return args;
  }
  return CheckedAbsMaxPerHead(t, num_heads, head_dim, out, nonfinite);
}

absl::Status ReductionBackend::AbsMaxHistogramPerHead(const TensorView& t, int64_t num_heads,
                                                      int64_t head_dim, absl::Span<float> absmax,
                                                      absl::Span<MagnitudeHistogram> hists,
                                                      int64_t* nonfinite) {
  if (absl::Status args =
          CheckAbsMaxHistogramPerHeadArgs(t, num_heads, head_dim, absmax, hists, nonfinite);
      !args.ok()) {
    return args;
  }
  return CheckedAbsMaxHistogramPerHead(t, num_heads, head_dim, absmax, hists, nonfinite);
}

absl::Status ReductionBackend::RangePerGroup(const TensorView& t, int64_t row_width,
                                             int64_t group_width, absl::Span<float> min,
                                             absl::Span<float> max, int64_t* nonfinite) {
  if (absl::Status args = CheckRangePerGroupArgs(t, row_width, group_width, min, max, nonfinite);
      !args.ok()) {
    return args;
  }
  return CheckedRangePerGroup(t, row_width, group_width, min, max, nonfinite);
}

absl::Status ReductionBackend::PackNvfp4(const TensorView& weight, const Nvfp4PackParams& params,
                                         absl::Span<uint8_t> packed, absl::Span<uint8_t> scales) {
  if (absl::Status s = CheckNvfp4PackArgs(weight, params, packed, scales); !s.ok()) return s;
  absl::StatusOr<int64_t> nonfinite = CheckedPackNvfp4(weight, params, packed, scales);
  if (!nonfinite.ok()) return nonfinite.status();
  return NonFiniteWeightsError(*nonfinite, weight);
}

absl::Status ReductionBackend::CheckedAbsMaxHistogramPerHead(
    const TensorView& t, int64_t num_heads, int64_t head_dim, absl::Span<float> absmax,
    absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite) {
  AbsMaxHistogramPerHeadReference(t, num_heads, head_dim, absmax, hists, nonfinite);
  return absl::OkStatus();
}

absl::Status ReductionBackend::CheckedRangePerGroup(const TensorView& t, int64_t row_width,
                                                    int64_t group_width, absl::Span<float> min,
                                                    absl::Span<float> max, int64_t* nonfinite) {
  RangePerGroupReference(t, row_width, group_width, min, max, nonfinite);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ReductionBackend::CheckedPackNvfp4(const TensorView& weight,
                                                           const Nvfp4PackParams& params,
                                                           absl::Span<uint8_t> packed,
                                                           absl::Span<uint8_t> scales) {
  int64_t nonfinite = 0;
  PackNvfp4Rows(weight, params, 0, weight.shape()[0], packed.data(), scales.data(), &nonfinite);
  return nonfinite;
}

}  // namespace caliper
