// Fast CPU reductions. Everything runs on integer keys of the raw bits, so no element is ever
// converted to float and the loops vectorise with plain integer min/max:
//   - |x| orders like the magnitude bits (bits & 0x7f..f), for bf16, f16 and f32 alike;
//   - x orders like the sign-magnitude bits folded into two's complement ("order key").
// Non-finite values have magnitude bits >= those of Inf, so the unmasked fast pass reveals them
// through its own result; only then is the range re-run with masking and counting (slow path).
// Large inputs are split across a small persistent thread pool.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/simd.h"


namespace caliper {
namespace {


constexpr int kLanes = 32;  // elements per iteration, independent accumulators

// Per-width key arithmetic. Key is the signed integer of the same width.
template <typename Bits>
struct KeyOps;

template <>
struct KeyOps<uint16_t> {
  using Key = int16_t;
  using Loose = LooseU16;
  static constexpr uint16_t kMagnitude = 0x7fff;
  static CALIPER_INLINE Key Abs(uint16_t b) { return static_cast<Key>(b & kMagnitude); }
  static CALIPER_INLINE Key Order(uint16_t b) {
    const Key s = static_cast<Key>(b);
    return static_cast<Key>(s ^ ((s >> 15) & kMagnitude));
  }
};

template <>
struct KeyOps<uint32_t> {
  using Key = int32_t;
  using Loose = LooseU32;
  static constexpr uint32_t kMagnitude = 0x7fffffffu;
  static CALIPER_INLINE Key Abs(uint32_t b) { return static_cast<Key>(b & kMagnitude); }
  static CALIPER_INLINE Key Order(uint32_t b) {
    const Key s = static_cast<Key>(b);
    return static_cast<Key>(s ^ ((s >> 31) & static_cast<Key>(kMagnitude)));
  }
};

// ---- Loop bodies (always inlined into the cloned entry points below) ----

// Min and max order key over n elements, no masking.
template <typename Bits>
CALIPER_INLINE void RangeBody(const uint8_t* data, int64_t n, typename KeyOps<Bits>::Key* kmin,
                              typename KeyOps<Bits>::Key* kmax) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  Key mn[kLanes], mx[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    mn[l] = std::numeric_limits<Key>::max();
    mx[l] = std::numeric_limits<Key>::min();
  }
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const Key k = Ops::Order(p[i + l]);
      mn[l] = std::min(mn[l], k);
      mx[l] = std::max(mx[l], k);
    }
  }
  for (int l = 0; i < n; ++i, ++l) {
    const Key k = Ops::Order(p[i]);
    mn[l] = std::min(mn[l], k);
    mx[l] = std::max(mx[l], k);
  }
  Key a = mn[0], b = mx[0];
  for (int l = 1; l < kLanes; ++l) {
    a = std::min(a, mn[l]);
    b = std::max(b, mx[l]);
  }
  *kmin = a;
  *kmax = b;
}

// Same, skipping and counting elements whose magnitude bits are >= inf_bits.
template <typename Bits>
CALIPER_INLINE int64_t RangeMaskedBody(const uint8_t* data, int64_t n, Bits inf_bits,
                                       typename KeyOps<Bits>::Key* kmin,
                                       typename KeyOps<Bits>::Key* kmax) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  Key mn = std::numeric_limits<Key>::max(), mx = std::numeric_limits<Key>::min();
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Bits b = p[i];
    const bool finite = static_cast<Bits>(b & Ops::kMagnitude) < inf_bits;
    const Key k = Ops::Order(b);
    mn = finite ? std::min(mn, k) : mn;
    mx = finite ? std::max(mx, k) : mx;
    bad += !finite;
  }
  *kmin = mn;
  *kmax = mx;
  return bad;
}

// Max magnitude key over n contiguous elements, no masking.
template <typename Bits>
CALIPER_INLINE typename KeyOps<Bits>::Key AbsMaxBody(const uint8_t* data, int64_t n) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  Key mx[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) mx[l] = std::max(mx[l], Ops::Abs(p[i + l]));
  }
  Key m = 0;
  for (; i < n; ++i) m = std::max(m, Ops::Abs(p[i]));
  for (int l = 0; l < kLanes; ++l) m = std::max(m, mx[l]);
  return m;
}

