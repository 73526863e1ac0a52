#!/usr/bin/env bash
# caliper report end to end: the demo model calibrated twice over loopback (mse with histograms;
# percentile:99.9 with NVFP4), `caliper report --compare`, report.json checked, report.html
# rendered by headless Chromium and the screenshot checked not blank (tests/e2e/check_report.py).
# usage: report_test.sh BUILD_DIR [OUT_DIR]   exit 77 (skipped) only when chromium is missing.
set -euo pipefail
BIN=$(cd "$1" && pwd)
OUT=${2:-$(mktemp -d)}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
CHROMIUM=$(command -v chromium || command -v chromium-browser || true)
"$BIN/client/demo/caliper-demo-gen" --out="$OUT/data" >/dev/null
"$BIN/server/caliper-server" --listen=127.0.0.1:0 --metrics_listen= >"$OUT/server.log" 2>&1 &
PID=$!
trap 'kill -TERM $PID 2>/dev/null; wait $PID 2>/dev/null || true' EXIT
ADDR=""
for _ in $(seq 1 100); do
  ADDR=$(sed -nE 's/^caliper-server listening on ([^ ]+) .*/\1/p' "$OUT/server.log" | head -1)
  [[ -n "$ADDR" ]] && break
  sleep 0.1
done
[[ -n "$ADDR" ]] || { cat "$OUT/server.log"; echo "server did not start"; exit 1; }
calibrate() {  # name, extra flags...
  local name=$1; shift
  "$BIN/client/caliper" calibrate --server="$ADDR" --model="$OUT/data/config.json" \
    --tensors="$OUT/data/dumps" --out="$OUT/$name" --name="$name" "$@" >"$OUT/$name.txt"
  awk '/^session/ {print $2; exit}' "$OUT/$name.txt"
}
A=$(calibrate mse --kv-observer=mse --histograms)
B=$(calibrate pct --kv-observer=percentile:99.9 --nvfp4 --observer=percentile:99.99)
"$BIN/client/caliper" report --server="$ADDR" --session="$A" --out="$OUT/report-a" >/dev/null
"$BIN/client/caliper" report --server="$ADDR" --session="$A" --compare="$B" --out="$OUT/report" >/dev/null
# A usage error and an unknown session are refused with the documented exit codes.
set +e
"$BIN/client/caliper" report --server="$ADDR" --out="$OUT/x" 2>/dev/null; rc_usage=$?
"$BIN/client/caliper" report --server="$ADDR" --session=nope --out="$OUT/x" --attempts=1 2>/dev/null; rc_missing=$?
"$BIN/client/caliper" calibrate --server="$ADDR" --model="$OUT/data/config.json" \
  --tensors="$OUT/data/dumps" --out="$OUT/bad" --kv-observer=percentile:101 2>"$OUT/bad.err"; rc_bad=$?
set -e
[[ $rc_usage == 2 && $rc_missing == 1 && $rc_bad == 2 ]] || { echo "exit codes: usage $rc_usage, missing $rc_missing, bad observer $rc_bad"; cat "$OUT/bad.err"; exit 1; }
grep -q -- "--kv-observer" "$OUT/bad.err"
SHOT=""
if [[ -n "$CHROMIUM" ]]; then
  SHOT="$OUT/report.png"
  timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1400,2400 --screenshot="$SHOT" "file://$OUT/report/report.html" \
    >"$OUT/chromium.log" 2>&1 || { cat "$OUT/chromium.log"; exit 1; }
fi
python3 "$HERE/check_report.py" "$OUT/report-a/report.json" "$OUT/report/report.json" \
  "$OUT/report/report.html" ${SHOT:+"$SHOT"}
if [[ -z "$CHROMIUM" ]]; then echo "chromium not installed (scripts/install-deps.sh chromium): screenshot skipped"; exit 77; fi
echo "report_test: ok ($OUT)"
