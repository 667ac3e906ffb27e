"""The job lifecycle's ASL against the code it drives: every Lambda task sends what its handler
parses, a requeued run starts from the state intake starts one with, and a run that ran out of
time is released rather than waited for again."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel

from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.spec import JobSpec
from gpufleet.handlers.models import EnqueueTask, LaunchTask, ReleaseTask
from gpufleet.handlers.payloads import RequeueTask, TokenTask
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.topology import (
    ENQUEUE,
    JOB_LIFECYCLE,
    LAUNCH,
    RELEASE,
    REQUEUE,
    RULES,
    WORKFLOW_ENDED,
)

DEFINITION: dict[str, Any] = json.loads(JOB_LIFECYCLE.definition())
STATES: dict[str, dict[str, Any]] = DEFINITION["States"]
# What each function the workflow invokes parses its payload with.
MODELS: dict[str, type[BaseModel]] = {
    ENQUEUE.construct_id: EnqueueTask,
    LAUNCH.construct_id: LaunchTask,
    RELEASE.construct_id: ReleaseTask,
    REQUEUE.construct_id: RequeueTask,
}


def lambda_tasks() -> dict[str, tuple[dict[str, Any], str]]:
    """Each Lambda task state with the construct id of the function it invokes."""
    tasks = {}
    for name, state in STATES.items():
        function = state.get("Parameters", {}).get("FunctionName", "")
        if state["Type"] == "Task" and function.startswith("${"):
            tasks[name] = (state, JOB_LIFECYCLE.function_substitutions[function[2:-1]])
    return tasks


def test_the_workflow_invokes_only_functions_whose_payload_model_is_known() -> None:
    invoked = {function for _, function in lambda_tasks().values()}
    assert invoked == set(MODELS) == set(JOB_LIFECYCLE.function_substitutions.values())


@pytest.mark.parametrize("name", sorted(lambda_tasks()))
def test_each_lambda_task_sends_exactly_what_its_handler_parses(name: str) -> None:
    state, function = lambda_tasks()[name]
    model = MODELS[function]
    payload = state["Parameters"]["Payload"]
    assert {key.removesuffix(".$") for key in payload} == set(model.model_fields)
    # A task that waits for a token hands the token over; the others have none to hand.
    waits = state["Resource"].endswith(".waitForTaskToken")
    assert waits is issubclass(model, TokenTask)
    if waits:
        assert payload["task_token.$"] == "$$.Task.Token"


def test_a_requeued_run_starts_from_the_state_intake_starts_one_with() -> None:
    plan = LaunchPlan.model_validate(
        {
            "nodes": 1,
            "steps": [
                {
                    "capacity_type": "spot",
                    "overrides": [{"instance_type": "g5.xlarge", "hourly_usd": 1}],
                }
            ],
            "max_launch_attempts": 1,
            "retry_wait_seconds": 1,
            "run_timeout_seconds": 10,
            "heartbeat_timeout_seconds": 5,
            "expected_seconds": 60,
            "expected_source": "spec",
        }
    )
    job = Job(
        job_id="j-" + "0" * 20,
        status=JobStatus.QUEUED,
        spec=JobSpec.model_validate(
            {"name": "n", "team": "ml", "image": "i", "command": ["x"], "resources": {"gpus": 1}}
        ),
        source="test",
        created_at=1.0,
        updated_at=1.0,
    )
    start = LifecycleService.workflow_input(job, plan, attempt=2)
    requeue = STATES["Requeue"]
    assert requeue["ResultPath"] == "$"
    selected = {f"{key}.$": f"$.Payload.{key}" for key in [*start, "continued"]}
    assert requeue["ResultSelector"] == selected
    # Unless the job continued in a new execution, back to the queue, where intake's execution
    # goes first (a child of an array's starts admitted: docs/arrays.md).
    continued = STATES[requeue["Next"]]
    assert continued["Type"] == "Choice" and continued["Default"] == "Enqueue"
    first = STATES[DEFINITION["StartAt"]]
    assert first["Default"] == "Enqueue"
    assert first["Choices"] == [{"Variable": "$.admission", "IsPresent": True, "Next": "Launch"}]
    [choice] = continued["Choices"]
    assert choice["Variable"] == "$.continued" and STATES[choice["Next"]]["Type"] == "Succeed"
    # Every state rebuilt on the way carries the execution's count of requeues to Requeue.
    rebuilt = [s for s in STATES.values() if s["Type"] == "Pass" and s["ResultPath"] == "$"]
    assert rebuilt and all(s["Parameters"]["cycles.$"] == "$.cycles" for s in rebuilt)
    payload = requeue["Parameters"]["Payload"]
    assert payload["cycles.$"] == "$.cycles" and payload["execution.$"] == "$$.Execution.Name"
    # What the Launch task reads from that state is there.
    launch = STATES["Launch"]["Parameters"]["Payload"]
    assert launch["step.$"] == "$.launch.step" and launch["attempt.$"] == "$.launch.attempt"
    assert {"step", "attempt"} <= set(start["launch"]) and start["launch"]["attempt"] == 2
    # And what the Enqueue task reads.
    assert STATES["Enqueue"]["Parameters"]["Payload"]["queued.$"] == "$.queued"
    assert EnqueueTask.model_validate({**start, "task_token": "t"}).queued.team == "ml"


def first_retrier(state: dict[str, Any], error: str) -> dict[str, Any] | None:
    """The retrier Step Functions applies to `error`: the first that names it or States.ALL
    (which matches every error but States.DataLimitExceeded and States.Runtime)."""
    return next(
        (r for r in state.get("Retry", []) if {error, "States.ALL"} & set(r["ErrorEquals"])),
        None,
    )


@pytest.mark.parametrize("error", ["States.Timeout", "States.HeartbeatTimeout"])
def test_a_run_that_ran_out_of_time_goes_to_release_without_waiting_again(error: str) -> None:
    launch = STATES["Launch"]
    assert launch["TimeoutSecondsPath"] and launch["HeartbeatSecondsPath"]
    retrier = first_retrier(launch, error)
    assert retrier is None or retrier["MaxAttempts"] == 0
    catcher = next(c for c in launch["Catch"] if {error, "States.ALL"} & set(c["ErrorEquals"]))
    assert catcher["Next"] == "Release"


@pytest.mark.parametrize(
    ("step", "end"), [("Release", "ReleaseFailed"), ("Requeue", "RequeueFailed")]
)
def test_a_step_that_fails_for_good_ends_the_workflow_unsettled_with_its_cause(
    step: str, end: str
) -> None:
    """Past its retries, Release or Requeue ends the execution in a Fail state: Step Functions
    then reports it FAILED with that error, which the backstop (WorkflowEnded) takes for a job
    left unsettled. The lifecycle's own end of a job that failed is a Succeed state: the
    workflow settled it, and ExecutionsFailed counts only workflows that broke."""
    [catcher] = STATES[step]["Catch"]
    assert catcher["ErrorEquals"] == ["States.ALL"] and catcher["Next"] == end
    fail = STATES[end]
    assert fail["Type"] == "Fail" and fail["Error"] == end
    # The reason the job ends with is the failing step's own error cause.
    assert fail["CausePath"] == f"{catcher['ResultPath']}.Cause"
    assert STATES["JobFailed"]["Type"] == "Succeed"


def test_the_backstop_hears_of_every_way_the_lifecycle_can_end_unsettled() -> None:
    rule = next(r for r in RULES if r.target_function == WORKFLOW_ENDED.construct_id)
    assert rule.on_default_bus and rule.pattern["source"] == ["aws.states"]
    # Every status of an execution that ended but SUCCEEDED.
    assert set(rule.pattern["detail"]["status"]) == {"FAILED", "TIMED_OUT", "ABORTED"}
    ends = {name for name, state in STATES.items() if state["Type"] in ("Succeed", "Fail")}
    assert ends == {"JobSucceeded", "JobFailed", "ContinuedAsNew", "ReleaseFailed", "RequeueFailed"}
