#!/usr/bin/env bash
# ruff and mypy over the Python package with the settings in client/python/pyproject.toml; mypy
# reads a built copy (the stubs and their .pyi are generated as the wheel's build makes them).
# Exit 77 (CTest: skipped) only when the tools venv cannot be created (no PyPI access).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
if ! venv=$("$root/scripts/python-env.sh" package); then
  echo "package_lint: the 'package' venv cannot be created (PyPI unreachable?); skipping" >&2
  exit 77
fi
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$root/client/python" "$stage/python"
rm -rf "$stage/python/build" "$stage/python/caliper/_pb" "$stage/python"/*.egg-info
(cd "$stage/python" && CALIPER_PROTO="$root/proto/caliper.proto" \
   CALIPER_VERSION_FILE="$root/VERSION" "$venv/bin/python" setup.py -q build_py \
   --build-lib "$stage/lib" >/dev/null)
"$venv/bin/ruff" check --config "$root/client/python/pyproject.toml" "$root/client/python"
(cd "$stage/lib" && "$venv/bin/mypy" --config-file "$root/client/python/pyproject.toml" \
   --cache-dir "$stage/mypy-cache")
echo "package_lint: ruff and mypy clean"
