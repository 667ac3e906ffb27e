"""Budgets checked during the run, against the actual cost: a job's own, and its team's month."""

from __future__ import annotations

import json
from typing import Any, cast

from gpufleet.adapters.local.memory import (
    InMemoryObjects,
    ManualClock,
    RecordingNotifier,
    RecordingWorkflow,
)
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import JobStatus
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.services.factory import build_dispatcher, build_intake, build_lifecycle
from gpufleet.services.lifecycle_base import control_key
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from tests.helpers import enqueue, local_ports, make_settings, plan_of


def world(team: TeamQuota) -> tuple[Any, Any, Any, Any]:
    settings = make_settings(
        config=FleetConfig(queue=QueuePolicy(max_gpus=8, max_instances=8, teams={"ml": team}))
    )
    ports = local_ports()
    lifecycle = build_lifecycle(ports, settings)
    return (
        ports,
        lifecycle,
        build_dispatcher(ports, settings, lifecycle),
        build_intake(ports, settings, lifecycle),
    )


def run_job(ports: Any, lifecycle: Any, dispatcher: Any, intake: Any, extra: str = "") -> str:
    body = (
        "name: train\nteam: ml\nimage: img\ncommand: [x]\nresources: {gpus: 1}\n"
        f"checkpoint: s3://ckpt/ml/train/\n{extra}"
    ).encode()
    cast(InMemoryObjects, ports.objects).objects["jobs/ml/train.yaml"] = body
    job_id = intake.submit_object("jobs/ml/train.yaml", "d1", "s3://b/jobs/ml/train.yaml").job_id
    assert job_id is not None
    plan = plan_of(ports, job_id)
    enqueue(lifecycle, ports, job_id, "enqueue-1", plan)
    assert dispatcher.run_pass().admitted == [job_id]
    admission = cast(RecordingWorkflow, ports.workflow).completed["enqueue-1"]
    assert (
        lifecycle.launch(job_id, plan, 0, 0, "run-1", Admission.model_validate(admission)) is None
    )
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    lifecycle.node_report(NodeReport(job_id=job_id, instance_id=instance, phase="started"))
    return str(job_id)


def checkpoint_requested(ports: Any, job_id: str) -> bool:
    control = json.loads(cast(InMemoryObjects, ports.objects).objects[control_key(job_id)])
    return bool(control["action"] == "checkpoint")


def end_run(ports: Any, lifecycle: Any, job_id: str) -> dict[str, Any]:
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    lifecycle.node_report(
        NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=0)
    )
    state = {"run": cast(RecordingWorkflow, ports.workflow).completed["run-1"]}
    return dict(lifecycle.release(job_id, WorkflowState.model_validate(state))["outcome"])


def test_a_job_is_stopped_at_a_checkpoint_when_its_cost_reaches_its_budget() -> None:
    ports, lifecycle, dispatcher, intake = world(TeamQuota(gpus=4))
    job_id = run_job(ports, lifecycle, dispatcher, intake, "budget_usd: 1.0\n")
    clock = cast(ManualClock, ports.clock)
    clock.advance(600)
    assert dispatcher.run_pass().over_budget == []  # well within its budget
    assert not checkpoint_requested(ports, job_id)
    clock.advance(3 * 86400)  # long past $1 at any GPU price
    assert dispatcher.run_pass().over_budget == [job_id]
    assert checkpoint_requested(ports, job_id)
    assert "stopped for budget" in cast(RecordingNotifier, ports.notifier).sent[0][0]
    assert dispatcher.run_pass().over_budget == []  # once
    outcome = end_run(ports, lifecycle, job_id)
    assert outcome["status"] == JobStatus.FAILED.value
    assert "budget of $1.00" in outcome["failure_reason"]


def test_a_teams_running_jobs_stop_when_its_month_passes_its_budget() -> None:
    ports, lifecycle, dispatcher, intake = world(TeamQuota(gpus=4, monthly_budget_usd=1.0))
    job_id = run_job(ports, lifecycle, dispatcher, intake)
    clock = cast(ManualClock, ports.clock)
    clock.advance(600)
    assert dispatcher.run_pass().over_budget == []
    clock.advance(2 * 86400)
    # A pass woken by an event leaves this to the schedule's full passes.
    assert dispatcher.run_pass(full=False).over_budget == []
    assert dispatcher.run_pass().over_budget == [job_id]
    assert checkpoint_requested(ports, job_id)
    outcome = end_run(ports, lifecycle, job_id)
    assert outcome["status"] == JobStatus.FAILED.value
    assert "team ml's monthly budget of $1.00" in outcome["failure_reason"]


def test_a_team_that_only_wants_to_know_is_told_and_keeps_running() -> None:
    quota = TeamQuota(gpus=4, monthly_budget_usd=1.0, on_budget="notify")
    ports, lifecycle, dispatcher, intake = world(quota)
    job_id = run_job(ports, lifecycle, dispatcher, intake)
    cast(ManualClock, ports.clock).advance(2 * 86400)
    assert dispatcher.run_pass().over_budget == []
    assert not checkpoint_requested(ports, job_id)
    sent = cast(RecordingNotifier, ports.notifier).sent
    assert "over its monthly budget" in sent[0][0]
    dispatcher.run_pass()
    assert len(sent) == 1  # told once, not on every pass
