#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh prometheus python3-yaml  # extras for tests/deploy (scrape test, render test)
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600
