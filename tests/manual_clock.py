"""A clock that moves only when a test moves it, for code that waits on several threads.

Threads wait on it (`wait(event, seconds)`); the test says how many it expects to be waiting
(`settle`), then moves time (`advance`), which returns once every thread whose wait ended has
left it. What a run does then depends on the steps the test takes, never on how fast the
machine is: no wall-clock time decides a result. Real time bounds only how long a test waits
for threads that never come (a bug): it fails then, with what it was waiting for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

# How long `settle` and `advance` wait for threads before they fail the test: a hang guard.
_GUARD_SECONDS = 10.0
# How often a waiting thread looks at its event (an Event cannot notify the clock when set).
_EVENT_POLL_SECONDS = 0.005


class ClockNeverSettled(AssertionError):
    pass


class ManualClock:
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._changed = threading.Condition()
        self._deadlines: dict[int, float] = {}  # waiting thread -> when its wait ends

    def now(self) -> float:
        with self._changed:
            return self._now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        me = threading.get_ident()
        with self._changed:
            self._deadlines[me] = self._now + max(0.0, seconds)
            self._changed.notify_all()
            try:
                while not event.is_set() and self._now < self._deadlines[me]:
                    self._changed.wait(_EVENT_POLL_SECONDS)
            finally:
                del self._deadlines[me]
                self._changed.notify_all()
            return event.is_set()

    def waiting(self) -> int:
        with self._changed:
            return len(self._deadlines)

    def settle(self, threads: int) -> None:
        """Return once exactly `threads` threads wait on the clock."""
        self._until(lambda: len(self._deadlines) == threads, f"{threads} threads waiting")

    def advance(self, seconds: float) -> None:
        """Move time on; return once each wait that ended meanwhile has returned."""
        with self._changed:
            self._now += seconds
            self._changed.notify_all()
        self._until(
            lambda: all(deadline > self._now for deadline in self._deadlines.values()),
            f"the waits that ended by {self._now} to return",
        )

    def _until(self, condition: Callable[[], bool], what: str) -> None:
        with self._changed:
            if not self._changed.wait_for(condition, timeout=_GUARD_SECONDS):
                raise ClockNeverSettled(
                    f"never saw {what}: {len(self._deadlines)} threads wait, until "
                    f"{sorted(self._deadlines.values())}, at {self._now}"
                )
