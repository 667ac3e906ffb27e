"""A background loop of the emulator: something AWS does on its own, every so often."""

from __future__ import annotations

import threading

from gpufleet.emulator.clock import EmulatorClock
from gpufleet.emulator.patches import EMULATOR, acting_as


class Ticker:
    """Calls `tick` every `every_seconds` of `clock` on a daemon thread, as the emulator, until
    stopped."""

    def __init__(self, name: str, every_seconds: float, clock: EmulatorClock) -> None:
        self._every = every_seconds
        self._clock = clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.ticks = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with acting_as(EMULATOR):
            while not self._clock.wait(self._stop, self._every):
                self.ticks += 1
                self.tick()

    def tick(self) -> None:
        raise NotImplementedError
