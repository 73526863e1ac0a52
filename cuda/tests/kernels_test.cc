// Standalone tests of the CUDA reductions against a naive CPU loop (no gtest on GPU machines).
// Prints "N passed, N failed"; exits 1 on any failure and 77 (skipped) when there is no device.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/host_reducer.h"
#include "cuda/kernels.h"

namespace caliper::cuda {
namespace {

int g_passed = 0, g_failed = 0;

void Check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAIL: %s\n", what.c_str());
  }
}

float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
}

// A tensor as raw little-endian bits, built from bit patterns so no encoder is needed.
struct Tensor {
  ElementType type;
  std::vector<uint8_t> bytes;
  int64_t size() const { return static_cast<int64_t>(bytes.size() / ElementSize(type)); }
  float At(int64_t i) const {
    if (type == ElementType::kF32) {
      float f;
      std::memcpy(&f, bytes.data() + 4 * i, 4);
      return f;
    }
    uint16_t b;
    std::memcpy(&b, bytes.data() + 2 * i, 2);
    if (type == ElementType::kF16) return HalfToFloat(b);
    const uint32_t wide = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &wide, 4);
    return f;
  }
  void SetBits(int64_t i, uint32_t bits) {
    if (type == ElementType::kF32) {
      std::memcpy(bytes.data() + 4 * i, &bits, 4);
    } else {
      const uint16_t b = static_cast<uint16_t>(bits);
      std::memcpy(bytes.data() + 2 * i, &b, 2);
    }
  }
};

uint32_t InfBits(ElementType t) {
  return t == ElementType::kBF16 ? 0x7f80u : t == ElementType::kF16 ? 0x7c00u : 0x7f800000u;
}
uint32_t SignBit(ElementType t) { return t == ElementType::kF32 ? 0x80000000u : 0x8000u; }
uint32_t NanBits(ElementType t) { return InfBits(t) | (t == ElementType::kF32 ? 0x400000u : 0x40u); }

// Random finite values: a random sign and mantissa, exponent within a band around 1.
Tensor Random(std::mt19937& rng, ElementType type, int64_t n, bool negative_only = false) {
  Tensor t{type, std::vector<uint8_t>(n * ElementSize(type))};
  std::uniform_int_distribution<uint32_t> any;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t r = any(rng);
    uint32_t bits;
    if (type == ElementType::kF32) {
      bits = (r & 0x807fffffu) | ((112u + (r >> 23) % 32u) << 23);
    } else if (type == ElementType::kBF16) {
      bits = (r & 0x807fu) | ((112u + (r >> 7) % 32u) << 7);
    } else {
      bits = (r & 0x83ffu) | ((1u + (r >> 10) % 29u) << 10);
    }
    if (negative_only) bits |= SignBit(type);
    t.SetBits(i, bits);
  }
  return t;
}

struct Expected {
  float min = INFINITY, max = -INFINITY;
  int64_t nonfinite = 0;
  std::vector<float> heads;
};

Expected Naive(const Tensor& t, int64_t heads, int64_t dim) {
  Expected e;
  e.heads.assign(heads, 0.0f);
  for (int64_t i = 0; i < t.size(); ++i) {
    const float v = t.At(i);
    if (!std::isfinite(v)) {
      ++e.nonfinite;
      continue;
    }
    e.min = std::min(e.min, v);
    e.max = std::max(e.max, v);
    float& slot = e.heads[(i % (heads * dim)) / dim];
    slot = std::max(slot, std::fabs(v));
  }
  return e;
}

std::string Label(const std::string& name, const Tensor& t, int64_t heads, int64_t dim) {
  return name + " " + ElementTypeName(t.type) + " n=" + std::to_string(t.size()) +
         " heads=" + std::to_string(heads) + " dim=" + std::to_string(dim);
}

void CheckTensor(HostReducer& r, const std::string& name, const Tensor& t, int64_t heads,
                 int64_t dim, const void* host = nullptr) {
  if (host == nullptr) host = t.bytes.data();
  const Expected want = Naive(t, heads, dim);
  const std::string label = Label(name, t, heads, dim);
  HostRange range;
  Error e = r.Range(host, t.type, t.size(), &range);
  Check(e.ok(), label + " Range: " + e.message);
  const bool any_finite = want.nonfinite < t.size();
  Check(range.has_finite == any_finite, label + " has_finite");
  if (any_finite) {
    Check(range.min == want.min, label + " min " + std::to_string(range.min) + " want " + std::to_string(want.min));
    Check(range.max == want.max, label + " max " + std::to_string(range.max) + " want " + std::to_string(want.max));
  }
  Check(range.nonfinite == want.nonfinite, label + " range nonfinite");
  std::vector<float> out(heads, -1.0f);
  int64_t bad = -1;
  e = r.AbsMaxPerHead(host, t.type, t.size(), heads, dim, out.data(), &bad);
  Check(e.ok(), label + " AbsMaxPerHead: " + e.message);
  int mismatches = 0;
  for (int64_t h = 0; h < heads; ++h) {
    if (out[h] != want.heads[h] && mismatches++ < 3) {
      std::printf("  head %lld: got %g want %g\n", static_cast<long long>(h), out[h], want.heads[h]);
    }
  }
  Check(mismatches == 0, label + " per-head absmax");
  Check(bad == want.nonfinite, label + " per-head nonfinite " + std::to_string(bad) + " want " + std::to_string(want.nonfinite));
}

const ElementType kTypes[] = {ElementType::kBF16, ElementType::kF16, ElementType::kF32};

