#!/usr/bin/env bash
# Prints the path of a venv at DIR holding caliper-client (a wheel of ./client/python, stubs
# generated from proto/ by the package's build hook, built with the grpcio-tools the package
# pins, from the small venv scripts/python-env.sh package)
# on top of a cached venv set (scripts/python-env.sh SET, default tools: torch, transformers, ...;
# vllm: vLLM's CPU build), reached through a .pth file. Reinstalls the package when what it is
# built from (client/python, proto/, VERSION, the base venv) changed, and only then: tests run in
# parallel in one venv, and a reinstall under a running test removes the scripts it executes.
# usage: scripts/python-client-env.sh DIR [SET]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: python-client-env.sh DIR}
set_name=${2:-tools}
builder=$("$root/scripts/python-env.sh" package)
base=$("$root/scripts/python-env.sh" "$set_name")
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # one installer at a time per venv (tests run in parallel)
[[ -x "$venv/bin/python" ]] || "$base/bin/python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
inputs=$(cd "$root" && {
  find client/python -type f -not -path '*/build/*' -not -path '*/_pb/*' \
    -not -path '*.egg-info/*' -not -path '*/__pycache__/*' -not -path '*/.mypy_cache/*' \
    -not -path '*/.pytest_cache/*' -print0 | sort -z | xargs -0 sha256sum
  sha256sum proto/caliper.proto VERSION; echo "$base $builder"; } | sha256sum | cut -c1-16)
stamp="$venv/.caliper-inputs"
if [[ -x "$venv/bin/python" && "$(cat "$stamp" 2>/dev/null)" == "$inputs" ]]; then
  echo "$venv"
  exit 0
fi
rm -f "$stamp" "$site/caliper-tools.pth"
"$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/caliper-base.pth"
# Built from a copy, so concurrent builds never share client/python/build.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$root/client/python" "$stage/python"
rm -rf "$stage/python/build" "$stage/python/caliper/_pb" "$stage/python"/*.egg-info
if ! { CALIPER_PROTO="$root/proto/caliper.proto" CALIPER_VERSION_FILE="$root/VERSION" \
         "$builder/bin/python" -m pip wheel -q \
         --no-build-isolation --no-deps -w "$stage/wheel" "$stage/python" &&
       "$venv/bin/python" -m pip install -q --no-deps --force-reinstall "$stage"/wheel/*.whl; \
     } >"$venv.log" 2>&1; then
  cat "$venv.log" >&2
  exit 1
fi
echo "$inputs" >"$stamp"
echo "$venv"