template <typename Bits>
CALIPER_INLINE typename KeyOps<Bits>::Key AbsMaxMaskedBody(const uint8_t* data, int64_t n,
                                                           Bits inf_bits, int64_t* bad) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  Key m = 0;
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) {
    const Key k = Ops::Abs(p[i]);
    const bool finite = static_cast<Bits>(k) < inf_bits;
    m = finite ? std::max(m, k) : m;
    count += !finite;
  }
  *bad += count;
  return m;
}

// acc[j] = max(acc[j], |x[r * cols + j]|) over `rows` rows: vectorises over columns whatever the
// head layout, which keeps tiny and odd head_dim as fast as large ones.
template <typename Bits>
CALIPER_INLINE void ColumnsBody(const uint8_t* data, int64_t rows, int64_t cols,
                                typename KeyOps<Bits>::Key* __restrict__ acc) {
  using Ops = KeyOps<Bits>;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  int64_t r = 0;
  // Four rows per pass: one accumulator load/store per four input vectors.
  for (; r + 4 <= rows; r += 4) {
    const auto* a = p + r * cols;
    const auto* b = a + cols;
    const auto* c = b + cols;
    const auto* d = c + cols;
    for (int64_t j = 0; j < cols; ++j) {
      const auto ab = std::max(Ops::Abs(a[j]), Ops::Abs(b[j]));
      const auto cd = std::max(Ops::Abs(c[j]), Ops::Abs(d[j]));
      acc[j] = std::max(acc[j], std::max(ab, cd));
    }
  }
  for (; r < rows; ++r) {
    const auto* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) acc[j] = std::max(acc[j], Ops::Abs(row[j]));
  }
}

template <typename Bits>
CALIPER_INLINE int64_t ColumnsMaskedBody(const uint8_t* data, int64_t rows, int64_t cols,
                                         Bits inf_bits,
                                         typename KeyOps<Bits>::Key* __restrict__ acc) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = p + r * cols;
    for (int64_t j = 0; j < cols; ++j) {
      const Key k = Ops::Abs(row[j]);
      const bool finite = static_cast<Bits>(k) < inf_bits;
      acc[j] = finite ? std::max(acc[j], k) : acc[j];
      bad += !finite;
    }
  }
  return bad;
}

// keys[h] = max(keys[h], acc[g * row + h * head_dim + d]) over folded rows g and d: column
// accumulators back to per-head keys, one vectorisable max per head segment.
template <typename Key>
CALIPER_INLINE void FoldHeadsBody(const Key* acc, int64_t cols, int64_t num_heads,
                                  int64_t head_dim, Key* __restrict__ keys) {
  for (int64_t base = 0; base < cols; base += num_heads * head_dim) {
    for (int64_t h = 0; h < num_heads; ++h) {
      const Key* a = acc + base + h * head_dim;
      Key m = keys[h];
      for (int64_t d = 0; d < head_dim; ++d) m = std::max(m, a[d]);
      keys[h] = m;
    }
  }
}

// ---- Cloned entry points (one per width; target_clones needs plain functions) ----

CALIPER_CLONES void Range16(const uint8_t* d, int64_t n, int16_t* mn, int16_t* mx) {
  RangeBody<uint16_t>(d, n, mn, mx);
}
CALIPER_CLONES void Range32(const uint8_t* d, int64_t n, int32_t* mn, int32_t* mx) {
  RangeBody<uint32_t>(d, n, mn, mx);
}
CALIPER_CLONES int64_t RangeMasked16(const uint8_t* d, int64_t n, uint16_t inf, int16_t* mn,
                                     int16_t* mx) {
  return RangeMaskedBody<uint16_t>(d, n, inf, mn, mx);
}
CALIPER_CLONES int64_t RangeMasked32(const uint8_t* d, int64_t n, uint32_t inf, int32_t* mn,
                                     int32_t* mx) {
  return RangeMaskedBody<uint32_t>(d, n, inf, mn, mx);
}
CALIPER_CLONES int16_t AbsMax16(const uint8_t* d, int64_t n) { return AbsMaxBody<uint16_t>(d, n); }
CALIPER_CLONES int32_t AbsMax32(const uint8_t* d, int64_t n) { return AbsMaxBody<uint32_t>(d, n); }
CALIPER_CLONES int16_t AbsMaxMasked16(const uint8_t* d, int64_t n, uint16_t inf, int64_t* bad) {
  return AbsMaxMaskedBody<uint16_t>(d, n, inf, bad);
}
CALIPER_CLONES int32_t AbsMaxMasked32(const uint8_t* d, int64_t n, uint32_t inf, int64_t* bad) {
  return AbsMaxMaskedBody<uint32_t>(d, n, inf, bad);
}
CALIPER_CLONES void Columns16(const uint8_t* d, int64_t rows, int64_t cols, int16_t* acc) {
  ColumnsBody<uint16_t>(d, rows, cols, acc);
}
CALIPER_CLONES void Columns32(const uint8_t* d, int64_t rows, int64_t cols, int32_t* acc) {
  ColumnsBody<uint32_t>(d, rows, cols, acc);
}
CALIPER_CLONES int64_t ColumnsMasked16(const uint8_t* d, int64_t rows, int64_t cols, uint16_t inf,
                                       int16_t* acc) {
  return ColumnsMaskedBody<uint16_t>(d, rows, cols, inf, acc);
}
CALIPER_CLONES int64_t ColumnsMasked32(const uint8_t* d, int64_t rows, int64_t cols, uint32_t inf,
                                       int32_t* acc) {
  return ColumnsMaskedBody<uint32_t>(d, rows, cols, inf, acc);
}

