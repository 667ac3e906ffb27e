"""The workflow's Lambda handlers around the lifecycle service: what they hand back to the state
machine (the ASL's Choices and ResultSelectors read exactly these keys)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest

from gpufleet import telemetry
from gpufleet.adapters.local.memory import FakeFleet, InMemoryObjects, RecordingWorkflow
from gpufleet.domain.job import JobStatus
from gpufleet.domain.launch import LaunchRequest
from gpufleet.domain.node_reports import NodeKey, node_key_object, sign_report
from gpufleet.domain.planning import LaunchPlan
from gpufleet.emulator.metrics import emf_metrics
from gpufleet.handlers import (
    on_launch,
    on_node_report,
    on_release,
    on_requeue,
    on_workflow_ended,
)
from gpufleet.services.backstop import WorkflowEnd
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.run_reports import NodeReport
from tests.helpers import SPEC_YAML, local_ports, make_settings, plan_of

SETTINGS = make_settings()
EVENTS = Path(__file__).resolve().parents[2] / "events" / "aws"


@dataclass
class Context:
    """What Powertools reads from a Lambda context."""

    function_name: str = "test"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:test"
    aws_request_id: str = "request-1"


def _submitted(ports: Any, service: LifecycleService) -> str:
    """The id of the one job a spec uploaded under its team's folder made."""
    cast(InMemoryObjects, ports.objects).objects["jobs/vision/a.yaml"] = SPEC_YAML
    job_id = (
        build_intake(ports, SETTINGS, service).submit_object("jobs/vision/a.yaml", "a", "a").job_id
    )
    assert job_id is not None
    return job_id


def finished_run(exit_code: int) -> tuple[LifecycleService, Any, str, dict[str, Any]]:
    """A job that launched and whose node reported its end; the run's result as the workflow
    holds it."""
    ports = local_ports()
    service = build_lifecycle(ports, SETTINGS)
    job_id = _submitted(ports, service)
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
    state = on_requeue.handler(
        {"job_id": job_id, "attempt": 2, "cycles": 0, "execution": job_id}, Context()
    )
    assert state["job_id"] == job_id
    assert (state["launch"]["step"], state["launch"]["attempt"]) == (0, 3)
    assert LaunchPlan.model_validate(state["plan"]).steps
    assert ports.jobs.get(job_id).status is JobStatus.QUEUED


# -- launches ----------------------------------------------------------------------------------


