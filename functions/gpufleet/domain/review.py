"""The periodic review of what jobs used (`gpufleet review`): right-size, waste, commitments.

Pure: it reads job records and their nodes' usage documents (domain/usage_layout.py) that the
caller fetched, and prices in dollars at the catalog's on-demand prices.

- **Right-size**: a job family (team and name) whose observed peaks (GPU memory on the fullest
  GPU, host memory, host CPU; plus `HEADROOM`) would fit the cheapest on-demand offering that
  selection deems feasible and the deployment boots (`selection.is_feasible`, `boot.boots`: the
  planners' own rules) at a lower price
  than the type it ran on. The saving is what the family paid for its node-hours times the
  share the cheaper type's on-demand price is below its own: a family that ran on spot saves
  in proportion to its spot bill, never more than it spent.
- **Waste**: GPU-hours held while idle (the share of GPU samples below
  `IDLE_UTILIZATION_PERCENT`, times the run's GPU-hours), held after the work ended (each node's
  `finished` mark to the job's release), and lost to interruptions and preemptions: a job
  without a checkpoint redid every earlier run (`prior_held_seconds`); one that checkpoints
  every C lost C/2 per interruption or preemption on average (capped at its earlier runs); one
  that checkpoints only on request lost nothing it was warned of.
- **Spend**: the window's jobs, what they cost over all their runs (`cost_usd`, a live one's
  so far) and the GPU-hours they held (node-hours of every run times the GPUs of the type the
  last run held).
- **Commitments**: per instance family, the hourly on-demand spend of the window; its steady
  baseline (the level held in 90 % of the hours); for each plan, the commitment that saves the
  most (for a discount d, the level the spend reaches in a share 1 - d of the hours: below that
  share of use the commitment costs more than it saves, the break-even) and the saving.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from gpufleet.domain.boot import STOCK_TARGETS, BootTarget, boots
from gpufleet.domain.catalog import Catalog, InstanceType
from gpufleet.domain.config import Reservation, ReservationKind
from gpufleet.domain.cost import spent_until
from gpufleet.domain.job import Job
from gpufleet.domain.selection import is_feasible
from gpufleet.domain.usage_layout import NodeSummary, UsageSummary, combined

HEADROOM = 0.10  # over the observed peaks, before an offering is said to fit
BASELINE_SHARE = 0.90  # of the window's hours the steady baseline is held in
HOUR = 3600.0


@dataclass(frozen=True)
class Plan:
    """A commitment and the discount the review assumes for it, with where the figure is from.
    AWS publishes these as upper bounds ("up to"): 3-year terms, all upfront; a 1-year no-upfront
    term gives less. The break-even utilization is 1 - discount."""

    name: str
    discount: float
    source: str


PLANS = (
    Plan(
        "Compute Savings Plan",
        0.66,
        "https://aws.amazon.com/savingsplans/compute-pricing/ (up to 66% off On-Demand)",
    ),
    Plan(
        "EC2 Instance Savings Plan",
        0.72,
        "https://aws.amazon.com/savingsplans/compute-pricing/ (up to 72% off On-Demand, "
        "one instance family in one Region)",
    ),
    Plan(
        "Standard Reserved Instances",
        0.72,
        "https://aws.amazon.com/ec2/pricing/reserved-instances/ (up to 72% off On-Demand)",
    ),
)
CAPACITY_BLOCKS = (
    "Capacity Blocks for ML are priced per offering (DescribeCapacityBlockOfferings' UpfrontFee "
    "for its hours), not as a discount, and gpufleet has no sourced price for them: give a "
    "booked block's price per instance-hour with --capacity-block TYPE=USD. A block is paid for "
    "every hour of its window, so it breaks even when the family fills at least (block $/h / "
    "on-demand $/h) of the block's hours; it buys certainty of capacity, which on-demand does not."
)


@dataclass(frozen=True)
class CapacityBlockBreakEven:
    instance_type: str
    block_usd_per_hour: float  # the user's price per instance-hour of the block
    on_demand_usd_per_hour: float  # the catalog's, in the region
    break_even_utilization: float  # of the block's hours; above 1: never cheaper than on-demand


def booked_block_prices(reservations: Iterable[Reservation]) -> dict[str, float]:
    """The price per instance-hour of the Capacity Blocks a config books, by instance type
    (the dearest where several book one type): the review's break-even for them needs no flag."""
    prices: dict[str, float] = {}
    for reservation in reservations:
        if reservation.kind is ReservationKind.CAPACITY_BLOCK and reservation.hourly_usd:
            name = reservation.instance_type
            prices[name] = max(prices.get(name, 0.0), reservation.hourly_usd)
    return prices


