#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest. The README's test command.
# usage: scripts/test.sh [image]: `image` also installs buildah, runc and mmdebstrap, so that
# deploy.image_build builds the container image instead of skipping (about 8 minutes more).
set -euo pipefail
cd "$(dirname "$0")/.."
extras=(prometheus python3-yaml)  # for tests/deploy (scrape test, render test)
for arg in "$@"; do
  case $arg in
    image) extras+=(buildah runc mmdebstrap) ;;
    *) echo "usage: scripts/test.sh [image]" >&2; exit 2 ;;
  esac
done
scripts/install-deps.sh "${extras[@]}"
# Test-only tool from PyPI: strict Kubernetes schema check in tests/deploy (optional).
if [[ ! -x .venv/bin/kubernetes-validate ]]; then
  { python3 -m venv .venv && .venv/bin/pip install -q kubernetes-validate==1.37.0; } \
    || echo "test.sh: kubernetes-validate not installed; the deploy schema check is skipped"
fi
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600
