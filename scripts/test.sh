#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through CTest. The README's test command.
# usage: scripts/test.sh [image]: `image` also installs buildah, runc and mmdebstrap, so that
# deploy.image_build builds the container image instead of skipping (about 8 minutes more).
# After ctest, whether it passed or not: scripts/skip-table.sh (every check this machine skipped,
# why, and what it needs) and scripts/leftovers.sh (processes or temporary files the run left
# behind: ctest runs with TMPDIR and CALIPER_TEST_RUN of its own). The exit code is ctest's; when
# ctest passed and the run left something behind, 1.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
extras=(prometheus python3-yaml chromium)  # tests/deploy (scrape, render), tests/e2e (report screenshot)
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
# The run's own temporary directory (1777: PostgreSQL runs as `postgres` under it) and marker.
run_tmp=$(mktemp -d /tmp/caliper-test-run.XXXXXX)
chmod 1777 "$run_tmp"
run_id=${run_tmp##*.}-$$
rc=0
TMPDIR=$run_tmp CALIPER_TEST_RUN=$run_id \
  ctest --output-on-failure -j"${JOBS:-$(nproc)}" --timeout 600 \
        --output-junit Testing/Temporary/ctest-junit.xml || rc=$?
"$root/scripts/skip-table.sh" . || true
left=0
"$root/scripts/leftovers.sh" "$run_id" "$run_tmp" || left=$?
if [[ $rc != 0 ]]; then exit $rc; fi
exit $left
