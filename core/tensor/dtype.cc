#include "core/tensor/dtype.h"

#include <cctype>
#include <cmath>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace caliper {

absl::StatusOr<DType> ParseDType(absl::string_view name, absl::string_view field) {
  std::string lower;
  for (char c : name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  if (lower == "bf16" || lower == "bfloat16") return DType::kBF16;
  if (lower == "f16" || lower == "fp16" || lower == "float16" || lower == "half") return DType::kF16;
  if (lower == "f32" || lower == "fp32" || lower == "float32" || lower == "float") return DType::kF32;
  return absl::InvalidArgumentError(absl::StrCat(
      field, ": unsupported dtype \"", name, "\" (expected BF16, F16 or F32)"));
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return "BF16";
    case DType::kF16: return "F16";
    case DType::kF32: return "F32";
  }
  return "?";
}

float F16ToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  uint32_t out;
  if (exponent == 0x1f) {
    out = sign | 0x7f800000u | (mantissa << 13);  // Inf / NaN
  } else if (exponent != 0) {
    out = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    out = sign;
  } else {  // subnormal: value = mantissa * 2^-24, exact in float
    float value = std::ldexp(static_cast<float>(mantissa), -24);
    std::memcpy(&out, &value, sizeof(out));
    out |= sign;
  }
  float result;
  std::memcpy(&result, &out, sizeof(result));
  return result;
}

uint16_t FloatToBF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

uint16_t FloatToF16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00u;
  if (magnitude >= 65520.0f) return sign | 0x7c00u;  // rounds to Inf
  if (magnitude < 6.103515625e-05f) {                  // subnormal half (or zero)
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 16777216.0f));
  }
  uint32_t m;
  std::memcpy(&m, &magnitude, sizeof(m));
  m += 0xfffu + ((m >> 13) & 1u);  // round to nearest even at bit 13
  const uint32_t exponent = (m >> 23) - 112;
  return sign | static_cast<uint16_t>((exponent << 10) | ((m >> 13) & 0x3ffu));
}

}  // namespace caliper
