// The CPU reductions' hot loops over raw bits (cpu_keys.h), one entry point per width: each is
// cloned for AVX2 and a portable default (target_clones needs plain functions), and the inline
// overloads below let the drivers in cpu_backend.cc be templates over the width. Unmasked loops
// let NaN/Inf through as keys beyond Inf's; masked ones skip and count them. Internal.
#ifndef CALIPER_CORE_TENSOR_CPU_LOOPS_H_
#define CALIPER_CORE_TENSOR_CPU_LOOPS_H_

#include <cstdint>

#include "core/tensor/cpu_keys.h"

namespace caliper {

void Range16(const uint8_t* d, int64_t n, int16_t* mn, int16_t* mx);
void Range32(const uint8_t* d, int64_t n, int32_t* mn, int32_t* mx);
int64_t RangeMasked16(const uint8_t* d, int64_t n, uint16_t inf, int16_t* mn, int16_t* mx);
int64_t RangeMasked32(const uint8_t* d, int64_t n, uint32_t inf, int32_t* mn, int32_t* mx);
int16_t AbsMax16(const uint8_t* d, int64_t n);
int32_t AbsMax32(const uint8_t* d, int64_t n);
int16_t AbsMaxMasked16(const uint8_t* d, int64_t n, uint16_t inf, int64_t* bad);
int32_t AbsMaxMasked32(const uint8_t* d, int64_t n, uint32_t inf, int64_t* bad);
void Columns16(const uint8_t* d, int64_t rows, int64_t cols, int16_t* acc);
void Columns32(const uint8_t* d, int64_t rows, int64_t cols, int32_t* acc);
int64_t ColumnsMasked16(const uint8_t* d, int64_t rows, int64_t cols, uint16_t inf, int16_t* acc);
int64_t ColumnsMasked32(const uint8_t* d, int64_t rows, int64_t cols, uint32_t inf, int32_t* acc);
void FoldHeads16(const int16_t* acc, int64_t cols, int64_t heads, int64_t dim, int16_t* keys);
void FoldHeads32(const int32_t* acc, int64_t cols, int64_t heads, int64_t dim, int32_t* keys);
// Per-column min / max order keys over `rows` rows of `width` elements.
int64_t ColumnRange16(const uint8_t* data, int64_t rows, int64_t width, uint16_t inf, int16_t* mn,
                      int16_t* mx);
int64_t ColumnRange32(const uint8_t* data, int64_t rows, int64_t width, uint32_t inf, int32_t* mn,
                      int32_t* mx);
void ColumnRangeUnmasked16(const uint8_t* data, int64_t rows, int64_t width, int16_t* mn,
                           int16_t* mx);
void ColumnRangeUnmasked32(const uint8_t* data, int64_t rows, int64_t width, int32_t* mn,
                           int32_t* mx);

// Overload set so the drivers can be templated on the bit width.
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
inline int64_t ColumnRangeKeys(const uint8_t* d, int64_t r, int64_t w, uint16_t inf, int16_t* mn,
                               int16_t* mx) {
  return ColumnRange16(d, r, w, inf, mn, mx);
}
inline int64_t ColumnRangeKeys(const uint8_t* d, int64_t r, int64_t w, uint32_t inf, int32_t* mn,
                               int32_t* mx) {
  return ColumnRange32(d, r, w, inf, mn, mx);
}
inline void ColumnRangeKeysUnmasked(const uint8_t* d, int64_t r, int64_t w, int16_t* mn,
                                    int16_t* mx) {
  ColumnRangeUnmasked16(d, r, w, mn, mx);
}
inline void ColumnRangeKeysUnmasked(const uint8_t* d, int64_t r, int64_t w, int32_t* mn,
                                    int32_t* mx) {
  ColumnRangeUnmasked32(d, r, w, mn, mx);
}

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_CPU_LOOPS_H_
