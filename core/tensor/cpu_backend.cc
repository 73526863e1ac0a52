// The CPU reduction backend: drivers that split a tensor across the thread pool and merge exact
// partial results, over the hot loops of cpu_loops.h (range, absmax, group ranges) and
// cpu_histogram.h (the histogram pass). The unmasked fast pass reveals NaN/Inf through its own
// result (their magnitude bits are >= Inf's); only then is a range re-run masked and counted.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/cpu_dtype_dispatch.h"
#include "core/tensor/cpu_histogram.h"
#include "core/tensor/cpu_keys.h"
#include "core/tensor/cpu_loops.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/thread_pool.h"

namespace caliper {
namespace {

template <typename Tag>
using BitsOf = CpuBits<Tag::value>;

// Below this many bytes per task, waking a worker costs more than it saves.
constexpr int64_t kMinBytesPerTask = 1 << 20;
// Column accumulators up to this size stay in L2; larger rows use the per-segment path.
constexpr int64_t kMaxColumnBytes = 256 << 10;
// Heads shorter than this never take the per-segment path (a call per segment is too slow).
constexpr int64_t kMinSegment = 256;
// Column accumulators narrower than this are widened to several rows at once.
constexpr int64_t kMinColumns = 4096;

class CpuBackend : public ReductionBackend {
 public:
  explicit CpuBackend(int threads) : pool_(threads - 1) {}

  absl::string_view name() const override { return "cpu"; }

  absl::Status CheckedRange(const TensorView& t, RangeStats* out) override {
    *out = DispatchDType(t.dtype(), [&](auto tag) { return RangeImpl<BitsOf<decltype(tag)>>(t); });
    return absl::OkStatus();
  }

  absl::Status CheckedAbsMaxPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                    absl::Span<float> out, int64_t* nonfinite) override {
    DispatchDType(t.dtype(), [&](auto tag) {
      AbsMaxImpl<BitsOf<decltype(tag)>>(t, num_heads, head_dim, out, nonfinite);
    });
    return absl::OkStatus();
  }