def capacity_block_break_even(
    block_prices: Mapping[str, float],
    catalog: Catalog,
    region: str,
    bootable: frozenset[BootTarget] = STOCK_TARGETS,
) -> list[CapacityBlockBreakEven]:
    """Per instance type given a block price: the share of the block's hours it must be used
    for the block to cost no more than those hours on-demand (every hour of a block is paid,
    used or not). A type without an on-demand price in the region (or not booted) is left out."""
    on_demand = {it.name: price for price, it in on_demand_prices(catalog, region, bootable)}
    return [
        CapacityBlockBreakEven(
            instance_type=name,
            block_usd_per_hour=price,
            on_demand_usd_per_hour=on_demand[name],
            break_even_utilization=round(price / on_demand[name], 3),
        )
        for name, price in sorted(block_prices.items())
        if on_demand.get(name)
    ]


@dataclass(frozen=True)
class ReviewedJob:
    job: Job
    nodes: tuple[NodeSummary, ...] = ()

    @cached_property
    def usage(self) -> UsageSummary:
        return combined(n.usage for n in self.nodes)


@dataclass(frozen=True)
class RightSize:
    team: str
    name: str
    jobs: int
    instance_type: str
    hourly_usd: float
    suggested_type: str
    suggested_hourly_usd: float
    node_hours: float
    saving_usd: float
    gpu_mem_peak_mib: float
    why: str


@dataclass(frozen=True)
class Waste:
    team: str
    name: str
    idle_gpu_hours: float
    idle_usd: float
    held_after_hours: float
    held_after_usd: float
    rework_hours: float
    rework_usd: float

    @property
    def total_usd(self) -> float:
        return self.idle_usd + self.held_after_usd + self.rework_usd


@dataclass(frozen=True)
class Commitment:
    family: str
    hours: int
    on_demand_usd: float
    baseline_usd_per_hour: float
    plan: str
    discount: float
    break_even_utilization: float
    commit_usd_per_hour: float
    saving_usd: float
    source: str


@dataclass(frozen=True)
class Spend:
    jobs: int
    launched: int  # jobs that held instances
    gpu_hours: float
    cost_usd: float


def spend(jobs: Iterable[Job], catalog: Catalog, now: float) -> Spend:
    """What the jobs cost and the GPU-hours they held, every run, up to `now` for live ones."""
    count = launched = 0
    gpu_hours = cost = 0.0
    for job in jobs:
        count += 1
        cost += job.cost_usd if job.cost_usd is not None else spent_until(job, now).cost_usd
        placement = job.placement
        if placement is None and not job.prior_held_seconds:
            continue
        launched += 1
        if placement is not None:
            try:
                gpus = catalog.instance_type(placement.instance_type).gpus
            except KeyError:  # a type the catalog no longer has: the GPUs it asked for
                gpus = job.effective_spec.resources.gpus
            until = job.released_at if job.released_at is not None else now
            held = job.prior_held_seconds + max(0.0, until - placement.launched_at)
            gpu_hours += held / HOUR * _nodes(job) * gpus
    return Spend(count, launched, round(gpu_hours, 3), round(cost, 2))


def _nodes(job: Job) -> int:
    return len(job.placement.instance_ids) if job.placement else 0


def _held_hours(job: Job) -> float:
    """Every run's node-hours: held seconds over the job's runs, times its nodes."""
    if job.placement is None or job.released_at is None:
        return job.prior_held_seconds / HOUR
    held = job.prior_held_seconds + max(0.0, job.released_at - job.placement.launched_at)
    return held / HOUR * _nodes(job)


