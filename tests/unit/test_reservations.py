"""Reserved capacity: used first when the job fits and it is free and active."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import cast

import pytest

from gpufleet.adapters.local.memory import InMemoryObjects
from gpufleet.domain.catalog import CatalogError, load_bundled
from gpufleet.domain.config import (
    ConfigFileError,
    FleetConfig,
    Reservation,
    ReservationKind,
    config_from_env,
    config_from_yaml,
    config_to_env,
)
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.planning import LaunchPlan, plan_launch
from gpufleet.domain.reserved import (
    FreeReservation,
    drain_at,
    drain_lead_seconds,
    free_reservations,
    reservation_hourly_usd,
    runs_to_drain,
    seconds_left,
    warned_block_key,
    warned_blocks,
    warning_kept_until,
)
from gpufleet.domain.spec import JobSpec, parse_spec
from gpufleet.services.queue_listing import queue_listing
from tests.helpers import make_settings, plan_of
from tests.unit import test_dispatcher

ODCR = Reservation(
    id="cr-0123456789abcdef0",
    kind=ReservationKind.ODCR,
    instance_type="p4d.24xlarge",
    zone="us-east-1a",
    count=2,
)
BLOCK = Reservation(
    id="cr-0fedcba9876543210",
    kind=ReservationKind.CAPACITY_BLOCK,
    instance_type="p4d.24xlarge",
    zone="us-east-1b",
    count=4,
    start=datetime(2026, 12, 1, tzinfo=UTC),
    end=datetime(2026, 12, 3, tzinfo=UTC),
    hourly_usd=14.5,
)


def spec(resources: str, spot: str = "auto") -> JobSpec:
    return parse_spec(
        f"name: a\nteam: t\nimage: i\ncommand: [x]\nspot: {spot}\nresources: {resources}\n"
    )


def plan(
    job: JobSpec,
    free: list[tuple[Reservation, int]],
    unavailable: frozenset[str] = frozenset(),
    *,
    seconds_left: float | None = None,
    expected_seconds: int = 3600,
) -> LaunchPlan:
    return plan_with(
        job,
        [FreeReservation(r, n, seconds_left if r.end else None) for r, n in free],
        expected_seconds,
        unavailable,
    )


A100_JOB = "{gpus: 8, gpu_memory_gib: 40, gpu_models: [A100]}"


@pytest.mark.parametrize("policy", ["auto", "required", "never"])
def test_a_free_reservation_the_job_fits_comes_first_at_the_on_demand_price_aws_bills_it_at(
    policy: str,
) -> None:
    steps = plan(spec(A100_JOB, policy), [(ODCR, 2)]).steps
    assert steps[0].capacity_type is CapacityType.RESERVED
    [override] = steps[0].overrides
    on_demand = max(
        o.hourly_usd
        for o in load_bundled().offerings("us-east-1")
        if o.instance_type.name == "p4d.24xlarge" and o.capacity_type == "on-demand"
    )
    assert (override.instance_type, override.zone, override.hourly_usd) == (
        "p4d.24xlarge",
        "us-east-1a",
        on_demand,
    )
    assert on_demand > 0
    assert override.reservation_id == ODCR.id and not override.capacity_block
    # Then what the spot policy allows.
    assert len(steps) == 1 + (2 if policy == "auto" else 1)


def test_capacity_blocks_are_used_before_odcrs_at_the_price_the_config_gives() -> None:
    [override] = plan(spec(A100_JOB), [(ODCR, 2), (BLOCK, 4)]).steps[0].overrides
    assert override.reservation_id == BLOCK.id and override.capacity_block
    assert override.hourly_usd == BLOCK.hourly_usd == 14.5


@pytest.mark.parametrize(
    ("seconds_left", "expected_seconds", "into"),
    [
        (7200.0, 3600, BLOCK.id),  # ends with an hour to spare
        (3600.0, 3600, BLOCK.id),  # ends just as its drain would come
        (3599.0, 3600, ODCR.id),  # would outlast the block: the ODCR, which has no end
        (0.0, 60, ODCR.id),  # the block's runs are draining already
    ],
)
def test_a_job_goes_to_a_capacity_block_only_when_its_expected_run_fits_the_time_left(
    seconds_left: float, expected_seconds: int, into: str
) -> None:
    job = spec(A100_JOB)
    steps = plan(
        job, [(ODCR, 2), (BLOCK, 4)], seconds_left=seconds_left, expected_seconds=expected_seconds
    ).steps
    assert steps[0].overrides[0].reservation_id == into
    alone = plan(job, [(BLOCK, 4)], seconds_left=seconds_left, expected_seconds=expected_seconds)
    assert (alone.steps[0].capacity_type is CapacityType.RESERVED) == (into == BLOCK.id)


def test_a_blocks_time_left_ends_where_its_runs_are_drained_before_ec2_terminates_them() -> None:
    end = BLOCK.end.timestamp() if BLOCK.end else 0.0
    lead = drain_lead_seconds(300, 120)
    assert lead == 420
    # EC2 begins terminating a block's instances 30 minutes before its end.
    assert drain_at(BLOCK, lead) == end - 1800 - 420
    assert seconds_left(BLOCK, end - 4 * 3600, lead) == 4 * 3600 - 1800 - 420
    assert seconds_left(BLOCK, end - 600, lead) == 0.0
    assert seconds_left(ODCR, 0.0, lead) is None
    assert free_reservations([BLOCK, ODCR], {BLOCK.id: 1}, end - 3 * 3600, lead) == [
        FreeReservation(BLOCK, 3, 3 * 3600 - 1800 - 420),
        FreeReservation(ODCR, 2, None),
    ]


def test_runs_on_a_block_are_drained_once_its_end_is_within_the_lead() -> None:
    lead = drain_lead_seconds(300, 120)
    at = drain_at(BLOCK, lead) or 0.0
    placements = [("j-block", BLOCK.id), ("j-odcr", ODCR.id), ("j-other", "cr-00000000")]
    assert runs_to_drain(placements, [BLOCK, ODCR], at - 1, lead) == []
    assert runs_to_drain(placements, [BLOCK, ODCR], at, lead) == ["j-block"]


@pytest.mark.parametrize(
    ("resources", "free"),
    [
        ("{gpus: 8, gpu_memory_gib: 80}", 2),  # needs 80 GiB GPUs; the reservation has 40
        ("{gpus: 8, gpu_models: [H100]}", 2),  # wrong model
        ("{gpus: 8, nodes: 3, gpu_models: [A100]}", 2),  # three nodes do not fit in two
        (A100_JOB, 0),  # all taken
    ],
)
def test_reservations_the_job_does_not_fit_are_skipped(resources: str, free: int) -> None:
    steps = plan(spec(resources), [(ODCR, free)]).steps
    assert all(step.capacity_type is not CapacityType.RESERVED for step in steps)


def test_a_reservation_that_just_failed_is_skipped() -> None:
    steps = plan(spec(A100_JOB), [(ODCR, 2)], frozenset({"reserved:p4d.24xlarge:us-east-1a"})).steps
    assert steps[0].capacity_type is CapacityType.SPOT


def test_capacity_blocks_are_active_only_inside_their_window() -> None:
    assert not BLOCK.active_at(datetime(2026, 11, 30, tzinfo=UTC).timestamp())
    assert BLOCK.active_at(datetime(2026, 12, 2, tzinfo=UTC).timestamp())
    assert not BLOCK.active_at(datetime(2026, 12, 3, tzinfo=UTC).timestamp())
    assert ODCR.active_at(0.0)


def test_config_round_trips_through_the_environment() -> None:
    config = FleetConfig(reservations=[ODCR, BLOCK])
    assert config_from_env(config_to_env(config)) == config
    assert config_from_env(None) == FleetConfig()


@pytest.mark.parametrize(
    "text",
    [
        "reservations: [{id: cr-1, kind: odcr, instance_type: p4d.24xlarge, zone: a, count: 1}]",
        "reservations: [{id: cr-0123456789abcdef0, kind: capacity-block, "
        "instance_type: p5.48xlarge, zone: us-east-1a, count: 1}]",
        # A block without its price: the catalog has no Capacity Block prices.
        "reservations: [{id: cr-0123456789abcdef0, kind: capacity-block, "
        "instance_type: p5.48xlarge, zone: us-east-1a, count: 1, "
        "start: 2026-12-01T11:30:00Z, end: 2026-12-02T11:30:00Z}]",
        "surprise: true",
        "reservations: [unclosed",
    ],
)
def test_bad_configs_are_refused_with_a_message(text: str) -> None:
    with pytest.raises(ConfigFileError, match="invalid gpufleet config"):
        config_from_yaml(text)


def test_the_repository_config_is_valid() -> None:
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "gpufleet.yaml").read_text()
    assert isinstance(config_from_yaml(text), FleetConfig)


LATER_BLOCK = BLOCK.model_copy(
    update={"start": datetime(2026, 12, 5, tzinfo=UTC), "end": datetime(2026, 12, 6, tzinfo=UTC)}
)


def waiting_spec(wait: bool = True) -> JobSpec:
    return spec(A100_JOB).model_copy(update={"wait_for_block": wait})


def upcoming(block: Reservation, left: float = 20 * 3600) -> FreeReservation:
    assert block.start is not None
    return FreeReservation(block, block.count, left, starts_at=block.start.timestamp())


def plan_with(
    job: JobSpec,
    free: list[FreeReservation],
    expected_seconds: int = 3600,
    unavailable: frozenset[str] = frozenset(),
) -> LaunchPlan:
    return plan_launch(
        job,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=3,
        retry_wait_seconds=10,
        boot_allowance_seconds=60,
        heartbeat_timeout_seconds=60,
        expected=DurationEstimate(expected_seconds, "default"),
        unavailable=unavailable,
        free_reservations=free,
    )


def test_a_job_that_asks_to_waits_for_a_block_that_starts_later_and_fits_it() -> None:
    assert LATER_BLOCK.start is not None
    waits = plan_with(waiting_spec(), [FreeReservation(ODCR, 0), upcoming(LATER_BLOCK)])
    assert waits.block_start == LATER_BLOCK.start.timestamp()
    # Admitted at the block's start, it launches there first, then as its spot policy allows.
    assert waits.steps[0].overrides[0].reservation_id == LATER_BLOCK.id
    assert [s.capacity_type for s in waits.steps[1:]] == [CapacityType.SPOT, CapacityType.ON_DEMAND]
    # Not asked, an active reservation it fits now, or a block too short for it: no wait.
    assert plan_with(waiting_spec(False), [upcoming(LATER_BLOCK)]).block_start is None
    assert (
        plan_with(waiting_spec(), [FreeReservation(ODCR, 2), upcoming(LATER_BLOCK)]).block_start
        is None
    )
    short = plan_with(waiting_spec(), [upcoming(LATER_BLOCK, left=1800)])
    assert short.block_start is None
    # An upcoming block is never launched into before it starts.
    assert plan_with(spec(A100_JOB), [upcoming(LATER_BLOCK)]).steps[0].capacity_type is not (
        CapacityType.RESERVED
    )


def test_the_blocks_that_start_later_are_listed_with_the_time_a_run_at_their_start_has() -> None:
    assert LATER_BLOCK.start is not None and LATER_BLOCK.end is not None
    now = LATER_BLOCK.start.timestamp() - 3600
    lead = drain_lead_seconds(300, 120)
    assert free_reservations([LATER_BLOCK, ODCR], {}, now, lead) == [
        FreeReservation(ODCR, 2, None),
        FreeReservation(
            LATER_BLOCK, 4, 24 * 3600 - 1800 - lead, starts_at=LATER_BLOCK.start.timestamp()
        ),
    ]


def test_the_queue_holds_a_job_for_its_block_and_launches_it_there_at_the_start() -> None:
    start = 1_767_225_600.0 + 2 * 3600  # the test clock's start + 2 h
    block = Reservation(
        id="cr-0fedcba9876543210",
        kind=ReservationKind.CAPACITY_BLOCK,
        instance_type="g5.xlarge",
        zone="us-east-1a",
        count=1,
        start=datetime.fromtimestamp(start, UTC),
        end=datetime.fromtimestamp(start + 24 * 3600, UTC),
        hourly_usd=0.7,
    )
    config = FleetConfig(reservations=[block], queue=test_dispatcher.POLICY)
    world = test_dispatcher.World(make_settings(config=config))
    key = "jobs/research/blocky.yaml"
    body = b"name: blocky\nteam: research\nimage: img\ncommand: [x]\nresources: {gpus: 1}\n"
    cast(InMemoryObjects, world.ports.objects).objects[key] = body + b"wait_for_block: true\n"
    job_id = world.intake.submit_object(key, key, key).job_id
    assert job_id is not None
    world.plans[job_id] = plan_of(world.ports, job_id)
    assert world.plans[job_id].block_start == start
    world.enqueue(job_id)
    held = world.dispatcher.run_pass()
    assert held.admitted == [] and held.waiting == {job_id: "block"}
    rows, _ = queue_listing(world.ports, test_dispatcher.POLICY)
    assert [(row.job_id, row.reason) for row in rows] == [(job_id, "block")]
    world.clock.advance(2 * 3600)  # the block starts
    assert world.dispatcher.run_pass().admitted == [job_id]
    world.start(job_id)
    placement = world.ports.jobs.get(job_id).placement
    assert placement is not None and placement.reservation_id == block.id


def test_an_odcr_of_a_type_the_catalog_does_not_price_there_needs_its_price_in_the_config() -> None:
    odcr = ODCR.model_copy(update={"instance_type": "p4d.24xlarge"})
    with pytest.raises(CatalogError, match="give its hourly_usd in the config"):
        reservation_hourly_usd(odcr, load_bundled(), "xx-nowhere-1")
    priced = odcr.model_copy(update={"hourly_usd": 9.0})
    assert reservation_hourly_usd(priced, load_bundled(), "xx-nowhere-1") == 9.0


def test_runs_on_a_block_ec2_warned_of_are_drained_whatever_the_config_says() -> None:
    lead = drain_lead_seconds(300, 120)
    early = (drain_at(BLOCK, lead) or 0.0) - 3600  # by the config, an hour before its drain
    placements = [("j-block", BLOCK.id), ("j-odcr", ODCR.id), ("j-unlisted", "cr-00000000")]
    assert runs_to_drain(placements, [BLOCK, ODCR], early, lead, warned={BLOCK.id}) == ["j-block"]
    # A block the config does not list: EC2's word is enough.
    assert runs_to_drain(placements, [BLOCK], early, lead, warned={"cr-00000000"}) == ["j-unlisted"]


def test_a_block_ec2_warned_of_has_no_time_left_for_a_new_run() -> None:
    lead = drain_lead_seconds(300, 120)
    early = (drain_at(BLOCK, lead) or 0.0) - 3600  # by the config, an hour more to run
    remembered = {"spot:g5.xlarge:us-east-1a", warned_block_key(BLOCK.id)}
    warned = warned_blocks(remembered)
    assert warned == {BLOCK.id}  # an offering's key is no block's
    (block,) = free_reservations([BLOCK], {}, early, lead, warned)
    assert block.seconds_left == 0.0 and seconds_left(ODCR, early, lead, warned) is None
    assert (
        plan(spec("{gpus: 8}"), [(BLOCK, 4)], seconds_left=block.seconds_left)
        .steps[0]
        .capacity_type
        is not CapacityType.RESERVED
    )


def test_a_blocks_warning_is_kept_until_it_ended_by_ec2s_word_and_the_configs() -> None:
    config_end = BLOCK.end.timestamp() if BLOCK.end else 0.0
    assert warning_kept_until(BLOCK.id, [BLOCK], config_end - 3600) == config_end
    assert warning_kept_until(BLOCK.id, [BLOCK], config_end + 60) == config_end + 60
    assert warning_kept_until("cr-00000000", [BLOCK], 100.0) == 100.0  # not in the config
