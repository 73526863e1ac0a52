#!/usr/bin/env bash
# Prints what this machine has, for the top of a CI log: tests that need a CPU feature or a device
# skip with the reason, and this says which machine a log came from.
set -uo pipefail
model=$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2- | sed 's/^ *//')
flags=$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2-)
has() { [[ " $flags " == *" $1 "* ]] && echo yes || echo no; }
echo "machine: ${model:-unknown CPU}, $(nproc) cores online ($(getconf _NPROCESSORS_CONF) configured)"
echo "machine: CPU features avx2=$(has avx2) avx512f=$(has avx512f) avx512_bf16=$(has avx512_bf16) amx_tile=$(has amx_tile) f16c=$(has f16c)"
awk '/^MemTotal|^MemAvailable/ {printf "machine: %s %.1f GiB\n", $1, $2 / 1048576}' /proc/meminfo
echo "machine: disk free $(df -h --output=avail . 2>/dev/null | tail -1 | tr -d ' ') under $PWD"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  nvidia-smi -L | sed 's/^/machine: /'
else
  echo "machine: no CUDA device (CUDA tests skip)"
fi
echo "machine: kernel $(uname -r), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
