#!/usr/bin/env python3
"""Checks deploy/grafana/caliper-dashboard.json: valid JSON, the panels an operator needs
(ingest rate by kind, rejections by reason, active sessions, RPC latency p50/p95/p99), only
metric names the server exports, and a layout Grafana can place. Standard library only.
dashboard_exprs() is shared with the Prometheus scrape test, which runs every query for real."""
import json
import re
import sys

# Exactly what caliper-server exports (server/ metrics).
SERVER_METRICS = {
    "caliper_ingested_bytes_total", "caliper_ingested_chunks_total",
    "caliper_rejected_chunks_total", "caliper_skipped_warmup_chunks_total",
    "caliper_active_sessions",
    "caliper_rpc_duration_seconds_bucket", "caliper_rpc_duration_seconds_count",
    "caliper_rpc_duration_seconds_sum", "caliper_finalizations_total", "caliper_backend_info",
    "caliper_state_writes_total", "caliper_state_written_bytes_total",
    "caliper_state_write_duration_seconds_bucket", "caliper_state_write_duration_seconds_count",
    "caliper_state_write_duration_seconds_sum", "caliper_state_files_loaded_total",
}
# Grafana variables replaced by values any Prometheus accepts.
VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*"}


def load(path):
    with open(path) as f:
        return json.load(f)


def dashboard_exprs(dash, substitute=True):
    """[(panel title, expr)] with Grafana variables substituted."""
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            e = t["expr"]
            if substitute:
                for k, v in VARIABLES.items():
                    e = e.replace(k, v)
            out.append((panel["title"], e))
    return out


def main(path):
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    dash = load(path)
    check(dash.get("uid") and dash.get("title"), "uid and title required")
    panels = dash.get("panels", [])
    ids = [p.get("id") for p in panels]
    check(len(ids) == len(set(ids)) and None not in ids, f"panel ids not unique: {ids}")
    var_names = {v["name"] for v in dash.get("templating", {}).get("list", [])}
    check({"datasource", "namespace"} <= var_names, f"template variables {var_names}")
    cells = set()
    for p in panels:
        g = p.get("gridPos", {})
        check(all(k in g for k in "xywh") and g["x"] + g["w"] <= 24,
              f"panel {p.get('title')}: bad gridPos {g}")
        for x in range(g.get("x", 0), g.get("x", 0) + g.get("w", 0)):
            for y in range(g.get("y", 0), g.get("y", 0) + g.get("h", 0)):
                check((x, y) not in cells, f"panel {p.get('title')} overlaps another at {x},{y}")
                cells.add((x, y))
        check(p.get("datasource", {}).get("uid") == "${datasource}",
              f"panel {p.get('title')}: datasource is not the ${{datasource}} variable")
        check(p.get("targets"), f"panel {p.get('title')} has no query")

    exprs = dashboard_exprs(dash, substitute=False)
    for title, e in exprs:
        names = set(re.findall(r"\bcaliper_[a-z_]+\b", e))
        check(names and names <= SERVER_METRICS, f"{title}: unknown metrics {names - SERVER_METRICS}")
        check(e.count("(") == e.count(")") and e.count("{") == e.count("}"), f"{title}: unbalanced {e}")
        check('namespace=~"$namespace"' in e, f"{title}: not filtered by $namespace: {e}")
        for counter in re.findall(r"\bcaliper_[a-z_]+_(?:total|bucket|count)\b", e):
            check(re.search(r"\b(rate|increase)\(" + counter, e) is not None,
                  f"{title}: counter {counter} used without rate()/increase()")

    def has(pred, what):
        check(any(pred(t, e) for t, e in exprs), f"missing panel: {what}")

    has(lambda t, e: "rate(caliper_ingested_bytes_total" in e and "by (kind)" in e,
        "ingest rate by kind")
    has(lambda t, e: "caliper_rejected_chunks_total" in e and "by (reason)" in e,
        "rejections by reason")
    has(lambda t, e: "caliper_rejected_chunks_total" in e and "by (kind)" in e,
        "rejections by kind")
    has(lambda t, e: "caliper_skipped_warmup_chunks_total" in e and "by (kind)" in e,
        "warm-up chunks skipped by kind")
    has(lambda t, e: "caliper_active_sessions" in e, "active sessions")
    for q in ("0.5", "0.95", "0.99"):
        has(lambda t, e, q=q: e.startswith(f"histogram_quantile({q},")
            and "caliper_rpc_duration_seconds_bucket" in e and "by (le" in e, f"RPC latency p{q}")
    for f in failures:
        print("FAIL:", f)
    print(f"dashboard_test: {len(panels)} panels, {len(exprs)} queries, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
