#!/usr/bin/env bash
# Runs pytest on a tests/python file against a build, in the caliper-client venv
# (scripts/python-client-env.sh BUILD_DIR/python-env[-SET] SET; SET from $CALIPER_PYTHON_SET,
# default tools).
# Exit 77 (CTest's SKIP_RETURN_CODE: the entry shows as skipped) when every test skipped or none
# was collected (pytest's exit 5); a run that skipped some prints `run_pytest: N passed, M skipped
# (reasons: ...)` after pytest's closing line (run_pytest_plugin.py). Failures stay failures.
# usage: run_pytest.sh BUILD_DIR TEST_FILE [pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd); shift
set_name=${CALIPER_PYTHON_SET:-tools}
suffix=$([[ "$set_name" == tools ]] || echo "-$set_name")
venv=$("$root/scripts/python-client-env.sh" "$build/python-env$suffix" "$set_name")
export CALIPER_BUILD_DIR="$build" CALIPER_SOURCE_DIR="$root" PYTHONDONTWRITEBYTECODE=1
cd "$root/tests/python"
# `python -m` puts the working directory (tests/python) first on sys.path: the plugin imports.
rc=0
"$venv/bin/python" -m pytest -q -p no:cacheprovider -p run_pytest_plugin "$@" || rc=$?
if [[ $rc == 5 ]]; then
  echo "run_pytest: 0 passed, 0 skipped (reasons: no tests collected from ${1:-?})"
  exit 77
fi
exit $rc
