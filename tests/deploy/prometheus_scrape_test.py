#!/usr/bin/env python3
"""Metrics scraped for real: starts caliper-server and Debian's Prometheus on loopback
ephemeral ports (scrape every 1 s), streams a calibration with a known byte count through the
deploy test client, and asserts through Prometheus' HTTP query API (/api/v1/query) that the
counters and the session gauge say what was sent. Also: `promtool check metrics` on the
/metrics page, Prometheus naming conventions, every Grafana dashboard query evaluated by the
real Prometheus, the gRPC health check the Kubernetes probe uses, JSON logs, and SIGTERM drain.
Every wait is bounded; everything started is stopped on every exit path.
Exit 77 (CTest skip) when prometheus is not installed."""
import argparse
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dashboard_test  # noqa: E402  (shares the dashboard's query list)

SKIP = 77
LOOPBACK = "127.0.0.1"
# The calibration the client streams (tests/deploy/deploy_test_client.cc), all float32.
LAYERS, TOKENS, KV_HEADS, HEAD_DIM, WEIGHTS, BAD = 4, 16, 2, 8, 2, 1
KV_BYTES = 2 * LAYERS * TOKENS * KV_HEADS * HEAD_DIM * 4   # K and V per layer
WEIGHT_BYTES = WEIGHTS * HEAD_DIM * (2 * KV_HEADS * HEAD_DIM) * 4
KV_CHUNKS, WEIGHT_CHUNKS = 2 * LAYERS, WEIGHTS
# `kind` values are the API's TargetKind names in lower case (unspecified: a chunk naming none).
KIND_LABELS = {"key", "value", "weight", "input_activation", "query"}
KNOWN_LABEL_VALUES = {"kind": KIND_LABELS | {"unspecified"},
                      "result": {"ok", "error", "restored", "corrupt"},
                      "backend": {"cpu", "cuda"}}
FORBIDDEN_LABELS = {"session", "session_id", "id", "peer", "producer_id", "module"}

procs = []


class Failure(Exception):
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def check(cond, what):
    if not cond:
        raise Failure(what)


def free_port():
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def start(cmd, **kw):
    p = subprocess.Popen(cmd, **kw)
    procs.append(p)
    return p


def stop(p, grace=10):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_all():
    for p in reversed(procs):
        stop(p, grace=5)


