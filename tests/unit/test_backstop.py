"""The backstop ends a job whose workflow ended without settling it, as Release would have."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryJobStore,
    ManualClock,
    RecordingWorkflow,
)
from gpufleet.domain.job import JobChanges, JobStatus
from gpufleet.domain.selection import NoFeasibleOffering
from gpufleet.domain.settlement import RESIZED
from gpufleet.domain.spec import Resources
from gpufleet.ports import WorkflowRun
from gpufleet.services.backstop import BackstopService, WorkflowEnd, failure_of
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from tests.helpers import plan_of
from tests.unit.test_services import admitted_job, run_to_finish, started


def running_job() -> tuple[LifecycleService, Any, str, str]:
    """An admitted job whose node runs it, ten minutes in: (service, ports, job, instance)."""
    service, ports, job_id, admission = admitted_job()
    assert (
        service.launch(
            job_id, plan_of(ports, job_id), 0, 0, "run", Admission.model_validate(admission)
        )
        is None
    )
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    service.node_report(started(job_id, instance))
    cast(ManualClock, ports.clock).advance(600)
    return service, ports, job_id, instance


def test_a_running_job_whose_workflow_was_stopped_is_ended_with_its_cost() -> None:
    service, ports, job_id, instance = running_job()
    assert ports.queue.state().running != []
    backstop = BackstopService(ports, service)
    ended = backstop.workflow_ended(WorkflowEnd(job_id, "ABORTED"))
    job = ports.jobs.get(job_id)
    assert ended is not None and ended["terminated"] == [instance]
    assert job.status is JobStatus.FAILED
    assert job.failure_reason == "WorkflowAborted: the job's workflow was stopped"
    assert job.cost_usd is not None and job.cost_usd > 0 and job.released_at is not None
    assert cast(FakeFleet, ports.fleet).live == {}
    assert ports.queue.state().running == []  # its share of the quotas is back
    # The event delivered again changes nothing.
    assert backstop.workflow_ended(WorkflowEnd(job_id, "ABORTED")) == {
        **job.summary(),
        "terminated": [],
    }
    assert ports.jobs.get(job_id) == job


def test_a_job_whose_release_failed_after_its_node_succeeded_ends_succeeded() -> None:
    service, ports, job_id, admission = admitted_job()
    run_to_finish(service, ports, job_id, admission)
    cause = json.dumps({"errorType": "ThrottlingException", "errorMessage": "Rate exceeded"})
    BackstopService(ports, service).workflow_ended(
        WorkflowEnd(job_id, "FAILED", "ReleaseFailed", cause)
    )
    job = ports.jobs.get(job_id)
    assert (job.status, job.exit_code) == (JobStatus.SUCCEEDED, 0)  # the run's own end
    assert job.cost_usd is not None and job.cost_usd > 0
    assert cast(FakeFleet, ports.fleet).live == {}


def test_a_job_whose_requeue_fails_still_ends_in_a_final_status_with_its_cost() -> None:
    """Issue 15: resized to a shape nothing can hold, a running job was checkpointed and
    released, its Requeue failed four times, the workflow ended, and the job stayed QUEUED for
    ever, with no cost although it held an instance."""
    service, ports, job_id, instance = running_job()
    impossible = Resources(gpus=8, gpu_memory_gib=200)
    ports.jobs.update(job_id, ports.clock.now(), JobChanges(resources_override=impossible))
    assert service.drain(job_id, RESIZED)
    checkpointed = NodeReport(
        job_id=job_id, instance_id=instance, phase="finished", exit_code=0, reason="checkpointed"
    )
    service.node_report(checkpointed)
    run = cast(RecordingWorkflow, ports.workflow).completed["run"]
    assert service.release(job_id, WorkflowState.model_validate({"run": run}))["requeue"] is True
    with pytest.raises(NoFeasibleOffering) as refused:  # each of Requeue's tries
        service.requeue_input(job_id, 1)
    cause = json.dumps({"errorType": "NoFeasibleOffering", "errorMessage": str(refused.value)})
    BackstopService(ports, service).workflow_ended(
        WorkflowEnd(job_id, "FAILED", "RequeueFailed", cause)
    )
    job = ports.jobs.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None
    assert job.failure_reason.startswith("RequeueFailed: NoFeasibleOffering: ")
    assert job.cost_usd is not None and job.cost_usd > 0  # the ten minutes it ran
    assert ports.queue.waiting() == [] and ports.queue.state().running == []


def test_a_job_that_ended_keeps_its_status_when_its_workflow_breaks_after() -> None:
    # The lifecycle's own end of a failed job is a Succeed state (no event reaches the
    # backstop); a FAILED execution of an ended job is a workflow that broke after it ended.
    service, ports, job_id, _instance = running_job()
    ports.jobs.transition(
        job_id, JobStatus.FAILED, ports.clock.now(), JobChanges(failure_reason="x")
    )
    store = cast(InMemoryJobStore, ports.jobs)
    BackstopService(ports, service).workflow_ended(WorkflowEnd(job_id, "FAILED", "ReleaseFailed"))
    ended = store.get(job_id)
    assert ended.status is JobStatus.FAILED and ended.failure_reason == "x"
    assert cast(FakeFleet, ports.fleet).live == {}  # its instances are not left running
    assert (
        BackstopService(ports, service).workflow_ended(WorkflowEnd("j-" + "9" * 20, "FAILED"))
        is None
    )


@pytest.mark.parametrize(
    ("end", "error", "cause"),
    [
        (
            WorkflowEnd("j", "TIMED_OUT"),
            "WorkflowTimedOut",
            "the job's workflow ran past its time limit",
        ),
        (WorkflowEnd.of("j", None), "WorkflowLost", "the job's workflow never started"),
        (
            WorkflowEnd.of("j", WorkflowRun("FAILED", 1.0, "States.Runtime", "bad path")),
            "States.Runtime",
            "bad path",
        ),
    ],
)
def test_each_end_of_a_workflow_has_its_reason(end: WorkflowEnd, error: str, cause: str) -> None:
    assert failure_of(end) == (error, cause)
