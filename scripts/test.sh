#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest. The README's test command.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh prometheus python3-yaml  # extras for tests/deploy (scrape test, render test)
# Test-only tool from PyPI: strict Kubernetes schema check in tests/deploy (optional).
if [[ ! -x .venv/bin/kubernetes-validate ]]; then
  { python3 -m venv .venv && .venv/bin/pip install -q kubernetes-validate==1.37.0; } \
    || echo "test.sh: kubernetes-validate not installed; the deploy schema check is skipped"
fi
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600
