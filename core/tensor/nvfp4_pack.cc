#include "core/tensor/nvfp4_pack.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "core/tensor/dtype.h"
#include "core/tensor/simd.h"


namespace caliper {
namespace {


CALIPER_INLINE float FromBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Branch-free widening (exact): normals and subnormals through one multiply, Inf/NaN kept.
CALIPER_INLINE float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t mag = static_cast<uint32_t>(h & 0x7fffu) << 13;
  float f = FromBits(mag) * 0x1p112f;
  if ((h & 0x7c00u) == 0x7c00u) f = FromBits(mag | 0x7f800000u);
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return FromBits(bits | sign);
}

struct E4M3Table {
  float value[256];
  E4M3Table() {
    for (int b = 0; b < 256; ++b) {
      const int exponent = (b >> 3) & 15, mantissa = b & 7;
      float v;
      if (exponent == 15 && mantissa == 7) {
        v = std::nanf("");
      } else if (exponent == 0) {
        v = std::ldexp(static_cast<float>(mantissa), -9);
      } else {
        v = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
      }
      value[b] = (b & 0x80) ? -v : v;
    }
  }
};
const E4M3Table& Table() {
  static const E4M3Table table;
  return table;
}

// compressed-tensors' cast_to_fp4 thresholds (round half to even on the E2M1 grid), as a count of
// thresholds met: the E2M1 magnitude index 0..7.
CALIPER_INLINE uint8_t Fp4Index(float q) {
  const float a = std::fabs(q);
  const uint8_t index = static_cast<uint8_t>((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) +
                                             (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f));
  // torch.sign(q) * |fp4| keeps the sign bit for every q < 0, rounded-to-zero ones included.
  return static_cast<uint8_t>(index | (q < 0.0f ? 8 : 0));
}

template <DType D>
CALIPER_INLINE float LoadAt(const uint8_t* p, int64_t i) {
  if constexpr (D == DType::kF32) {
    return FromBits(reinterpret_cast<const LooseU32*>(p)[i]);
  } else if constexpr (D == DType::kBF16) {
    return FromBits(static_cast<uint32_t>(reinterpret_cast<const LooseU16*>(p)[i]) << 16);
  } else {
    return HalfToFloat(reinterpret_cast<const LooseU16*>(p)[i]);
  }
}

template <DType D>
CALIPER_INLINE float RoundToWeightDtype(float v) {
  if constexpr (D == DType::kBF16) return BF16ToFloat(FloatToBF16(v));
  if constexpr (D == DType::kF16) return F16ToFloat(FloatToF16(v));
  return v;
}

template <DType D>
CALIPER_INLINE int64_t PackGroupsBody(const uint8_t* in, int64_t groups, float gs,
                                      bool in_weight_dtype, uint8_t zero_scale, uint8_t* packed,
                                      uint8_t* scales) {
  const float* table = Table().value;
  int64_t bad = 0;
  for (int64_t g = 0; g < groups; ++g) {
    float v[kNvfp4GroupSize];
    float amax = 0.0f;
    int finite = 0;
    for (int i = 0; i < kNvfp4GroupSize; ++i) {
      v[i] = LoadAt<D>(in, g * kNvfp4GroupSize + i);
      const float a = std::fabs(v[i]);
      finite += a <= 3.4028235e38f;  // false for NaN and Inf
      amax = std::max(amax, a);
    }
    bad += kNvfp4GroupSize - finite;
    float local = amax / 6.0f;
    if (in_weight_dtype) local = RoundToWeightDtype<D>(local);
    uint8_t bits = FloatToE4M3(gs * local);
    if ((bits & 0x7f) == 0) bits = zero_scale;
    scales[g] = bits;
    const float eff = table[bits] / gs;
    uint8_t nib[kNvfp4GroupSize];
    for (int i = 0; i < kNvfp4GroupSize; ++i) nib[i] = Fp4Index(v[i] / eff);
    for (int i = 0; i < kNvfp4GroupSize / 2; ++i) {
      packed[g * (kNvfp4GroupSize / 2) + i] =
          static_cast<uint8_t>(nib[2 * i] | (nib[2 * i + 1] << 4));
    }
  }
  return bad;
}

CALIPER_CLONES int64_t PackGroupsF32(const uint8_t* in, int64_t groups, float gs, bool wd,
                                     uint8_t zero, uint8_t* packed, uint8_t* scales) {
  return PackGroupsBody<DType::kF32>(in, groups, gs, wd, zero, packed, scales);
}
CALIPER_CLONES int64_t PackGroupsBF16(const uint8_t* in, int64_t groups, float gs, bool wd,
                                      uint8_t zero, uint8_t* packed, uint8_t* scales) {
  return PackGroupsBody<DType::kBF16>(in, groups, gs, wd, zero, packed, scales);
}
CALIPER_CLONES int64_t PackGroupsF16(const uint8_t* in, int64_t groups, float gs, bool wd,
                                     uint8_t zero, uint8_t* packed, uint8_t* scales) {
  return PackGroupsBody<DType::kF16>(in, groups, gs, wd, zero, packed, scales);
}

}  // namespace

