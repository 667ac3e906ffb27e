from __future__ import annotations

import itertools

import pytest

from gpufleet.domain.cost import fleet_hourly_usd, held_seconds, run_cost_usd
from gpufleet.domain.job import (
    TERMINAL_STATUSES,
    JobStatus,
    Placement,
    can_transition,
    job_id_for_delivery,
)
from gpufleet.domain.launch import (
    CapacityType,
    ErrorCategory,
    LaunchError,
    LaunchResult,
    classify_launch_error,
    worst_category,
)

HAPPY_PATH = [
    JobStatus.SUBMITTED,
    JobStatus.QUEUED,
    JobStatus.LAUNCHING,
    JobStatus.RUNNING,
    JobStatus.SUCCEEDED,
]


def test_the_happy_path_is_legal_step_by_step() -> None:
    for current, target in itertools.pairwise(HAPPY_PATH):
        assert can_transition(current, target)


def test_terminal_statuses_never_move() -> None:
    for terminal, target in itertools.product(TERMINAL_STATUSES, JobStatus):
        assert not can_transition(terminal, target)


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (JobStatus.SUBMITTED, JobStatus.RUNNING),
        (JobStatus.QUEUED, JobStatus.SUCCEEDED),
        (JobStatus.SUBMITTED, JobStatus.SUCCEEDED),
        (JobStatus.RUNNING, JobStatus.LAUNCHING),
        (JobStatus.QUEUED, JobStatus.SUBMITTED),
    ],
)
def test_skips_and_reversals_are_illegal(current: JobStatus, target: JobStatus) -> None:
    assert not can_transition(current, target)


def test_requeue_and_cancel_are_legal_from_live_states() -> None:
    assert can_transition(JobStatus.RUNNING, JobStatus.QUEUED)
    assert can_transition(JobStatus.LAUNCHING, JobStatus.QUEUED)
    for live in (JobStatus.SUBMITTED, JobStatus.QUEUED, JobStatus.LAUNCHING, JobStatus.RUNNING):
        assert can_transition(live, JobStatus.CANCELLED)
        assert can_transition(live, JobStatus.FAILED)


def test_job_ids_are_stable_per_delivery_and_distinct_across_deliveries() -> None:
    first = job_id_for_delivery("s3://b/jobs/a.yaml#v1")
    assert first == job_id_for_delivery("s3://b/jobs/a.yaml#v1")
    assert first != job_id_for_delivery("s3://b/jobs/a.yaml#v2")
    assert first.startswith("j-") and len(first) == 22


@pytest.mark.parametrize(
    ("code", "category"),
    [
        ("InsufficientInstanceCapacity", ErrorCategory.CAPACITY),
        ("InsufficientHostCapacity", ErrorCategory.CAPACITY),
        ("MaxSpotInstanceCountExceeded", ErrorCategory.CAPACITY),
        ("SpotMaxPriceTooLow", ErrorCategory.CAPACITY),
        ("UnfulfillableCapacity", ErrorCategory.CAPACITY),
        ("Unsupported", ErrorCategory.CAPACITY),
        ("VcpuLimitExceeded", ErrorCategory.QUOTA),
        ("MaxFleetCountExceeded", ErrorCategory.QUOTA),
        ("InsufficientFreeAddressesInSubnet", ErrorCategory.QUOTA),
        ("ReservationCapacityExceeded", ErrorCategory.CAPACITY),
        ("VolumeLimitExceeded", ErrorCategory.QUOTA),
        ("InvalidLaunchTemplateId.NotFound", ErrorCategory.CONFIGURATION),
        ("UnauthorizedOperation", ErrorCategory.CONFIGURATION),
        # The spot-request tag on a launch that makes none: our template's fault.
        ("InvalidParameterValue", ErrorCategory.CONFIGURATION),
        # EC2's server errors and throttling: the same launch may work in a moment.
        ("InternalError", ErrorCategory.TRANSIENT),
        ("Unavailable", ErrorCategory.TRANSIENT),
        ("RequestLimitExceeded", ErrorCategory.TRANSIENT),
        ("IdempotentParameterMismatch", ErrorCategory.TRANSIENT),
        # Created a moment before the launch: EC2 may not see it yet.
        ("InvalidPlacementGroup.Unknown", ErrorCategory.TRANSIENT),
        # A code EC2 adds tomorrow is retried (within the plan's attempts), not fatal.
        ("SomeCodeEc2AddsLater", ErrorCategory.TRANSIENT),
    ],
)
def test_every_fleet_error_code_has_a_category(code: str, category: ErrorCategory) -> None:
    assert classify_launch_error(code) is category


def test_the_most_fundamental_error_decides() -> None:
    assert worst_category(["InsufficientInstanceCapacity", "VcpuLimitExceeded"]) is (
        ErrorCategory.QUOTA
    )
    assert worst_category(["InsufficientInstanceCapacity", "InvalidParameterValue"]) is (
        ErrorCategory.CONFIGURATION
    )
    assert worst_category(["InsufficientInstanceCapacity", "InternalError"]) is (
        ErrorCategory.CAPACITY
    )
    assert worst_category(["InternalError"]) is ErrorCategory.TRANSIENT
    assert worst_category(["InsufficientInstanceCapacity"]) is ErrorCategory.CAPACITY


def test_a_launch_result_without_instances_is_a_failure_with_a_category() -> None:
    failed = LaunchResult(
        capacity_type=CapacityType.SPOT,
        errors=[LaunchError(code="InsufficientInstanceCapacity")],
    )
    assert not failed.launched
    assert failed.error_category is ErrorCategory.CAPACITY
    launched = LaunchResult(instance_ids=["i-1"], capacity_type=CapacityType.SPOT)
    assert launched.launched and launched.error_category is None


def test_cost_is_every_node_for_every_second_held() -> None:
    placement = Placement(
        instance_ids=["i-1", "i-2"],
        instance_type="p4d.24xlarge",
        capacity_type="spot",
        hourly_usd=10.0,
        launched_at=1000.0,
    )
    assert fleet_hourly_usd(placement) == 20.0
    assert held_seconds(placement, 1000.0 + 1800) == 1800
    assert run_cost_usd(placement, 1000.0 + 1800) == pytest.approx(10.0)
    # A release time before the launch (clock skew) never yields a negative cost.
    assert run_cost_usd(placement, 500.0) == 0.0


def test_month_to_date_spend_counts_ended_and_running_jobs_of_this_month() -> None:
    from gpufleet.domain.cost import month_start, spend_this_month_usd
    from gpufleet.domain.job import Job
    from gpufleet.domain.spec import parse_spec

    now = 1_767_225_600.0 + 10 * 86400  # 2026-01-11
    spec = parse_spec("name: a\nteam: t\nimage: i\ncommand: [x]\n")
    placement = Placement(
        instance_ids=["i-1"],
        instance_type="g5.xlarge",
        capacity_type="spot",
        hourly_usd=2.0,
        launched_at=now - 1800,
    )

    def job(created: float, **fields: object) -> Job:
        return Job(
            job_id=f"j-{created}",
            status=JobStatus.RUNNING,
            spec=spec,
            source="s",
            created_at=created,
            updated_at=created,
        ).model_copy(update=fields)

    jobs = [
        job(now - 3600, cost_usd=10.0, status=JobStatus.SUCCEEDED),
        job(now - 3600, placement=placement, prior_cost_usd=0.5),  # running: 0.5 + 1.0
        job(month_start(now) - 60, cost_usd=99.0, status=JobStatus.SUCCEEDED),  # last month
    ]
    assert spend_this_month_usd(jobs, now) == pytest.approx(11.5)