def counted(output: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, dimensions, total) of each metric a handler published (embedded metric format:
    a metric's values are a list)."""
    published = []
    for line in output.splitlines():
        for metric in emf_metrics(line):
            total = sum(json.loads(line)[metric.name])
            published.append((metric.name, dict(metric.dimensions), float(total)))
    return sorted(published)


def launch_task(plan: LaunchPlan, job_id: str, step: int, attempt: int, token: str) -> Any:
    return {
        "job_id": job_id,
        "task_token": token,
        "plan": plan.model_dump(mode="json"),
        "step": step,
        "attempt": attempt,
    }


def launchable(fleet: FakeFleet) -> tuple[LifecycleService, Any, str, LaunchPlan]:
    ports = local_ports(fleet)
    service = build_lifecycle(ports, SETTINGS)
    job_id = _submitted(ports, service)
    return service, ports, job_id, plan_of(ports, job_id)


SERVICE = {telemetry.SERVICE_DIMENSION: telemetry.SERVICE}


def test_a_launch_counts_its_instances_by_capacity_type_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service, ports, job_id, plan = launchable(FakeFleet())
    monkeypatch.setattr(on_launch, "lifecycle", lambda: service)
    capsys.readouterr()
    on_launch.handler(launch_task(plan, job_id, 0, 0, "run-1"), Context())
    spot = {**SERVICE, telemetry.CAPACITY_TYPE: "spot"}
    assert counted(capsys.readouterr().out) == [(telemetry.INSTANCES_LAUNCHED.name, spot, 1.0)]
    # Step Functions runs the step again (a timeout, a lost response): it launches nothing more
    # and counts nothing more.
    on_launch.handler(launch_task(plan, job_id, 0, 0, "run-2"), Context())
    assert counted(capsys.readouterr().out) == []
    assert ports.jobs.get(job_id).placement is not None


def test_a_launch_on_on_demand_after_spot_had_none_counts_a_fallback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_spot(request: LaunchRequest) -> list[str] | None:
        return ["InsufficientInstanceCapacity"] if request.capacity_type == "spot" else None

    service, ports, job_id, plan = launchable(FakeFleet(no_spot))
    monkeypatch.setattr(on_launch, "lifecycle", lambda: service)
    capsys.readouterr()
    on_launch.handler(launch_task(plan, job_id, 0, 0, "run-1"), Context())
    failure = {**SERVICE, telemetry.ERROR_CATEGORY: "capacity"}
    assert counted(capsys.readouterr().out) == [(telemetry.LAUNCH_FAILURES.name, failure, 1.0)]
    nxt = cast(RecordingWorkflow, ports.workflow).completed["run-1"]["launch"]
    on_launch.handler(launch_task(plan, job_id, nxt["step"], nxt["attempt"], "run-2"), Context())
    on_demand = {**SERVICE, telemetry.CAPACITY_TYPE: "on-demand"}
    assert counted(capsys.readouterr().out) == [
        (telemetry.INSTANCES_LAUNCHED.name, on_demand, 1.0),
        (telemetry.ONDEMAND_FALLBACKS.name, SERVICE, 1.0),
    ]


# -- node reports ------------------------------------------------------------------------------


def node_event(**detail: Any) -> dict[str, Any]:
    """A `Node ...` event as EventBridge delivers it, with `detail` laid over a real one."""
    event: dict[str, Any] = json.loads((EVENTS / "node-finished.json").read_text())
    event["detail"] = {**event["detail"], **detail}
    return event


def run_key(ports: Any, job_id: str) -> NodeKey:
    """The key Launch made for the job's run (what its agent signs with)."""
    return NodeKey.from_document(ports.objects.get_bytes(node_key_object(job_id), 1024))


def signed_event(key: NodeKey, **detail: Any) -> dict[str, Any]:
    """A node event as the agent holding `key` sends it."""
    event = node_event(**detail)
    event["detail"] = sign_report(event["detail"], key, sent_ms=1_800_000_000_000)
    return event


def launched_run(
    earlier_try: NodeKey | None = None,
) -> tuple[LifecycleService, Any, str, str]:
    """A job whose instance launched and has not reported yet; `earlier_try`: the key an
    earlier try of this launch wrote before it died."""
    ports = local_ports()
    service = build_lifecycle(ports, SETTINGS)
    job_id = _submitted(ports, service)
    if earlier_try is not None:
        ports.objects.put_json(node_key_object(job_id), earlier_try.document())
    assert service.launch(job_id, plan_of(ports, job_id), 0, 2, task_token="run") is None
    return service, ports, job_id, ports.jobs.get(job_id).placement.instance_ids[0]


def test_a_launch_makes_a_random_key_per_run_kept_out_of_the_job_and_its_manifest() -> None:
    _service, ports, job_id, _instance = launched_run()
    key = run_key(ports, job_id)
    assert key.run == ports.jobs.get(job_id).attempts == 1
    assert key.secret.hex() not in json.dumps(ports.jobs.get(job_id).model_dump(mode="json"))
    manifest = cast(InMemoryObjects, ports.objects).objects[f"runs/{job_id}/run.json"]
    assert key.secret.hex() not in manifest.decode()
    _other_service, other_ports, other_job, _ = launched_run()
    assert run_key(other_ports, other_job).secret != key.secret  # random, not derived


def test_a_launch_tried_again_keeps_its_runs_key_and_a_new_run_gets_a_new_one() -> None:
    """The instances of a launch that died before recording them may have read its key."""
    earlier = NodeKey(run=1, secret=bytes(range(32)))
    _service, ports, job_id, _instance = launched_run(earlier_try=earlier)
    assert run_key(ports, job_id) == earlier
    stale = NodeKey(run=7, secret=bytes(range(32)))  # another run's: never reused
    _service, ports, job_id, _instance = launched_run(earlier_try=stale)
    assert run_key(ports, job_id).run == 1
    assert run_key(ports, job_id).secret != stale.secret


def forgeries(job_id: str, instance: str, key: NodeKey) -> dict[str, dict[str, Any]]:
    """Finish reports for the job that its agent did not send, by what is wrong with them."""
    finish = {"job_id": job_id, "instance_id": instance, "exit_code": 0}
    another_jobs_key = NodeKey(run=key.run, secret=bytes(32))
    return {
        "unsigned": node_event(**finish),
        "another job's key": signed_event(another_jobs_key, **finish),
        "changed after signing": signed_event(key, **finish)
        | {"detail": signed_event(key, **finish)["detail"] | {"exit_code": 1}},
        "replayed from another job": signed_event(key, **finish)
        | {"detail": signed_event(key, **finish)["detail"] | {"job_id": "j-" + "f" * 20}},
        "another run's": signed_event(NodeKey(run=key.run + 1, secret=key.secret), **finish),
    }


def test_a_forged_report_changes_nothing_and_the_agents_own_is_heard(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    service, ports, job_id, instance = launched_run()
    monkeypatch.setattr(on_node_report, "lifecycle", lambda: service)
    key = run_key(ports, job_id)
    before = ports.jobs.get(job_id)
    capsys.readouterr()
    answers = {
        why: on_node_report.handler(event, Context())
        for why, event in forgeries(job_id, instance, key).items()
    }
    assert answers == {
        "unsigned": {"dropped": "unsigned"},
        "another job's key": {"dropped": "bad-signature"},
        "changed after signing": {"dropped": "bad-signature"},
        "replayed from another job": {"dropped": "other-run"},  # that job has no run
        "another run's": {"dropped": "other-run"},
    }
    assert ports.jobs.get(job_id) == before
    assert "run" not in cast(RecordingWorkflow, ports.workflow).completed
    assert sorted(dropped_metrics(capsys.readouterr().out)) == sorted(
        a["dropped"] for a in answers.values()
    )
    heard = on_node_report.handler(
        signed_event(key, job_id=job_id, instance_id=instance, exit_code=0), Context()
    )
    assert heard == {"job_id": job_id, "phase": "finished"}
    assert cast(RecordingWorkflow, ports.workflow).completed["run"]["exit_code"] == 0


def dropped_metrics(output: str) -> list[str]:
    """The Problem of every NodeReportsDropped the handler published (embedded metric format)."""
    problems = []
    for line in output.splitlines():
        if line.startswith("{") and '"_aws"' in line:
            document = json.loads(line)
            if "NodeReportsDropped" in document:
                problems.append(document["Problem"])
    return problems


@pytest.mark.parametrize(
    ("detail", "problem"),
    [
        ({"job_id": "j-" + "0" * 20}, "other-run"),  # a job with no run has no key
        ({"instance_id": "i-not-its-own"}, "unknown-instance"),
        ({"exit_code": 256}, "invalid"),
        ({"exit_code": 10**40}, "invalid"),
        ({"exit_code": -9}, "invalid"),
        ({"job_id": "../../etc/passwd"}, "invalid"),
        ({"phase": "exploded"}, "invalid"),
    ],
)
def test_a_report_that_cannot_be_heard_is_dropped_once_and_counted(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    detail: dict[str, Any],
    problem: str,
) -> None:
    service, ports, job_id, _run = finished_run(exit_code=0)
    instance = ports.jobs.get(job_id).placement.instance_ids[0]
    before = ports.jobs.get(job_id)
    monkeypatch.setattr(on_node_report, "lifecycle", lambda: service)
    capsys.readouterr()
    event = signed_event(
        run_key(ports, job_id), **{"job_id": job_id, "instance_id": instance, **detail}
    )
    # It returns: Lambda does not retry a report that can never be heard.
    assert on_node_report.handler(event, Context()) == {"dropped": problem}
    assert ports.jobs.get(job_id) == before
    assert dropped_metrics(capsys.readouterr().out) == [problem]
    [logged] = [r for r in caplog.records if r.getMessage() == "node report dropped"]
    assert logged.problem == problem  # type: ignore[attr-defined]
    assert "etc/passwd" not in repr(logged.__dict__)  # where it is wrong, not what it says


def test_an_event_that_is_no_report_at_all_is_dropped(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert on_node_report.handler({"detail": "nonsense"}, Context()) == {"dropped": "invalid"}
    assert dropped_metrics(capsys.readouterr().out) == ["invalid"]


def test_the_end_of_a_continued_execution_ends_its_job(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that continued in `<job_id>-<n>` (docs/aws-fidelity.md F5): WorkflowEnded hears of
    that execution failing and ends the job it names."""
    ended: list[WorkflowEnd] = []

    class Backstop:
        def workflow_ended(self, end: WorkflowEnd) -> dict[str, Any]:
            ended.append(end)
            return {"job_id": end.job_id}

    event = json.loads((EVENTS / "states-execution-failed.json").read_text())
    job_id = event["detail"]["name"]
    event["detail"]["name"] = f"{job_id}-2"
    monkeypatch.setattr(on_workflow_ended, "backstop", Backstop)
    monkeypatch.setattr(
        on_workflow_ended,
        "settings",
        lambda: make_settings(job_state_machine_arn=event["detail"]["stateMachineArn"]),
    )
    assert on_workflow_ended.handler(event, Context()) == {"job_id": job_id, "ended": True}
    assert [(e.job_id, e.status, e.error) for e in ended] == [(job_id, "FAILED", "RequeueFailed")]
