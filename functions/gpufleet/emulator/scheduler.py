"""EventBridge Scheduler for the emulator: moto stores schedules but never fires them.

Every schedule in the topology fires on a short period, as an asynchronous invocation of its
target with the real Scheduler's event shape.
"""

from __future__ import annotations

import re
import threading

from gpufleet import topology
from gpufleet.emulator.account import ACCOUNT_ID, Account
from gpufleet.emulator.patches import invoke_async


class ScheduleRunner:
    def __init__(self, account: Account, period_seconds: float = 5.0) -> None:
        self._account = account
        self._period = period_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(self._period):
            tick += 1
            for schedule in topology.SCHEDULES:
                # rate(5 minutes) fires every fifth tick: a minute of AWS is a tick here.
                if tick % _minutes(schedule.expression):
                    continue
                arn = self._account.function_arns[schedule.target_function]
                event = {"source": "aws.scheduler", "schedule": schedule.construct_id}
                invoke_async(ACCOUNT_ID, arn, event)


def _minutes(expression: str) -> int:
    match = re.fullmatch(r"rate\((\d+) minutes?\)", expression)
    return int(match.group(1)) if match else 1
