"""EventBridge Scheduler for the emulator: moto stores schedules but never fires them.

Every schedule in the topology fires on a short period, as an asynchronous invocation of its
target with the real Scheduler's event shape.
"""

from __future__ import annotations

import re

from gpufleet import topology
from gpufleet.emulator.account import ACCOUNT_ID, Account
from gpufleet.emulator.patches import CONTROL_PLANE, acting_as, invoke_async
from gpufleet.emulator.ticker import Ticker


class ScheduleRunner(Ticker):
    def __init__(self, account: Account, period_seconds: float = 5.0) -> None:
        super().__init__("scheduler", period_seconds, account.clock)
        self._account = account

    def tick(self) -> None:
        for schedule in topology.SCHEDULES:
            # rate(5 minutes) fires every fifth tick, rate(1 day) every 1440th: a minute of AWS
            # is a tick here.
            if self.ticks % _minutes(schedule.expression):
                continue
            arn = self._account.function_arns[schedule.target_function]
            event = {"source": "aws.scheduler", "schedule": schedule.construct_id}
            # Invoked as Lambda's service would, not as the emulator.
            with acting_as(CONTROL_PLANE):
                invoke_async(ACCOUNT_ID, arn, event)


_MINUTES_PER_UNIT = {"minute": 1, "hour": 60, "day": 1440}


def _minutes(expression: str) -> int:
    """The period of a `rate(N unit)` expression in minutes (cron: every minute)."""
    match = re.fullmatch(r"rate\((\d+) (minute|hour|day)s?\)", expression)
    return int(match.group(1)) * _MINUTES_PER_UNIT[match.group(2)] if match else 1
