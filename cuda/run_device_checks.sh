#!/usr/bin/env bash
# One command for a machine with a GPU: builds cuda/ standalone (CMake + nvcc only; plain nvcc if
# CMake is missing), runs its tests, then benchmark 4 (kernel vs device-to-device copy bandwidth)
# (absmax, absmax+histogram and range, each as a ratio to device copy bandwidth)
# and, when torch is importable, the PyTorch x.abs().amax(dim=(0, 2)) comparison and the vLLM
# plugin's statistics ops under CUDA-graph capture (plugin_graph_check.py). < 5 min.
# Usage: cuda/run_device_checks.sh [build-dir]     (results also written to <build-dir>/results.txt)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build-cuda}
mkdir -p "$build"
nvcc=${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export CUDACXX=$nvcc
results=$build/results.txt
: > "$results"
log() { echo "$*" | tee -a "$results"; }

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee -a "$results" || true
start=$(date +%s)
if command -v cmake >/dev/null; then
  gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
  cmake "${gen[@]}" -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    -DCALIPER_CUDA_ARCHITECTURES=native >"$build/configure.log"
  cmake --build "$build" -j "$(nproc)" >"$build/build.log"
else
  flags=(-O3 -std=c++17 -arch=native -I"$here/..")
  "$nvcc" "${flags[@]}" -c "$here/kernels.cu" -o "$build/kernels.o"
  "$nvcc" "${flags[@]}" -x cu "$here/tests/kernels_test.cc" "$build/kernels.o" -o "$build/cuda_kernels_test"
  "$nvcc" "${flags[@]}" -x cu "$here/bench/kernel_bench.cc" "$build/kernels.o" -o "$build/cuda_kernel_bench"
fi
log "build: $(( $(date +%s) - start )) s"

# Tests: here a skip (77, no device) is a failure, since this script exists to use the device.
set +e
"$build/cuda_kernels_test" | tee -a "$results" | tail -n 20
test_rc=${PIPESTATUS[0]}
set -e
if [[ $test_rc -ne 0 ]]; then log "cuda_kernels_test: FAILED (rc=$test_rc)"; exit 1; fi

"$build/cuda_kernel_bench" | tee -a "$results"
ours_ms=$(awk '/RESULT name=absmax_per_head_bf16 /{for(i=1;i<=NF;i++) if($i ~ /^ms=/) print substr($i,4)}' "$results")
tokens=$(awk '/^torch_shape/{for(i=1;i<=NF;i++) if($i ~ /^tokens=/) print substr($i,8)}' "$results")

if python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  python3 "$here/bench/torch_compare.py" --tokens="$tokens" | tee -a "$results"
  torch_ms=$(awk '/RESULT name=torch_abs_amax_bf16 /{for(i=1;i<=NF;i++) if($i ~ /^ms=/) print substr($i,4)}' "$results")
  log "speedup_vs_torch=$(awk -v t="$torch_ms" -v o="$ours_ms" 'BEGIN{printf "%.2f", t/o}') (goal >= 2)"
  # The vLLM plugin's statistics ops captured in a CUDA graph and replayed (pure torch).
  python3 "$here/plugin_graph_check.py" 2>&1 | tee -a "$results" \
    || log "plugin_graph_check: FAILED"
else
  log "torch: not importable with CUDA here; PyTorch comparison skipped"
fi
log "total: $(( $(date +%s) - start )) s"