def on_demand_prices(
    catalog: Catalog, region: str, bootable: frozenset[BootTarget] = STOCK_TARGETS
) -> list[tuple[float, InstanceType]]:
    """Each bootable type's lowest on-demand price in the region, cheapest first."""
    prices: dict[str, tuple[float, InstanceType]] = {}
    for o in catalog.offerings(region):
        name = o.instance_type.name
        if o.capacity_type == "on-demand" and (
            name not in prices or o.hourly_usd < prices[name][0]
        ):
            prices[name] = (o.hourly_usd, o.instance_type)
    return sorted(
        (p for p in prices.values() if boots(p[1], bootable)), key=lambda p: (p[0], p[1].name)
    )


def right_size(
    reviewed: Iterable[ReviewedJob],
    catalog: Catalog,
    region: str,
    bootable: frozenset[BootTarget] = STOCK_TARGETS,
) -> list[RightSize]:
    """The families whose observed peaks fit a cheaper on-demand offering than the one they ran
    on; biggest saving first. A family with no usage, or that ran on several types, is left out
    (its peaks say nothing about one type)."""
    families: dict[tuple[str, str], list[ReviewedJob]] = defaultdict(list)
    for item in reviewed:
        if item.job.placement is not None and item.nodes and not item.job.spec.stages:
            families[(item.job.spec.team, item.job.spec.name)].append(item)
    prices = on_demand_prices(catalog, region, bootable)
    price_of = {it.name: price for price, it in prices}
    cheapest: dict[tuple[str, float], tuple[float, InstanceType] | None] = {}
    found: list[RightSize] = []
    for (team, name), items in families.items():
        types = {i.job.placement.instance_type for i in items if i.job.placement}
        if len(types) != 1:
            continue
        (current,) = types
        current_price = price_of.get(current)
        usage = items[0].usage if len(items) == 1 else combined(i.usage for i in items)
        if current_price is None or usage.gpu_mem_mib.peak is None:
            continue
        resources = items[-1].job.effective_spec.resources
        needs = resources.model_copy(
            update={
                "gpu_memory_gib": usage.gpu_mem_mib.peak * (1 + HEADROOM) / 1024,
                "memory_gib": max(1.0, (usage.host_mem_mib.peak or 1024.0) * (1 + HEADROOM) / 1024),
                "vcpus": _vcpus_needed(catalog, current, usage),
            }
        )
        # The cheapest first: the first that fits is the one, and none past the current price.
        # Families alike (a trace's jobs of one shape) need the same: each shape looked up once.
        key = (needs.model_dump_json(), current_price)
        if key not in cheapest:
            cheapest[key] = next(
                (
                    (price, it)
                    for price, it in prices
                    if price < current_price and is_feasible(it, needs)
                ),
                None,
            )
        best = cheapest[key]
        if best is None:
            continue
        best_price, best_type = best
        node_hours = sum(_held_hours(i.job) for i in items)
        # At the price each run paid (spot or on-demand), less the share the type saves.
        paid = sum(
            _held_hours(i.job) * i.job.placement.hourly_usd for i in items if i.job.placement
        )
        found.append(
            RightSize(
                team=team,
                name=name,
                jobs=len(items),
                instance_type=current,
                hourly_usd=current_price,
                suggested_type=best_type.name,
                suggested_hourly_usd=best_price,
                node_hours=round(node_hours, 3),
                saving_usd=round(paid * (1 - best_price / current_price), 2),
                gpu_mem_peak_mib=usage.gpu_mem_mib.peak,
                why=(
                    f"peak GPU memory {usage.gpu_mem_mib.peak / 1024:.1f} GiB of "
                    f"{(usage.gpu_mem_total_mib or 0) / 1024:.0f} GiB; fits "
                    f"{best_type.gpu_memory_gib:g} GiB GPUs with {HEADROOM:.0%} headroom"
                ),
            )
        )
    return sorted(found, key=lambda r: -r.saving_usd)


def _vcpus_needed(catalog: Catalog, instance_type: str, usage: UsageSummary) -> int:
    """The vCPUs the observed CPU peak used on `instance_type`, with headroom."""
    vcpus = catalog.instance_type(instance_type).vcpus
    peak = usage.cpu_percent.peak
    return max(1, math.ceil(vcpus * (peak if peak is not None else 100.0) / 100 * (1 + HEADROOM)))


