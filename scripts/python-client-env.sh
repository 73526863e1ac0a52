#!/usr/bin/env bash
# Prints the path of a venv at DIR holding caliper-client (pip install ./client/python, stubs
# generated from proto/ by the package's build hook) on top of the cached tooling venv
# (scripts/python-env.sh tools: torch, transformers, grpcio-tools, ...), reached through a .pth
# file. Reinstalls the package every call (seconds), so it always matches the checkout.
# usage: scripts/python-client-env.sh DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:?usage: python-client-env.sh DIR}
tools=$("$root/scripts/python-env.sh" tools)
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # one installer at a time per venv (tests run in parallel)
[[ -x "$venv/bin/python" ]] || "$tools/bin/python" -m venv --without-pip "$venv"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$tools/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' >"$site/caliper-tools.pth"
# Built from a copy, so concurrent builds never share client/python/build.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -r "$root/client/python" "$stage/python"
rm -rf "$stage/python/build" "$stage/python/caliper/_pb" "$stage/python"/*.egg-info
if ! CALIPER_PROTO="$root/proto/caliper.proto" "$venv/bin/python" -m pip install -q \
    --no-build-isolation --no-deps --force-reinstall "$stage/python" >"$venv.log" 2>&1; then
  cat "$venv.log" >&2
  exit 1
fi
echo "$venv"
