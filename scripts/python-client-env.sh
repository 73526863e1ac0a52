#!/usr/bin/env bash
# Prints the path of a venv at DIR holding caliper-client (a wheel of ./client/python, stubs
# generated from proto/ by the package's build hook, built with the grpcio-tools the package
# pins, from the small venv scripts/python-env.sh package)
# on top of a cached venv set (scripts/python-env.sh SET, default tools: torch, transformers, ...;
# vllm: vLLM's CPU build), reached through a .pth file. Reinstalls the package every call
# (seconds), so it always matches the checkout.
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
rm -f "$site/caliper-tools.pth"
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
echo "$venv"
