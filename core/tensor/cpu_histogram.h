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

// Distance between consecutive heads' per-task counts: they start 512 bytes apart modulo 4 KiB, as
// at a stride of kSlots the same slot of every head would fall in one L1 set and the heads' hot
// slots would evict each other.
inline constexpr int64_t kCpuHistogramHeadStride =
    (MagnitudeHistogram::kSlots - 128 + 1023) / 1024 * 1024 + 128;
static_assert(kCpuHistogramHeadStride >= MagnitudeHistogram::kSlots);

void CpuAbsMaxHistogramPerHead(ThreadPool& pool, int tasks, const TensorView& t,
                               int64_t num_heads, int64_t head_dim, absl::Span<float> absmax,
                               absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_CPU_HISTOGRAM_H_