CALIPER_CLONES void FoldHeads16(const int16_t* acc, int64_t cols, int64_t heads, int64_t dim,
                                int16_t* keys) {
  FoldHeadsBody<int16_t>(acc, cols, heads, dim, keys);
}
CALIPER_CLONES void FoldHeads32(const int32_t* acc, int64_t cols, int64_t heads, int64_t dim,
                                int32_t* keys) {
  FoldHeadsBody<int32_t>(acc, cols, heads, dim, keys);
}

// Overload set so the drivers below can be templated on the bit width.
inline void FoldHeads(const int16_t* a, int64_t c, int64_t h, int64_t d, int16_t* k) {
  FoldHeads16(a, c, h, d, k);
}
inline void FoldHeads(const int32_t* a, int64_t c, int64_t h, int64_t d, int32_t* k) {
  FoldHeads32(a, c, h, d, k);
}
inline void RangeKeys(const uint8_t* d, int64_t n, int16_t* a, int16_t* b) { Range16(d, n, a, b); }
inline void RangeKeys(const uint8_t* d, int64_t n, int32_t* a, int32_t* b) { Range32(d, n, a, b); }
inline int64_t RangeKeysMasked(const uint8_t* d, int64_t n, uint16_t inf, int16_t* a, int16_t* b) {
  return RangeMasked16(d, n, inf, a, b);
}
inline int64_t RangeKeysMasked(const uint8_t* d, int64_t n, uint32_t inf, int32_t* a, int32_t* b) {
  return RangeMasked32(d, n, inf, a, b);
}
template <typename Bits>
typename KeyOps<Bits>::Key AbsMaxKey(const uint8_t* d, int64_t n) {
  if constexpr (sizeof(Bits) == 2) return AbsMax16(d, n); else return AbsMax32(d, n);
}
inline int16_t AbsMaxKeyMasked(const uint8_t* d, int64_t n, uint16_t inf, int64_t* bad) {
  return AbsMaxMasked16(d, n, inf, bad);
}
inline int32_t AbsMaxKeyMasked(const uint8_t* d, int64_t n, uint32_t inf, int64_t* bad) {
  return AbsMaxMasked32(d, n, inf, bad);
}
inline void ColumnKeys(const uint8_t* d, int64_t r, int64_t c, int16_t* acc) { Columns16(d, r, c, acc); }
inline void ColumnKeys(const uint8_t* d, int64_t r, int64_t c, int32_t* acc) { Columns32(d, r, c, acc); }
inline int64_t ColumnKeysMasked(const uint8_t* d, int64_t r, int64_t c, uint16_t inf, int16_t* acc) {
  return ColumnsMasked16(d, r, c, inf, acc);
}
inline int64_t ColumnKeysMasked(const uint8_t* d, int64_t r, int64_t c, uint32_t inf, int32_t* acc) {
  return ColumnsMasked32(d, r, c, inf, acc);
}


// ---- Histogram pass (absmax, |x| histogram and count of the max, one read of the data) ----

enum class HistCode { kBF16, kF16, kF32 };

