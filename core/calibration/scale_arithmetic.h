// Whose arithmetic turns observed statistics into scales (docs/observers.md, "Compatibility").
// Caliper's: moving averages in double, every scale one correctly rounded float32 operation.
// llm-compressor's (recipe compat llm-compressor): what its torch code computes, in the dtype the
// model was observed in: each operation in float32 then rounded to that dtype, `2688 / amax` as
// torch does it (reciprocal, then multiply), the moving average as `v * (1 - c) + x * c`.
#ifndef CALIPER_CORE_CALIBRATION_SCALE_ARITHMETIC_H_
#define CALIPER_CORE_CALIBRATION_SCALE_ARITHMETIC_H_

#include "core/tensor/dtype.h"

namespace caliper {

enum class Compat { kCaliper, kLlmCompressor };

class ScaleArithmetic {
 public:
  ScaleArithmetic() = default;  // Caliper's
  ScaleArithmetic(Compat compat, DType observed) : compat_(compat), dtype_(observed) {}

  Compat compat() const { return compat_; }
  DType dtype() const { return dtype_; }

  // One moving-average step from `average` towards `value` with constant c. Caliper's keeps
  // doubles (no drift over thousands of batches); llm-compressor's rounds every step.
  double Step(double average, float value, double c) const;
  // 448 * 6 / amax (amax > 0, finite); the caller handles dead tensors.
  float GlobalScale(float amax) const;
  // absmax / qmax, the FP8 KV scale.
  float KvScale(float absmax, float qmax) const;

 private:
  float Round(float value) const;  // to dtype_ (identity for F32)

  Compat compat_ = Compat::kCaliper;
  DType dtype_ = DType::kF32;
};

}  // namespace caliper

#endif  // CALIPER_CORE_CALIBRATION_SCALE_ARITHMETIC_H_
