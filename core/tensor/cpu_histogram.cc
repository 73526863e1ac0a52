// Slots come from the magnitude bits with integer arithmetic in the key's own width (f16 subnormals
// fixed up through an exact int -> float conversion), so the per-block loops vectorise; the
// increments are scattered stores into per-task uint32 counts, kept zero between calls and merged
// over the slots a call touched.
#include "core/tensor/cpu_histogram.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <vector>

#include "core/tensor/cpu_dtype_dispatch.h"
#include "core/tensor/cpu_keys.h"

namespace caliper {
namespace {

using H = MagnitudeHistogram;

constexpr int kHistBlock = 128;
// The pass reads its input this far ahead into every cache level. Without it the DRAM reads did
// not overlap the increments (one-thread pass time ~ read time + increment time on a Xeon whose
// single-thread read bandwidth is latency-bound); 1.5-2.5 KiB measured best there, 6 KiB worse
// than none (the lines leave L1 before they are used).
constexpr int64_t kPrefetchBytes = 2048;
constexpr int64_t kHeadStride = kCpuHistogramHeadStride;
static_assert(H::kSlots <= 32767);  // slots are kept as int16

// Slot of a finite magnitude key of dtype D; Inf / NaN keys land in the overflow slot.
template <DType D>
CALIPER_INLINE int32_t SlotOfKey(typename KeyOps<CpuBits<D>>::Key k) {
  const uint32_t m = static_cast<uint32_t>(k);
  uint32_t f32_bits;
  if constexpr (D == DType::kF32) {
    f32_bits = m;
  } else if constexpr (D == DType::kBF16) {
    f32_bits = m << 16;
  } else {
    // f16 normals: exponent rebased from 15 to 127; subnormals k * 2^-24 exactly, via float(k).
    const uint32_t normal = (m << 13) + (112u << 23);
    const uint32_t subnormal =
        __builtin_bit_cast(uint32_t, static_cast<float>(static_cast<int32_t>(m))) - (24u << 23);
    f32_bits = m < 0x400u ? subnormal : normal;
    f32_bits = m >= 0x7c00u ? 0x7f800000u : f32_bits;
  }
  const int32_t t = static_cast<int32_t>(f32_bits >> H::kShift) - H::kBias + H::kFirstLogSlot;
  const int32_t s = std::min(std::max(t, int32_t{H::kUnderflowSlot}), int32_t{H::kOverflowSlot});
  return m == 0 ? int32_t{H::kZeroSlot} : s;
}

// The slot of a magnitude key in the key's own width, branch-free so the block loop vectorises
// (16 lanes for bf16/f16): the same as SlotOfKey except for f16 subnormals, which the caller
// fixes up (they are rare, and their slot needs the position of the leading bit).
template <DType D>
CALIPER_INLINE typename KeyOps<CpuBits<D>>::Key FastSlotOfKey(typename KeyOps<CpuBits<D>>::Key k) {
  using Key = typename KeyOps<CpuBits<D>>::Key;
  constexpr Key kFirst = H::kFirstLogSlot - H::kBias;  // slot of a normal = (f32 bits >> kShift) + this
  constexpr Key kOverflow = H::kOverflowSlot, kUnderflow = H::kUnderflowSlot;
  Key t;
  if constexpr (D == DType::kF16) {
    // f16 normal: f32 bits >> kShift are (k >> 3) + (112 << 7); all land in the log bins.
    constexpr int kF16Shift = 10 - H::kMantissaBits;
    t = static_cast<Key>((k >> kF16Shift) + ((112 << H::kMantissaBits) + kFirst));
    t = k >= Key{0x7c00} ? kOverflow : t;
  } else {
    constexpr int kShift = D == DType::kF32 ? H::kShift : 0;  // bf16 keys are f32 bits >> 16
    t = static_cast<Key>((k >> kShift) + kFirst);
    t = std::min(std::max(t, kUnderflow), kOverflow);
  }
  return k == 0 ? Key{H::kZeroSlot} : t;
}

// A nonzero f16 magnitude key below the smallest normal.
CALIPER_INLINE bool IsF16Subnormal(int16_t k) { return k != 0 && k < int16_t{0x400}; }

// Per-head running state of one task.
template <typename Key>
struct HeadState {
  Key max_key = 0;
  uint64_t max_count = 0;
  int32_t lo = H::kSlots, hi = -1;  // slots touched since the last flush
};

// One head's segment of head_dim elements into that head's counts and running state.
template <DType D>
CALIPER_INLINE void HistSegment(const typename KeyOps<CpuBits<D>>::Loose* seg, int64_t head_dim,
                                uint32_t* __restrict__ c,
                                HeadState<typename KeyOps<CpuBits<D>>::Key>& state,
                                int64_t* nonfinite) {
  using Bits = CpuBits<D>;
  using Ops = KeyOps<Bits>;
  using Key = typename Ops::Key;
  const Key inf = static_cast<Key>(InfBits<Bits>(D));
  Key key[kHistBlock];
  int16_t slot[kHistBlock];  // every slot fits: kSlots < 2^15
  for (int64_t base = 0; base < head_dim; base += kHistBlock) {
    const int m = static_cast<int>(std::min<int64_t>(kHistBlock, head_dim - base));
    // An address, not a pointer into the buffer: past its end the hint is harmless.
    const uintptr_t ahead = reinterpret_cast<uintptr_t>(seg + base) + kPrefetchBytes;
    for (int64_t b = 0; b < m * static_cast<int64_t>(sizeof(*seg)); b += 64) {
      __builtin_prefetch(reinterpret_cast<const void*>(ahead + b), /*rw=*/0, /*locality=*/3);
    }
    // A map loop and a reduction loop over the block, each vectorised (one mixed loop is not).
    for (int i = 0; i < m; ++i) {
      key[i] = Ops::Abs(seg[base + i]);
      slot[i] = static_cast<int16_t>(FastSlotOfKey<D>(key[i]));
    }
    Key kmin = std::numeric_limits<Key>::max(), bmax = 0, bbad = 0, subnormal = 0;
    for (int i = 0; i < m; ++i) {
      kmin = std::min(kmin, key[i]);
      bmax = std::max(bmax, key[i] < inf ? key[i] : Key{0});
      bbad = static_cast<Key>(bbad + (key[i] < inf ? 0 : 1));
      if constexpr (D == DType::kF16) {
        subnormal = static_cast<Key>(subnormal | (IsF16Subnormal(key[i]) ? 1 : 0));
      }
    }
    // Slots grow with keys, so the block's slot range comes from its extreme keys.
    int32_t lo = FastSlotOfKey<D>(kmin);
    const int32_t hi = bbad != 0 ? int32_t{H::kOverflowSlot} : FastSlotOfKey<D>(bmax);
    if constexpr (D == DType::kF16) {
      if (subnormal != 0) {
        for (int i = 0; i < m; ++i) {
          if (IsF16Subnormal(key[i])) slot[i] = static_cast<int16_t>(SlotOfKey<D>(key[i]));
        }
        lo = SlotOfKey<D>(kmin);
      }
    }
    if (m == kHistBlock) {  // the common full block, unrolled: the increments are the cost
#pragma GCC unroll 16
      for (int i = 0; i < kHistBlock; ++i) ++c[slot[i]];
    } else {
      for (int i = 0; i < m; ++i) ++c[slot[i]];
    }
    state.lo = std::min(state.lo, lo);
    state.hi = std::max(state.hi, hi);
    *nonfinite += bbad;
    if (bmax >= state.max_key) {
      uint64_t eq = 0;
      for (int i = 0; i < m; ++i) eq += key[i] == bmax;
      if (bmax > state.max_key || state.max_count == 0) {
        state.max_key = bmax;
        state.max_count = eq;
      } else {
        state.max_count += eq;
      }
    }
  }
}

// `rows` rows of num_heads segments of head_dim elements: counts[h * kHeadStride + slot] += ...
// (rows in order: reading head by head over a tile of rows was slower).
template <DType D>
CALIPER_INLINE void HistRowsBody(const uint8_t* data, int64_t rows, int64_t num_heads,
                                 int64_t head_dim, uint32_t* __restrict__ counts,
                                 HeadState<typename KeyOps<CpuBits<D>>::Key>* heads,
                                 int64_t* bad) {
  const auto* p = reinterpret_cast<const typename KeyOps<CpuBits<D>>::Loose*>(data);
  int64_t nonfinite = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < num_heads; ++h) {
      HistSegment<D>(p + (r * num_heads + h) * head_dim, head_dim, counts + h * kHeadStride,
                     heads[h], &nonfinite);
    }
  }
  *bad += nonfinite;
}

