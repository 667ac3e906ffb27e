"""What a run cost: every node's hourly price for every second it was held, plus its EBS
storage for the same seconds; and what a job has cost over all its runs.

A job's earlier runs (requeued after a preemption or an interruption, retried, earlier stages)
are kept in its `prior_*` fields; its current run is priced from its placement up to the moment
its instances were released. Everything that prices a job (the settlement of a run, the cost
report the CLI prints, a team's spend this month, the budget stop) goes through here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from gpufleet.domain.config import CostPolicy
from gpufleet.domain.job import Job, JobChanges, Placement

if TYPE_CHECKING:  # planning ranks by duration, which reads the cost of past runs
    from gpufleet.domain.planning import LaunchPlan


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


def compute_cost_usd(placement: Placement, released_at: float) -> float:
    """The instances alone, for as long as the run held them, at the placement's price (a
    reservation's own, for a run on reserved capacity: `domain.reserved`)."""
    return fleet_hourly_usd(placement) * held_seconds(placement, released_at) / 3600.0


def run_cost_usd(placement: Placement, released_at: float) -> float:
    """Instances and their storage, for as long as the run held them."""
    return compute_cost_usd(placement, released_at) + storage_cost_usd(placement, released_at)


# The capacity types a cost report shows the instances' cost of, each on its own.
CAPACITY_COST_FIELDS = {
    "spot": "spot_usd",
    "on-demand": "on_demand_usd",
    "reserved": "reserved_usd",
}


@dataclass(frozen=True, slots=True)
class Spent:
    """What a job has cost and held so far, every run of it."""

    cost_usd: float  # instances and storage
    held_seconds: float
    storage_usd: float  # the storage part of cost_usd
    # The instances' part of cost_usd by capacity type (spot, on-demand, reserved).
    by_capacity: dict[str, float] = field(default_factory=dict)

    def prior_fields(self) -> dict[str, Any]:
        """The job's fields that keep it once the current run has ended, by name: for changes
        that check them with others in one go (`as_prior`: on their own)."""
        return {
            "prior_cost_usd": self.cost_usd,
            "prior_held_seconds": self.held_seconds,
            "prior_storage_usd": self.storage_usd,
            "prior_capacity_usd": self.by_capacity,
        }

    def as_prior(self) -> JobChanges:
        """The job's fields that keep it once the current run has ended."""
        return JobChanges.model_validate(self.prior_fields())


def spent_until(job: Job, until: float | None) -> Spent:
    """The job's cost, held time and storage cost of every run so far, its current run's up
    to `until` included (None, or no placement: the earlier runs' alone)."""
    placement = job.placement
    by_capacity = dict(job.prior_capacity_usd)
    if placement is None or until is None:
        return Spent(job.prior_cost_usd, job.prior_held_seconds, job.prior_storage_usd, by_capacity)
    compute = compute_cost_usd(placement, until)
    kind = placement.capacity_type
    by_capacity[kind] = by_capacity.get(kind, 0.0) + compute
    storage = storage_cost_usd(placement, until)
    return Spent(
        job.prior_cost_usd + compute + storage,
        job.prior_held_seconds + held_seconds(placement, until),
        job.prior_storage_usd + storage,
        by_capacity,
    )


def launch_costs(job: Job) -> tuple[float, float | None]:
    """What a launched (or launching) job costs per hour (0 before it holds instances), and
    when that cost reaches its budget (None: no budget)."""
    placement = job.placement
    if placement is None:
        return 0.0, None
    per_hour = fleet_hourly_usd(placement) + storage_usd_per_hour(
        len(placement.instance_ids), placement.storage_gib, placement.storage_usd_per_gib_month
    )
    budget, stop_at = job.spec.budget_usd, None
    if budget is not None and per_hour > 0:
        left = max(0.0, budget - job.prior_cost_usd)
        stop_at = placement.launched_at + left / per_hour * 3600
    return round(per_hour, 6), stop_at


def estimated_run_usd(plan: LaunchPlan, *, root_volume_gib: int, cost: CostPolicy) -> float:
    """Before a run: the plan's first choice x expected hours x the estimate factor, plus the
    nodes' storage for as long."""
    hours = plan.expected_seconds / 3600
    storage = storage_usd_per_hour(plan.nodes, root_volume_gib, cost.ebs_usd_per_gib_month)
    return round(plan.estimated_cost_usd() * cost.estimate_factor + storage * hours, 6)


def _by_capacity(by_capacity: Mapping[str, float]) -> dict[str, float]:
    """The instances' cost of each capacity type, as a cost report names them."""
    return {
        name: round(by_capacity.get(kind, 0.0), 6) for kind, name in CAPACITY_COST_FIELDS.items()
    }


def cost_report(job: Job) -> dict[str, Any]:
    """The job's cost line, as the demo and the CLI print it: cost_usd = hourly_usd x
    held_seconds / 3600 + storage_usd, over every run of the job (a preempted or interrupted
    run was paid for too); the instances' part of it shown by capacity type (spot_usd,
    on_demand_usd, reserved_usd: a run on a reservation at the reservation's price)."""
    placement = job.placement
    estimate = job.estimated_cost_usd
    if placement is None or job.released_at is None:
        return {
            "hourly_usd": None,
            "held_seconds": round(job.prior_held_seconds, 3),
            **_by_capacity(job.prior_capacity_usd),
            "storage_usd": round(job.prior_storage_usd, 6),
            "cost_usd": job.cost_usd or 0.0,
            "estimated_cost_usd": estimate,
        }
    spent = spent_until(job, job.released_at)
    storage = job.storage_usd if job.storage_usd is not None else spent.storage_usd
    cost = job.cost_usd if job.cost_usd is not None else spent.cost_usd
    # Over several runs (possibly on different types) the hourly price is the held-time
    # average, so that the identity above holds exactly.
    hourly = fleet_hourly_usd(placement)
    if job.prior_held_seconds and spent.held_seconds > 0:
        hourly = (cost - storage) * 3600 / spent.held_seconds
    return {
        "hourly_usd": round(hourly, 6),
        "held_seconds": round(spent.held_seconds, 3),
        **_by_capacity(spent.by_capacity),
        "storage_usd": round(storage, 6),
        "cost_usd": round(cost, 6),
        "estimated_cost_usd": estimate,
    }


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
        total += spent_until(job, job.released_at or now).cost_usd
    return total
