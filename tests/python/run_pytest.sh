#!/usr/bin/env bash
# Runs pytest on a tests/python file against a build, in the caliper-client venv
# (scripts/python-client-env.sh BUILD_DIR/python-env[-SET] SET; SET from $CALIPER_PYTHON_SET,
# default tools).
# usage: run_pytest.sh BUILD_DIR TEST_FILE [pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd); shift
set_name=${CALIPER_PYTHON_SET:-tools}
suffix=$([[ "$set_name" == tools ]] || echo "-$set_name")
venv=$("$root/scripts/python-client-env.sh" "$build/python-env$suffix" "$set_name")
export CALIPER_BUILD_DIR="$build" CALIPER_SOURCE_DIR="$root" PYTHONDONTWRITEBYTECODE=1
cd "$root/tests/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