  absl::Status CheckedAbsMaxHistogramPerHead(const TensorView& t, int64_t num_heads,
                                             int64_t head_dim, absl::Span<float> absmax,
                                             absl::Span<MagnitudeHistogram> hists,
                                             int64_t* nonfinite) override {
    const int64_t rows = t.num_elements() / (num_heads * head_dim);
    const int tasks = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(rows, TasksFor(static_cast<int64_t>(t.bytes().size())))));
    CpuAbsMaxHistogramPerHead(pool_, tasks, t, num_heads, head_dim, absmax, hists, nonfinite);
    return absl::OkStatus();
  }

  // Per-column order keys over the rows (split across the pool, merged exactly), then groups.
  absl::Status CheckedRangePerGroup(const TensorView& t, int64_t row_width, int64_t group_width,
                                    absl::Span<float> min, absl::Span<float> max,
                                    int64_t* nonfinite) override {
    DispatchDType(t.dtype(), [&](auto tag) {
      GroupRangeImpl<BitsOf<decltype(tag)>>(t, row_width, group_width, min, max, nonfinite);
    });
    return absl::OkStatus();
  }

  // Rows split across the pool; every task writes its own slice, so the bytes do not depend on
  // the split.
  absl::StatusOr<int64_t> CheckedPackNvfp4(const TensorView& t, const Nvfp4PackParams& params,
                                           absl::Span<uint8_t> packed,
                                           absl::Span<uint8_t> scales) override {
    const int64_t rows = t.shape()[0];
    const int tasks = static_cast<int>(std::min<int64_t>(
        std::max<int64_t>(rows, 1), TasksFor(static_cast<int64_t>(t.bytes().size()))));
    std::vector<int64_t> bad(tasks, 0);
    pool_.ParallelFor(tasks, [&](int i) {
      const int64_t r0 = rows * i / tasks, r1 = rows * (i + 1) / tasks;
      if (r0 < r1) PackNvfp4Rows(t, params, r0, r1, packed.data(), scales.data(), &bad[i]);
    });
    int64_t total = 0;
    for (int64_t b : bad) total += b;
    return total;
  }

 private:
  int TasksFor(int64_t bytes) const {
    const int64_t by_size = std::max<int64_t>(1, bytes / kMinBytesPerTask);
    return static_cast<int>(std::min<int64_t>(pool_.size(), by_size));
  }

  template <typename Bits>
  void GroupRangeImpl(const TensorView& t, int64_t width, int64_t group, absl::Span<float> out_min,
                      absl::Span<float> out_max, int64_t* nonfinite) {
    using Key = typename KeyOps<Bits>::Key;
    const int64_t rows = t.num_elements() / width;
    const Bits inf = InfBits<Bits>(t.dtype());
    const Key pos_inf_key = KeyOps<Bits>::Order(inf);
    const Key neg_inf_key =
        KeyOps<Bits>::Order(static_cast<Bits>(inf | ~KeyOps<Bits>::kMagnitude));
    const int tasks = static_cast<int>(std::min<int64_t>(
        std::max<int64_t>(rows, 1), TasksFor(static_cast<int64_t>(t.bytes().size()))));
    std::vector<std::vector<Key>> mn(tasks, std::vector<Key>(width, std::numeric_limits<Key>::max()));
    std::vector<std::vector<Key>> mx(tasks, std::vector<Key>(width, std::numeric_limits<Key>::min()));
    std::vector<int64_t> bad(tasks, 0);
    pool_.ParallelFor(tasks, [&](int i) {
      const int64_t r0 = rows * i / tasks, r1 = rows * (i + 1) / tasks;
      if (r0 >= r1) return;
      const uint8_t* p = t.bytes().data() + r0 * width * static_cast<int64_t>(sizeof(Bits));
      ColumnRangeKeysUnmasked(p, r1 - r0, width, mn[i].data(), mx[i].data());
      bool clean = true;
      for (int64_t c = 0; c < width; ++c) {
        clean = clean && mx[i][c] < pos_inf_key && mn[i][c] > neg_inf_key;
      }
      if (clean) return;
      // NaN/Inf in these rows: again, masked and counted.
      std::fill(mn[i].begin(), mn[i].end(), std::numeric_limits<Key>::max());
      std::fill(mx[i].begin(), mx[i].end(), std::numeric_limits<Key>::min());
      bad[i] = ColumnRangeKeys(p, r1 - r0, width, inf, mn[i].data(), mx[i].data());
    });
    *nonfinite = 0;
    for (int i = 0; i < tasks; ++i) *nonfinite += bad[i];
    for (size_t g = 0; g < out_min.size(); ++g) {
      Key lo = std::numeric_limits<Key>::max(), hi = std::numeric_limits<Key>::min();
      const int64_t c1 = std::min<int64_t>(width, (static_cast<int64_t>(g) + 1) * group);
      for (int i = 0; i < tasks; ++i) {
        for (int64_t c = static_cast<int64_t>(g) * group; c < c1; ++c) {
          lo = std::min(lo, mn[i][c]);
          hi = std::max(hi, mx[i][c]);
        }
      }
      // The seeds are NaN keys: a group with no finite element keeps +inf / -inf.
      out_min[g] = lo == std::numeric_limits<Key>::max() ? std::numeric_limits<float>::infinity()
                                                          : OrderKeyToFloat<Bits>(t.dtype(), lo);
      out_max[g] = hi == std::numeric_limits<Key>::min() ? -std::numeric_limits<float>::infinity()
                                                          : OrderKeyToFloat<Bits>(t.dtype(), hi);
    }
  }

  template <typename Bits>
  RangeStats RangeImpl(const TensorView& t) {
    using Ops = KeyOps<Bits>;
    using Key = typename Ops::Key;
    const int64_t n = t.num_elements();
    const uint8_t* data = t.bytes().data();
    const Bits inf = InfBits<Bits>(t.dtype());
    const Key pos_inf_key = Ops::Order(inf);
    const Key neg_inf_key = Ops::Order(static_cast<Bits>(inf | ~Ops::kMagnitude));

    struct Part {
      Key mn = std::numeric_limits<Key>::max(), mx = std::numeric_limits<Key>::min();
      int64_t bad = 0;
    };
    const int tasks = TasksFor(n * static_cast<int64_t>(sizeof(Bits)));
    std::vector<Part> parts(tasks);
    const int64_t per_task = (n / tasks + kLanes - 1) / kLanes * kLanes;
    pool_.ParallelFor(tasks, [&](int i) {
      const int64_t begin = std::min(n, i * per_task);
      const int64_t end = i + 1 == tasks ? n : std::min(n, begin + per_task);
      if (begin >= end) return;
      const uint8_t* p = data + begin * static_cast<int64_t>(sizeof(Bits));
      Part& part = parts[i];
      RangeKeys(p, end - begin, &part.mn, &part.mx);
      // NaN/Inf keys sit beyond the Inf keys at either end: only then pay for masking.
      if (part.mx >= pos_inf_key || part.mn <= neg_inf_key) {
        part.bad = RangeKeysMasked(p, end - begin, inf, &part.mn, &part.mx);
      }
    });
    Key mn = std::numeric_limits<Key>::max(), mx = std::numeric_limits<Key>::min();
    RangeStats s;
    s.nonfinite = 0;
    for (const Part& part : parts) {
      mn = std::min(mn, part.mn);
      mx = std::max(mx, part.mx);
      s.nonfinite += part.bad;
    }
    if (s.nonfinite < n) {  // at least one finite element: keys are real values
      s.min = OrderKeyToFloat<Bits>(t.dtype(), mn);
      s.max = OrderKeyToFloat<Bits>(t.dtype(), mx);
    }
    return s;
  }

  template <typename Bits>
  void AbsMaxImpl(const TensorView& t, int64_t num_heads, int64_t head_dim, absl::Span<float> out,
                  int64_t* nonfinite) {
    using Key = typename KeyOps<Bits>::Key;
    const int64_t row = num_heads * head_dim;
    const int64_t n = t.num_elements();
    const Bits inf = InfBits<Bits>(t.dtype());
    std::vector<Key> head_keys(num_heads, 0);
    int64_t bad = 0;
    if (row * static_cast<int64_t>(sizeof(Bits)) <= kMaxColumnBytes || head_dim < kMinSegment) {
      bad = ColumnPath<Bits>(t.bytes().data(), n / row, num_heads, head_dim, inf, head_keys);
    } else {
      bad = SegmentPath<Bits>(t.bytes().data(), n, num_heads, head_dim, inf, head_keys);
    }
    for (int64_t h = 0; h < num_heads; ++h) {
      out[h] = KeyBitsToFloat(t.dtype(), static_cast<uint32_t>(head_keys[h]));
    }
    *nonfinite = bad;
  }

  // Rows are grouped `fold` at a time into one accumulator of fold * row columns, each task
  // owning a contiguous range of groups; the last task also takes the leftover rows.
  template <typename Bits>
  int64_t ColumnPath(const uint8_t* data, int64_t rows, int64_t num_heads, int64_t head_dim,
                     Bits inf, std::vector<typename KeyOps<Bits>::Key>& head_keys) {
    using Key = typename KeyOps<Bits>::Key;
    const int64_t row = num_heads * head_dim;
    const int64_t fold = std::max<int64_t>(1, kMinColumns / row);
    const int64_t cols = fold * row;
    const int64_t groups = rows / fold;
    const int64_t leftover_rows = rows - groups * fold;
    const int64_t group_bytes = cols * static_cast<int64_t>(sizeof(Bits));
    const int tasks = groups == 0 ? 1 : static_cast<int>(std::min<int64_t>(
                                            groups, TasksFor(rows * row * static_cast<int64_t>(sizeof(Bits)))));
    std::vector<std::vector<Key>> task_keys(tasks);
    std::vector<int64_t> task_bad(tasks, 0);
    pool_.ParallelFor(tasks, [&](int i) {
      const int64_t g0 = groups * i / tasks, g1 = groups * (i + 1) / tasks;
      const bool last = i + 1 == tasks;
      // Reused per thread: chunks arriving in many small pieces call this once per piece.
      thread_local std::vector<Key> acc;
      acc.assign(cols, 0);
      const uint8_t* p = data + g0 * group_bytes;
      const uint8_t* rest = data + groups * group_bytes;
      ColumnKeys(p, g1 - g0, cols, acc.data());
      if (last) ColumnKeys(rest, 1, leftover_rows * row, acc.data());
      std::vector<Key> keys(num_heads, 0);
      FoldHeads(acc.data(), cols, num_heads, head_dim, keys.data());
      if (*std::max_element(keys.begin(), keys.end()) >= static_cast<Key>(inf)) {
        std::fill(acc.begin(), acc.end(), 0);
        task_bad[i] = ColumnKeysMasked(p, g1 - g0, cols, inf, acc.data());
        if (last) task_bad[i] += ColumnKeysMasked(rest, 1, leftover_rows * row, inf, acc.data());
        std::fill(keys.begin(), keys.end(), 0);
        FoldHeads(acc.data(), cols, num_heads, head_dim, keys.data());
      }
      task_keys[i] = std::move(keys);
    });
    int64_t bad = 0;
    for (int i = 0; i < tasks; ++i) {
      bad += task_bad[i];
      for (int64_t h = 0; h < num_heads; ++h) head_keys[h] = std::max(head_keys[h], task_keys[i][h]);
    }
    return bad;
  }

  // Rows too wide for column accumulators: reduce each contiguous head segment directly.
  template <typename Bits>
  int64_t SegmentPath(const uint8_t* data, int64_t n, int64_t num_heads, int64_t head_dim,
                      Bits inf, std::vector<typename KeyOps<Bits>::Key>& head_keys) {
    using Key = typename KeyOps<Bits>::Key;
    const int tasks = TasksFor(n * static_cast<int64_t>(sizeof(Bits)));
    std::vector<std::vector<Key>> task_keys(tasks, std::vector<Key>(num_heads, 0));
    std::vector<int64_t> task_bad(tasks, 0);
    pool_.ParallelFor(tasks, [&](int i) {
      const int64_t begin = n * i / tasks, end = n * (i + 1) / tasks;
      std::vector<Key>& keys = task_keys[i];
      for (int64_t pos = begin; pos < end;) {
        const int64_t segment = pos / head_dim;
        const int64_t seg_end = std::min(end, (segment + 1) * head_dim);
        const int64_t h = segment % num_heads;
        const uint8_t* p = data + pos * static_cast<int64_t>(sizeof(Bits));
        Key k = AbsMaxKey<Bits>(p, seg_end - pos);
        if (k >= static_cast<Key>(inf)) k = AbsMaxKeyMasked(p, seg_end - pos, inf, &task_bad[i]);
        keys[h] = std::max(keys[h], k);
        pos = seg_end;
      }
    });
    int64_t bad = 0;
    for (int i = 0; i < tasks; ++i) {
      bad += task_bad[i];
      for (int64_t h = 0; h < num_heads; ++h) head_keys[h] = std::max(head_keys[h], task_keys[i][h]);
    }
    return bad;
  }


  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<ReductionBackend> MakeCpuBackend(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace caliper