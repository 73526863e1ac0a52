// Element types Caliper accepts on the wire and in files, and their conversion to float.
// Only BF16, F16 and F32 are accepted for statistics; anything else is an InvalidArgument
// naming the field it came from. Conversions are exact (bf16/f16 -> f32 never rounds).
#ifndef CALIPER_CORE_TENSOR_DTYPE_H_
#define CALIPER_CORE_TENSOR_DTYPE_H_

#include <cstdint>
#include <cstring>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace caliper {

enum class DType { kBF16, kF16, kF32 };

// Accepts safetensors spellings ("BF16", "F16", "F32") and torch/numpy ones
// ("bfloat16", "float16", "half", "float32", "float"), case-insensitive.
// `field` names the request field in the error message.
absl::StatusOr<DType> ParseDType(absl::string_view name, absl::string_view field = "dtype");

// Safetensors spelling: "BF16", "F16", "F32".
absl::string_view DTypeName(DType dtype);

constexpr size_t ItemSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

inline float BF16ToFloat(uint16_t bits) {
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

// IEEE half to float, exact for normals, subnormals, Inf and NaN.
float F16ToFloat(uint16_t bits);

// Round-to-nearest-even float -> bf16 / f16 (used by generators and tests).
uint16_t FloatToBF16(float value);
uint16_t FloatToF16(float value);

}  // namespace caliper

#endif  // CALIPER_CORE_TENSOR_DTYPE_H_
