"""The wall clock, for the runtimes that have one."""

from __future__ import annotations

import time


class SystemClock:
    def now(self) -> float:
        return time.time()
