"""Reserved capacity: used first when the job fits and it is free and active."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpufleet.domain.catalog import load_bundled
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
from gpufleet.domain.spec import JobSpec, parse_spec

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
)


def spec(resources: str, spot: str = "auto") -> JobSpec:
    return parse_spec(
        f"name: a\nteam: t\nimage: i\ncommand: [x]\nspot: {spot}\nresources: {resources}\n"
    )


def plan(
    job: JobSpec, free: list[tuple[Reservation, int]], unavailable: frozenset[str] = frozenset()
) -> LaunchPlan:
    return plan_launch(
        job,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=3,
        retry_wait_seconds=10,
        boot_allowance_seconds=60,
        heartbeat_timeout_seconds=60,
        expected=DurationEstimate(3600, "default"),
        unavailable=unavailable,
        free_reservations=free,
    )


A100_JOB = "{gpus: 8, gpu_memory_gib: 40, gpu_models: [A100]}"


@pytest.mark.parametrize("policy", ["auto", "required", "never"])
def test_a_free_reservation_the_job_fits_comes_first_at_zero_marginal_price(policy: str) -> None:
    steps = plan(spec(A100_JOB, policy), [(ODCR, 2)]).steps
    assert steps[0].capacity_type is CapacityType.RESERVED
    [override] = steps[0].overrides
    assert (override.instance_type, override.zone, override.hourly_usd) == (
        "p4d.24xlarge",
        "us-east-1a",
        0.0,
    )
    assert override.reservation_id == ODCR.id and not override.capacity_block
    # Then what the spot policy allows.
    assert len(steps) == 1 + (2 if policy == "auto" else 1)


def test_capacity_blocks_are_used_before_odcrs() -> None:
    [override] = plan(spec(A100_JOB), [(ODCR, 2), (BLOCK, 4)]).steps[0].overrides
    assert override.reservation_id == BLOCK.id and override.capacity_block


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
