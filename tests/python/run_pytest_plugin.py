"""pytest plugin of run_pytest.sh (`-p run_pytest_plugin`; no conftest involved): each
tests/python file is one CTest entry, and CTest knows only pass, fail and skip, so

- a run where every test skipped (none passed, failed or xfailed) exits 77, CTest's
  SKIP_RETURN_CODE: the entry shows as skipped, not passed;
- a run that skipped some prints, after pytest's own closing line,
  `run_pytest: N passed, M skipped (reasons: ...)`, which scripts/skip-table.sh lists.
Failures stay failures (pytest's exit code is kept whenever anything failed)."""
import collections

import pytest

SKIP_RETURN_CODE = 77
_summary = []  # the line to print at the very end, if any


def _reason(report):
    """A skip's reason as pytest's -rs gives it: longrepr is (path, lineno, "Skipped: why")."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    if text.startswith("Skipped: "):
        text = text[len("Skipped: "):]
    return " ".join(text.split()) or "no reason given"


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    stats = reporter.stats
    count = {key: len(stats.get(key, []))
             for key in ("passed", "failed", "error", "xfailed", "xpassed", "skipped")}
    skipped = count["skipped"]
    if not skipped:
        return
    reasons = collections.Counter(_reason(r) for r in stats.get("skipped", []))
    listed = "; ".join(reason if n == 1 else f"{reason} (x{n})"
                       for reason, n in reasons.most_common())
    parts = [f"{count['passed']} passed"]
    parts += [f"{count[key]} {key}" for key in ("failed", "error", "xfailed", "xpassed")
              if count[key]]
    _summary.append(f"run_pytest: {', '.join(parts)}, {skipped} skipped (reasons: {listed})")
    ran = count["passed"] + count["failed"] + count["error"] + count["xfailed"] + count["xpassed"]
    if ran == 0 and int(exitstatus) == 0:
        session.exitstatus = SKIP_RETURN_CODE


def pytest_unconfigure(config):
    for line in _summary:
        print(line, flush=True)
