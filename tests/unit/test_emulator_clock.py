"""The embedded account's paced clock: emulated time stands still while a thread of the account
works, so what a timer decides does not depend on how long that work takes in real time."""

from __future__ import annotations

import threading
import time
from itertools import pairwise

from gpufleet.emulator.clock import paced_clock
from tests.helpers import wait_for

# The most the clock moves on between two of its looks (`clock._MOST_PER_LOOK_SECONDS`).
_ONE_LOOK = 0.02


def test_emulated_time_stands_still_while_a_thread_of_the_account_works() -> None:
    with paced_clock() as clock:
        readings: list[float] = []

        def work() -> None:
            readings.append(clock.now())
            time.sleep(0.3)  # real work, however long it takes: no emulated time passes
            readings.append(clock.now())

        worker = threading.Thread(target=work)
        worker.start()
        worker.join()

    assert len(readings) == 2 and readings[1] == readings[0]


def test_a_timer_counts_emulated_seconds_not_the_real_time_its_thread_spends_working() -> None:
    """A heartbeat every 0.05 emulated seconds whose sending takes 0.1 real seconds is still
    0.05 emulated seconds after the last, as a heartbeat timeout counts it."""
    wakes: list[float] = []
    with paced_clock() as clock:
        stop = threading.Event()

        def heartbeat() -> None:
            while not clock.wait(stop, 0.05) and len(wakes) < 4:
                wakes.append(clock.now())
                time.sleep(0.1)  # delivering it: the clock waits for that

        beating = threading.Thread(target=heartbeat)
        beating.start()
        beating.join()

    gaps = [later - earlier for earlier, later in pairwise(wakes)]
    assert len(gaps) == 3
    assert all(0.05 - 1e-9 <= gap <= 0.05 + _ONE_LOOK + 1e-9 for gap in gaps), gaps


def test_a_wait_ends_when_its_event_is_set_and_says_so() -> None:
    with paced_clock() as clock:
        event = threading.Event()
        answers: list[bool] = []
        waiter = threading.Thread(target=lambda: answers.append(clock.wait(event, 3600)))
        waiter.start()
        event.set()
        waiter.join()
        assert answers == [True]
        assert clock.wait(threading.Event(), 0) is False


def test_the_callers_own_thread_is_not_watched_and_time_moves_on_while_it_works() -> None:
    with paced_clock() as clock:
        before = clock.now()
        wait_for(lambda: clock.now() > before)  # polls with real sleeps on this thread
