#!/usr/bin/env bash
# The one build everyone uses: CI, the demo, the Dockerfile.
# usage: scripts/build.sh [TARGET...] [-DOPTION=VALUE...]: arguments starting with '-' go to CMake
# configure, the others name the targets to build (default: all), e.g. the image's
# `scripts/build.sh caliper-server`.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# ccache (when installed) keeps compiled objects between clones on one machine: paths are made
# relative to the checkout, so a fresh clone elsewhere hits the same cache.
launcher=()
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
configure=() targets=()
for arg in "$@"; do
  if [[ $arg == -* ]]; then configure+=("$arg"); else targets+=(--target "$arg"); fi
done
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" "${configure[@]}"
CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true cmake --build "$BUILD_DIR" -j"$JOBS" "${targets[@]}"