def wait_for(what, fn, timeout, interval=0.25):
    """Polls fn() until it returns something truthy; Failure after `timeout` seconds."""
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError) as e:
            last = e
        time.sleep(interval)
    raise Failure(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


class Prometheus:
    def __init__(self, base):
        self.base = base

    def query(self, expr):
        url = f"{self.base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        try:
            body = json.loads(http_get(url))
        except urllib.error.HTTPError as e:  # 400 on a bad query, with the reason in the body
            body = json.loads(e.read().decode())
        if body.get("status") != "success":
            raise Failure(f"query {expr!r}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def scalar(self, expr):
        """Value of a one-series instant vector; None when empty."""
        result = self.query(expr)["result"]
        check(len(result) <= 1, f"{expr}: {len(result)} series, want at most 1")
        return float(result[0]["value"][1]) if result else None

    def wait_value(self, expr, want, timeout=20):
        t0 = time.monotonic()
        wait_for(f"{expr} == {want}", lambda: self.scalar(expr) == want, timeout)
        return time.monotonic() - t0


def client(binary, *args):
    out = subprocess.run([binary] + list(args), capture_output=True, text=True, timeout=60)
    check(out.returncode == 0, f"client {' '.join(args)} exited {out.returncode}: {out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def check_metrics_page(promtool, text):
    # promtool's own linter: naming, HELP, TYPE, _total counters, units.
    lint = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                          text=True, timeout=30)
    check(lint.returncode == 0,
          f"promtool check metrics failed:\n{lint.stdout}{lint.stderr}")
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    ours = {n: t for n, t in types.items() if n.startswith("caliper_")}
    want = {"caliper_ingested_bytes_total": "counter", "caliper_ingested_chunks_total": "counter",
            "caliper_rejected_chunks_total": "counter", "caliper_active_sessions": "gauge",
            "caliper_skipped_warmup_chunks_total": "counter",
            "caliper_rpc_duration_seconds": "histogram",
            "caliper_state_write_duration_seconds": "histogram",
            "caliper_finalizations_total": "counter", "caliper_backend_info": "gauge"}
    # Other families may be added; these are the ones the dashboard and the docs rely on.
    check(all(ours.get(n) == t for n, t in want.items()),
          f"caliper metric families {ours} lack some of {want}")
    for name, kind in ours.items():
        if kind == "counter":
            check(name.endswith("_total"), f"counter {name} lacks _total")
        if kind == "histogram":  # a histogram names its base unit; durations one way
            check(name.endswith(("_duration_seconds", "_bytes", "_tokens")),
                  f"histogram {name} names no unit (_duration_seconds, _bytes, _tokens)")
            check("seconds" not in name or name.endswith("_duration_seconds"),
                  f"histogram {name} is a duration not named *_duration_seconds")
    for m in re.finditer(r"^(caliper_\w+)\{([^}]*)\}", text, re.M):
        for key, value in re.findall(r'(\w+)="([^"]*)"', m.group(2)):
            check(key not in FORBIDDEN_LABELS, f"{m.group(1)} has unbounded label {key}")
            if key in KNOWN_LABEL_VALUES:
                check(value in KNOWN_LABEL_VALUES[key], f"{m.group(1)}{{{key}={value!r}}}")
    return len(ours)


def run(a, tmp):
    # --- caliper-server on loopback, port 0 for both listeners.
    server_log = open(os.path.join(tmp, "server.log"), "w+")
    server = start([a.server, f"--listen={LOOPBACK}:0", f"--metrics_listen={LOOPBACK}:0",
                    "--device=cpu", "--log_format=json", "--drain_timeout=5s",
                    f"--state_dir={os.path.join(tmp, 'state')}"],
                   stdout=subprocess.PIPE, stderr=server_log, text=True)
    lines = queue.Queue()
    threading.Thread(target=lambda: [lines.put(l) for l in server.stdout], daemon=True).start()

    def startup_line():
        try:
            return re.search(r"caliper-server listening on (\S+) \(metrics (\S+), backend (\w+)\)",
                             lines.get(timeout=0.5))
        except queue.Empty:
            check(server.poll() is None, f"server exited {server.returncode}")
            return None
    m = wait_for("the server's startup line", startup_line, timeout=30)
    grpc_addr, metrics_addr, backend = m.groups()
    log(f"server up: grpc {grpc_addr}, metrics {metrics_addr}, backend {backend}")
    check(grpc_addr.startswith(LOOPBACK) and metrics_addr.startswith(LOOPBACK), "not on loopback")
    check(backend == "cpu", f"backend {backend}, asked for cpu")
    health = client(a.client, "health", f"--target={grpc_addr}")
    check(health["status"] == 1, f"grpc.health.v1 status {health}")
    log("grpc.health.v1 Check: SERVING (what the Kubernetes grpc probe calls)")

    # --- the /metrics page itself.
    page = http_get(f"http://{metrics_addr}/metrics")
    n = check_metrics_page(a.promtool, page)
    log(f"/metrics: promtool check metrics OK, {n} caliper_ families, conventions OK")

    # --- Prometheus on loopback, scraping the server every second.
    config = os.path.join(tmp, "prometheus.yml")
    with open(config, "w") as f:
        f.write(f"""global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: caliper
    metrics_path: /metrics
    static_configs:
      - targets: ["{metrics_addr}"]
""")
    cc = subprocess.run([a.promtool, "check", "config", config], capture_output=True, text=True,
                        timeout=30)
    check(cc.returncode == 0, f"promtool check config: {cc.stdout}{cc.stderr}")
    prom = None
    for attempt in range(3):  # a port picked free may be taken before Prometheus binds it
        port = free_port()
        p = start([a.prometheus, f"--config.file={config}",
                   f"--storage.tsdb.path={os.path.join(tmp, f'data{attempt}')}",
                   f"--web.listen-address={LOOPBACK}:{port}", "--log.level=warn"],
                  stdout=subprocess.DEVNULL, stderr=open(os.path.join(tmp, "prometheus.log"), "a"))
        base = f"http://{LOOPBACK}:{port}"
        try:
            wait_for("Prometheus /-/ready",
                     lambda: p.poll() is None and "Ready" in http_get(f"{base}/-/ready"), 30)
            prom = Prometheus(base)
            break
        except Failure:
            stop(p)
    check(prom is not None, "Prometheus did not start: " +
          open(os.path.join(tmp, "prometheus.log")).read()[-2000:])
    log(f"prometheus up on {base}")
    took = prom.wait_value('up{job="caliper"}', 1.0, timeout=30)
    log(f"first successful scrape after {took:.1f}s")
    check(prom.scalar("sum(caliper_ingested_bytes_total)") == 0.0, "bytes before any ingest")
    check(prom.scalar("caliper_active_sessions") == 0.0, "sessions before any ingest")

    # --- a known calibration.
    t0 = time.monotonic()
    sent = client(a.client, "ingest", f"--target={grpc_addr}", f"--layers={LAYERS}",
                  f"--tokens={TOKENS}", f"--kv_heads={KV_HEADS}", f"--head_dim={HEAD_DIM}",
                  f"--weights={WEIGHTS}", f"--bad_chunks={BAD}")
    log(f"streamed: {sent}")
    check(sent["sent_kv_bytes"] == KV_BYTES and sent["sent_weight_bytes"] == WEIGHT_BYTES,
          f"client sent {sent}, test expects kv {KV_BYTES} weight {WEIGHT_BYTES}")
    check(sent["accepted_bytes"] == KV_BYTES + WEIGHT_BYTES and sent["rejected_chunks"] == BAD,
          f"ObserveSummary {sent}")
    total = KV_BYTES + WEIGHT_BYTES
    took = prom.wait_value("sum(caliper_ingested_bytes_total)", float(total))
    log(f"Prometheus: sum(caliper_ingested_bytes_total) == {total} bytes sent, "
        f"{took:.1f}s after the stream ended ({time.monotonic() - t0:.1f}s after it started)")
    expect = {
        'caliper_ingested_bytes_total{kind="key"}': KV_BYTES // 2,
        'caliper_ingested_bytes_total{kind="value"}': KV_BYTES // 2,
        'caliper_ingested_bytes_total{kind="weight"}': WEIGHT_BYTES,
        'caliper_ingested_bytes_total{kind="input_activation"}': 0,
        "sum(caliper_ingested_chunks_total)": KV_CHUNKS + WEIGHT_CHUNKS,
        'caliper_ingested_chunks_total{kind="key"}': KV_CHUNKS // 2,
        "sum(caliper_rejected_chunks_total)": BAD,
        'sum(caliper_rejected_chunks_total{reason="invalid_argument"})': BAD,
        'caliper_rejected_chunks_total{reason="invalid_argument",kind="key"}': BAD,
        "sum(caliper_skipped_warmup_chunks_total)": 0,
        "caliper_active_sessions": 1,
        'caliper_backend_info{backend="cpu"}': 1,
        'caliper_rpc_duration_seconds_count{method="CreateSession"}': 1,
        'caliper_rpc_duration_seconds_count{method="Observe"}': 1,
    }
    for expr, want in expect.items():
        got = prom.scalar(expr)
        check(got == float(want), f"{expr} = {got}, want {want}")
    log(f"Prometheus agrees on {len(expect)} more series (per kind, chunks, rejections, "
        "sessions, backend, RPC counts)")

    client(a.client, "finalize", f"--target={grpc_addr}", f"--session={sent['session_id']}")
    prom.wait_value('caliper_finalizations_total{result="ok"}', 1.0)
    check(prom.scalar("caliper_active_sessions") == 1.0, "a finalized session is still held")
    client(a.client, "delete", f"--target={grpc_addr}", f"--session={sent['session_id']}")
    prom.wait_value("caliper_active_sessions", 0.0)
    log("finalize -> caliper_finalizations_total{result=ok} 1; delete -> caliper_active_sessions 0")
    # --state_dir: create, the stream's end and finalize each waited for a durable write.
    writes = prom.scalar('caliper_state_writes_total{result="ok"}')
    check(writes >= 3, f'caliper_state_writes_total{{result="ok"}} = {writes}, want >= 3')
    check(prom.scalar('caliper_state_writes_total{result="error"}') == 0.0, "state write errors")
    log(f"state: {writes:.0f} durable session writes, no errors")

    # --- every dashboard query, evaluated by the real Prometheus.
    dash = dashboard_test.load(a.dashboard)
    exprs = dashboard_test.dashboard_exprs(dash)
    for title, expr in exprs:
        prom.query(expr)  # raises on a query Prometheus rejects
    by_kind = [e for t, e in exprs if "caliper_ingested_bytes_total" in e and "by (kind)" in e]
    kinds = {r["metric"].get("kind") for r in prom.query(by_kind[0])["result"]}
    check(kinds == KIND_LABELS, f"ingest-by-kind panel shows kinds {kinds}")
    p99 = [e for t, e in exprs if e.startswith("histogram_quantile(0.99, sum by (le, method)")]
    methods = {r["metric"].get("method") for r in prom.query(p99[0])["result"]}
    check({"CreateSession", "Observe"} <= methods, f"latency panel methods {methods}")
    log(f"all {len(exprs)} dashboard queries accepted by Prometheus; panels show data")

    # --- graceful stop, then the logs.
    t0 = time.monotonic()
    server.send_signal(signal.SIGTERM)
    try:
        rc = server.wait(timeout=15)
    except subprocess.TimeoutExpired:
        raise Failure("server still running 15s after SIGTERM (drain_timeout 5s)")
    check(rc == 0, f"server exited {rc} after SIGTERM")
    log(f"SIGTERM: exit 0 after {time.monotonic() - t0:.2f}s")
    server_log.seek(0)
    events = []
    for line in server_log.read().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            raise Failure(f"--log_format=json wrote a non-JSON line: {line!r}")
        check({"time", "severity", "event"} <= set(e), f"log line lacks time/severity/event: {e}")
        events.append(e)
    names = [e["event"] for e in events]
    rpc = [e for e in events if e["event"] == "rpc" and e.get("session") == sent["session_id"]]
    check(rpc and all(e.get("peer") for e in rpc), "no rpc log line with this session and a peer")
    check("chunk_rejected" in names, "the rejected chunk was not logged")
    check(names[-2:] == ["draining", "stopped"], f"last events {names[-2:]}")
    log(f"logs: {len(events)} JSON lines with time/severity/event; rpc lines carry session + peer")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True)
    ap.add_argument("--client", required=True)
    ap.add_argument("--dashboard", required=True)
    ap.add_argument("--prometheus", default=shutil.which("prometheus"))
    ap.add_argument("--promtool", default=shutil.which("promtool"))
    a = ap.parse_args()
    if not a.prometheus or not a.promtool:
        print("SKIP: prometheus/promtool not installed (scripts/install-deps.sh prometheus)")
        return SKIP
    # CTest's timeout sends SIGTERM: still stop what was started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    tmp = tempfile.mkdtemp(prefix="caliper-prom-")
    try:
        run(a, tmp)
        print("prometheus_scrape_test: PASS")
        return 0
    except Failure as e:
        print(f"FAIL: {e}")
        for name in ("server.log", "prometheus.log"):
            path = os.path.join(tmp, name)
            if os.path.exists(path):
                print(f"--- {name} (tail)\n" + open(path).read()[-3000:])
        return 1
    finally:
        stop_all()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