void RunAll(HostReducer& r, const std::string& tag) {
  std::mt19937 rng(1234);
  const std::pair<int64_t, int64_t> layouts[] = {{1, 1},  {1, 7},  {3, 5},  {8, 128},
                                                 {4, 33}, {2, 1},  {5, 64}, {32, 128}};
  for (ElementType type : kTypes) {
    for (auto [heads, dim] : layouts) {
      for (int64_t tokens : {1, 3, 97, 1100}) {
        CheckTensor(r, tag + " random", Random(rng, type, tokens * heads * dim), heads, dim);
      }
    }
    for (int64_t n : {1, 2, 7, 9, 15, 31, 33, 63, 65, 1023, 4097}) {
      const Tensor t = Random(rng, type, n);
      CheckTensor(r, tag + " odd-length", t, 1, n);
      CheckTensor(r, tag + " odd-length", t, n, 1);
    }
    CheckTensor(r, tag + " huge-head-dim", Random(rng, type, 3 * 2 * 300001), 2, 300001);
    CheckTensor(r, tag + " negative-only", Random(rng, type, 64 * 8 * 16, true), 8, 16);

    Tensor zeros{type, std::vector<uint8_t>(4096 * ElementSize(type), 0)};
    CheckTensor(r, tag + " all-zero", zeros, 4, 16);

    Tensor specials = Random(rng, type, 1 << 20);
    specials.SetBits(5, NanBits(type));
    specials.SetBits(777, InfBits(type));
    specials.SetBits(300000, InfBits(type) | SignBit(type));
    specials.SetBits((1 << 20) - 1, NanBits(type) | SignBit(type));
    CheckTensor(r, tag + " nan-inf", specials, 8, 128);

    Tensor all_bad{type, std::vector<uint8_t>(4 * ElementSize(type))};
    for (int i = 0; i < 4; ++i) all_bad.SetBits(i, i % 2 ? NanBits(type) : InfBits(type));
    CheckTensor(r, tag + " all-nonfinite", all_bad, 2, 2);

    // Host data at an odd 2-byte offset inside a buffer.
    const Tensor t = Random(rng, type, 3 * 4 * 33);
    std::vector<uint8_t> shifted(t.bytes.size() + 2);
    std::memcpy(shifted.data() + 2, t.bytes.data(), t.bytes.size());
    CheckTensor(r, tag + " unaligned-host", t, 4, 33, shifted.data() + 2);

    // Many tokens: several pieces and slots in flight.
    CheckTensor(r, tag + " large", Random(rng, type, (1 << 22) + 8 * 128), 8, 128);
  }
  std::vector<float> out(3);
  int64_t bad = 0;
  const Tensor t = Random(rng, ElementType::kBF16, 10);
  Check(!r.AbsMaxPerHead(t.bytes.data(), t.type, 10, 3, 1, out.data(), &bad).ok(),
        tag + " n not whole rows is an error");
}

// Device launchers directly: a Range over a device pointer that is not 16-byte aligned takes the
// scalar prefix path; per-head requires alignment and says so.
void TestLaunchers() {
  std::mt19937 rng(99);
  const Tensor t = Random(rng, ElementType::kBF16, 4099);
  void* device = nullptr;
  DeviceRange* range = nullptr;
  Check(cudaMalloc(&device, t.bytes.size() + 16) == cudaSuccess, "cudaMalloc");
  Check(cudaMalloc(reinterpret_cast<void**>(&range), sizeof(DeviceRange)) == cudaSuccess, "cudaMalloc");
  auto* shifted = static_cast<uint8_t*>(device) + 2;
  Check(cudaMemcpy(shifted, t.bytes.data(), t.bytes.size(), cudaMemcpyHostToDevice) == cudaSuccess, "H2D");
  Check(ResetRange(range, nullptr) == cudaSuccess, "ResetRange");
  Check(LaunchRange(shifted, t.type, t.size(), range, nullptr) == cudaSuccess, "LaunchRange");
  DeviceRange host{};
  Check(cudaMemcpy(&host, range, sizeof(host), cudaMemcpyDeviceToHost) == cudaSuccess, "D2H");
  const Expected want = Naive(t, 1, t.size());
  Check(RangeKeyToFloat(host.min_key) == want.min && RangeKeyToFloat(host.max_key) == want.max,
        "launcher Range on a 2-byte-aligned pointer");
  Check(LaunchAbsMaxPerHead(shifted, t.type, 8, 0, 1, 8, nullptr, nullptr, nullptr) ==
            cudaErrorMisalignedAddress,
        "per-head launcher rejects a misaligned pointer");
  cudaFree(device);
  cudaFree(range);
}

}  // namespace
}  // namespace caliper::cuda

int main() {
  using namespace caliper::cuda;
  const int devices = DeviceCount();
  if (devices == 0) {
    std::printf("no CUDA device: 0 passed, 0 failed (skipped)\n");
    return 77;
  }
  std::unique_ptr<HostReducer> reducer;
  Error e = HostReducer::Create(ReducerOptions(), &reducer);
  Check(e.ok(), "HostReducer::Create: " + e.message);
  if (reducer) RunAll(*reducer, "default-staging");
  // Small staging: many pieces, rows split mid-head, pieces spanning rows.
  ReducerOptions small;
  small.staging_bytes = 4096;
  small.slots = 2;
  std::unique_ptr<HostReducer> small_reducer;
  e = HostReducer::Create(small, &small_reducer);
  Check(e.ok(), "HostReducer::Create(small): " + e.message);
  if (small_reducer) RunAll(*small_reducer, "small-staging");
  TestLaunchers();
  ReducerOptions bad;
  bad.staging_bytes = 100;
  Check(!HostReducer::Create(bad, &small_reducer).ok(), "staging_bytes not a multiple of 16 is rejected");
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