CALIPER_CLONES_AVX512 void HistRowsBF16(const uint8_t* d, int64_t rows, int64_t heads,
                                        int64_t dim, uint32_t* counts, HeadState<int16_t>* state,
                                        int64_t* bad) {
  HistRowsBody<DType::kBF16>(d, rows, heads, dim, counts, state, bad);
}
CALIPER_CLONES_AVX512 void HistRowsF16(const uint8_t* d, int64_t rows, int64_t heads,
                                       int64_t dim, uint32_t* counts, HeadState<int16_t>* state,
                                       int64_t* bad) {
  HistRowsBody<DType::kF16>(d, rows, heads, dim, counts, state, bad);
}
CALIPER_CLONES_AVX512 void HistRowsF32(const uint8_t* d, int64_t rows, int64_t heads,
                                       int64_t dim, uint32_t* counts, HeadState<int32_t>* state,
                                       int64_t* bad) {
  HistRowsBody<DType::kF32>(d, rows, heads, dim, counts, state, bad);
}

template <DType D>
void HistRows(const uint8_t* d, int64_t rows, int64_t heads, int64_t dim, uint32_t* counts,
              HeadState<typename KeyOps<CpuBits<D>>::Key>* state, int64_t* bad) {
  if constexpr (D == DType::kBF16) HistRowsBF16(d, rows, heads, dim, counts, state, bad);
  if constexpr (D == DType::kF16) HistRowsF16(d, rows, heads, dim, counts, state, bad);
  if constexpr (D == DType::kF32) HistRowsF32(d, rows, heads, dim, counts, state, bad);
}

