from __future__ import annotations

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.launch import CapacityType, ErrorCategory, LaunchOverride
from gpufleet.domain.planning import LaunchPlan, LaunchStep, plan_launch
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.spec import JobSpec, parse_spec


def spec(spot: str = "auto", resources: str = "{gpus: 1, gpu_memory_gib: 16}") -> object:
    return parse_spec(
        f"name: t\nteam: ml\nimage: img\ncommand: [x]\nspot: {spot}\nresources: {resources}\n"
        "timeout: 1h\n"
    )


def plan(spot: str = "auto", resources: str = "{gpus: 1, gpu_memory_gib: 16}") -> LaunchPlan:
    return plan_for(spec(spot, resources))  # type: ignore[arg-type]


def plan_for(job_spec: JobSpec) -> LaunchPlan:
    """The plan for `job_spec` in us-east-1 with the bundled catalog."""
    return plan_launch(
        job_spec,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=5,
        retry_wait_seconds=30,
        boot_allowance_seconds=600,
        heartbeat_timeout_seconds=300,
        expected=DurationEstimate(3600, "default"),
    )


@pytest.mark.parametrize(
    ("spot", "capacity_types"),
    [
        ("auto", [CapacityType.SPOT, CapacityType.ON_DEMAND]),
        ("required", [CapacityType.SPOT]),
        ("never", [CapacityType.ON_DEMAND]),
    ],
)
def test_steps_follow_the_spot_policy(spot: str, capacity_types: list[CapacityType]) -> None:
    assert [step.capacity_type for step in plan(spot).steps] == capacity_types


def test_each_step_is_diversified_and_fits_the_job() -> None:
    catalog = load_bundled()
    for step in plan().steps:
        types = {o.instance_type for o in step.overrides}
        assert len(types) >= 2
        for override in step.overrides:
            instance = catalog.instance_type(override.instance_type)
            assert instance.gpus >= 1 and instance.gpu_memory_gib >= 16
            assert override.hourly_usd > 0


def test_timeouts_add_the_boot_allowance() -> None:
    assert plan().run_timeout_seconds == 3600 + 600
    assert plan().heartbeat_timeout_seconds == 300 + 600


def test_a_short_jobs_heartbeat_stays_below_its_task_timeout() -> None:
    """Step Functions refuses a task whose HeartbeatSeconds is not below its TimeoutSeconds:
    a 1-minute job's run timeout (60 + 600 s) is under the usual heartbeat window (900 s)."""
    short = parse_spec("name: t\nteam: ml\nimage: img\ncommand: [x]\ntimeout: 60\n")
    launch = plan_launch(
        short,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=5,
        retry_wait_seconds=30,
        boot_allowance_seconds=600,
        heartbeat_timeout_seconds=900,
        expected=DurationEstimate(60, "default"),
    )
    assert launch.heartbeat_timeout_seconds < launch.run_timeout_seconds == 660
    with pytest.raises(ValueError, match="heartbeat"):
        LaunchPlan.model_validate(launch.model_dump() | {"heartbeat_timeout_seconds": 660})


def test_an_impossible_job_names_the_constraint() -> None:
    with pytest.raises(NoFeasibleOffering) as caught:
        plan(resources="{gpus: 8, gpu_memory_gib: 500}")
    assert "500" in str(caught.value) or "memory" in str(caught.value)


def two_step_plan(max_attempts: int = 5) -> LaunchPlan:
    override = [LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)]
    return LaunchPlan(
        nodes=1,
        steps=[
            LaunchStep(capacity_type=CapacityType.SPOT, overrides=override),
            LaunchStep(capacity_type=CapacityType.ON_DEMAND, overrides=override),
        ],
        max_launch_attempts=max_attempts,
        retry_wait_seconds=10,
        run_timeout_seconds=100,
        heartbeat_timeout_seconds=50,
        expected_seconds=3600,
        expected_source="default",
    )


def test_capacity_errors_fall_back_then_wait_then_give_up() -> None:
    p = two_step_plan(max_attempts=3)
    assert p.after_failure(0, 1, ErrorCategory.CAPACITY).step == 1
    waited = p.after_failure(1, 2, ErrorCategory.CAPACITY)
    assert waited.retry_later and waited.step == 0
    assert p.after_failure(0, 3, ErrorCategory.CAPACITY).give_up


def test_configuration_errors_give_up_at_once() -> None:
    assert two_step_plan().after_failure(0, 1, ErrorCategory.CONFIGURATION).give_up


def test_the_override_chosen_prefers_the_zone_specific_one() -> None:
    step = LaunchStep(
        capacity_type=CapacityType.SPOT,
        overrides=[
            LaunchOverride(instance_type="g5.xlarge", zone="us-east-1a", hourly_usd=1.0),
            LaunchOverride(instance_type="g5.xlarge", zone="us-east-1b", hourly_usd=2.0),
        ],
    )
    assert step.override_for("g5.xlarge", "us-east-1b").hourly_usd == 2.0
    assert step.override_for("g5.xlarge", "us-east-1f").hourly_usd == 1.0
    with pytest.raises(ValueError, match="not among"):
        step.override_for("p5.48xlarge", None)


def test_waiting_for_capacity_backs_off_exponentially_up_to_a_cap() -> None:
    plan = two_step_plan(max_attempts=100)
    waits = [
        plan.after_failure(1, attempts, ErrorCategory.CAPACITY).wait_seconds
        for attempts in (2, 4, 6, 8, 40)
    ]
    assert waits == [10, 20, 40, 80, 900]
