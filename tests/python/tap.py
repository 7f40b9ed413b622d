# SPDX-License-Identifier: MIT
"""Per-rank check log for the Python tests: one "ok"/"not ok" line per check,
written and flushed as it happens so a rank that hangs or dies still leaves
what it had found; launch.py merges the ranks' logs into TAP."""
import os
import traceback


class Report:
    def __init__(self):
        self._f = open(os.environ["KCOLL_TEST_REPORT"], "w", buffering=1)

    def _line(self, status, desc, detail):
        one = [" ".join(str(x).split()) for x in (desc, detail)]  # one line, no tabs
        self._f.write(f"{status}\t{one[0]}\t{one[1]}\n")

    def check(self, cond, desc, detail=""):
        self._line("ok" if cond else "not ok", desc, detail)
        return cond

    def skip(self, desc, reason):
        self._line("skip", desc, reason)

    def raises(self, exc, fn, desc, want=()):
        """fn() must raise exc whose text contains every string in want."""
        try:
            fn()
        except exc as e:
            missing = [w for w in want if w not in str(e)]
            return self.check(not missing, desc, f"{e!r} lacks {missing}" if missing else "")
        except Exception as e:
            return self.check(False, desc, f"raised {e!r}: {traceback.format_exc(limit=2)!r}")
        return self.check(False, desc, f"no {exc.__name__} raised")
