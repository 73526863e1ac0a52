"""How every tests/peers entry says what this machine let it check. CTest knows only pass, fail
and skip, so an entry never passes silently over cases it did not run:

- nothing can be checked here: `skipped: WHY; not checked here: WHAT` and exit 77 (the entries'
  SKIP_RETURN_CODE: CTest shows them as skipped);
- some cases cannot: after the run, `peers: N cases checked, M skipped (reasons: WHY: WHAT)`,
  and the exit code is the checks' (0 or 1).
scripts/skip-table.sh lists both kinds after ctest."""
SKIP_RETURN_CODE = 77


def skip_all(why, what):
    """The entry checks nothing here: prints the line, returns the exit code (77)."""
    print(f"skipped: {why}; not checked here: {what}", flush=True)
    return SKIP_RETURN_CODE


class Cases:
    """Counts the cases an entry ran and the ones it could not run here, with why."""

    def __init__(self):
        self.checked = 0
        self.skipped = []  # (count, why, what)

    def ran(self, n=1):
        self.checked += n

    def skip(self, n, why, what):
        self.skipped.append((n, why, what))

    def exit_code(self, failures):
        """Prints what was skipped (if anything) and the closing line; 1 when a check failed,
        77 when no case ran and some were skipped, else 0."""
        if self.skipped and not self.checked and not failures:
            return skip_all("; ".join(why for _, why, _ in self.skipped),
                            "; ".join(what for _, _, what in self.skipped))
        if self.skipped:
            n = sum(count for count, _, _ in self.skipped)
            reasons = "; ".join(f"{why}: {what} ({count})" for count, why, what in self.skipped)
            print(f"peers: {self.checked} cases checked, {n} skipped (reasons: {reasons})",
                  flush=True)
        print(f"{len(failures)} failed" if failures else "all passed", flush=True)
        return 1 if failures else 0
