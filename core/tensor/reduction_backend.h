// The compute interface core needs from a device: the reductions behind every observer.
// The CPU backend (cpu_backend.cc, MakeCpuBackend) is the reference; the CUDA backend (cuda/) implements the
// same contract. Implementations must be safe to call from many threads at once.
// NaN and +-Inf never enter min/max/absmax: they are counted in `nonfinite` so the caller can
// reject the chunk with a clear error instead of poisoning the statistic.
#ifndef CALIPER_CORE_TENSOR_REDUCTION_BACKEND_H_
#define CALIPER_CORE_TENSOR_REDUCTION_BACKEND_H_

#include <cstdint>
#include <limits>
#include <memory>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "core/tensor/magnitude_histogram.h"
#include "core/tensor/nvfp4_pack.h"
#include "core/tensor/tensor_view.h"

namespace caliper {

struct RangeStats {
  float min = std::numeric_limits<float>::infinity();   // over finite elements
  float max = -std::numeric_limits<float>::infinity();  // over finite elements
  int64_t nonfinite = 0;                                 // NaN and +-Inf elements seen
};

// The public calls check their arguments (the Check*Args functions below, errors naming the
// argument) and only then hand them to the implementation's Checked* method, so no backend can
// skip or reword a check.
class ReductionBackend {
 public:
  virtual ~ReductionBackend() = default;

  // "cpu" or "cuda"; exported as a metric label and logged at start-up.
  virtual absl::string_view name() const = 0;

  // A chunk may arrive in many small pieces (network buffer slices, ~64 KiB). A backend with a
  // fixed cost per call (a device round trip) returns the run size worth gathering pieces into
  // first; 0 reduces each piece in place (the CPU backend).
  virtual int64_t min_run_bytes() const { return 0; }

  // Min and max over every finite element of `tensor`.
  absl::Status Range(const TensorView& tensor, RangeStats* out);

  // Per-head absolute maximum. The tensor is read as rows of num_heads * head_dim elements
  // (any shape whose element count is a multiple of that row); head h is columns
  // [h * head_dim, (h + 1) * head_dim). out.size() must equal num_heads; each entry is seeded
  // with 0, so an all-zero head gives 0. Non-finite elements are counted, not reduced.
  absl::Status AbsMaxPerHead(const TensorView& tensor, int64_t num_heads, int64_t head_dim,
                             absl::Span<float> out, int64_t* nonfinite);

  // AbsMaxPerHead plus each head's |x| histogram (core/tensor/magnitude_histogram.h), in the same
  // pass; hists.size() == num_heads, each overwritten. The histograms are meaningful only when
  // *nonfinite == 0 (callers reject such chunks).
  absl::Status AbsMaxHistogramPerHead(const TensorView& tensor, int64_t num_heads,
                                      int64_t head_dim, absl::Span<float> absmax,
                                      absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite);
  // Min and max per column group, for the moving-average observers (per K/V head, per 16 input
  // columns). The tensor is read as rows of `row_width` elements; group g is columns
  // [g * group_width, min((g + 1) * group_width, row_width)), so min/max hold
  // ceil(row_width / group_width) entries, each overwritten (+inf / -inf when empty). Ties order
  // -0 below +0, as Range. Non-finite elements are counted, not reduced.
  absl::Status RangePerGroup(const TensorView& tensor, int64_t row_width, int64_t group_width,
                             absl::Span<float> min, absl::Span<float> max, int64_t* nonfinite);
  // NVFP4 packing of a [rows, cols] weight (core/tensor/nvfp4_pack.h): the same bytes as
  // PackNvfp4Reference, the same errors (arguments, non-finite weights).
  absl::Status PackNvfp4(const TensorView& weight, const Nvfp4PackParams& params,
                         absl::Span<uint8_t> packed, absl::Span<uint8_t> scales);

 protected:
  // The implementations, called with checked arguments.
  virtual absl::Status CheckedRange(const TensorView& tensor, RangeStats* out) = 0;
  virtual absl::Status CheckedAbsMaxPerHead(const TensorView& tensor, int64_t num_heads,
                                            int64_t head_dim, absl::Span<float> out,
                                            int64_t* nonfinite) = 0;
  // The defaults of the three below run the scalar references (free functions below); backends
  // override them with fast paths that must give bit-identical results.
  virtual absl::Status CheckedAbsMaxHistogramPerHead(const TensorView& tensor, int64_t num_heads,
                                                     int64_t head_dim, absl::Span<float> absmax,
                                                     absl::Span<MagnitudeHistogram> hists,
                                                     int64_t* nonfinite);
  virtual absl::Status CheckedRangePerGroup(const TensorView& tensor, int64_t row_width,
                                            int64_t group_width, absl::Span<float> min,
                                            absl::Span<float> max, int64_t* nonfinite);
  // Returns the count of non-finite weights (the caller refuses the weight when it is not 0).
  virtual absl::StatusOr<int64_t> CheckedPackNvfp4(const TensorView& weight,
                                                   const Nvfp4PackParams& params,
                                                   absl::Span<uint8_t> packed,
                                                   absl::Span<uint8_t> scales);
};

// The scalar reference loops every backend must match bit for bit; arguments already checked.
void AbsMaxHistogramPerHeadReference(const TensorView& tensor, int64_t num_heads,
                                     int64_t head_dim, absl::Span<float> absmax,
                                     absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite);
void RangePerGroupReference(const TensorView& tensor, int64_t row_width, int64_t group_width,
                            absl::Span<float> min, absl::Span<float> max, int64_t* nonfinite);

// The argument checks every AbsMaxPerHead implementation makes first (positive sizes, no
// overflow, out.size() == num_heads, whole rows), with errors naming the argument.
absl::Status CheckAbsMaxPerHeadArgs(const TensorView& tensor, int64_t num_heads, int64_t head_dim,
                                    absl::Span<const float> out, const int64_t* nonfinite);

// The same plus hists.size() == num_heads (AbsMaxHistogramPerHead).
absl::Status CheckAbsMaxHistogramPerHeadArgs(const TensorView& tensor, int64_t num_heads,
                                             int64_t head_dim, absl::Span<const float> absmax,
                                             absl::Span<const MagnitudeHistogram> hists,
                                             const int64_t* nonfinite);

// RangePerGroup's checks: positive widths, ceil(row_width / group_width) entries in min and
// max, whole rows; errors name the argument.
absl::Status CheckRangePerGroupArgs(const TensorView& tensor, int64_t row_width,
                                    int64_t group_width, absl::Span<const float> min,
                                    absl::Span<const float> max, const int64_t* nonfinite);

// threads <= 0: use std::thread::hardware_concurrency().
std::unique_ptr<ReductionBackend> MakeCpuBackend(int threads = 0);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_REDUCTION_BACKEND_H_
