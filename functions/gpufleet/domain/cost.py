"""What a run cost: every node's hourly price for every second it was held, plus its EBS
storage for the same seconds."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from gpufleet.domain.job import Job, Placement


def held_seconds(placement: Placement, released_at: float) -> float:
    return max(0.0, released_at - placement.launched_at)


def fleet_hourly_usd(placement: Placement) -> float:
    """Price per hour of all the job's nodes together."""
    return placement.fleet_hourly_usd


# AWS prorates a GiB-month of EBS by the second over a 730-hour month.
SECONDS_PER_MONTH = 730 * 3600


def storage_usd_per_hour(nodes: int, gib_per_node: float, usd_per_gib_month: float) -> float:
    return nodes * gib_per_node * usd_per_gib_month * 3600 / SECONDS_PER_MONTH


def storage_cost_usd(placement: Placement, released_at: float) -> float:
    per_hour = storage_usd_per_hour(
        len(placement.instance_ids), placement.storage_gib, placement.storage_usd_per_gib_month
    )
    return per_hour * held_seconds(placement, released_at) / 3600.0


def run_cost_usd(placement: Placement, released_at: float) -> float:
    """Instances and their storage, for as long as the run held them."""
    compute = fleet_hourly_usd(placement) * held_seconds(placement, released_at) / 3600.0
    return compute + storage_cost_usd(placement, released_at)


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
