// Benchmark 4: reduction kernel throughput (bytes of input read per second) against the
// device-to-device cudaMemcpy bandwidth measured in the same run (bytes read + written per
// second, the bandwidthTest convention), plus the pinned-staging host path against a plain
// pageable cudaMemcpy. Plain C++ (no Google Benchmark on GPU machines); prints one
// "RESULT name=... key=value" line per measurement for run_device_checks.sh.
//   cuda_kernel_bench [--bytes=1073741824] [--iters=20]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/host_reducer.h"
#include "cuda/kernels.h"

namespace {

using namespace caliper::cuda;

#define BENCH_CHECK(call)                                                              \
  do {                                                                                 \
    if (cudaError_t err_ = (call); err_ != cudaSuccess) {                              \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(err_));        \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

// Median milliseconds of `iters` timed runs of `fn` on the default stream, after 2 warm-ups.
double TimeMs(int iters, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  BENCH_CHECK(cudaEventCreate(&start));
  BENCH_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 2; ++i) fn();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK(cudaEventRecord(start, nullptr));
    fn();
    BENCH_CHECK(cudaEventRecord(stop, nullptr));
    BENCH_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

int64_t Flag(int argc, char** argv, const char* name, int64_t fallback) {
  const std::string prefix = std::string("--") + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return std::atoll(argv[i] + prefix.size());
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  if (DeviceCount() == 0) {
    std::printf("no CUDA device: benchmark skipped\n");
    return 77;
  }
  const int64_t bytes = Flag(argc, argv, "bytes", int64_t{1} << 30);
  const int iters = static_cast<int>(Flag(argc, argv, "iters", 20));
  const int64_t heads = 8, dim = 128;
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, buffer %lld MiB\n", prop.name, prop.multiProcessorCount,
              static_cast<long long>(bytes >> 20));

  // Random bf16 bit patterns with a band of exponents; the same bytes serve the F32 runs.
  std::vector<uint16_t> pattern(8 << 20);
  std::mt19937 rng(1);
  for (auto& b : pattern) b = static_cast<uint16_t>((rng() & 0x807f) | ((112 + rng() % 32) << 7));
  void *src = nullptr, *dst = nullptr;
  BENCH_CHECK(cudaMalloc(&src, bytes));
  BENCH_CHECK(cudaMalloc(&dst, bytes));
  for (int64_t off = 0; off < bytes; off += pattern.size() * 2) {
    BENCH_CHECK(cudaMemcpy(static_cast<char*>(src) + off, pattern.data(),
                           std::min<int64_t>(pattern.size() * 2, bytes - off), cudaMemcpyHostToDevice));
  }
  unsigned int* head_bits = nullptr;
  unsigned long long* bad = nullptr;
  DeviceRange* range = nullptr;
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&head_bits), heads * sizeof(unsigned int)));
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(unsigned long long)));
  BENCH_CHECK(cudaMalloc(reinterpret_cast<void**>(&range), sizeof(DeviceRange)));

  const double copy_ms = TimeMs(iters, [&] { BENCH_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr)); });
  const double copy_gbps = 2.0 * bytes / copy_ms / 1e6;
  std::printf("RESULT name=d2d_copy ms=%.4f gbps=%.1f\n", copy_ms, copy_gbps);

  auto report = [&](const char* name, double ms) {
    const double gbps = bytes / ms / 1e6;
    std::printf("RESULT name=%s ms=%.4f gbps=%.1f ratio_to_d2d=%.3f\n", name, ms, gbps, gbps / copy_gbps);
  };
  for (ElementType type : {ElementType::kBF16, ElementType::kF32}) {
    const int64_t n = bytes / static_cast<int64_t>(ElementSize(type));
    const std::string suffix = type == ElementType::kBF16 ? "bf16" : "f32";
    report(("absmax_per_head_" + suffix).c_str(), TimeMs(iters, [&] {
             BENCH_CHECK(cudaMemsetAsync(head_bits, 0, heads * sizeof(unsigned int), nullptr));
             BENCH_CHECK(LaunchAbsMaxPerHead(src, type, n, 0, heads, dim, head_bits, bad, nullptr));
           }));
    report(("range_" + suffix).c_str(), TimeMs(iters, [&] {
             BENCH_CHECK(ResetRange(range, nullptr));
             BENCH_CHECK(LaunchRange(src, type, n, range, nullptr));
           }));
  }
  // Sanity: the kernel's answer for the last run matches the pattern's largest magnitude.
  std::vector<unsigned int> got(heads);
  BENCH_CHECK(cudaMemset(head_bits, 0, heads * sizeof(unsigned int)));
  BENCH_CHECK(LaunchAbsMaxPerHead(src, ElementType::kBF16, bytes / 2, 0, heads, dim, head_bits, bad, nullptr));
  BENCH_CHECK(cudaMemcpy(got.data(), head_bits, heads * sizeof(unsigned int), cudaMemcpyDeviceToHost));
  uint16_t want = 0;
  for (uint16_t b : pattern) want = std::max<uint16_t>(want, b & 0x7fff);
  const unsigned int overall = *std::max_element(got.begin(), got.end());
  std::printf("sanity: absmax bits %08x, expected %08x: %s\n", overall, static_cast<unsigned>(want) << 16,
              overall == (static_cast<unsigned>(want) << 16) ? "ok" : "MISMATCH");

  // Host path: pageable memory through HostReducer vs a plain pageable cudaMemcpy H2D.
  const int64_t host_bytes = std::min<int64_t>(bytes, int64_t{256} << 20);
  std::vector<uint8_t> host(host_bytes);
  for (int64_t off = 0; off < host_bytes; off += pattern.size() * 2) {
    std::memcpy(host.data() + off, pattern.data(), std::min<int64_t>(pattern.size() * 2, host_bytes - off));
  }
  std::unique_ptr<HostReducer> reducer;
  if (Error e = HostReducer::Create(ReducerOptions(), &reducer); !e.ok()) {
    std::fprintf(stderr, "HostReducer: %s\n", e.message.c_str());
    return 1;
  }
  const double h2d_ms = TimeMs(5, [&] { BENCH_CHECK(cudaMemcpy(dst, host.data(), host_bytes, cudaMemcpyHostToDevice)); });
  std::vector<float> out(heads);
  int64_t nonfinite = 0;
  const double host_ms = TimeMs(5, [&] {
    Error e = reducer->AbsMaxPerHead(host.data(), ElementType::kBF16, host_bytes / 2, heads, dim, out.data(), &nonfinite);
    if (!e.ok()) std::fprintf(stderr, "AbsMaxPerHead: %s\n", e.message.c_str());
  });
  std::printf("RESULT name=h2d_pageable_copy ms=%.3f gbps=%.1f\n", h2d_ms, host_bytes / h2d_ms / 1e6);
  std::printf("RESULT name=host_absmax_bf16 ms=%.3f gbps=%.1f ratio_to_h2d=%.3f\n", host_ms,
              host_bytes / host_ms / 1e6, h2d_ms / host_ms);
  std::printf("torch_shape tokens=%lld heads=%lld dim=%lld\n",
              static_cast<long long>(bytes / 2 / (heads * dim)), static_cast<long long>(heads),
              static_cast<long long>(dim));
  cudaFree(src);
  cudaFree(dst);
  return 0;
}