def waste(reviewed: Iterable[ReviewedJob]) -> list[Waste]:
    """Per family: idle GPU-hours, hours held after the work ended, rework; in dollars at the
    prices the jobs ran at. Most wasteful first."""
    rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * 6)
    for item in reviewed:
        job, placement = item.job, item.job.placement
        if placement is None or job.released_at is None:
            continue
        node_hourly = placement.hourly_usd
        gpus = max(1, job.effective_spec.resources.gpus)
        row = rows[(job.spec.team, job.spec.name)]
        idle = item.usage.idle_fraction
        if idle is not None:
            node_hours = _held_hours(job)
            row[0] += node_hours * gpus * idle
            row[1] += node_hours * node_hourly * idle
        after = sum(_held_after_seconds(n, job.released_at) for n in item.nodes) / HOUR
        row[2] += after * gpus
        row[3] += after * node_hourly
        rework = rework_seconds(job) / HOUR * _nodes(job)
        row[4] += rework * gpus
        row[5] += rework * node_hourly
    found = [
        Waste(team, name, *(round(v, 3) if i % 2 == 0 else round(v, 2) for i, v in enumerate(r)))
        for (team, name), r in rows.items()
    ]
    return sorted((w for w in found if w.total_usd > 0), key=lambda w: -w.total_usd)


def _held_after_seconds(node: NodeSummary, released_at: float) -> float:
    finished = [t for t, name in node.events if name == "finished"]
    return max(0.0, released_at - max(finished)) if finished else 0.0


def rework_seconds(job: Job) -> float:
    """Run time (per node) that interruptions and preemptions made the job do again."""
    events = job.total("interruptions") + job.total("preemptions")
    if not events or not job.prior_held_seconds:
        return 0.0
    spec = job.spec
    if spec.checkpoint is None:
        return job.prior_held_seconds  # every earlier run started over
    interval = spec.checkpoint_interval_seconds
    if interval is None:
        return 0.0  # it checkpoints when asked, and gpufleet asks before it stops a run
    return min(job.prior_held_seconds, events * interval / 2)


def commitments(
    jobs: Iterable[Job], start: float, end: float, plans: Sequence[Plan] = PLANS
) -> list[Commitment]:
    """Per instance family, what each plan would have saved over the window's on-demand
    spend (hour by hour), at the commitment that saves the most."""
    hours = max(1, math.ceil((end - start) / HOUR))
    spend: dict[str, list[float]] = defaultdict(lambda: [0.0] * hours)
    for job in jobs:
        placement = job.placement
        if placement is None or placement.capacity_type != "on-demand":
            continue
        run_end = job.released_at if job.released_at is not None else end
        _spread(
            spend[placement.instance_type.split(".", 1)[0]],
            placement.fleet_hourly_usd,
            max(start, placement.launched_at) - start,
            min(end, run_end) - start,
        )
    found: list[Commitment] = []
    for family, hourly in sorted(spend.items()):
        ordered = sorted(hourly)
        baseline = _quantile(ordered, 1 - BASELINE_SHARE)
        for plan in plans:
            commit = _quantile(ordered, plan.discount)
            saving = sum(min(u, commit) for u in hourly) - commit * (1 - plan.discount) * hours
            found.append(
                Commitment(
                    family=family,
                    hours=hours,
                    on_demand_usd=round(sum(hourly), 2),
                    baseline_usd_per_hour=round(baseline, 4),
                    plan=plan.name,
                    discount=plan.discount,
                    break_even_utilization=round(1 - plan.discount, 2),
                    commit_usd_per_hour=round(commit, 4),
                    saving_usd=round(max(0.0, saving), 2),
                    source=plan.source,
                )
            )
    return found


def _spread(hourly: list[float], rate: float, start: float, end: float) -> None:
    """Add `rate` $/hour from `start` to `end` (seconds into the window) to the hourly bins."""
    t = max(0.0, start)
    while t < end:
        index = int(t // HOUR)
        if index >= len(hourly):
            return
        upto = min(end, (index + 1) * HOUR)
        hourly[index] += rate * (upto - t) / HOUR
        t = upto


def _quantile(ordered: Sequence[float], q: float) -> float:
    """The level the hourly spend reaches or exceeds in a share 1 - q of the hours."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.floor(q * len(ordered))))]