template <DType D>
void HistImpl(ThreadPool& pool, int tasks, const TensorView& t, int64_t num_heads,
              int64_t head_dim, absl::Span<float> absmax, absl::Span<MagnitudeHistogram> hists,
              int64_t* nonfinite) {
  using Key = typename KeyOps<CpuBits<D>>::Key;
  const int64_t row_bytes = num_heads * head_dim * static_cast<int64_t>(sizeof(CpuBits<D>));
  const int64_t rows = t.num_elements() / (num_heads * head_dim);
  // uint32 counts hold any one slot's count as long as a flush comes every this many rows.
  const int64_t rows_per_flush =
      std::max<int64_t>(1, std::numeric_limits<uint32_t>::max() / std::max<int64_t>(1, head_dim));
  for (int64_t h = 0; h < num_heads; ++h) {
    hists[h] = MagnitudeHistogram();
    hists[h].counts.assign(H::kSlots, 0);
  }
  std::vector<HeadState<Key>> merged(num_heads);
  int64_t bad = 0;
  std::mutex mu;  // guards hists, merged and bad
  pool.ParallelFor(tasks, [&](int i) {
    // Kept all-zero between uses: a call clears only the slots it touched.
    thread_local std::vector<uint32_t> counts;
    if (counts.size() < static_cast<size_t>(num_heads * kHeadStride)) {
      counts.assign(num_heads * kHeadStride, 0);
    }
    std::vector<HeadState<Key>> state(num_heads);
    int64_t task_bad = 0;
    auto flush = [&] {
      std::lock_guard<std::mutex> lock(mu);
      for (int64_t h = 0; h < num_heads; ++h) {
        uint32_t* c = counts.data() + h * kHeadStride;
        for (int32_t s = state[h].lo; s <= state[h].hi; ++s) {
          hists[h].counts[s] += c[s];
          c[s] = 0;
        }
        state[h].lo = H::kSlots;
        state[h].hi = -1;
      }
    };
    const int64_t r0 = rows * i / tasks, r1 = rows * (i + 1) / tasks;
    for (int64_t r = r0; r < r1; r += rows_per_flush) {
      const int64_t n = std::min(rows_per_flush, r1 - r);
      HistRows<D>(t.bytes().data() + r * row_bytes, n, num_heads, head_dim, counts.data(),
                  state.data(), &task_bad);
      flush();
    }
    std::lock_guard<std::mutex> lock(mu);
    bad += task_bad;
    for (int64_t h = 0; h < num_heads; ++h) {
      HeadState<Key>& m = merged[h];
      if (state[h].max_count == 0) continue;
      if (state[h].max_key > m.max_key || m.max_count == 0) {
        m.max_key = state[h].max_key;
        m.max_count = state[h].max_count;
      } else if (state[h].max_key == m.max_key) {
        m.max_count += state[h].max_count;
      }
    }
  });
  for (int64_t h = 0; h < num_heads; ++h) {
    hists[h].max = KeyBitsToFloat(D, static_cast<uint32_t>(merged[h].max_key));
    hists[h].max_count = merged[h].max_count;
    absmax[h] = hists[h].max;
  }
  *nonfinite = bad;
}

}  // namespace

void CpuAbsMaxHistogramPerHead(ThreadPool& pool, int tasks, const TensorView& t,
                               int64_t num_heads, int64_t head_dim, absl::Span<float> absmax,
                               absl::Span<MagnitudeHistogram> hists, int64_t* nonfinite) {
  DispatchDType(t.dtype(), [&](auto tag) {
    HistImpl<decltype(tag)::value>(pool, tasks, t, num_heads, head_dim, absmax, hists, nonfinite);
  });
}

}  // namespace caliper
