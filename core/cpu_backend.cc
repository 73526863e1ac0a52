// Reference CPU reductions. Simple single-pass loops; the perf issue makes them fast.
#include <cmath>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/reduction_backend.h"

namespace caliper {
namespace {

template <typename Fn>
void ForEachFloat(const TensorView& t, Fn&& fn) {
  const uint8_t* p = t.bytes().data();
  const int64_t n = t.num_elements();
  switch (t.dtype()) {
    case DType::kF32:
      for (int64_t i = 0; i < n; ++i) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        fn(i, v);
      }
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        fn(i, BF16ToFloat(b));
      }
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t b;
        std::memcpy(&b, p + 2 * i, 2);
        fn(i, F16ToFloat(b));
      }
      break;
  }
}

class CpuBackend : public ReductionBackend {
 public:
  absl::string_view name() const override { return "cpu"; }

  absl::Status Range(const TensorView& t, RangeStats* out) override {
    RangeStats s;
    ForEachFloat(t, [&](int64_t, float v) {
      if (!std::isfinite(v)) {
        ++s.nonfinite;
        return;
      }
      s.min = std::min(s.min, v);
      s.max = std::max(s.max, v);
    });
    *out = s;
    return absl::OkStatus();
  }

  absl::Status AbsMaxPerHead(const TensorView& t, int64_t num_heads, int64_t head_dim,
                             absl::Span<float> out, int64_t* nonfinite) override {
    if (num_heads <= 0 || head_dim <= 0) {
      return absl::InvalidArgumentError("num_heads and head_dim must be positive");
    }
    if (static_cast<int64_t>(out.size()) != num_heads) {
      return absl::InvalidArgumentError(
          absl::StrCat("output has ", out.size(), " entries for ", num_heads, " heads"));
    }
    const int64_t row = num_heads * head_dim;
    if (t.num_elements() % row != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor of ", t.num_elements(), " elements is not rows of ", num_heads, " x ", head_dim));
    }
    for (float& v : out) v = 0.0f;
    int64_t bad = 0;
    ForEachFloat(t, [&](int64_t i, float v) {
      if (!std::isfinite(v)) {
        ++bad;
        return;
      }
      float& slot = out[(i % row) / head_dim];
      slot = std::max(slot, std::fabs(v));
    });
    *nonfinite = bad;
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<ReductionBackend> MakeCpuBackend(int /*threads*/) {
  return std::make_unique<CpuBackend>();
}

}  // namespace caliper
