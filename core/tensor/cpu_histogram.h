// The CPU backend's one-pass absmax + |x| histogram + count of the max per head
// (CpuBackend::CheckedAbsMaxHistogramPerHead: arguments already checked), bit-identical to the
// reference loop and to MagnitudeHistogram::SlotOf. Rows are split into `tasks` tasks on `pool`.
#ifndef CALIPER_CORE_TENSOR_CPU_HISTOGRAM_H_
#define CALIPER_CORE_TENSOR_CPU_HISTOGRAM_H_

#include <cstdint>

#include "absl/types/span.h"
#include "core/tensor/magnitude_histogram.h"
#include "core/tensor/tensor_view.h"
#include "core/tensor/thread_pool.h"

namespace caliper {

void CpuAbsMaxHistogramPerHead(ThreadPool& pool, int tasks, const TensorView& t,
                               int64_t num_heads, int64_t head_dim, absl::Span<float> absmax,
                               absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_CPU_HISTOGRAM_H_
