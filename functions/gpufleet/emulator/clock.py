"""The embedded account's time: what its emulated nodes, its loops (the schedules) and Step
Functions' timers wait on.

`WallClock` is the machine's clock (`gpufleet emulator`, whose HTTP server waits on sockets, and
the chaos runs). `PacedClock` (`gpufleet demo`, and so every test that runs a demo) is a virtual
clock that stands still while anything the account started is working: a node sending its
heartbeat, a Lambda function running, Step Functions stepping an execution, a thread starting.
It moves on, never faster than the wall clock, only while each of those threads waits: on this
clock, blocked in `threading` (an event, a lock's condition, a join) for another thread, or on a
real process outside the account (in `subprocess`, or the agent relaying a container's output:
a node's container is a real process, whose time is the world's, not the account's).

So what happens is decided by emulated seconds, not by how fast a loaded machine runs the
threads: a node that heartbeats every 0.5 emulated seconds is never taken for silent by a
2-second heartbeat timeout, however long a heartbeat takes to deliver, and a node that stops
heartbeating always is. A loaded machine makes a run take longer; it does not change its result.

Step Functions' heartbeat timeouts and `Wait` states wait on it too (`patches`). What still
waits real seconds and is no result's cause: a thread in `time.sleep` (Step Functions' `Retry`
intervals: the clock stands still meanwhile), a task's `TimeoutSeconds` (the clock moves on
meanwhile, never faster than real time), and the timestamps AWS and the control plane write
(the wall clock, which never runs behind this one).
"""

from __future__ import annotations

import gc
import logging
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Protocol

from gpufleet.agent.docker import relay

# Where a thread's innermost frame says it waits: for another thread, or for a real process.
_OUTSIDE_FILES = frozenset({threading.__file__, subprocess.__file__, selectors.__file__})

_LOG = logging.getLogger(__name__)

# How often the clock looks whether every thread waits, and the most one look moves it on: a
# thread that started working between two looks costs at most that much emulated time.
_LOOK_SECONDS = 0.005
_MOST_PER_LOOK_SECONDS = 0.02
# How often a waiting thread looks at its event (an Event cannot tell the clock it was set).
_EVENT_POLL_SECONDS = 0.02
# A thread that works this long in real time without waiting is stuck (or blocked where the
# clock cannot see it, as on a socket): time moves on anyway, and the log names the thread.
_STALL_SECONDS = 60.0


class EmulatorClock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until `event` is set or `seconds` have passed; whether it is set."""
        ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class PacedClock:
    """Emulated seconds that pass only while every thread started since the clock began waits.

    The threads that ran before it began (a test runner's, the caller's) are not watched: the
    caller polls the account, it takes no part in it."""

    def __init__(self) -> None:
        self._now = 0.0
        self._changed = threading.Condition()
        self._waits: dict[int, tuple[float, threading.Event]] = {}  # thread -> deadline, event
        self._unwatched: set[int] = set()
        self._stopped = threading.Event()
        self._driver = threading.Thread(target=self._drive, name="emulator-clock", daemon=True)

    def start(self) -> None:
        self._unwatched = {t.ident for t in threading.enumerate() if t.ident is not None}
        self._driver.start()

    def stop(self) -> None:
        """From now on waits last real seconds (threads that outlive the account end so)."""
        self._stopped.set()
        self._driver.join(timeout=5)
        with self._changed:
            self._changed.notify_all()

    def now(self) -> float:
        with self._changed:
            return self._now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        me = threading.get_ident()
        with self._changed:
            deadline = self._now + max(0.0, seconds)
            self._waits[me] = (deadline, event)
            try:
                while not event.is_set() and self._now < deadline:
                    if self._stopped.is_set():
                        break
                    self._changed.wait(_EVENT_POLL_SECONDS)
            finally:
                del self._waits[me]
        if self._stopped.is_set() and not event.is_set():
            return event.wait(max(0.0, deadline - self.now()))
        return event.is_set()

    def sleep(self, seconds: float) -> None:
        self.wait(threading.Event(), seconds)

    def _drive(self) -> None:
        self._unwatched.add(threading.get_ident())
        looked = still_since = time.monotonic()
        while not self._stopped.wait(_LOOK_SECONDS):
            now = time.monotonic()
            elapsed, looked = now - looked, now
            with self._changed:
                working = self._working()
                if working and now - still_since < _STALL_SECONDS:
                    if any(w.endswith("(woken)") for w in working):
                        self._changed.notify_all()
                    continue
                if working:
                    _LOG.warning("emulated time moves on past threads still working: %s", working)
                still_since = now
                self._now += min(elapsed, _MOST_PER_LOOK_SECONDS)
                self._changed.notify_all()

    def _working(self) -> list[str]:
        """The threads that keep time still: woken from a wait on this clock and not yet back,
        or watched and neither waiting on it nor blocked in `threading`."""
        frames = _current_frames()
        working = []
        for thread in threading.enumerate():
            ident = thread.ident
            waiting = self._waits.get(ident or 0)
            if waiting is not None:
                deadline, event = waiting
                if event.is_set() or deadline <= self._now:
                    working.append(f"{thread.name} (woken)")
                continue
            if ident in self._unwatched:
                continue
            frame = frames.get(ident or 0)
            if frame is None or not _waits_outside_the_account(frame):
                working.append(thread.name)
        return working


def _current_frames() -> dict[int, FrameType]:
    """`sys._current_frames()` with the garbage collector held off. CPython 3.11 holds its
    runtime lock while it builds the frames, and a collection that an allocation starts
    meanwhile may free objects (here a `Popen`, its finalizer waiting) whose release needs that
    lock or the GIL another thread holds while it waits for that lock: the process hangs
    (https://github.com/python/cpython/issues/106883, the fix its maintainers suggested, not
    backported to 3.11; a demo test hung so here)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        return sys._current_frames()
    finally:
        if collecting:
            gc.enable()


def _waits_outside_the_account(frame: FrameType) -> bool:
    """Whether the thread whose innermost frame this is waits for another thread (in
    `threading`) or for a real process: in `subprocess` (waiting for a child) or `selectors`
    (reading a child's pipes: nothing else of the account uses them), or in the agent's relay of
    a container's output (blocked reading it; a line it hands on runs in deeper frames, which
    count as working). Only the innermost frame is read: walking `f_back` of a running thread's
    frames can crash the interpreter (CPython 3.11)."""
    return frame.f_code is relay.__code__ or frame.f_code.co_filename in _OUTSIDE_FILES


@contextmanager
def paced_clock() -> Iterator[PacedClock]:
    clock = PacedClock()
    clock.start()
    try:
        yield clock
    finally:
        clock.stop()
