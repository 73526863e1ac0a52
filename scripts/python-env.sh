#!/usr/bin/env bash
# Creates (once) and prints the path of a cached Python venv for one requirements set.
# usage: scripts/python-env.sh tools     -> venv with scripts/requirements-tools.txt
# A set may add scripts/requirements-SET-nodeps.txt: installed after, with --no-deps (for wheels
# whose own pins cannot resolve on PyPI, e.g. vLLM's CPU build).
# The venv lives outside the checkout, keyed by a hash of its requirements file, so CI runs and
# clones on one machine share it; a changed requirements file makes a new one. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
set_name=${1:?usage: python-env.sh SET}
req="scripts/requirements-${set_name}.txt"
[[ -f "$req" ]] || { echo "python-env: no $req" >&2; exit 2; }
cache=${CALIPER_CACHE_DIR:-$HOME/.cache/caliper}
nodeps="scripts/requirements-${set_name}-nodeps.txt"
hash=$(cat "$req" $( [[ -f "$nodeps" ]] && echo "$nodeps") | sha256sum | cut -c1-12)
venv="$cache/venv-${set_name}-${hash}"
if [[ ! -f "$venv/.complete" ]]; then
  mkdir -p "$cache"
  exec 9>"$cache/.lock-${set_name}"
  flock 9  # one installer at a time per set; the others wait and reuse it
  if [[ ! -f "$venv/.complete" ]]; then
    echo "python-env: creating $venv (first run: several minutes)" >&2
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip >&2
    "$venv/bin/pip" install -q -r "$req" >&2
    if [[ -f "$nodeps" ]]; then "$venv/bin/pip" install -q --no-deps -r "$nodeps" >&2; fi
    touch "$venv/.complete"
  fi
fi
echo "$venv"
