#!/usr/bin/env bash
# The package's own unit tests (client/python/tests: no server, no torch) with plain `pytest`, in
# the caliper-client venv over the small 'package' set. Exit 77 when PyPI is unreachable.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "$1" && pwd)
if ! venv=$("$root/scripts/python-client-env.sh" "$build/python-env-package" package); then
  echo "package_units: the venv cannot be created (PyPI unreachable?); skipping" >&2
  exit 77
fi
# From tests/ so that `python -m pytest` puts no source tree of caliper first on sys.path: the
# installed package is what is tested.
cd "$root/client/python/tests"
PYTHONDONTWRITEBYTECODE=1 exec "$venv/bin/python" -m pytest -q -p no:cacheprovider
