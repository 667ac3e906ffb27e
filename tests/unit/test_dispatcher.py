"""The dispatcher and the queue steps of the lifecycle, on in-memory adapters."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryJobQueue,
    InMemoryJobStore,
    InMemoryObjects,
    ManualClock,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.fair_share import usage_by_team
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.queueing import QueuePolicy, RunningJob, TeamQuota
from gpufleet.domain.spec import Priority
from gpufleet.ports import AdmissionLimits, Ports, QueueEntry
from gpufleet.services.dispatcher import DispatcherService
from gpufleet.services.factory import build_dispatcher, build_intake, build_lifecycle
from gpufleet.services.intake import IntakeService
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import (
    JobAlreadyEnded,
    control_key,
    queued_job,
    run_manifest_key,
)
from gpufleet.services.queue_listing import queue_listing
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from gpufleet.settings import Settings
from gpufleet.topology import DETAIL_JOB_QUEUED
from tests.helpers import enqueue, local_ports, make_settings, plan_of

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
    def __init__(self, settings: Settings = SETTINGS) -> None:
        self.ports: Ports = local_ports()
        self.lifecycle: LifecycleService = build_lifecycle(self.ports, settings)
        self.dispatcher: DispatcherService = build_dispatcher(self.ports, settings, self.lifecycle)
        self.intake: IntakeService = build_intake(self.ports, settings, self.lifecycle)
        self.tokens = 0
        self.plans: dict[str, LaunchPlan] = {}
        self.queue_tokens: dict[str, str] = {}  # each job's latest Enqueue token

    @property
    def clock(self) -> ManualClock:
        return cast(ManualClock, self.ports.clock)

    @property
    def workflow(self) -> RecordingWorkflow:
        return cast(RecordingWorkflow, self.ports.workflow)

    def submit(
        self,
        name: str,
        priority: str,
        gpus: int = 4,
        team: str = "research",
        expected_duration: str | None = None,
    ) -> str:
        expected = f"expected_duration: {expected_duration}\n" if expected_duration else ""
        body = (
            f"name: {name}\nteam: {team}\npriority: {priority}\nimage: img\ncommand: [x]\n"
            f"resources: {{gpus: {gpus}}}\ncheckpoint: s3://ckpt/{team}/{name}/\n{expected}"
        ).encode()
        key = f"jobs/{team}/{name}-{self.clock.now()}.yaml"
        cast(InMemoryObjects, self.ports.objects).objects[key] = body
        job_id = self.intake.submit_object(key, key, key).job_id
        assert job_id is not None
        self.plans[job_id] = plan_of(self.ports, job_id)
        self.clock.advance(1)  # submissions in a known order
        return job_id

    def enqueue(self, job_id: str) -> str:
        self.tokens += 1
        token = f"enqueue-{self.tokens}"
        enqueue(self.lifecycle, self.ports, job_id, token, self.plans[job_id])
        self.queue_tokens[job_id] = token
        return token

    def start(self, job_id: str) -> str:
        """Launch an admitted job, handing on what the dispatcher said (as the workflow does),
        and have its node report that it started."""
        admission = self.workflow.completed[self.queue_tokens[job_id]]
        assert admission["admitted"] is True
        self.tokens += 1
        token = f"run-{self.tokens}"
        plan = self.plans[job_id]
        assert (
            self.lifecycle.launch(
                job_id, plan, 0, self.tokens, token, Admission.model_validate(admission)
            )
            is None
        )
        instance = self.ports.jobs.get(job_id).placement.instance_ids[0]  # type: ignore[union-attr]
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
    queued_at = world.clock.now()
    tokens = [world.enqueue(first), world.enqueue(second)]
    world.clock.advance(30)
    before = world.ports.jobs.get(first)
    result = world.dispatcher.run_pass()
    assert result.admitted == [first]
    # The team's quota is full for every job it has waiting: the pass reads only the next, the
    # first job of the pass to wait for room, which holds the reservation.
    assert result.waiting == {second: "quota"} and result.blocked == {"research/normal": "quota"}
    assert result.waited_seconds == [30.0]
    # What the workflow hands to Launch, which notes the wait on the job.
    assert world.workflow.completed[tokens[0]] == {
        "admitted": True,
        "queued_at": queued_at,
        "admitted_at": queued_at + 30,
        "shortages_until": 0.0,  # no capacity shortage remembered: Launch need not look
    }
    assert tokens[1] not in world.workflow.completed
    assert world.ports.jobs.get(first) == before  # admission does not touch the job
    rows, _ = queue_listing(world.ports, POLICY)
    assert [(row.job_id, row.reason) for row in rows] == [(second, "quota")]

    world.start(first)
    job = world.ports.jobs.get(first)
    assert (job.waited_seconds, job.first_admitted_at) == (30.0, queued_at + 30)


def test_a_run_charges_its_team_and_the_next_pass_puts_the_other_team_first() -> None:
    teams = {"research": TeamQuota(gpus=4), "vision": TeamQuota(gpus=4)}
    policy = POLICY.model_copy(update={"max_gpus": 4, "teams": teams})
    world = World(make_settings(config=FleetConfig(queue=policy)))
    ran = world.submit("ran", "normal")
    world.enqueue(ran)
    assert world.dispatcher.run_pass().admitted == [ran]
    instance = world.start(ran)
    world.clock.advance(3600)
    run = world.finish(ran, instance)
    world.lifecycle.release(ran, WorkflowState.model_validate({"run": run}))
    ledgers = world.ports.queue.state().team_usage
    now, half_life = world.clock.now(), policy.fair_share_half_life_seconds
    # Its 4 GPUs for the hour it held its instance, charged to its team once.
    assert usage_by_team(ledgers, now, half_life) == {"research": pytest.approx(4.0, rel=0.01)}
    world.lifecycle.release(ran, WorkflowState.model_validate({"run": run}))  # repeated
    assert world.ports.queue.state().team_usage == ledgers
    # research's job came first, but vision has used nothing: vision's goes first.
    earlier = world.submit("earlier", "normal")
    later = world.submit("later", "normal", team="vision")
    world.enqueue(earlier)
    world.enqueue(later)
    rows, _ = queue_listing(world.ports, policy)  # `gpufleet queue` shows that order
    assert [(row.job_id, row.reason) for row in rows] == [(later, "next"), (earlier, "capacity")]
    assert world.dispatcher.run_pass().admitted == [later]


def test_a_pass_reports_the_queue_state_it_began_from() -> None:
    world = World()
    running = world.submit("run", "normal")
    world.enqueue(running)
    first = world.dispatcher.run_pass()
    assert first.admitted == [running]
    assert first.state is not None and first.state.running == []
    assert {p: n for p, n in first.state.waiting.items() if n} == {Priority.NORMAL: 1}
    world.start(running)
    for name, priority in (("h1", "high"), ("h2", "high"), ("l1", "low")):
        world.enqueue(world.submit(name, priority))
    state = world.dispatcher.run_pass().state
    assert state is not None
    assert [r.job.job_id for r in state.running] == [running] and state.gpus_held == 4
    assert {p: n for p, n in state.waiting.items() if n} == {Priority.HIGH: 2, Priority.LOW: 1}


class CountingQueue(InMemoryJobQueue):
    """Remembers which streams (team, class) a pass began to read."""

    def __init__(self, jobs: InMemoryJobStore) -> None:
        super().__init__(jobs)
        self.asked: list[tuple[str, Priority]] = []

    def stream(self, team: str, priority: Priority) -> Iterator[QueueEntry]:
        self.asked.append((team, priority))  # read from here on (the first page)
        yield from super().stream(team, priority)


def test_the_queue_reserves_by_the_plans_expected_run_time() -> None:
    world = World()
    first = world.submit("first", "normal", expected_duration="45m")
    second = world.submit("second", "normal", expected_duration="2h")
    world.enqueue(first)
    world.enqueue(second)
    assert {w.job.job_id: w.job.expected_seconds for w in world.ports.queue.waiting()} == {
        first: 2700,
        second: 7200,
    }
    now = world.clock.now()
    assert world.dispatcher.run_pass().admitted == [first]  # the team's 4 GPUs are taken
    held = world.ports.queue.state().running[0].job
    assert (held.job_id, held.expected_end) == (first, now + 2700)


def test_a_pass_reads_only_the_streams_that_have_jobs_and_may_admit_one() -> None:
    world = World()
    queue = CountingQueue(cast(InMemoryJobStore, world.ports.jobs))
    world.ports = replace(world.ports, queue=queue)
    world.lifecycle = build_lifecycle(world.ports, SETTINGS)
    world.dispatcher = build_dispatcher(world.ports, SETTINGS, world.lifecycle)
    world.intake = build_intake(world.ports, SETTINGS, world.lifecycle)

    assert world.dispatcher.run_pass(full=False).admitted == []
    assert world.dispatcher.run_pass().admitted == []
    assert queue.asked == []  # nothing waits: no stream is read at all
    low = world.submit("low", "low")
    world.enqueue(low)
    assert world.dispatcher.run_pass(full=False).admitted == [low]
    assert queue.asked == [("research", Priority.LOW)]
    world.start(low)
    # The team's quota is full: of its waiting jobs, whatever their number, only the first is
    # read (it holds the reservation).
    for index in range(3):
        world.enqueue(world.submit(f"more-{index}", "normal"))
    result = world.dispatcher.run_pass()
    assert result.admitted == [] and result.blocked == {"research/normal": "quota"}
    assert queue.asked == [("research", Priority.LOW), ("research", Priority.NORMAL)]
    assert result.items_read == 1


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
    assert (
        world.lifecycle.release(low, WorkflowState.model_validate({"run": run}))["requeue"] is True
    )
    world.plans[low] = world.lifecycle.requeue(low)
    job = world.ports.jobs.get(low)
    assert job.status is JobStatus.QUEUED and job.preemptions == 1 and job.prior_cost_usd > 0
    world.enqueue(low)

    # The preemptor gets the GPUs; the victim yields until it runs.
    rows, _ = queue_listing(world.ports, POLICY)
    assert {row.job_id: row.reason for row in rows} == {high: "next", low: "yielding"}
    result = world.dispatcher.run_pass()
    assert result.admitted == [high]
    high_instance = world.start(high)
    world.clock.advance(600)
    run = world.finish(high, high_instance)
    assert (
        world.lifecycle.release(high, WorkflowState.model_validate({"run": run}))["outcome"][
            "status"
        ]
        == "SUCCEEDED"
    )

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
    assert (
        world.lifecycle.release(low, WorkflowState.model_validate({"run": run}))["requeue"] is True
    )  # it was preempted


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
    assert world.ports.queue.state().running == []  # its share is back
    with pytest.raises(JobAlreadyEnded):
        world.lifecycle.cancel(running)
    # The workflow then releases it, which records the cost of what the cancelled run held.
    token = world.ports.jobs.get(running).task_token
    assert token is not None and world.workflow.completed[token]["cancelled"] is True
    released = world.lifecycle.release(
        running, WorkflowState.model_validate({"run": world.workflow.completed[token]})
    )
    assert released["requeue"] is False
    summary = released["outcome"]
    assert summary["status"] == "CANCELLED" and summary["cost_usd"] is not None


def test_an_admission_whose_notification_was_lost_is_sent_again() -> None:
    world = World()
    job_id = world.submit("a", "normal")
    token = world.enqueue(job_id)
    entry = next(world.ports.queue.stream("research", Priority.NORMAL))
    admitted_at = world.clock.now()
    world.ports.queue.admit(
        entry,
        RunningJob(job_id, "research", entry.job.priority, 4, 1, admitted_at),
        AdmissionLimits(8, 8, None),
    )
    # The dispatcher died here, before completing the task. The next pass does it.
    world.clock.advance(30)
    world.dispatcher.run_pass()
    # Told again with when it was admitted (the queue keeps it), not when it was told; its
    # wait is not known then: the launch notes none rather than a wrong one.
    assert world.workflow.completed[token] == {"admitted": True, "admitted_at": admitted_at}
    # Until its launch says so, a pass cannot know the workflow heard: it tells it again, and
    # that keeps the job's share.
    world.dispatcher.run_pass()
    [held] = world.ports.queue.state().running
    assert held.job.job_id == job_id and not held.notified
    world.start(job_id)
    assert world.ports.queue.state().running[0].notified
    job = world.ports.jobs.get(job_id)
    assert (job.first_admitted_at, job.waited_seconds) == (admitted_at, 0.0)


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
    assert (
        world.lifecycle.release(running, WorkflowState.model_validate({"run": run}))["requeue"]
        is True
    )
    world.plans[running] = world.lifecycle.requeue(running)
    # The next run is planned for the new shape, not the old one.
    from gpufleet.domain.catalog import load_bundled

    first_choice = world.plans[running].steps[0].overrides[0].instance_type
    assert load_bundled().instance_type(first_choice).gpus >= 4
    job = world.ports.jobs.get(running)
    assert job.effective_spec.resources.gpus == 4 and job.preemptions == 0
    world.enqueue(running)
    assert {e.job.job_id: e.job.gpus for e in world.ports.queue.waiting()}[running] == 4


def arrive(world: World, job_id: str) -> str:
    """The Enqueue task as the handler runs it: admitted on arrival (its task completed at
    once, and the handler counts the admission), or queued."""
    world.tokens += 1
    token = f"enqueue-{world.tokens}"
    queued = queued_job(world.ports.jobs.get(job_id))
    admitted = world.dispatcher.enqueue(queued, token, world.plans[job_id])
    assert admitted is (world.workflow.completed.get(token, {}).get("admitted") is True)
    world.queue_tokens[job_id] = token
    return token


def queued_events(world: World) -> list[dict[str, Any]]:
    return cast(RecordingPublisher, world.ports.events).of_type(DETAIL_JOB_QUEUED)


def test_a_job_that_arrives_when_nothing_waits_is_admitted_by_its_enqueue_task() -> None:
    world = World()
    job_id = world.submit("a", "normal")
    token = arrive(world, job_id)
    told = world.workflow.completed[token]
    assert told["admitted"] is True and told["queued_at"] == told["admitted_at"]
    state = world.ports.queue.state()
    assert [r.job.job_id for r in state.running] == [job_id]
    assert queued_events(world) == []  # no pass to wake
    assert world.dispatcher.run_pass().admitted == []  # and nothing left for one
    world.start(job_id)
    assert world.ports.jobs.get(job_id).status is JobStatus.RUNNING


def test_a_job_that_arrives_behind_waiting_jobs_or_over_its_quota_waits_for_a_pass() -> None:
    world = World()
    first, second, third = (world.submit(n, "normal") for n in ("a", "b", "c"))
    arrive(world, first)  # admitted: the team's 4 GPUs are taken
    second_token = arrive(world, second)  # over the quota: queued
    assert second_token not in world.workflow.completed
    assert [e["job_id"] for e in queued_events(world)] == [second]
    world.ports.queue.release(first)  # room again, but the second waits ahead of the third
    third_token = arrive(world, third)
    assert third_token not in world.workflow.completed
    assert world.dispatcher.run_pass().admitted == [second]  # in its place


def test_a_job_cancelled_before_it_arrives_is_neither_admitted_nor_queued() -> None:
    world = World()
    job_id = world.submit("a", "normal")
    world.lifecycle.cancel(job_id)
    token = arrive(world, job_id)
    assert world.workflow.completed[token] == {"cancelled": True}
    state = world.ports.queue.state()
    assert state.running == [] and world.ports.queue.waiting() == []


def test_jobs_blocked_ahead_in_any_number_do_not_hide_a_job_of_another_team_that_fits() -> None:
    world = World()
    held = world.submit("held", "critical")
    world.enqueue(held)
    assert world.dispatcher.run_pass().admitted == [held]  # research's 4 GPUs are taken
    # More than a pass once considered, older and of the same class: each over research's quota,
    # with nothing of a lower class to preempt.
    blocked = [world.submit(f"blocked-{i}", "critical") for i in range(250)]
    for job_id in blocked:
        world.enqueue(job_id)
    urgent = world.submit("urgent", "critical", gpus=1, team="ops")
    world.enqueue(urgent)
    result = world.dispatcher.run_pass()
    assert result.admitted == [urgent]
    # Of the research stream only its first job is read (for the reservation): its shapes show
    # that nothing of it fits.
    assert result.blocked == {"research/critical": "quota"} and result.items_read == 2
