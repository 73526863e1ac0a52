// Naive element-by-element reductions: the slow, obviously correct reference the fast CPU
// backend and the CUDA backend are tested against. Same contract as ReductionBackend.
#ifndef CALIPER_TESTS_SUPPORT_NAIVE_REDUCE_H_
#define CALIPER_TESTS_SUPPORT_NAIVE_REDUCE_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/tensor/dtype.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"

namespace caliper::testing {

// Encodes floats as `dtype` bytes (round to nearest even).
inline std::vector<uint8_t> Encode(DType dtype, const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * ItemSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t b = dtype == DType::kBF16 ? FloatToBF16(values[i]) : FloatToF16(values[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}


inline float NaiveElement(const TensorView& t, int64_t i) {
  const uint8_t* p = t.bytes().data();
  if (t.dtype() == DType::kF32) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  uint16_t b;
  std::memcpy(&b, p + 2 * i, 2);
  return t.dtype() == DType::kBF16 ? BF16ToFloat(b) : F16ToFloat(b);
}

inline RangeStats NaiveRange(const TensorView& t) {
  RangeStats s;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const float v = NaiveElement(t, i);
    if (!std::isfinite(v)) {
      ++s.nonfinite;
      continue;
    }
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
  }
  return s;
}

// Precondition: num_elements is a multiple of num_heads * head_dim.
inline std::vector<float> NaiveAbsMaxPerHead(const TensorView& t, int64_t num_heads,
                                             int64_t head_dim, int64_t* nonfinite) {
  std::vector<float> out(num_heads, 0.0f);
  const int64_t row = num_heads * head_dim;
  *nonfinite = 0;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    const float v = NaiveElement(t, i);
    if (!std::isfinite(v)) {
      ++*nonfinite;
      continue;
    }
    float& slot = out[(i % row) / head_dim];
    slot = std::max(slot, std::fabs(v));
  }
  return out;
}

}  // namespace caliper::testing

#endif  // CALIPER_TESTS_SUPPORT_NAIVE_REDUCE_H_
