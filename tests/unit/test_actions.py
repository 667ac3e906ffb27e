"""What a running job's metric alarms do, and the MetricWatch pass that decides when they go
off, against the in-memory adapters."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    InMemoryMetrics,
    InMemoryObjects,
    RecordingNotifier,
    RecordingPublisher,
    RecordingWorkflow,
)
from gpufleet.domain.config import MetricPolicy
from gpufleet.domain.job import JobStatus
from gpufleet.domain.scaling import AlarmKind, SeriesQuery
from gpufleet.domain.settlement import MEMORY_LEAK, RESIZED
from gpufleet.services.actions import MetricActions
from gpufleet.services.factory import build_actions, build_lifecycle, build_metric_watch
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import control_key
from gpufleet.services.metric_watch import WatchResult
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import WorkflowState
from gpufleet.topology import (
    DETAIL_JOB_FLAGGED,
    DETAIL_JOB_SCALED,
    GPU_MEMORY_METRIC,
    GPU_UTILIZATION_METRIC,
)
from tests.helpers import intake_for, local_ports, make_settings, plan_of

SETTINGS = make_settings()
ELASTIC = "resources: {gpus: 1, nodes: 2, elastic: {min_nodes: 1, max_nodes: 4}}\n"


class Running:
    """One job of the given spec, launched and started on the in-memory ports."""

    def __init__(self, body: str = "") -> None:
        self.ports = local_ports()
        key = "jobs/vision/job.yaml"
        spec = f"name: train\nteam: vision\nimage: img\ncommand: [python, train.py]\n{body}"
        cast(InMemoryObjects, self.ports.objects).objects[key] = spec.encode()
        job_id = intake_for(self.ports, SETTINGS).submit_object(key, key, key).job_id
        assert job_id is not None
        self.job_id = job_id
        self.lifecycle: LifecycleService = build_lifecycle(self.ports, SETTINGS)
        self.actions: MetricActions = build_actions(self.ports, SETTINGS, self.lifecycle)
        self.start()

    def start(self, token: str = "token") -> None:
        plan = plan_of(self.ports, self.job_id)
        assert self.lifecycle.launch(self.job_id, plan, 0, 0, task_token=token) is None
        placement = self.job().placement
        assert placement is not None
        for instance in placement.instance_ids:
            self.lifecycle.node_report(
                NodeReport(job_id=self.job_id, instance_id=instance, phase="started")
            )
        assert self.job().status is JobStatus.RUNNING

    def job(self) -> Any:
        return self.ports.jobs.get(self.job_id)

    def nodes(self) -> int:
        return int(self.job().effective_spec.resources.nodes)

    def checkpoint_asked(self) -> bool:
        objects = cast(InMemoryObjects, self.ports.objects).objects
        return b"checkpoint" in objects.get(control_key(self.job_id), b"")

    def finish_run(self, token: str = "token", exit_code: int = 0) -> dict[str, Any]:
        """The node stops (at the checkpoint asked for) and the workflow releases the run."""
        instance = self.job().placement.instance_ids[0]
        report = NodeReport(
            job_id=self.job_id, instance_id=instance, phase="finished", exit_code=exit_code
        )
        self.lifecycle.node_report(report)
        run = cast(RecordingWorkflow, self.ports.workflow).completed[token]
        return self.lifecycle.release(self.job_id, WorkflowState.model_validate({"run": run}))


def test_busy_gpus_scale_an_elastic_job_out_by_a_step_and_it_resumes_larger() -> None:
    job = Running(ELASTIC)
    assert job.actions.on_alarm(job.job_id, AlarmKind.BUSY) == ["scaled-out"]
    assert job.nodes() == 3
    assert job.job().drain_reason == RESIZED and job.checkpoint_asked()
    scaled = cast(RecordingPublisher, job.ports.events).of_type(DETAIL_JOB_SCALED)
    assert scaled == [{"job_id": job.job_id, "nodes": 3, "previous_nodes": 2}]
    # EventBridge delivers the alarm twice: the job is already on its way to the new shape.
    job.actions.on_alarm(job.job_id, AlarmKind.BUSY)
    assert job.nodes() == 3
    assert len(cast(RecordingPublisher, job.ports.events).of_type(DETAIL_JOB_SCALED)) == 1

    assert job.finish_run()["requeue"] is True
    assert job.lifecycle.requeue(job.job_id).nodes == 3  # the next run is planned on 3 nodes


def test_the_jobs_own_metric_scales_it_out_like_busy_gpus() -> None:
    job = Running(ELASTIC + "scale_on: {metric: samples_per_second, below: 1000}\n")
    assert job.actions.on_alarm(job.job_id, AlarmKind.SCALE_ON) == ["scaled-out"]
    assert job.nodes() == 3


def test_an_elastic_job_at_its_max_or_not_running_stays_as_it_is() -> None:
    at_max = Running("resources: {gpus: 1, nodes: 4, elastic: {min_nodes: 1, max_nodes: 4}}\n")
    assert at_max.actions.on_alarm(at_max.job_id, AlarmKind.BUSY) == []
    assert at_max.nodes() == 4 and not at_max.checkpoint_asked()

    waiting = Running(ELASTIC)
    waiting.lifecycle.drain(waiting.job_id, "preempted")  # already stopping for someone else
    waiting.actions.on_alarm(waiting.job_id, AlarmKind.BUSY)
    assert waiting.nodes() == 2


def test_idle_gpus_scale_an_elastic_job_in_and_at_its_min_flag_it() -> None:
    job = Running(ELASTIC)
    assert job.actions.on_alarm(job.job_id, AlarmKind.IDLE) == ["scaled-in"]
    assert job.nodes() == 1 and job.job().drain_reason == RESIZED

    at_min = Running("resources: {gpus: 1, nodes: 1, elastic: {min_nodes: 1, max_nodes: 4}}\n")
    assert at_min.actions.on_alarm(at_min.job_id, AlarmKind.IDLE) == ["low-utilization"]
    assert at_min.nodes() == 1 and not at_min.checkpoint_asked()


def test_a_job_that_is_not_elastic_is_flagged_when_idle_and_never_resized() -> None:
    job = Running()
    assert job.actions.on_alarm(job.job_id, AlarmKind.BUSY) == []
    assert job.actions.on_alarm(job.job_id, AlarmKind.IDLE) == ["low-utilization"]
    assert job.job().resources_override is None


def test_a_job_released_for_idle_gpus_is_cancelled_whatever_its_container_exits_with() -> None:
    """The container stopped at the checkpoint may exit non-zero (143 after SIGTERM): the job
    still ends as its release asked, not retried as a failed run."""
    job = Running("on_idle: release\n")
    assert job.actions.on_alarm(job.job_id, AlarmKind.IDLE) == ["low-utilization"]
    assert job.checkpoint_asked()
    released = job.finish_run(exit_code=143)
    assert released["requeue"] is False
    assert released["outcome"]["status"] == "CANCELLED"
    assert "idle" in released["outcome"]["failure_reason"]


def test_a_memory_leak_alerts_flags_and_restarts_the_job_as_a_retry() -> None:
    job = Running("max_retries: 1\n")
    assert job.actions.on_alarm(job.job_id, AlarmKind.LEAK) == ["memory-leak"]
    [(subject, message)] = cast(RecordingNotifier, job.ports.notifier).sent
    assert "leaks GPU memory" in subject and "restarted" in message
    assert job.job().drain_reason == MEMORY_LEAK and job.checkpoint_asked()
    assert job.finish_run()["requeue"] is True
    job.lifecycle.requeue(job.job_id)
    assert job.job().retries == 1

    # It leaks again on its next run, with no retry left: alerted and flagged, not stopped.
    job.start("token-2")
    job.actions.on_alarm(job.job_id, AlarmKind.LEAK)
    _, again = cast(RecordingNotifier, job.ports.notifier).sent[-1]
    assert "no retries left" in again
    assert job.job().drain_reason is None


def publish(job: Running, metric: str, statistic: str, values: list[float]) -> None:
    """One point a period of the default policy (60 s), the last in the period now ending."""
    now = job.ports.clock.now()
    first = now - len(values) * 60
    cast(InMemoryMetrics, job.ports.metrics).series[
        SeriesQuery(job.job_id, metric, statistic, 60)
    ] = [(first + index * 60, value) for index, value in enumerate(values)]


def test_the_watch_acts_on_an_alarm_once_it_goes_off_and_not_again_while_it_stays() -> None:
    job = Running()
    watch = build_metric_watch(job.ports, SETTINGS, job.lifecycle)
    assert watch.run().fired == {}  # no data: nothing breaches
    publish(job, GPU_UTILIZATION_METRIC, "Average", [5.0] * 30)
    first = watch.run()
    assert first.fired == {job.job_id: ["idle"]} and first.jobs == 1
    assert job.job().flags == ["low-utilization"] and job.job().alarming == [AlarmKind.IDLE]
    flagged = cast(RecordingPublisher, job.ports.events).of_type(DETAIL_JOB_FLAGGED)
    # Run again on the same data (a schedule delivered twice, or still idle): no second action.
    assert watch.run().fired == {}
    assert cast(RecordingPublisher, job.ports.events).of_type(DETAIL_JOB_FLAGGED) == flagged
    # Busy again: the alarm clears, and acts once more if the job idles again.
    publish(job, GPU_UTILIZATION_METRIC, "Average", [50.0] * 30)
    assert watch.run().fired == {} and job.job().alarming == []
    publish(job, GPU_UTILIZATION_METRIC, "Average", [5.0] * 30)
    assert watch.run().fired == {job.job_id: ["idle"]}


def test_of_two_passes_that_overlap_only_one_acts(monkeypatch: pytest.MonkeyPatch) -> None:
    job = Running()
    publish(job, GPU_UTILIZATION_METRIC, "Average", [5.0] * 30)
    listed = job.ports.jobs.list_jobs(JobStatus.RUNNING)
    first = build_metric_watch(job.ports, SETTINGS, job.lifecycle)
    assert first.run().fired == {job.job_id: ["idle"]}
    # The second pass listed the job before the first recorded its alarm.
    monkeypatch.setattr(job.ports.jobs, "list_jobs", lambda *_, **__: listed)
    second = build_metric_watch(job.ports, SETTINGS, job.lifecycle)
    assert second.run().fired == {}
    flagged = cast(RecordingPublisher, job.ports.events).of_type(DETAIL_JOB_FLAGGED)
    assert [event["flags"] for event in flagged] == [["low-utilization"]]


def test_a_relaunched_job_starts_its_alarms_afresh() -> None:
    job = Running("max_retries: 2\n")
    watch = build_metric_watch(job.ports, SETTINGS, job.lifecycle)
    publish(job, GPU_MEMORY_METRIC, "Maximum", [1000.0 + 10 * i for i in range(16)])
    assert watch.run().fired == {job.job_id: ["leak"]}
    assert job.job().drain_reason == MEMORY_LEAK
    assert job.finish_run()["requeue"] is True
    job.lifecycle.requeue(job.job_id)
    job.start("token-2")
    assert job.job().alarming == []  # the new run's alarms have not gone off
    assert watch.run().fired == {job.job_id: ["leak"]}  # it leaks again: restarted again
    assert job.job().retries == 1 and job.job().drain_reason == MEMORY_LEAK


def test_a_pass_reads_a_jobs_three_series_in_one_call() -> None:
    job = Running()
    result = build_metric_watch(job.ports, SETTINGS, job.lifecycle).run()
    assert result.jobs == 1 and result.calls == 1
    [batch] = cast(InMemoryMetrics, job.ports.metrics).batches
    assert {q.job_id for q in batch.queries} == {job.job_id}
    # Utilization (idle), temperature (hot), memory (leak), over the longest window (idle's).
    assert len(batch.queries) == 3 and batch.end - batch.start == 30 * 60


def test_with_metric_actions_disabled_a_pass_reads_nothing() -> None:
    job = Running()
    settings = make_settings(
        config=SETTINGS.config.model_copy(update={"metrics": MetricPolicy(enabled=False)})
    )
    publish(job, GPU_UTILIZATION_METRIC, "Average", [5.0] * 30)
    assert build_metric_watch(job.ports, settings, job.lifecycle).run() == WatchResult()
    assert cast(InMemoryMetrics, job.ports.metrics).batches == []
    assert job.job().flags == []
