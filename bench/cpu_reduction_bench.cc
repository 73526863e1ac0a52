// Benchmark 1: CPU reduction throughput (GB/s of input) against this machine's single-thread
// memory read bandwidth, measured in the same run over a buffer of the same size (a plain
// sum-read loop, run once per iteration next to the reduction). Counter ratio_to_read_bw =
// reduction GB/s / read GB/s; goal >= 0.8 for per-head absmax on BF16 and F32.
// BM_HistogramIncrementFloor is the bound any exact histogram pass meets here (see its comment).
//   cpu_reduction_bench [--benchmark_filter=...] [--benchmark_min_time=...]
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/tensor/cpu_histogram.h"
#include "core/tensor/dtype.h"
#include "core/tensor/magnitude_histogram.h"
#include "core/tensor/reduction_backend.h"
#include "core/tensor/tensor_view.h"

namespace caliper {
namespace {

constexpr int64_t kBufferBytes = int64_t{256} << 20;  // far larger than any cache here
constexpr int64_t kHeads = 8, kHeadDim = 128;

// Finite random values of `dtype`, one 256 MiB buffer per dtype, built once.
const std::vector<uint8_t>& Buffer(DType dtype) {
  static std::vector<uint8_t> buffers[3];
  std::vector<uint8_t>& b = buffers[static_cast<int>(dtype)];
  if (b.empty()) {
    b.resize(kBufferBytes);
    std::mt19937 rng(static_cast<unsigned>(dtype) + 1);
    std::normal_distribution<float> normal(0.0f, 2.0f);
    std::vector<uint8_t> block(1 << 20);
    for (size_t i = 0; i < block.size(); i += ItemSize(dtype)) {
      const float v = normal(rng);
      if (dtype == DType::kF32) {
        std::memcpy(&block[i], &v, 4);
      } else {
        const uint16_t bits = dtype == DType::kBF16 ? FloatToBF16(v) : FloatToF16(v);
        std::memcpy(&block[i], &bits, 2);
      }
    }
    for (int64_t off = 0; off < kBufferBytes; off += block.size()) {
      std::memcpy(b.data() + off, block.data(), block.size());
    }
  }
  return b;
}

// The baseline: one thread summing the buffer as 64-bit words, with the same AVX2 clone the
// reductions get, so the comparison is not flattered by a weaker baseline ISA.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
__attribute__((noinline)) uint64_t SumRead(const uint8_t* p, int64_t bytes) {
  uint64_t acc[8] = {};
  for (int64_t i = 0; i + 64 <= bytes; i += 64) {
    for (int l = 0; l < 8; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      acc[l] += w;
    }
  }
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs `reduce` once per iteration and, paired with it, one baseline read pass over the same
// buffer, so both see the same machine load (this machine is shared and noisy). Reports the
// reduction's time as the iteration time and ratio_to_read_bw = baseline time / reduction time.
template <typename Fn>
void RunPaired(benchmark::State& state, const std::vector<uint8_t>& buffer, Fn&& reduce) {
  double reduce_s = 0, read_s = 0;
  for (auto _ : state) {
    auto t0 = Clock::now();
    reduce();
    const double r = Seconds(t0);
    state.SetIterationTime(r);
    reduce_s += r;
    t0 = Clock::now();
    benchmark::DoNotOptimize(SumRead(buffer.data(), kBufferBytes));
    read_s += Seconds(t0);
  }
  const double bytes = static_cast<double>(kBufferBytes) * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["read_GBps"] = bytes / read_s / 1e9;
  state.counters["reduce_GBps"] = bytes / reduce_s / 1e9;
  state.counters["ratio_to_read_bw"] = read_s / reduce_s;
}

void BM_SingleThreadReadBandwidth(benchmark::State& state) {
  const std::vector<uint8_t>& b = Buffer(DType::kBF16);
  RunPaired(state, b, [&] { benchmark::DoNotOptimize(SumRead(b.data(), kBufferBytes)); });
}

// Runs `reduce(backend, view)` paired with the read baseline over a [tokens, kHeads, kHeadDim]
// view of the dtype's buffer. Args: dtype, backend threads (0 = all cores).
template <typename Fn>
void RunPerHead(benchmark::State& state, Fn&& reduce) {
  const auto dtype = static_cast<DType>(state.range(0));
  const std::vector<uint8_t>& b = Buffer(dtype);
  const int64_t tokens = kBufferBytes / ItemSize(dtype) / (kHeads * kHeadDim);
  auto view = TensorView::Create(dtype, {tokens, kHeads, kHeadDim}, b);
  auto backend = MakeCpuBackend(static_cast<int>(state.range(1)));
  RunPaired(state, b, [&] {
    if (absl::Status s = reduce(*backend, *view); !s.ok()) {
      const std::string message = s.ToString();
      state.SkipWithError(message.c_str());
    }
  });
  state.SetLabel(std::string(DTypeName(dtype)));
}

void BM_AbsMaxPerHead(benchmark::State& state) {
  std::vector<float> out(kHeads);
  int64_t bad = 0;
  RunPerHead(state, [&](ReductionBackend& backend, const TensorView& view) {
    absl::Status s = backend.AbsMaxPerHead(view, kHeads, kHeadDim, absl::MakeSpan(out), &bad);
    benchmark::DoNotOptimize(out.data());
    return s;
  });
}

// The one-pass absmax + histogram (sessions whose recipe asks for histograms); compare its
// ratio_to_read_bw with BM_AbsMaxPerHead's in the same run.
void BM_AbsMaxHistogramPerHead(benchmark::State& state) {
  std::vector<float> out(kHeads);
  std::vector<MagnitudeHistogram> hists(kHeads);
  int64_t bad = 0;
  RunPerHead(state, [&](ReductionBackend& backend, const TensorView& view) {
    absl::Status s = backend.AbsMaxHistogramPerHead(view, kHeads, kHeadDim, absl::MakeSpan(out),
                                                     absl::MakeSpan(hists), &bad);
    benchmark::DoNotOptimize(hists.data());
    return s;
  });
}

// The floor of an exact histogram pass on this machine: the scattered increments alone, one per
// element, into per-head uint32 counts laid out as the CPU pass lays them out, over the slots of the same values precomputed outside the
// timing (from the buffer's repeated 1 MiB block, so the slots stay in cache and no data is read).
// Paired with the read baseline like the reductions: a histogram pass cannot beat this ratio.
__attribute__((noinline)) void IncrementSlots(const std::vector<int16_t>& block_slots,
                                              int64_t repeats, uint32_t* counts) {
  constexpr int64_t kStride = kCpuHistogramHeadStride;
  const int64_t rows = static_cast<int64_t>(block_slots.size()) / (kHeads * kHeadDim);
  for (int64_t rep = 0; rep < repeats; ++rep) {
    const int16_t* s = block_slots.data();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t h = 0; h < kHeads; ++h, s += kHeadDim) {
        uint32_t* c = counts + h * kStride;
#pragma GCC unroll 16
        for (int64_t i = 0; i < kHeadDim; ++i) ++c[s[i]];
      }
    }
  }
}

void BM_HistogramIncrementFloor(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const std::vector<uint8_t>& b = Buffer(dtype);
  const size_t item = ItemSize(dtype);
  std::vector<int16_t> slots((size_t{1} << 20) / item);
  for (size_t i = 0; i < slots.size(); ++i) {
    float v;
    if (dtype == DType::kF32) {
      std::memcpy(&v, &b[i * item], 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, &b[i * item], 2);
      v = dtype == DType::kBF16 ? BF16ToFloat(bits) : F16ToFloat(bits);
    }
    slots[i] = static_cast<int16_t>(MagnitudeHistogram::SlotOf(v));
  }
  std::vector<uint32_t> counts(kHeads * kCpuHistogramHeadStride);
  RunPaired(state, b, [&] {
    IncrementSlots(slots, kBufferBytes >> 20, counts.data());
    benchmark::DoNotOptimize(counts.data());
  });
  state.SetLabel(std::string(DTypeName(dtype)));
}

void BM_Range(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const std::vector<uint8_t>& b = Buffer(dtype);
  auto view = TensorView::Create(dtype, {kBufferBytes / static_cast<int64_t>(ItemSize(dtype))}, b);
  auto backend = MakeCpuBackend(static_cast<int>(state.range(1)));
  RangeStats stats;
  RunPaired(state, b, [&] {
    if (!backend->Range(*view, &stats).ok()) state.SkipWithError("Range failed");
    benchmark::DoNotOptimize(stats);
  });
  state.SetLabel(std::string(DTypeName(dtype)));
}

// The moving-average observers' per-group min/max (inputs: 16-column groups of a 4096-wide row),
// only for recipes that ask for minmax; compare with BM_Range's ratio in the same run.
void BM_RangePerGroup(benchmark::State& state) {
  const auto dtype = static_cast<DType>(state.range(0));
  const std::vector<uint8_t>& b = Buffer(dtype);
  constexpr int64_t kColumns = 4096, kGroup = 16;
  const int64_t rows = kBufferBytes / static_cast<int64_t>(ItemSize(dtype)) / kColumns;
  auto view = TensorView::Create(dtype, {rows, kColumns}, b);
  auto backend = MakeCpuBackend(static_cast<int>(state.range(1)));
  std::vector<float> lo(kColumns / kGroup), hi(kColumns / kGroup);
  int64_t bad = 0;
  RunPaired(state, b, [&] {
    if (!backend->RangePerGroup(*view, kColumns, kGroup, absl::MakeSpan(lo), absl::MakeSpan(hi),
                                &bad).ok()) {
      state.SkipWithError("RangePerGroup failed");
    }
    benchmark::DoNotOptimize(lo.data());
  });
  state.SetLabel(std::string(DTypeName(dtype)));
}

void DTypesAndThreads(benchmark::internal::Benchmark* b) {
  b->ArgNames({"dtype", "threads"});
  for (DType d : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (int threads : {1, 0}) b->Args({static_cast<int64_t>(d), threads});
  }
  b->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
}

BENCHMARK(BM_SingleThreadReadBandwidth)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(1.0);
BENCHMARK(BM_AbsMaxPerHead)->Apply(DTypesAndThreads);
BENCHMARK(BM_AbsMaxHistogramPerHead)->Apply(DTypesAndThreads);
BENCHMARK(BM_HistogramIncrementFloor)
    ->ArgName("dtype")
    ->DenseRange(0, 2)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(1.0);
BENCHMARK(BM_Range)->Apply(DTypesAndThreads);
BENCHMARK(BM_RangePerGroup)->Apply(DTypesAndThreads);

}  // namespace
}  // namespace caliper

BENCHMARK_MAIN();
