#!/usr/bin/env bash
# Runs pytest on a tests/python file against a build, in the caliper-client venv
# (scripts/python-client-env.sh BUILD_DIR/python-env).
# usage: run_pytest.sh BUILD_DIR TEST_FILE [pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd); shift
venv=$("$root/scripts/python-client-env.sh" "$build/python-env")
export CALIPER_BUILD_DIR="$build" CALIPER_SOURCE_DIR="$root" PYTHONDONTWRITEBYTECODE=1
cd "$root/tests/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
