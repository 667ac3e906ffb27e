"""The workflow's Lambda handlers around the lifecycle service: what they hand back to the state
machine (the ASL's Choices and ResultSelectors read exactly these keys)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import InMemoryObjects, RecordingWorkflow
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.handlers import on_release, on_requeue
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.lifecycle import LifecycleService, NodeReport
from tests.helpers import SPEC_YAML, local_ports, make_settings, plan_of

SETTINGS = make_settings()


@dataclass
class Context:
    """What Powertools reads from a Lambda context."""

    function_name: str = "test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:test"
    aws_request_id: str = "request-1"


def finished_run(exit_code: int) -> tuple[LifecycleService, Any, str, dict[str, Any]]:
    """A job that launched and whose node reported its end; the run's result as the workflow
    holds it."""
    ports = local_ports()
    service = build_lifecycle(ports, SETTINGS)
    cast(InMemoryObjects, ports.objects).objects["jobs/a.yaml"] = SPEC_YAML
    job_id = build_intake(ports, SETTINGS, service).submit_object("jobs/a.yaml", "a", "a").job_id
    assert job_id is not None
    assert service.launch(job_id, plan_of(ports, job_id), 0, 2, task_token="run") is None
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    report = NodeReport(job_id=job_id, instance_id=instance, phase="finished", exit_code=exit_code)
    service.node_report(report)
    return service, ports, job_id, cast(RecordingWorkflow, ports.workflow).completed["run"]


def test_release_hands_back_the_final_status_when_the_job_ended(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, ports, job_id, run = finished_run(exit_code=0)
    monkeypatch.setattr(on_release, "lifecycle", lambda: service)
    released = on_release.handler({"job_id": job_id, "state": {"run": run}}, Context())
    assert (released["requeue"], released["status"]) == (False, "SUCCEEDED")
    assert released["outcome"] == ports.jobs.get(job_id).summary()


def test_a_requeued_run_starts_again_one_launch_attempt_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service, ports, job_id, run = finished_run(exit_code=1)  # retried: max_retries allows it
    monkeypatch.setattr(on_release, "lifecycle", lambda: service)
    monkeypatch.setattr(on_requeue, "lifecycle", lambda: service)
    released = on_release.handler({"job_id": job_id, "state": {"run": run}}, Context())
    assert (released["requeue"], released["status"]) == (True, "QUEUED")
    assert "outcome" not in released

    # The launch that ran it used attempt 2: the next run counts on from 3.
    state = on_requeue.handler({"job_id": job_id, "attempt": 2}, Context())
    assert state["job_id"] == job_id
    assert (state["launch"]["step"], state["launch"]["attempt"]) == (0, 3)
    assert LaunchPlan.model_validate(state["plan"]).steps
    assert ports.jobs.get(job_id).status is JobStatus.QUEUED
