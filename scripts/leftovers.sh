#!/usr/bin/env bash
# After a test run: lists what the run started that is still there, and fails (exit 1) if
# anything is. scripts/test.sh runs ctest with CALIPER_TEST_RUN=RUN_ID and TMPDIR=RUN_TMPDIR (a
# directory of its own) in the environment, so that
# - a process of the run is one whose environment holds CALIPER_TEST_RUN=RUN_ID (every process a
#   test starts inherits it: caliper-server, PostgreSQL, vLLM and Python workers) or whose command
#   line names RUN_TMPDIR (a postmaster's `-D`);
# - a temporary file or directory of the run is an entry of RUN_TMPDIR. Caches their tools keep
#   there on purpose are not counted (pytest-of-*: pytest keeps its last 3 base temps;
#   torchinductor_*: torch's compile cache), nor what vLLM leaves behind (below).
# Processes get a grace period (GRACE seconds, default 30) to finish exiting first. When nothing
# is left, RUN_TMPDIR is removed; otherwise it stays, for a look.
# usage: scripts/leftovers.sh RUN_ID RUN_TMPDIR
set -uo pipefail
run_id=${1:?usage: leftovers.sh RUN_ID RUN_TMPDIR}
run_tmp=${2:?usage: leftovers.sh RUN_ID RUN_TMPDIR}
grace=${GRACE:-30}
marker="CALIPER_TEST_RUN=$run_id"

# This script, its callers and its own children are not the run's.
declare -A mine=()
p=$$
while [[ -n "$p" && "$p" != 0 ]]; do
  mine[$p]=1
  p=$(awk '/^PPid:/ { print $2 }' "/proc/$p/status" 2>/dev/null)
done

# The run's processes, and their descendants (PostgreSQL's backends rewrite their command line
# and environment).
run_processes() {
  local dir pid state ppid
  local -A parent=() found=()
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [[ -n "${mine[$pid]:-}" ]] && continue
    read -r state ppid < <(awk '/^State:/ { s = $2 } /^PPid:/ { p = $2 } END { print s, p }' \
                           "$dir/status" 2>/dev/null) || continue
    [[ -z "$state" || "$state" == Z || "$state" == X ]] && continue  # gone, or a zombie
    [[ "$ppid" == "$$" ]] && continue
    parent[$pid]=$ppid
    if { tr '\0' '\n' <"$dir/environ" | grep -qxF -- "$marker" ||
         tr '\0' ' ' <"$dir/cmdline" | grep -qF -- "$run_tmp"; } 2>/dev/null; then
      found[$pid]=1
    fi
  done
  local more=1
  while [[ $more == 1 ]]; do
    more=0
    for pid in "${!parent[@]}"; do
      if [[ -z "${found[$pid]:-}" && -n "${found[${parent[$pid]}]:-}" ]]; then
        found[$pid]=1
        more=1
      fi
    done
  done
  for pid in "${!found[@]}"; do echo "$pid"; done | sort -n
}

left=$(run_processes)
for ((i = 0; i < grace * 2 && ${#left} > 0; i++)); do
  sleep 0.5
  left=$(run_processes)
done

failed=0
if [[ -n "$left" ]]; then
  failed=1
  echo "leftovers: processes the test run started are still running:"
  for pid in $left; do
    printf '  %s\n' "$(ps -o pid=,ppid=,etime=,user=,args= -p "$pid" 2>/dev/null | cut -c1-200)"
  done
fi
if [[ -d "$run_tmp" ]]; then
  # vLLM leaves its ZeroMQ IPC sockets (uuid4 names, vllm/utils/network_utils.py
  # get_open_zmq_ipc_path, under VLLM_RPC_BASE_PATH = TMPDIR) and its file:// rendezvous files (vllm_dist_*, the same file's
  # get_distributed_init_method) in TMPDIR after a clean shutdown: not the run's to clean, removed
  # with RUN_TMPDIR.
  entries=$(find "$run_tmp" -mindepth 1 -maxdepth 1 -not -name 'pytest-of-*' \
              -not -name 'torchinductor_*' -not -name 'vllm_dist_*' \
              -not \( -type s -regextype posix-extended \
                     -regex '.*/[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}' \) \
              -printf '%f\n' 2>/dev/null | sort)
  if [[ -n "$entries" ]]; then
    failed=1
    echo "leftovers: temporary files and directories the test run left in $run_tmp:"
    while IFS= read -r entry; do
      printf '  %s (%s)\n' "$entry" "$(du -sh "$run_tmp/$entry" 2>/dev/null | cut -f1)"
    done <<<"$entries"
  fi
fi
if [[ $failed == 0 ]]; then
  echo "leftovers: none (no process of the run is running, nothing was left in its TMPDIR)"
  rm -rf -- "$run_tmp"
else
  echo "leftovers: the test run left the above behind ($run_tmp kept)"
fi
exit $failed
