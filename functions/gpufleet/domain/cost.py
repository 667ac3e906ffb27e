"""What a run cost: every node's hourly price for every second it was held."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from gpufleet.domain.job import Job, Placement


def held_seconds(placement: Placement, released_at: float) -> float:
    return max(0.0, released_at - placement.launched_at)


def fleet_hourly_usd(placement: Placement) -> float:
    """Price per hour of all the job's nodes together."""
    return placement.hourly_usd * len(placement.instance_ids)


def run_cost_usd(placement: Placement, released_at: float) -> float:
    return fleet_hourly_usd(placement) * held_seconds(placement, released_at) / 3600.0


def month_start(epoch_seconds: float) -> float:
    """The start (UTC) of the calendar month `epoch_seconds` falls in."""
    moment = datetime.fromtimestamp(epoch_seconds, UTC)
    return datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp()


def spend_this_month_usd(jobs: Iterable[Job], now: float) -> float:
    """What jobs submitted this month have cost so far, running ones up to `now`."""
    since = month_start(now)
    total = 0.0
    for job in jobs:
        if job.created_at < since:
            continue
        if job.cost_usd is not None:
            total += job.cost_usd
            continue
        total += job.prior_cost_usd
        if job.placement is not None:
            total += run_cost_usd(job.placement, job.released_at or now)
    return total
