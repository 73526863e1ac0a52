#!/usr/bin/env bash
# After ctest: a table of every check this machine did not run. CTest entries reported "Skipped"
# (SKIP_RETURN_CODE 77 or a skip regex such as GoogleTest's), and entries that passed while
# skipping part of their cases (the `run_pytest: N passed, M skipped (reasons: ...)` line of
# tests/python/run_pytest.sh, the `peers: N cases checked, M skipped (reasons: ...)` line of
# tests/peers/peer_report.py), each with its reason and what it needs (AVX-512 or AMX, a GPU,
# PostgreSQL, Chromium, buildah, ...). Informational: exits 0 whatever it finds.
# Reads BUILD_DIR/Testing/Temporary/ctest-junit.xml (scripts/test.sh runs ctest with
# --output-junit Testing/Temporary/ctest-junit.xml: the only record of which entries exited 77)
# and LastTest.log (every entry's whole output); without the JUnit file, skips are recognized in
# LastTest.log by their skip-regex reason or their own `skipped:` / `SKIP:` lines.
# usage: scripts/skip-table.sh [BUILD_DIR]   (default build)
set -euo pipefail
build=${1:-build}
exec python3 - "$build" <<'PY'
import collections
import os
import re
import sys
import xml.etree.ElementTree as ET

build = sys.argv[1]
tmp = os.path.join(build, "Testing", "Temporary")
junit_path = os.path.join(tmp, "ctest-junit.xml")
log_path = os.path.join(tmp, "LastTest.log")

# What a reason needs, by its words (first match wins).
NEEDS = [
    (r"avx-?512|\bamx\b|fp8 kv cache", "x86 with AVX-512 or AMX"),
    (r"cuda|\bgpu\b|nvidia|nvcc", "an NVIDIA GPU"),
    (r"postgres", "PostgreSQL 15"),
    (r"chrom", "Chromium"),
    (r"buildah|runc|mmdebstrap|the image needs root", "buildah, runc, mmdebstrap, root"),
    (r"openssl", "the openssl CLI"),
    (r"pypi|venv cannot be created", "PyPI access"),
    (r"clang|libfuzzer", "clang with libFuzzer"),
    (r"prometheus", "Prometheus"),
    (r"^ONLY=", "ONLY unset"),
]
PARTIAL = re.compile(r"^(run_pytest: (?P<ran>\d+) passed|peers: (?P<checked>\d+) cases checked)"
                     r"(?P<rest>.*?), (?P<skipped>\d+) skipped \(reasons: (?P<reasons>.*)\)$")


def needs(reason):
    for pattern, what in NEEDS:
        if re.search(pattern, reason, re.I):
            return what
    return "- (does not apply here)"


def read_log():
    """{entry: (output, status line)} from LastTest.log."""
    out = {}
    if not os.path.exists(log_path):
        return out
    with open(log_path, errors="replace") as f:
        text = f.read()
    for block in re.split(r"\n(?=\d+/\d+ Testing: )", text):
        m = re.match(r"\d+/\d+ Testing: (.+)", block)
        if not m:
            continue
        body = block.split("Output:\n" + "-" * 58 + "\n", 1)
        output = body[1].split("<end of output>", 1)[0] if len(body) == 2 else ""
        after = block.split("<end of output>", 1)[-1]
        out[m.group(1).strip()] = (output, after)
    return out


def skip_reason(output, fallback):
    lines = [l.strip() for l in output.splitlines() if l.strip()]
    for i in range(len(lines) - 1, -1, -1):
        l = lines[i]
        if l.startswith("skipped: "):
            return l[len("skipped: "):]
        m = PARTIAL.match(l)
        if m:
            return m.group("reasons")
        if l.startswith("SKIP: "):
            return l[len("SKIP: "):]
        if re.search(r"skipping$|skipped$", l):
            return l
        if l.endswith(": Skipped") and i + 1 < len(lines):  # GoogleTest: the message follows
            return lines[i + 1]
    for l in reversed(lines):
        if l.startswith("[  SKIPPED ]"):
            return l
    return lines[-1] if lines else fallback


log = read_log()
skipped = []  # (entry, what, reason)
status_source = "junit"
if os.path.exists(junit_path):
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        if case.get("status") not in ("notrun", "disabled"):
            continue
        name = case.get("name")
        message = (case.find("skipped").get("message", "") if case.find("skipped") is not None
                   else case.get("status"))
        output = log.get(name, ("", ""))[0] or (case.findtext("system-out") or "")
        what = "all" if message.startswith("SKIP_") else f"all (not run: {message})"
        skipped.append((name, what, skip_reason(output, message)))
else:
    status_source = "LastTest.log"
    for name, (output, after) in log.items():
        tail = [l.strip() for l in output.splitlines() if l.strip()][-5:]
        if "Skip regular expression found" in after or any(
                l.startswith(("skipped: ", "SKIP: ")) for l in tail) or (
                tail and re.search(r"skipp(ed|ing)$", tail[-1])):
            skipped.append((name, "all", skip_reason(output, "skipped")))
names_skipped = {s[0] for s in skipped}
partial = []  # (entry, what, reason)
for name, (output, _) in log.items():
    if name in names_skipped:
        continue
    for line in output.splitlines():
        m = PARTIAL.match(line.strip())
        if m and int(m.group("skipped")):
            ran = int(m.group("ran") or m.group("checked"))
            total = ran + int(m.group("skipped"))
            unit = "tests" if m.group("ran") is not None else "cases"
            for reason in m.group("reasons").split("; "):
                partial.append((name, f"{m.group('skipped')} of {total} {unit}", reason))

if not log and status_source == "LastTest.log":
    print(f"skip-table: no {log_path}: run ctest first")
    sys.exit(0)
rows = sorted(skipped) + sorted(partial)
print()
if not rows:
    print("skip-table: nothing skipped: every CTest entry ran all of its checks")
    sys.exit(0)
print(f"skip-table: {len(skipped)} CTest entries skipped, {len({p[0] for p in partial})} ran "
      f"only part of their checks (statuses from {status_source})")
w = max(len(r[0]) for r in rows)
ww = max(len(r[1]) for r in rows)
wn = max(len(needs(r[2])) for r in rows)
print(f"{'entry':<{w}}  {'skipped':<{ww}}  {'needs':<{wn}}  reason")
for name, what, reason in rows:
    print(f"{name:<{w}}  {what:<{ww}}  {needs(reason):<{wn}}  {reason}")
by_need = collections.Counter(needs(r[2]) for r in rows)
print("by need: " + "; ".join(f"{n}: {c}" for n, c in by_need.most_common()))
PY
