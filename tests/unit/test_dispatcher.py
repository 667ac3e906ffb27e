"""The dispatcher and the queue steps of the lifecycle, on in-memory adapters."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryObjects,
    ManualClock,
    RecordingWorkflow,
)
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.queueing import QueuePolicy, RunningJob, TeamQuota
from gpufleet.ports import AdmissionLimits, Ports
from gpufleet.services.dispatcher import DispatcherService, queue_listing
from gpufleet.services.factory import build_dispatcher, build_lifecycle
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import (
    JobAlreadyEnded,
    LifecycleService,
    NodeReport,
    control_key,
    run_manifest_key,
)
from tests.helpers import local_ports, make_settings

POLICY = QueuePolicy(
    max_gpus=8,
    max_instances=8,
    reserve_share=0.0,
    min_runtime_seconds=60,
    preemption_grace_seconds=120,
    teams={"research": TeamQuota(gpus=4, borrow=0)},
)
SETTINGS = make_settings(config=FleetConfig(queue=POLICY))


class World:
    def __init__(self) -> None:
        self.ports: Ports = local_ports()
        self.lifecycle: LifecycleService = build_lifecycle(self.ports, SETTINGS)
        self.dispatcher: DispatcherService = build_dispatcher(self.ports, SETTINGS, self.lifecycle)
        self.tokens = 0
        self.plans: dict[str, LaunchPlan] = {}

    @property
    def clock(self) -> ManualClock:
        return cast(ManualClock, self.ports.clock)

    @property
    def workflow(self) -> RecordingWorkflow:
        return cast(RecordingWorkflow, self.ports.workflow)

    def submit(self, name: str, priority: str, gpus: int = 4) -> str:
        body = (
            f"name: {name}\nteam: research\npriority: {priority}\nimage: img\ncommand: [x]\n"
            f"resources: {{gpus: {gpus}}}\ncheckpoint: s3://ckpt/{name}/\n"
        ).encode()
        key = f"jobs/{name}-{self.clock.now()}.yaml"
        cast(InMemoryObjects, self.ports.objects).objects[key] = body
        job_id = IntakeService(self.ports).submit_object(key, key, key).job_id
        assert job_id is not None
        self.plans[job_id] = LaunchPlan.model_validate(self.lifecycle.prepare(job_id)["plan"])
        self.clock.advance(1)  # submissions in a known order
        return job_id

    def enqueue(self, job_id: str) -> str:
        self.tokens += 1
        token = f"enqueue-{self.tokens}"
        self.lifecycle.enqueue(job_id, token, self.plans[job_id])
        return token

    def start(self, job_id: str) -> str:
        """Launch an admitted job and have its node report that it started."""
        assert self.lifecycle.launch(job_id, self.plans[job_id], 0, self.tokens).launched
        instance = self.ports.jobs.get(job_id).placement.instance_ids[0]  # type: ignore[union-attr]
        self.tokens += 1
        self.lifecycle.await_node(job_id, f"node-{self.tokens}")
        self.lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
        return instance

    def finish(self, job_id: str, instance: str) -> dict[str, Any]:
        self.lifecycle.node_report(
            NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
        )
        token = self.ports.jobs.get(job_id).task_token
        assert token is not None
        return self.workflow.completed[token]


def test_admission_completes_the_parked_task_within_the_quota() -> None:
    world = World()
    first, second = world.submit("a", "normal"), world.submit("b", "normal")
    tokens = [world.enqueue(first), world.enqueue(second)]
    result = world.dispatcher.run_pass()
    assert result.admitted == [first]
    assert result.waiting == {second: "quota"}
    assert world.workflow.completed[tokens[0]] == {"admitted": True}
    assert tokens[1] not in world.workflow.completed
    rows, _ = queue_listing(world.ports, POLICY)
    assert [(row.job_id, row.reason) for row in rows] == [(second, "quota")]


def test_a_high_priority_job_preempts_resumes_the_victim_from_its_checkpoint() -> None:
    world = World()
    low = world.submit("low", "low")
    world.enqueue(low)
    world.dispatcher.run_pass()
    low_instance = world.start(low)

    world.clock.advance(120)  # past the minimum runtime
    high = world.submit("high", "high")
    world.enqueue(high)
    result = world.dispatcher.run_pass()
    assert result.preempted == [low] and result.admitted == []
    control = cast(InMemoryObjects, world.ports.objects).objects[control_key(low)]
    assert json.loads(control)["action"] == "checkpoint"

    # The node checkpoints and stops; the workflow releases it and requeues it.
    run = world.finish(low, low_instance)
    assert world.lifecycle.release(low, {"run": run})["requeue"] is True
    world.plans[low] = world.lifecycle.requeue(low)
    job = world.ports.jobs.get(low)
    assert job.status is JobStatus.QUEUED and job.preemptions == 1 and job.prior_cost_usd > 0
    world.enqueue(low)

    # The preemptor gets the GPUs; the victim yields until it runs.
    result = world.dispatcher.run_pass()
    assert result.admitted == [high]
    assert result.waiting == {low: "yielding"}
    high_instance = world.start(high)
    world.clock.advance(600)
    world.finish(high, high_instance)
    world.lifecycle.release(high)
    world.lifecycle.record_outcome(high, {"run": {"exit_code": 0}})

    assert world.dispatcher.run_pass().admitted == [low]
    world.start(low)
    manifest = json.loads(cast(InMemoryObjects, world.ports.objects).objects[run_manifest_key(low)])
    assert manifest["resume"] is True  # the relaunch resumes from the checkpoint


def test_a_victim_that_does_not_checkpoint_in_time_is_stopped_and_requeued() -> None:
    world = World()
    low = world.submit("low", "low")
    world.enqueue(low)
    world.dispatcher.run_pass()
    world.start(low)
    world.clock.advance(120)
    world.enqueue(world.submit("high", "high"))
    world.dispatcher.run_pass()
    world.clock.advance(POLICY.preemption_grace_seconds + 1)
    result = world.dispatcher.run_pass()
    assert result.forced == [low]
    assert cast(FakeFleet, world.ports.fleet).live == {}
    token = world.ports.jobs.get(low).task_token
    run = world.workflow.completed[token]
    assert run["exit_code"] is None
    assert world.lifecycle.release(low, {"run": run})["requeue"] is True  # it was preempted


def test_cancel_a_waiting_job_and_a_running_one() -> None:
    world = World()
    running, waiting = world.submit("run", "normal"), world.submit("wait", "normal")
    world.enqueue(running)
    waiting_token = world.enqueue(waiting)
    world.dispatcher.run_pass()
    world.start(running)

    assert world.lifecycle.cancel(waiting)["status"] == "CANCELLED"
    assert world.workflow.completed[waiting_token] == {"cancelled": True}
    assert world.ports.queue.waiting() == []

    assert world.lifecycle.cancel(running)["status"] == "CANCELLED"
    assert cast(FakeFleet, world.ports.fleet).live == {}  # released at once
    assert world.ports.queue.running() == []  # its share is back
    with pytest.raises(JobAlreadyEnded):
        world.lifecycle.cancel(running)
    # The workflow then records the cost of what the cancelled run held.
    summary = world.lifecycle.record_outcome(running, {"run": {"cancelled": True}})
    assert summary["status"] == "CANCELLED" and summary["cost_usd"] is not None


def test_an_admission_whose_notification_was_lost_is_sent_again() -> None:
    world = World()
    job_id = world.submit("a", "normal")
    token = world.enqueue(job_id)
    entry = world.ports.queue.candidates(world.clock.now(), POLICY, 1)[0]
    world.ports.queue.admit(
        entry,
        RunningJob(job_id, "research", entry.job.priority, 4, 1, world.clock.now()),
        AdmissionLimits(8, 8, None),
    )
    # The dispatcher died here, before completing the task. The next pass does it.
    world.dispatcher.run_pass()
    assert world.workflow.completed[token] == {"admitted": True}
    assert world.ports.queue.running()[0].notified


def test_resize_a_waiting_job_and_a_running_one() -> None:
    world = World()
    running, waiting = world.submit("run", "normal", gpus=2), world.submit("wait", "normal")
    world.enqueue(running)
    world.enqueue(waiting)
    world.dispatcher.run_pass()
    instance = world.start(running)

    from gpufleet.domain.spec import Resources

    world.lifecycle.resize(waiting, Resources(gpus=1))
    [entry] = world.ports.queue.waiting()
    assert entry.job.gpus == 1  # waits with its new shape

    world.lifecycle.resize(running, Resources(gpus=4))
    control = cast(InMemoryObjects, world.ports.objects).objects[control_key(running)]
    assert json.loads(control)["action"] == "checkpoint"
    run = world.finish(running, instance)
    assert world.lifecycle.release(running, {"run": run})["requeue"] is True
    world.plans[running] = world.lifecycle.requeue(running)
    # The next run is planned for the new shape, not the old one.
    from gpufleet.domain.catalog import load_bundled

    first_choice = world.plans[running].steps[0].overrides[0].instance_type
    assert load_bundled().instance_type(first_choice).gpus >= 4
    job = world.ports.jobs.get(running)
    assert job.effective_spec.resources.gpus == 4 and job.preemptions == 0
    world.enqueue(running)
    assert {e.job.job_id: e.job.gpus for e in world.ports.queue.waiting()}[running] == 4
