#!/usr/bin/env bash
# Runs pytest on tests/python files against a build: a venv per build dir whose packages come
# from the cached tooling venv (scripts/python-env.sh tools, through a .pth file), with
# `pip install ./client/python` (stubs generated from proto/ by the package's build hook).
# usage: run_pytest.sh BUILD_DIR TEST_FILE [pytest args]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd); shift
tools=$("$root/scripts/python-env.sh" tools)
venv="$build/python-env"
exec 9>"$build/.python-env.lock"
flock 9  # one installer at a time; tests run in parallel under ctest -j
if [[ ! -x "$venv/bin/python" ]]; then
  "$tools/bin/python" -m venv --without-pip "$venv"
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$tools/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/caliper-tools.pth"
# Build in a copy so parallel builds of one checkout do not share client/python/build.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$root/client/python" "$stage/python"
rm -rf "$stage/python/build" "$stage/python/caliper/_pb" "$stage/python"/*.egg-info
CALIPER_PROTO="$root/proto/caliper.proto" "$venv/bin/python" -m pip install -q \
  --no-build-isolation --no-deps --force-reinstall "$stage/python" >"$build/python-env.log" 2>&1 \
  || { cat "$build/python-env.log"; exit 1; }
flock -u 9
export CALIPER_BUILD_DIR="$build" CALIPER_SOURCE_DIR="$root" PYTHONDONTWRITEBYTECODE=1
cd "$root/tests/python"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
