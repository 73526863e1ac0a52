#!/usr/bin/env bash
# The README's run command: installs deps, builds, generates a small Llama-like model with TP=2
# dumps, starts caliper-server on a free loopback port, calibrates over gRPC (FP8 KV per head and
# NVFP4), fetches the same session for a TP=8 deployment, runs caliper-capture on a tiny random
# Llama (Python client, statistics mode), and shows outputs and /metrics.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BUILD_DIR=${BUILD_DIR:-build}
OUT=${DEMO_OUT:-demo-out}

rm -rf "$OUT"
mkdir -p "$OUT"
# SKIP_BUILD=1 reuses an existing BUILD_DIR (e.g. after scripts/test.sh). Only the targets the
# demo runs are built (scripts/test.sh builds everything). The Python venvs the capture step
# needs (PyPI downloads, minutes on a fresh machine) are made while they compile.
[[ "${SKIP_BUILD:-0}" == 1 ]] || scripts/install-deps.sh
( scripts/python-env.sh package && scripts/python-env.sh tools ) >"$OUT/python-env.log" 2>&1 &
PYENV_JOB=$!
[[ "${SKIP_BUILD:-0}" == 1 ]] || scripts/build.sh caliper caliper-server caliper-demo-gen

if [[ "$BUILD_DIR" = /* ]]; then BIN="$BUILD_DIR"; else BIN="$ROOT/$BUILD_DIR"; fi
echo
echo "== 1. synthetic model, checkpoint and TP=2 dumps"
"$BIN/client/demo/caliper-demo-gen" --out="$OUT/data"

echo
echo "== 2. caliper-server on a free loopback port"
SERVER_LOG="$OUT/server.log"
"$BIN/server/caliper-server" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --device="${CALIPER_DEVICE:-auto}" >"$SERVER_LOG" 2>&1 &
SERVER_PID=$!
stop_server() {
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID" && echo "caliper-server stopped (SIGTERM, exit 0)" || echo "caliper-server exited with $?"
  fi
}
trap stop_server EXIT
ADDR="" METRICS=""
for _ in $(seq 1 100); do
  line=$(grep -m1 '^caliper-server listening on ' "$SERVER_LOG" || true)
  if [[ -n "$line" ]]; then
    ADDR=$(sed -E 's/^caliper-server listening on ([^ ]+) .*/\1/' <<<"$line")
    METRICS=$(sed -E 's/.*\(metrics ([^,]+),.*/\1/' <<<"$line")
    break
  fi
  kill -0 "$SERVER_PID" 2>/dev/null || { cat "$SERVER_LOG"; echo "caliper-server failed to start"; exit 1; }
  sleep 0.1
done
[[ -n "$ADDR" ]] || { cat "$SERVER_LOG"; echo "caliper-server did not report its port"; exit 1; }
echo "$line"

echo
echo "== 3. caliper calibrate (KV per head + NVFP4 weights and activations, deployment TP=2)"
"$BIN/client/caliper" calibrate --server="$ADDR" --model="$OUT/data/config.json" \
  --kv=per-head --nvfp4 --weights="$OUT/data/checkpoint" --tensors="$OUT/data/dumps" \
  --tp=2 --name=demo --out="$OUT/tp2" | tee "$OUT/calibrate.txt"
SESSION=$(awk '/^session/ {print $2; exit}' "$OUT/calibrate.txt")

echo
echo "== 4. caliper scales: the same session for TP=8 (4 KV heads -> 8 with replicas)"
"$BIN/client/caliper" scales --server="$ADDR" --session="$SESSION" --tp=8 --out="$OUT/tp8" \
  | grep -E '^(session|kv cache|wrote)'

echo
echo "== 5. caliper sessions"
"$BIN/client/caliper" sessions --server="$ADDR"

echo
echo "== 6. outputs"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
for dep in ("tp2", "tp8"):
    calib = json.load(open(f"{out}/{dep}/kv_cache_calib.json"))
    row = calib["scales"][0]
    n = calib["num_head"]
    print(f"{out}/{dep}/kv_cache_calib.json: {calib['quant_type']}, num_head {n}, "
          f"scales_shape {calib['scales_shape']}")
    print(f"  layer 0 K: {[round(x, 5) for x in row[:n]]}")
    print(f"  layer 0 V: {[round(x, 5) for x in row[n:]]}")
scales = json.load(open(f"{out}/tp2/scales.json"))
mods = scales["nvfp4"]["modules"]
print(f"{out}/tp2/scales.json: {len(scales['kv_cache']['layers'])} KV layers, {len(mods)} NVFP4 "
      f"modules, {len(scales['warnings'])} warnings")
for name in ("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj"):
    m = mods[name]
    print(f"  {name}: weight_amax {m['weight_amax']}, weight_global_scale "
          f"{m['weight_global_scale']}, input_global_scale {m['input_global_scale']} "
          f"(group {m['fused_group']})")
for w in scales["warnings"][:5]:
    print(f"  warning: {w['where']}: {w['message']}")
PY

echo
echo "== 7. caliper-capture: a tiny random Llama (built from a config, no downloads) calibrated live"
wait "$PYENV_JOB" || { cat "$OUT/python-env.log"; echo "the Python venvs could not be made"; exit 1; }
PYENV=$(scripts/python-client-env.sh "$BIN/python-env")
"$PYENV/bin/python" - "$OUT/capture-model" <<'PY'
import json, sys, torch, transformers
torch.manual_seed(0)
cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               vocab_size=512, max_position_embeddings=512)
cfg.architectures = ["LlamaForCausalLM"]
model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(sys.argv[1])
ids = [torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(i)).tolist()
       for i in range(8)]
json.dump(ids, open(sys.argv[1] + "/calibration_ids.json", "w"))
PY
"$PYENV/bin/caliper-capture" --server="$ADDR" --model="$OUT/capture-model" \
  --token-ids="$OUT/capture-model/calibration_ids.json" --kv=per-head --nvfp4 \
  --format=compressed-tensors --model-device=cpu --name=demo-capture --out="$OUT/capture"

echo
echo "== 8. /metrics (caliper_ series) from http://$METRICS/metrics"
curl -fsS "http://$METRICS/metrics" | grep '^caliper_' | grep -v '_bucket{' | awk 'NR <= 60'

echo
echo "outputs: $OUT/tp2 (deployment TP=2), $OUT/tp8 (TP=8), $OUT/capture (caliper-capture); server log: $SERVER_LOG"