// f16 has subnormals below 2^-14 that no shift maps onto the f32 bins; a table of every
// magnitude (built from the exact f32 value) gives the same slot as MagnitudeHistogram::SlotOf.
const uint16_t* F16SlotTable() {
  static const std::vector<uint16_t>* table = [] {
    auto* t = new std::vector<uint16_t>(1 << 15);
    for (uint32_t b = 0; b < (1u << 15); ++b) {
      const bool finite = b < 0x7c00u;
      (*t)[b] = static_cast<uint16_t>(finite ? MagnitudeHistogram::SlotOf(F16ToFloat(
                                                   static_cast<uint16_t>(b)))
                                             : MagnitudeHistogram::kOverflowSlot);
    }
    return t;
  }();
  return table->data();
}

constexpr int kHistBlock = 64;

// Slots of one block: shift/subtract/clamp on the magnitude bits (vectorises), then scalar
// increments; the block max over finite values and, when it reaches the running max, the count
// of elements equal to it. Non-finite values go to the overflow slot and are counted.
template <HistCode kCode, typename Bits>
CALIPER_INLINE void HistBody(const uint8_t* data, int64_t n, Bits inf, const uint16_t* f16_slots,
                             uint64_t* __restrict__ counts, typename KeyOps<Bits>::Key* max_key,
                             uint64_t* max_count, int64_t* bad) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  constexpr int kShift16 = MagnitudeHistogram::kShift - 16;  // bf16 = top half of f32
  int32_t slot[kHistBlock];
  Key key[kHistBlock];
  for (int64_t base = 0; base < n; base += kHistBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kHistBlock, n - base));
    Key bmax = 0;
    int64_t bbad = 0;
    for (int i = 0; i < m; ++i) {
      const Key k = Ops::Abs(p[base + i]);
      const bool finite = static_cast<Bits>(k) < inf;
      int32_t s;
      if constexpr (kCode == HistCode::kF16) {
        s = f16_slots[static_cast<Bits>(k)];
      } else {
        const int32_t shifted = kCode == HistCode::kF32
                                    ? static_cast<int32_t>(static_cast<uint32_t>(k) >>
                                                           MagnitudeHistogram::kShift)
                                    : static_cast<int32_t>(static_cast<uint32_t>(k) >> kShift16);
        const int32_t t = shifted - MagnitudeHistogram::kBias + MagnitudeHistogram::kFirstLogSlot;
        s = std::min(std::max(t, int32_t{MagnitudeHistogram::kUnderflowSlot}),
                     int32_t{MagnitudeHistogram::kOverflowSlot});
        s = k == 0 ? MagnitudeHistogram::kZeroSlot : s;
      }
      slot[i] = s;
      key[i] = finite ? k : Key{-1};
      bmax = std::max(bmax, finite ? k : Key{0});
      bbad += !finite;
    }
    for (int i = 0; i < m; ++i) ++counts[slot[i]];
    *bad += bbad;
    if (bmax >= *max_key) {
      uint64_t eq = 0;
      for (int i = 0; i < m; ++i) eq += key[i] == bmax;
      if (bmax > *max_key) {
        *max_key = bmax;
        *max_count = eq;
      } else {
        *max_count += eq;
      }
    }
  }
}

CALIPER_CLONES void HistBF16(const uint8_t* d, int64_t n, uint16_t inf, uint64_t* counts,
                             int16_t* mk, uint64_t* mc, int64_t* bad) {
  HistBody<HistCode::kBF16, uint16_t>(d, n, inf, nullptr, counts, mk, mc, bad);
}
CALIPER_CLONES void HistF16(const uint8_t* d, int64_t n, uint16_t inf, const uint16_t* table,
                            uint64_t* counts, int16_t* mk, uint64_t* mc, int64_t* bad) {
  HistBody<HistCode::kF16, uint16_t>(d, n, inf, table, counts, mk, mc, bad);
}
CALIPER_CLONES void HistF32(const uint8_t* d, int64_t n, uint32_t inf, uint64_t* counts,
                            int32_t* mk, uint64_t* mc, int64_t* bad) {
  HistBody<HistCode::kF32, uint32_t>(d, n, inf, nullptr, counts, mk, mc, bad);
}

// ---- Key -> float ----

