from __future__ import annotations

import pytest

from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.launch import CapacityType, ErrorCategory, LaunchOverride
from gpufleet.domain.planning import (
    LaunchPlan,
    LaunchStep,
    job_observed_hazard,
    plan_launch,
    rank_offerings,
)
from gpufleet.domain.selection import NoFeasibleOffering, observed_hazard
from gpufleet.domain.spec import JobSpec, SpotPolicy, parse_spec


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


def plan_with(job_spec: JobSpec, observed: float, hours: float = 10.0) -> LaunchPlan:
    return plan_launch(
        job_spec,
        load_bundled(),
        "us-east-1",
        max_launch_attempts=5,
        retry_wait_seconds=30,
        boot_allowance_seconds=600,
        heartbeat_timeout_seconds=300,
        expected=DurationEstimate(int(hours * 3600), "spec"),
        observed_hazard=observed,
    )


def test_auto_puts_on_demand_first_when_spot_is_dearer_in_expectation() -> None:
    """The step order of `auto` is selection's expected cost to finish: spot first while spot
    is cheaper, on-demand first (spot still allowed, after it) once the rework makes it dearer."""
    gang = spec(resources="{gpus: 8, gpu_memory_gib: 40, nodes: 2}")
    spot_first = plan_with(gang, observed=0.0)  # type: ignore[arg-type]
    assert [s.capacity_type for s in spot_first.steps] == [
        CapacityType.SPOT,
        CapacityType.ON_DEMAND,
    ]
    assert spot_first.is_on_demand_fallback(1)
    od_first = plan_with(gang, observed=0.2)  # type: ignore[arg-type]
    assert [s.capacity_type for s in od_first.steps] == [CapacityType.ON_DEMAND, CapacityType.SPOT]
    assert not od_first.is_on_demand_fallback(0)
    # Admission budgets against the first choice: the on-demand price now.
    assert od_first.steps[0].overrides[0].hourly_usd > spot_first.steps[0].overrides[0].hourly_usd
    # `required` and `never` keep their one capacity type whatever the hazard.
    required = plan_with(spec("required", "{gpus: 8, gpu_memory_gib: 40, nodes: 2}"), 0.2)  # type: ignore[arg-type]
    assert [s.capacity_type for s in required.steps] == [CapacityType.SPOT]


def test_the_order_follows_the_cheapest_expected_cost_of_each_capacity_type() -> None:
    catalog = load_bundled()
    gang = spec(resources="{gpus: 8, gpu_memory_gib: 40, nodes: 2}")
    for observed in (0.0, 0.01, 0.05, 0.1, 0.2, 0.5):
        costs = {
            capacity: rank_offerings(
                gang.resources,  # type: ignore[attr-defined]
                policy,
                catalog,
                "us-east-1",
                expected=DurationEstimate(36000, "spec"),
                checkpoint_interval_seconds=None,
                observed_hazard=observed,
            ).best.expected_cost_usd
            for capacity, policy in (
                (CapacityType.SPOT, SpotPolicy.REQUIRED),
                (CapacityType.ON_DEMAND, SpotPolicy.NEVER),
            )
        }
        first = plan_with(gang, observed).steps[0].capacity_type  # type: ignore[arg-type]
        assert first is min(costs, key=lambda c: costs[c])


def test_a_jobs_observed_hazard_reads_its_interruptions_and_spot_time() -> None:
    job_spec = spec(resources="{gpus: 8, gpu_memory_gib: 40, nodes: 2}")
    job = Job(
        job_id="j-0123456789abcdef0123",
        status=JobStatus.QUEUED,
        spec=job_spec,  # type: ignore[arg-type]
        source="test",
        created_at=0.0,
        updated_at=0.0,
        interruptions=3,
        spot_held_seconds=6 * 3600.0,
    )
    assert job_observed_hazard(job) == observed_hazard(3, 6 * 3600.0, 2) == 0.0794
    assert job_observed_hazard(job.model_copy(update={"interruptions": 0})) == 0.0


def _spot_costs_and_ceiling(job: JobSpec, observed: float) -> tuple[dict, float]:
    """Each spot offering's expected cost, and the best on-demand one's (10 h runs)."""
    ranked = {
        policy: rank_offerings(
            job.resources,
            policy,
            load_bundled(),
            "us-east-1",
            expected=DurationEstimate(36000, "spec"),
            checkpoint_interval_seconds=None,
            observed_hazard=observed,
        )
        for policy in (SpotPolicy.REQUIRED, SpotPolicy.NEVER)
    }
    costs = {
        (r.offering.instance_type.name, r.offering.zone): r.expected_cost_usd
        for r in ranked[SpotPolicy.REQUIRED]
    }
    return costs, ranked[SpotPolicy.NEVER].best.expected_cost_usd


def test_the_spot_step_goes_wide_but_never_past_the_on_demand_fallback() -> None:
    """A full cheapest spot pool should send the launch to the next spot types while they are
    cheaper in expectation than on-demand, and never to a spot type dearer than it."""
    one_gpu = plan_with(spec(), 0.0).steps[0]  # type: ignore[arg-type]
    assert one_gpu.capacity_type is CapacityType.SPOT
    assert len({o.instance_type for o in one_gpu.overrides}) > 3
    gang = spec(resources="{gpus: 8, gpu_memory_gib: 40, nodes: 2}")
    costs, ceiling = _spot_costs_and_ceiling(gang, 0.05)  # type: ignore[arg-type]
    spot_step = plan_with(gang, 0.05).steps[0]  # type: ignore[arg-type]
    assert spot_step.capacity_type is CapacityType.SPOT
    assert all(costs[(o.instance_type, o.zone)] <= ceiling for o in spot_step.overrides)
    # Without an on-demand fallback (`required`) nothing caps the spot step but its size.
    required = plan_with(spec("required", "{gpus: 8, gpu_memory_gib: 40, nodes: 2}"), 0.05)  # type: ignore[arg-type]
    assert any(costs[(o.instance_type, o.zone)] > ceiling for o in required.steps[0].overrides)
