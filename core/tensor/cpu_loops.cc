#include "core/tensor/cpu_loops.h"

#include <algorithm>
#include <limits>

namespace caliper {
namespace {

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

}  // namespace

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
CALIPER_CLONES_AVX512 int16_t AbsMax16(const uint8_t* d, int64_t n) {
  return AbsMaxBody<uint16_t>(d, n);
}
CALIPER_CLONES_AVX512 int32_t AbsMax32(const uint8_t* d, int64_t n) {
  return AbsMaxBody<uint32_t>(d, n);
}
CALIPER_CLONES_AVX512 int16_t AbsMaxMasked16(const uint8_t* d, int64_t n, uint16_t inf,
                                             int64_t* bad) {
  return AbsMaxMaskedBody<uint16_t>(d, n, inf, bad);
}
CALIPER_CLONES_AVX512 int32_t AbsMaxMasked32(const uint8_t* d, int64_t n, uint32_t inf,
                                             int64_t* bad) {
  return AbsMaxMaskedBody<uint32_t>(d, n, inf, bad);
}
CALIPER_CLONES_AVX512 void Columns16(const uint8_t* d, int64_t rows, int64_t cols, int16_t* acc) {
  ColumnsBody<uint16_t>(d, rows, cols, acc);
}
CALIPER_CLONES_AVX512 void Columns32(const uint8_t* d, int64_t rows, int64_t cols, int32_t* acc) {
  ColumnsBody<uint32_t>(d, rows, cols, acc);
}
CALIPER_CLONES_AVX512 int64_t ColumnsMasked16(const uint8_t* d, int64_t rows, int64_t cols,
                                              uint16_t inf, int16_t* acc) {
  return ColumnsMaskedBody<uint16_t>(d, rows, cols, inf, acc);
}
CALIPER_CLONES_AVX512 int64_t ColumnsMasked32(const uint8_t* d, int64_t rows, int64_t cols,
                                              uint32_t inf, int32_t* acc) {
  return ColumnsMaskedBody<uint32_t>(d, rows, cols, inf, acc);
}

CALIPER_CLONES_AVX512 void FoldHeads16(const int16_t* acc, int64_t cols, int64_t heads,
                                       int64_t dim, int16_t* keys) {
  FoldHeadsBody<int16_t>(acc, cols, heads, dim, keys);
}
CALIPER_CLONES_AVX512 void FoldHeads32(const int32_t* acc, int64_t cols, int64_t heads,
                                       int64_t dim, int32_t* keys) {
  FoldHeadsBody<int32_t>(acc, cols, heads, dim, keys);
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

}  // namespace caliper