float KeyBitsToFloat(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kBF16: return BF16ToFloat(static_cast<uint16_t>(bits));
    case DType::kF16: return F16ToFloat(static_cast<uint16_t>(bits));
    case DType::kF32: break;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Order keys are an involution of the bits: applying Order again gives the bits back.
template <typename Bits>
float OrderKeyToFloat(DType dtype, typename KeyOps<Bits>::Key key) {
  const Bits bits = static_cast<Bits>(KeyOps<Bits>::Order(static_cast<Bits>(key)));
  return KeyBitsToFloat(dtype, bits);
}

template <typename Bits>
Bits InfBits(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return static_cast<Bits>(0x7f80u);
    case DType::kF16: return static_cast<Bits>(0x7c00u);
    case DType::kF32: break;
  }
  return static_cast<Bits>(0x7f800000u);
}

// Per-column min / max order keys over `rows` rows of `width` elements; NaN/Inf are counted and
// leave the seeds (Key max / min, which are NaN keys, never a finite value's).
template <typename Bits>
CALIPER_INLINE int64_t ColumnRangeBody(const uint8_t* data, int64_t rows, int64_t width, Bits inf,
                                       typename KeyOps<Bits>::Key* mn,
                                       typename KeyOps<Bits>::Key* mx) {
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  const Key inf_key = static_cast<Key>(inf);
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* q = p + r * width;
    for (int64_t c = 0; c < width; ++c) {
      const Bits b = q[c];
      const bool finite = Ops::Abs(b) < inf_key;
      const Key k = Ops::Order(b);
      mn[c] = std::min(mn[c], finite ? k : std::numeric_limits<Key>::max());
      mx[c] = std::max(mx[c], finite ? k : std::numeric_limits<Key>::min());
      bad += finite ? 0 : 1;
    }
  }
  return bad;
}

// The same without masking: NaN/Inf keys land beyond the Inf keys, which the caller checks
// before paying for the masked loop.
template <typename Bits>
CALIPER_INLINE void ColumnRangeUnmaskedBody(const uint8_t* data, int64_t rows, int64_t width,
                                            typename KeyOps<Bits>::Key* mn,
                                            typename KeyOps<Bits>::Key* mx) {
  using Ops = KeyOps<Bits>;
  const auto* p = reinterpret_cast<const typename Ops::Loose*>(data);
  for (int64_t r = 0; r < rows; ++r) {
    const auto* q = p + r * width;
    for (int64_t c = 0; c < width; ++c) {
      const auto k = Ops::Order(q[c]);
      mn[c] = std::min(mn[c], k);
      mx[c] = std::max(mx[c], k);
    }
  }
}

CALIPER_CLONES int64_t ColumnRange16(const uint8_t* data, int64_t rows, int64_t width,
                                     uint16_t inf, int16_t* mn, int16_t* mx) {
  return ColumnRangeBody<uint16_t>(data, rows, width, inf, mn, mx);
}

CALIPER_CLONES int64_t ColumnRange32(const uint8_t* data, int64_t rows, int64_t width,
                                     uint32_t inf, int32_t* mn, int32_t* mx) {
  return ColumnRangeBody<uint32_t>(data, rows, width, inf, mn, mx);
}

CALIPER_CLONES void ColumnRangeUnmasked16(const uint8_t* data, int64_t rows, int64_t width,
                                          int16_t* mn, int16_t* mx) {
  ColumnRangeUnmaskedBody<uint16_t>(data, rows, width, mn, mx);
}

CALIPER_CLONES void ColumnRangeUnmasked32(const uint8_t* data, int64_t rows, int64_t width,
                                          int32_t* mn, int32_t* mx) {
  ColumnRangeUnmaskedBody<uint32_t>(data, rows, width, mn, mx);
}

// ---- Thread pool ----

// A few persistent workers. ParallelFor runs fn(0..tasks-1) and returns when all are done; the
// caller works too, so concurrent callers and a busy pool never deadlock.
class ThreadPool {
 public:
  explicit ThreadPool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { WorkerLoop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const { return static_cast<int>(threads_.size()) + 1; }

  void ParallelFor(int tasks, const std::function<void(int)>& fn) {
    if (tasks <= 1 || threads_.empty()) {
      for (int i = 0; i < tasks; ++i) fn(i);
      return;
    }
    auto batch = std::make_shared<Batch>();
    batch->fn = &fn;
    batch->tasks = tasks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(batch);
    }
    wake_.notify_all();
    RunTasks(*batch);
    std::unique_lock<std::mutex> lock(batch->mu);
    batch->done_cv.wait(lock, [&] { return batch->done == batch->tasks; });
  }

