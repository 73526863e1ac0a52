#!/usr/bin/env bash
# caliper-server as a process: prints its bound ports, serves /metrics, and exits 0 on SIGTERM.
set -euo pipefail
SERVER=$1
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
"$SERVER" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 --log_format=json --drain_timeout=5s \
  >"$LOG" 2>&1 &
PID=$!
line=""
for _ in $(seq 1 100); do
  line=$(grep -m1 '^caliper-server listening on ' "$LOG" || true)
  [[ -n "$line" ]] && break
  sleep 0.1
done
[[ -n "$line" ]] || { echo "no startup line"; cat "$LOG"; kill -9 $PID; exit 1; }
echo "$line"
[[ "$line" =~ ^caliper-server\ listening\ on\ 127\.0\.0\.1:([0-9]+)\ \(metrics\ 127\.0\.0\.1:([0-9]+),\ backend\ (cpu|cuda)\)$ ]] \
  || { echo "startup line format changed: $line"; kill -9 $PID; exit 1; }
GRPC_PORT=${BASH_REMATCH[1]}
METRICS_PORT=${BASH_REMATCH[2]}
[[ "$GRPC_PORT" != 0 && "$METRICS_PORT" != 0 ]] || { echo "port 0 reported"; exit 1; }
page=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$METRICS_PORT/metrics').read().decode())")
grep -q '^caliper_active_sessions 0' <<<"$page" || { echo "metrics page lacks caliper_active_sessions"; exit 1; }
grep -q '^caliper_backend_info{backend="\(cpu\|cuda\)"} 1' <<<"$page" || { echo "no backend_info"; exit 1; }
kill -TERM $PID
rc=0
wait $PID || rc=$?
[[ $rc == 0 ]] || { echo "exit code $rc after SIGTERM"; cat "$LOG"; exit 1; }
# JSON log lines with severity: started, draining, stopped.
python3 - "$LOG" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
names = [e["event"] for e in events]
assert names.index("backend") < names.index("started") < names.index("draining") < names.index("stopped") == len(names) - 1, names
assert all(e["severity"] in ("INFO", "WARNING", "ERROR") and e["time"].endswith("Z") for e in events)
PY
echo "OK: exit 0 after SIGTERM"
