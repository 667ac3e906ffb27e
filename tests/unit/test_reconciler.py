"""The reconciler terminates what no live job holds, and nothing else."""

from __future__ import annotations

from typing import cast

from gpufleet.adapters.local.memory import FakeFleet, InMemoryObjects, ManualClock
from gpufleet.domain.launch import CapacityType, LaunchOverride, LaunchRequest
from gpufleet.domain.planning import LaunchPlan
from gpufleet.services.factory import build_lifecycle
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import NodeReport
from gpufleet.services.reconciler import ReconcilerService
from tests.helpers import SPEC_YAML, local_ports
from tests.unit.test_services import SETTINGS


def test_orphans_are_terminated_and_held_instances_are_kept() -> None:
    ports = local_ports()
    fleet = cast(FakeFleet, ports.fleet)
    clock = cast(ManualClock, ports.clock)
    lifecycle = build_lifecycle(ports, SETTINGS)
    jobs = []
    for name in ("running", "ended", "stuck"):
        key = f"jobs/{name}.yaml"
        cast(InMemoryObjects, ports.objects).objects[key] = SPEC_YAML
        job_id = IntakeService(ports).submit_object(key, key, key).job_id
        assert job_id is not None
        plan = LaunchPlan.model_validate(lifecycle.prepare(job_id)["plan"])
        lifecycle.launch(job_id, plan, 0, 0)
        jobs.append(job_id)
    running, ended, stuck = jobs
    instance = {j: ports.jobs.get(j).placement.instance_ids[0] for j in jobs}  # type: ignore[union-attr]
    lifecycle.node_report(
        NodeReport(job_id=running, instance_id=instance[running], phase="started")
    )
    lifecycle.record_outcome(ended, {"error": {"Error": "Boom"}})  # ended, instance left behind
    # A second fleet for the running job: its launch crashed after CreateFleet and was retried.
    leftover = fleet.launch(
        LaunchRequest(
            job_id=running,
            attempt=9,
            capacity_type=CapacityType.SPOT,
            nodes=1,
            overrides=[LaunchOverride(instance_type="g5.xlarge", hourly_usd=1.0)],
        )
    ).instance_ids[0]
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
