"""The reconciler terminates what no live job holds, and nothing else."""

from __future__ import annotations

from typing import cast

from gpufleet.adapters.local.memory import FakeFleet, InMemoryObjects, ManualClock, in_memory_ports
from gpufleet.domain.config import WarmPool
from gpufleet.domain.job import JobStatus
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.lifecycle import NodeReport
from gpufleet.services.reconciler import ReconcilerService
from tests.helpers import SPEC_YAML, local_ports, plan_of
from tests.unit.test_services import SETTINGS


def test_orphans_are_terminated_and_held_instances_are_kept() -> None:
    ports = local_ports()
    fleet = cast(FakeFleet, ports.fleet)
    clock = cast(ManualClock, ports.clock)
    lifecycle = build_lifecycle(ports, SETTINGS)
    intake = build_intake(ports, SETTINGS, lifecycle)
    jobs = []
    for name in ("running", "ended", "stuck"):
        key = f"jobs/{name}.yaml"
        cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
        job_id = intake.submit_object(key, key, key).job_id
        assert job_id is not None
        assert lifecycle.launch(job_id, plan_of(ports, job_id), 0, 0, f"token-{name}") is None
        jobs.append(job_id)
    running, ended, stuck = jobs
    instance = {j: ports.jobs.get(j).placement.instance_ids[0] for j in jobs}  # type: ignore[union-attr]
    lifecycle.node_report(
        NodeReport(job_id=running, instance_id=instance[running], phase="started")
    )
    # Ended with its instance left behind (its Release kept failing: ReleaseFailed).
    ports.jobs.transition(ended, JobStatus.FAILED, clock.now(), {"failure_reason": "Boom"})
    # A second fleet for the running job: a launch crashed after CreateFleet, and the retry that
    # recorded the job's placement did not see it (EC2 lists new instances late).
    leftover = "i-" + "f" * 17
    fleet.live[leftover] = fleet.owners[leftover] = running
    for instance_id in fleet.live:
        fleet.launched_at[instance_id] = clock.now()

    reconciler = ReconcilerService(ports, grace_seconds=300, boot_allowance_seconds=900)
    assert reconciler.run().terminated == {}  # everything is younger than the grace period

    clock.advance(600)
    result = reconciler.run()
    assert set(result.terminated) == {instance[ended], leftover}
    assert instance[running] in fleet.live and instance[stuck] in fleet.live

    clock.advance(600)  # the stuck job's node never reported in
    assert set(reconciler.run().terminated) == {instance[stuck]}
    assert set(fleet.live) == {instance[running]}


def test_the_warm_pool_is_kept_full_while_in_demand_and_released_after_its_ttl() -> None:
    clock = ManualClock()
    pool = WarmPool(instance_type="g5.xlarge", count=2, ttl_minutes=30)
    fleet = FakeFleet(warm_pool=pool, clock=clock)
    ports = in_memory_ports(fleet=fleet, clock=clock)
    reconciler = ReconcilerService(
        ports, grace_seconds=300, boot_allowance_seconds=900, warm_pool=pool
    )
    first = reconciler.run()
    assert len(first.warm_launched) == 2  # a new pool starts in demand
    assert first.terminated == {}  # idle warm instances are nobody's orphans
    assert reconciler.run().warm_launched == []  # already full

    clock.advance(600)
    taken = fleet.launch(
        LaunchRequest(
            job_id="j-00000000000000000001",
            attempt=0,
            capacity_type=CapacityType.SPOT,
            nodes=1,
            overrides=[LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)],
        )
    ).instance_ids
    assert taken[0] in first.warm_launched
    refill = reconciler.run()
    assert len(refill.warm_launched) == 1  # the claim was demand: topped up again

    # Nobody asks for the type for a TTL: what waited that long is released, nothing replaces it.
    clock.advance(30 * 60 - 60)
    assert reconciler.run().warm_released == []  # still in demand
    clock.advance(60)
    released = reconciler.run()
    idle = sorted({*first.warm_launched, *refill.warm_launched} - set(taken))
    assert released.warm_released == idle and released.warm_launched == []
    assert [i for i in fleet.managed_instances() if i.warm] == []
    assert reconciler.run().warm_launched == []  # out of demand: stays empty
