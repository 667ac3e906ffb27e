"""From a job spec to a launch plan.

A plan is an ordered list of steps, each one capacity type over a diversified list of offerings
(CreateFleet overrides). `auto` jobs try the capacity type whose best offering is cheaper in
expected cost to finish first (spot, unless its expected rework makes it dearer), then the
other; `required` only spot; `never` only on-demand. An `auto` spot step holds no offering
dearer in expected cost than the best on-demand one (the fallback it would otherwise skip).
What to do after a failed step is decided here, not in the state machine: the ASL only follows
`step`, `retry_later` and `give_up`.

Offerings are ranked by `rank_offerings`, with the same inputs wherever a ranking is made:
`gpufleet plan`, intake's first plan, every launch and the simulator; the spot hazard they are
ranked at is raised by what the job lived through on spot (`job_observed_hazard`).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.domain.boot import STOCK_TARGETS, BootTarget, boots
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.config import Reservation, ReservationKind
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.job import Job
from gpufleet.domain.launch import CapacityType, ErrorCategory, LaunchOverride
from gpufleet.domain.reserved import FreeReservation, fits_in_time, reservation_hourly_usd
from gpufleet.domain.selection import (
    NoFeasibleOffering,
    Selection,
    diversify,
    is_feasible,
    observed_hazard,
    select,
)
from gpufleet.domain.spec import JobSpec, Resources, SpotPolicy


class LaunchStep(BaseModel):
    model_config = ConfigDict(frozen=True)

    capacity_type: CapacityType
    overrides: list[LaunchOverride] = Field(min_length=1)

    def override_for(self, instance_type: str, zone: str | None) -> LaunchOverride:
        """The override EC2 chose (zone-specific when the plan knows the zone)."""
        same_type = [o for o in self.overrides if o.instance_type == instance_type]
        exact = [o for o in same_type if o.zone == zone]
        chosen = exact or same_type
        if not chosen:
            raise ValueError(f"{instance_type} is not among this step's overrides")
        return chosen[0]


# Waiting for capacity backs off exponentially, up to this.
MAX_RETRY_WAIT_SECONDS = 900


class NextMove(BaseModel):
    step: int
    retry_later: bool = False
    give_up: bool = False
    wait_seconds: int = 0  # how long to wait first, when retry_later


class LaunchPlan(BaseModel):
    model_config = ConfigDict(frozen=True)

    nodes: int = Field(ge=1)
    steps: list[LaunchStep] = Field(min_length=1)
    max_launch_attempts: int = Field(ge=1)
    retry_wait_seconds: int = Field(ge=1)
    run_timeout_seconds: int = Field(ge=1, description="The job's timeout plus boot allowance")
    heartbeat_timeout_seconds: int = Field(
        ge=1, description="Silence after which the node is taken for lost"
    )

    @model_validator(mode="after")
    def _heartbeat_below_timeout(self) -> LaunchPlan:
        # Step Functions: a task's HeartbeatSeconds must be smaller than its TimeoutSeconds.
        if self.heartbeat_timeout_seconds >= self.run_timeout_seconds:
            raise ValueError("heartbeat_timeout_seconds must be below run_timeout_seconds")
        return self

    expected_seconds: int = Field(ge=1, description="Expected run time offerings were ranked by")
    expected_source: str = Field(description="Where the expected run time came from")
    block_start: float | None = Field(
        default=None,
        description="When the Capacity Block the job waits for starts (spec wait_for_block): "
        "the queue admits it no earlier",
    )

    def estimated_cost_usd(self) -> float:
        """The run's cost on the plan's first choice: what admission budgets against."""
        first = self.steps[0].overrides[0]
        return first.hourly_usd * self.nodes * self.expected_seconds / 3600

    def is_on_demand_fallback(self, step: int) -> bool:
        """Whether a launch at `step` is an on-demand fallback: on-demand capacity after the
        plan tried spot (the job would rather have had spot)."""
        return self.steps[step].capacity_type is CapacityType.ON_DEMAND and any(
            s.capacity_type is CapacityType.SPOT for s in self.steps[:step]
        )

    def after_failure(self, step: int, attempts: int, category: ErrorCategory | None) -> NextMove:
        """Where to go after `attempts` launch calls, the last of which failed at `step`."""
        if category is ErrorCategory.CONFIGURATION or attempts >= self.max_launch_attempts:
            return NextMove(step=step, give_up=True)
        if step + 1 < len(self.steps):
            return NextMove(step=step + 1)
        # Every capacity type failed: wait, then start again from the preferred one. Each round
        # of the plan that fails doubles the wait (spot `required` jobs can wait long).
        rounds = max(1, attempts // len(self.steps))
        wait = min(self.retry_wait_seconds * 2 ** (rounds - 1), MAX_RETRY_WAIT_SECONDS)
        return NextMove(step=0, retry_later=True, wait_seconds=max(wait, 1))


def rank_offerings(
    resources: Resources,
    spot: SpotPolicy,
    catalog: Catalog,
    region: str,
    *,
    expected: DurationEstimate,
    checkpoint_interval_seconds: int | None,
    observed_hazard: float = 0.0,
    unavailable: frozenset[str] = frozenset(),
    limit: int = 50,
    bootable: frozenset[BootTarget] = STOCK_TARGETS,
    needs_instance_store: bool = False,
) -> Selection:
    """The feasible offerings for `resources` under `spot`, cheapest expected cost to finish
    first: the price for the `expected` run time plus the rework a spot interruption costs,
    the work since the last checkpoint (the job's `checkpoint_interval`; none: the whole run),
    at the bucket's hazard or the job's `observed_hazard` when higher; only types with NVMe
    instance-store disks when the job `needs_instance_store`. Raises NoFeasibleOffering."""
    interval = checkpoint_interval_seconds
    return select(
        resources,
        spot,
        catalog,
        region,
        expected_hours=expected.seconds / 3600,
        checkpoint_interval_hours=None if interval is None else interval / 3600,
        observed=observed_hazard,
        unavailable=unavailable,
        limit=limit,
        bootable=bootable,
        needs_instance_store=needs_instance_store,
    )


def job_observed_hazard(job: Job) -> float:
    """The spot hazard (per instance-hour) the job's own interruptions suggest, for the stage
    it is on: `selection.observed_hazard` of its interruptions over its spot instance-hours."""
    nodes = job.effective_spec.resources.nodes
    return observed_hazard(job.interruptions, job.spot_held_seconds, nodes)


_STEP_ORDER: dict[SpotPolicy, tuple[tuple[CapacityType, SpotPolicy], ...]] = {
    SpotPolicy.AUTO: (
        (CapacityType.SPOT, SpotPolicy.REQUIRED),
        (CapacityType.ON_DEMAND, SpotPolicy.NEVER),
    ),
    SpotPolicy.REQUIRED: ((CapacityType.SPOT, SpotPolicy.REQUIRED),),
    SpotPolicy.NEVER: ((CapacityType.ON_DEMAND, SpotPolicy.NEVER),),
}


def plan_launch(
    spec: JobSpec,
    catalog: Catalog,
    region: str,
    *,
    max_launch_attempts: int,
    retry_wait_seconds: int,
    boot_allowance_seconds: int,
    heartbeat_timeout_seconds: int,
    expected: DurationEstimate,
    unavailable: frozenset[str] = frozenset(),
    free_reservations: Sequence[FreeReservation] = (),
    max_types: int = 8,
    bootable: frozenset[BootTarget] = STOCK_TARGETS,
    observed_hazard: float = 0.0,
) -> LaunchPlan:
    """The launch plan for a job: one step per allowed capacity type. Reserved capacity the job
    fits comes first (already paid for), then spot and on-demand as the spot policy allows,
    for `auto` the one with the cheaper expected cost to finish first (a tie goes to spot).
    `observed_hazard` is the job's (`job_observed_hazard`).

    `free_reservations` are the reservations with how many instances each has free and how
    long a run launched into each may last (and the Capacity Blocks that start later, which a
    job whose spec says `wait_for_block` waits for: `block_start`);
    `bootable` what the deployment's launch templates boot. Raises NoFeasibleOffering when no
    capacity type has an offering that fits.
    """
    steps: list[LaunchStep] = []
    reserved = reserved_step(
        spec, catalog, region, free_reservations, expected, unavailable, bootable
    )
    block_start = None
    if reserved is None:
        waited = block_to_wait_for(spec, catalog, free_reservations, expected, bootable)
        if waited is not None:
            # The queue admits it at the block's start; its launch then goes there first.
            reserved = _reserved_launch(waited.reservation, catalog, region)
            block_start = waited.starts_at
    if reserved is not None:
        steps.append(reserved)
    last_refusal: NoFeasibleOffering | None = None
    selections: list[tuple[CapacityType, Selection]] = []
    for capacity_type, only_this_type in _STEP_ORDER[spec.spot]:
        try:
            selections.append(
                (
                    capacity_type,
                    rank_offerings(
                        spec.resources,
                        only_this_type,
                        catalog,
                        region,
                        expected=expected,
                        checkpoint_interval_seconds=spec.checkpoint_interval_seconds,
                        observed_hazard=observed_hazard,
                        unavailable=unavailable,
                        bootable=bootable,
                        needs_instance_store=spec.needs_instance_store,
                    ),
                )
            )
        except NoFeasibleOffering as exc:
            last_refusal = exc
    # A spot offering dearer in expectation than the best on-demand one is never worth trying
    # before it: the fallback caps how far down the spot ranking a launch goes.
    ceiling = min(
        (s.best.expected_cost_usd for t, s in selections if t is CapacityType.ON_DEMAND),
        default=float("inf"),
    )
    ranked: list[tuple[float, LaunchStep]] = []
    for capacity_type, selection in selections:
        candidates = [
            r
            for i, r in enumerate(selection)
            if i == 0 or capacity_type is not CapacityType.SPOT or r.expected_cost_usd <= ceiling
        ]
        overrides = [
            LaunchOverride(
                instance_type=r.offering.instance_type.name,
                zone=r.offering.zone,
                hourly_usd=r.offering.hourly_usd,
            )
            for r in diversify(
                candidates,
                max_types,
                capacity_type="spot" if capacity_type is CapacityType.SPOT else "on-demand",
            )
        ]
        step = LaunchStep(capacity_type=capacity_type, overrides=overrides)
        ranked.append((selection.best.expected_cost_usd, step))
    # Stable: at equal expected cost the order of _STEP_ORDER (spot first) stands.
    steps.extend(step for _, step in sorted(ranked, key=lambda r: r[0]))
    if not steps:
        assert last_refusal is not None
        raise last_refusal
    run_timeout = spec.timeout_seconds + boot_allowance_seconds
    return LaunchPlan(
        nodes=spec.resources.nodes,
        steps=steps,
        max_launch_attempts=max_launch_attempts,
        retry_wait_seconds=retry_wait_seconds,
        run_timeout_seconds=run_timeout,
        # The first heartbeat comes after boot, so the allowance covers the boot too. The
        # States Language wants a task's heartbeat below its timeout (a short job's timeout
        # can be under the usual heartbeat window).
        heartbeat_timeout_seconds=min(
            heartbeat_timeout_seconds + boot_allowance_seconds, run_timeout - 1
        ),
        expected_seconds=expected.seconds,
        expected_source=expected.source,
        block_start=block_start,
    )


def reserved_step(
    spec: JobSpec,
    catalog: Catalog,
    region: str,
    free_reservations: Sequence[FreeReservation],
    expected: DurationEstimate,
    unavailable: frozenset[str],
    bootable: frozenset[BootTarget],
) -> LaunchStep | None:
    """A launch into the best reservation active now that the job fits, if any: Capacity
    Blocks before ODCRs (a block's hours are lost if unused), then the smallest that holds the
    job. The launch is priced at the reservation's price (`reservation_hourly_usd`)."""
    fitting = [
        free.reservation
        for free in free_reservations
        if free.starts_at is None and _fits(spec, catalog, free, expected, unavailable, bootable)
    ]
    if not fitting:
        return None
    best = min(
        fitting,
        key=lambda r: (r.kind is not ReservationKind.CAPACITY_BLOCK, r.count, r.id),
    )
    return _reserved_launch(best, catalog, region)


def _reserved_launch(reservation: Reservation, catalog: Catalog, region: str) -> LaunchStep:
    override = LaunchOverride(
        instance_type=reservation.instance_type,
        zone=reservation.zone,
        hourly_usd=reservation_hourly_usd(reservation, catalog, region),
        reservation_id=reservation.id,
        capacity_block=reservation.kind is ReservationKind.CAPACITY_BLOCK,
    )
    return LaunchStep(capacity_type=CapacityType.RESERVED, overrides=[override])


def block_to_wait_for(
    spec: JobSpec,
    catalog: Catalog,
    free_reservations: Sequence[FreeReservation],
    expected: DurationEstimate,
    bootable: frozenset[BootTarget],
) -> FreeReservation | None:
    """For a job whose spec asks to wait for a Capacity Block (`wait_for_block`): the block
    not yet started that it fits and that starts first; None when it does not ask, or none
    fits."""
    if not spec.wait_for_block:
        return None
    fitting = [
        free
        for free in free_reservations
        if free.starts_at is not None
        and _fits(spec, catalog, free, expected, frozenset(), bootable)
    ]
    return min(fitting, key=lambda f: (f.starts_at or 0.0, f.reservation.id), default=None)


def _fits(
    spec: JobSpec,
    catalog: Catalog,
    free: FreeReservation,
    expected: DurationEstimate,
    unavailable: frozenset[str],
    bootable: frozenset[BootTarget],
) -> bool:
    """Whether the job fits the reservation: enough free instances of a type it can run on,
    not just failed for capacity, and enough time left for its `expected` run (a Capacity
    Block ends: a run that would outlast it goes elsewhere)."""
    reservation = free.reservation
    key = f"{CapacityType.RESERVED.value}:{reservation.instance_type}:{reservation.zone}"
    try:
        instance = catalog.instance_type(reservation.instance_type)
    except KeyError:
        return False
    return (
        free.free >= spec.resources.nodes
        and fits_in_time(free, expected.seconds)
        and key not in unavailable
        and is_feasible(instance, spec.resources, needs_instance_store=spec.needs_instance_store)
        and boots(instance, bootable)
    )
