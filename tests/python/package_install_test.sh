#!/usr/bin/env bash
# `pip install ./client/python` as a user runs it (build isolation: setuptools and the pinned
# grpcio-tools come from PyPI) into (1) a clean venv, getting the newest dependencies, and (2) a
# venv already holding the oldest protobuf and grpcio the package claims (pyproject's lower
# bounds), which pip must keep. In each: import caliper, its version is VERSION's, the generated
# stubs run on that protobuf, and the package's unit tests pass. Exit 77 when PyPI is unreachable.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The package's layout in the repository (proto/ and VERSION two levels up), without build trees.
mkdir -p "$work/src/proto" "$work/src/client"
cp "$root/proto/caliper.proto" "$work/src/proto/"
cp "$root/VERSION" "$work/src/"
cp -r "$root/client/python" "$work/src/client/python"
rm -rf "$work/src/client/python/build" "$work/src/client/python/caliper/_pb" \
  "$work/src/client/python"/*.egg-info
pyproject="$root/client/python/pyproject.toml"
oldest_protobuf=$(grep -oP '"protobuf>=\K[0-9.]+' "$pyproject")
oldest_grpcio=$(grep -oP '"grpcio>=\K[0-9.]+' "$pyproject")
want_version=$(cat "$root/VERSION")
python3 -m venv "$work/probe"
if ! "$work/probe/bin/pip" download -q --no-deps -d "$work/probe-dl" "protobuf==$oldest_protobuf" \
     >/dev/null 2>&1; then
  echo "package_install: PyPI unreachable; skipping" >&2
  exit 77
fi
for case in clean oldest; do
  venv="$work/$case"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  if [[ $case == oldest ]]; then
    "$venv/bin/pip" install -q "protobuf==$oldest_protobuf" "grpcio==$oldest_grpcio.0"
  fi
  "$venv/bin/pip" install -q "$work/src/client/python" pytest
  "$venv/bin/python" - "$case" "$want_version" "$oldest_protobuf" <<'PY'
import sys
import warnings

case, want_version, oldest = sys.argv[1:]
with warnings.catch_warnings():
    if case == "oldest":
        warnings.simplefilter("error")  # gencode and runtime of one major: not even a warning
    import caliper
    from caliper._pb import caliper_pb2 as pb
import google.protobuf
print(f"{case}: caliper {caliper.__version__}, protobuf {google.protobuf.__version__}")
assert caliper.__version__ == want_version, (caliper.__version__, want_version)
if case == "oldest":
    assert google.protobuf.__version__ == oldest, "pip replaced the oldest protobuf"
msg = pb.ScalesResponse(tp_size=8, scales_json=b"{}\n")
assert pb.ScalesResponse.FromString(msg.SerializeToString()) == msg
PY
  (cd "$work/src/client/python/tests" && "$venv/bin/python" -m pytest -q -p no:cacheprovider)
done
echo "package_install: clean and oldest-dependency installs import and pass their unit tests"