 private:
  struct Batch {
    const std::function<void(int)>* fn = nullptr;
    int tasks = 0;
    std::atomic<int> next{0};
    std::mutex mu;
    std::condition_variable done_cv;
    int done = 0;  // guarded by mu
  };

  static void RunTasks(Batch& b) {
    for (int i; (i = b.next.fetch_add(1)) < b.tasks;) {
      (*b.fn)(i);
      std::lock_guard<std::mutex> lock(b.mu);
      if (++b.done == b.tasks) b.done_cv.notify_all();
    }
  }

  void WorkerLoop() {
    for (;;) {
      std::shared_ptr<Batch> batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        wake_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (stop_) return;
        batch = queue_.front();
        // Drop exhausted batches; the owner is waiting on its own counter, not on the queue.
        if (batch->next.load() >= batch->tasks) {
          queue_.pop_front();
          continue;
        }
      }
      RunTasks(*batch);
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Batch>> queue_;
  bool stop_ = false;
};

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

  absl::Status Range(const TensorView& t, RangeStats* out) override {
    if (out == nullptr) return absl::InvalidArgumentError("out: must not be null");
    if (t.dtype() == DType::kF32) {
      *out = RangeImpl<uint32_t>(t);
    } else {
      *out = RangeImpl<uint16_t>(t);
    }
    return absl::OkStatus();
  }

