#!/usr/bin/env bash
# usage: run_in_venv.sh SET SCRIPT [ARGS...]: runs SCRIPT with the python of the cached venv
# `scripts/python-env.sh SET` (created on first use). Exit 77 (CTest: skipped) only when the venv
# cannot be created at all (no PyPI access); the script's own failures are failures.
set -uo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
set_name=$1; shift
if ! venv=$("$root/scripts/python-env.sh" "$set_name"); then
  echo "run_in_venv: the '$set_name' venv cannot be created (PyPI unreachable?); skipping" >&2
  exit 77
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" "$@"
