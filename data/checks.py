"""checks.py: pass/fail bookkeeping for the data tools' tests (one line per check, then the
closing `N passed, M failed` line that dev/run_tests.sh adds up, and the exit status)."""

import sys


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def __call__(self, ok, what):
        print(("  ok   " if ok else " FAIL  ") + what, flush=True)
        if ok:
            self.passed += 1
        else:
            self.failed += 1

    def finish(self):
        print(f"{self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)