  absl::Status AbsMaxPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                             absl::Span<float> out, int64_t* nonfinite) override {
    if (absl::Status args = CheckAbsMaxPerHeadArgs(t, num_heads, head_dim, out, nonfinite);
        !args.ok()) {
      return args;
    }
    if (t.dtype() == DType::kF32) {
      AbsMaxImpl<uint32_t>(t, num_heads, head_dim, out, nonfinite);
    } else {
      AbsMaxImpl<uint16_t>(t, num_heads, head_dim, out, nonfinite);
    }
    return absl::OkStatus();
  }


  absl::Status AbsMaxHistogramPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                                      absl::Span<float> absmax,
                                      absl::Span<MagnitudeHistogram> hists,
                                      int64_t* nonfinite) override {
    if (absl::Status args =
            CheckAbsMaxHistogramPerHeadArgs(t, num_heads, head_dim, absmax, hists, nonfinite);
        !args.ok()) {
      return args;
    }
    if (t.dtype() == DType::kF32) {
      HistImpl<uint32_t>(t, num_heads, head_dim, absmax, hists, nonfinite);
    } else {
      HistImpl<uint16_t>(t, num_heads, head_dim, absmax, hists, nonfinite);
    }
    return absl::OkStatus();
  }

  // Per-column order keys over the rows (split across the pool, merged exactly), then groups.
  absl::Status RangePerGroup(const TensorView& t, int64_t row_width, int64_t group_width,
                             absl::Span<float> min, absl::Span<float> max,
                             int64_t* nonfinite) override {
    if (absl::Status args =
            CheckRangePerGroupArgs(t, row_width, group_width, min, max, nonfinite);
        !args.ok()) {
      return args;
    }
    if (t.dtype() == DType::kF32) {
      GroupRangeImpl<uint32_t>(t, row_width, group_width, min, max, nonfinite);
    } else {
      GroupRangeImpl<uint16_t>(t, row_width, group_width, min, max, nonfinite);
    }
    return absl::OkStatus();
  }

  // Rows split across the pool; every task writes its own slice, so the bytes do not depend on
  // the split.
  absl::Status PackNvfp4(const TensorView& t, const Nvfp4PackParams& params,
                         absl::Span<uint8_t> packed, absl::Span<uint8_t> scales) override {
    if (absl::Status s = CheckNvfp4PackArgs(t, params, packed, scales); !s.ok()) return s;
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
    if (total > 0) {
      return absl::InvalidArgumentError(absl::StrCat("weight.data: ", total,
                                                     " non-finite values (NaN/Inf) in ",
                                                     t.ShapeString(), "; cannot quantize"));
    }
    return absl::OkStatus();
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
      if constexpr (sizeof(Bits) == 2) {
        ColumnRangeUnmasked16(p, r1 - r0, width, mn[i].data(), mx[i].data());
      } else {
        ColumnRangeUnmasked32(p, r1 - r0, width, mn[i].data(), mx[i].data());
      }
      bool clean = true;
      for (int64_t c = 0; c < width; ++c) {
        clean = clean && mx[i][c] < pos_inf_key && mn[i][c] > neg_inf_key;
      }
      if (clean) return;
      // NaN/Inf in these rows: again, masked and counted.
      std::fill(mn[i].begin(), mn[i].end(), std::numeric_limits<Key>::max());
      std::fill(mx[i].begin(), mx[i].end(), std::numeric_limits<Key>::min());
      if constexpr (sizeof(Bits) == 2) {
        bad[i] = ColumnRange16(p, r1 - r0, width, inf, mn[i].data(), mx[i].data());
      } else {
        bad[i] = ColumnRange32(p, r1 - r0, width, inf, mn[i].data(), mx[i].data());
      }
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


  // Rows split across tasks; each task keeps its own per-head counts, merged by addition.
  template <typename Bits>
  void HistImpl(const TensorView& t, int64_t num_heads, int64_t head_dim, absl::Span<float> absmax,
                absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite) {
    using Key = typename KeyOps<Bits>::Key;
    constexpr int kSlots = MagnitudeHistogram::kSlots;
    const int64_t row = num_heads * head_dim;
    const int64_t rows = t.num_elements() / row;
    const Bits inf = InfBits<Bits>(t.dtype());
    const DType dtype = t.dtype();
    const uint16_t* f16_slots = dtype == DType::kF16 ? F16SlotTable() : nullptr;
    const uint8_t* data = t.bytes().data();
    const int tasks = static_cast<int>(std::max<int64_t>(
        1, std::min<int64_t>(rows, TasksFor(t.num_elements() * static_cast<int64_t>(sizeof(Bits))))));
    struct Part {
      std::vector<uint64_t> counts;  // [head][slot]
      std::vector<Key> max_key;
      std::vector<uint64_t> max_count;
      int64_t bad = 0;
    };
    std::vector<Part> parts(tasks);
    pool_.ParallelFor(tasks, [&](int i) {
      Part& part = parts[i];
      part.counts.assign(num_heads * kSlots, 0);
      part.max_key.assign(num_heads, 0);
      part.max_count.assign(num_heads, 0);
      const int64_t r0 = rows * i / tasks, r1 = rows * (i + 1) / tasks;
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t h = 0; h < num_heads; ++h) {
          const uint8_t* p = data + (r * row + h * head_dim) * static_cast<int64_t>(sizeof(Bits));
          uint64_t* c = part.counts.data() + h * kSlots;
          if constexpr (sizeof(Bits) == 4) {
            HistF32(p, head_dim, inf, c, &part.max_key[h], &part.max_count[h], &part.bad);
          } else if (dtype == DType::kF16) {
            HistF16(p, head_dim, inf, f16_slots, c, &part.max_key[h], &part.max_count[h],
                    &part.bad);
          } else {
            HistBF16(p, head_dim, inf, c, &part.max_key[h], &part.max_count[h], &part.bad);
          }
        }
      }
    });
    int64_t bad = 0;
    for (int64_t h = 0; h < num_heads; ++h) {
      MagnitudeHistogram& hist = hists[h];
      hist = MagnitudeHistogram();
      hist.counts.assign(kSlots, 0);
      Key key = 0;
      uint64_t count = 0;
      for (const Part& part : parts) {
        const uint64_t* c = part.counts.data() + h * kSlots;
        for (int s = 0; s < kSlots; ++s) hist.counts[s] += c[s];
        if (part.max_key[h] > key) {
          key = part.max_key[h];
          count = part.max_count[h];
        } else if (part.max_key[h] == key) {
          count += part.max_count[h];
        }
      }
      hist.max = KeyBitsToFloat(dtype, static_cast<uint32_t>(key));
      hist.max_count = count;
      absmax[h] = hist.max;
    }
    for (const Part& part : parts) bad += part.bad;
    *nonfinite = bad;
  }

  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<ReductionBackend> MakeCpuBackend(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::make_unique<CpuBackend>(threads);
}

}  // namespace caliper