uint8_t FloatToE4M3(float value) {
  if (std::isnan(value)) return 0x7f;
  const uint8_t sign = std::signbit(value) ? 0x80 : 0;
  const float a = std::min(std::fabs(value), 448.0f);
  if (a < 0x1p-6f) {
    // Subnormal range: multiples of 2^-9; a * 512 is exact, rounded half to even. 8 -> 2^-6.
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f)));
  }
  uint32_t bits;
  std::memcpy(&bits, &a, sizeof(bits));
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // round the 23-bit mantissa to 3 bits, half to even
  const uint32_t exponent = (bits >> 23) - 127 + 7;
  return static_cast<uint8_t>(sign | (exponent << 3) | ((bits >> 20) & 7u));
}

float E4M3ToFloat(uint8_t bits) { return Table().value[bits]; }

absl::Status CheckNvfp4PackArgs(const TensorView& weight, const Nvfp4PackParams& params,
                                absl::Span<const uint8_t> packed,
                                absl::Span<const uint8_t> scales) {
  if (weight.shape().size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight.shape: NVFP4 packs 2-D [rows, cols] weights, got ",
                     weight.ShapeString()));
  }
  const int64_t cols = weight.shape()[1];
  if (cols % kNvfp4GroupSize != 0) {
    return absl::InvalidArgumentError(absl::StrCat("weight.shape[1]: ", cols,
                                                   " columns is not a multiple of the group size ",
                                                   kNvfp4GroupSize));
  }
  const int64_t n = weight.num_elements();
  if (static_cast<int64_t>(packed.size()) != n / 2) {
    return absl::InvalidArgumentError(absl::StrCat("packed: has ", packed.size(),
                                                   " bytes, needs ", n / 2, " for ",
                                                   weight.ShapeString()));
  }
  if (static_cast<int64_t>(scales.size()) != n / kNvfp4GroupSize) {
    return absl::InvalidArgumentError(absl::StrCat("scales: has ", scales.size(),
                                                   " bytes, needs ", n / kNvfp4GroupSize,
                                                   " for ", weight.ShapeString()));
  }
  if (!std::isfinite(params.global_scale) || !(params.global_scale > 0.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "global_scale: must be finite and positive, got ", params.global_scale));
  }
  return absl::OkStatus();
}

void PackNvfp4Rows(const TensorView& weight, const Nvfp4PackParams& params, int64_t row_begin,
                   int64_t row_end, uint8_t* packed, uint8_t* scales, int64_t* nonfinite) {
  const int64_t cols = weight.shape()[1];
  const int64_t groups = (row_end - row_begin) * cols / kNvfp4GroupSize;
  const int64_t first = row_begin * cols;
  const uint8_t* in = weight.bytes().data() + first * static_cast<int64_t>(ItemSize(weight.dtype()));
  uint8_t* out_packed = packed + first / 2;
  uint8_t* out_scales = scales + first / kNvfp4GroupSize;
  const float gs = params.global_scale;
  const bool wd = params.group_scale_in_weight_dtype;
  const uint8_t zero = params.zero_group_scale;
  int64_t bad = 0;
  switch (weight.dtype()) {
    case DType::kF32: bad = PackGroupsF32(in, groups, gs, wd, zero, out_packed, out_scales); break;
    case DType::kBF16: bad = PackGroupsBF16(in, groups, gs, wd, zero, out_packed, out_scales); break;
    case DType::kF16: bad = PackGroupsF16(in, groups, gs, wd, zero, out_packed, out_scales); break;
  }
  *nonfinite = bad;
}

absl::Status PackNvfp4Reference(const TensorView& weight, const Nvfp4PackParams& params,
                                absl::Span<uint8_t> packed, absl::Span<uint8_t> scales) {
  if (absl::Status s = CheckNvfp4PackArgs(weight, params, packed, scales); !s.ok()) return s;
  int64_t bad = 0;
  PackNvfp4Rows(weight, params, 0, weight.shape()[0], packed.data(), scales.data(), &bad);
  return NonFiniteWeightsError(bad, weight);
}

absl::Status NonFiniteWeightsError(int64_t nonfinite, const TensorView& weight) {
  if (nonfinite == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("weight.data: ", nonfinite,
                                                 " non-finite values (NaN/Inf) in ",
                                                 weight.ShapeString(), "; cannot quantize"));
}

}  // namespace caliper
