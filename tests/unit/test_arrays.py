"""Arrays, sweeps and dependencies: the spec's rules and `domain/arrays.py`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import RecordingWorkflow
from gpufleet.domain.arrays import (
    Readiness,
    array_status,
    child_env,
    child_job_id,
    child_spec,
    dependency_verdict,
    status_counts,
    submission_from_mapping,
)
from gpufleet.domain.job import JobStatus, is_job_id
from gpufleet.domain.spec import (
    ARRAY_INDEX_ENV,
    MAX_ARRAY_SIZE,
    MAX_ENV,
    Dependency,
    DependencyMode,
    JobSpec,
    SpecError,
    json_schema,
    parse_spec,
    spec_from_mapping,
)
from gpufleet.errors import TransientError
from gpufleet.ports import NO_WORKFLOW_YET
from gpufleet.services.factory import build_dispatcher, build_lifecycle
from tests.helpers import intake_for, local_ports, make_settings, sent_as

S, F, C, R, Q = (
    JobStatus.SUCCEEDED,
    JobStatus.FAILED,
    JobStatus.CANCELLED,
    JobStatus.RUNNING,
    JobStatus.QUEUED,
)


def job(name: str = "train", **fields: Any) -> dict[str, Any]:
    return {"name": name, "team": "vision", "image": "img:1", "command": ["python"], **fields}


def refused(document: object) -> list[tuple[str, str]]:
    with pytest.raises(SpecError) as caught:
        submission_from_mapping(document)
    return [(f.field, f.message) for f in caught.value.fields] or [("", caught.value.message)]


def test_an_array_gives_each_child_its_index_under_both_names() -> None:
    spec = spec_from_mapping(job(array={"size": 3}, env={"A": "1"}))
    assert spec.size == 3 and spec.is_array
    child = child_spec(spec, 2)
    assert child.env == {"A": "1", "GPUFLEET_ARRAY_INDEX": "2", "AWS_BATCH_JOB_ARRAY_INDEX": "2"}
    assert child.array is None and not child.is_array
    with pytest.raises(ValueError, match="child 3 of an array of 3"):
        child_env(spec, 3)


def test_a_grid_sweep_makes_every_combination_with_values_as_written() -> None:
    spec = parse_spec(
        "name: sweep\nteam: vision\nimage: img:1\ncommand: [python]\n"
        "sweep: {grid: {lr: [0.1, 0.01], batch: [32, 64, 128], fp16: [true]}}\n"
    )
    assert spec.size == 6
    points = [child_env(spec, i) for i in range(spec.size)]
    assert {(p["batch"], p["lr"]) for p in points} == {
        (b, lr) for b in ("32", "64", "128") for lr in ("0.1", "0.01")
    }
    assert points[0] == {
        "GPUFLEET_ARRAY_INDEX": "0",
        "AWS_BATCH_JOB_ARRAY_INDEX": "0",
        "batch": "32",
        "fp16": "true",
        "lr": "0.1",
    }
    assert points[1]["lr"] == "0.01"  # the last sorted name varies fastest


def test_a_list_sweep_makes_one_child_a_point() -> None:
    spec = spec_from_mapping(job(sweep={"points": [{"MODEL": "a"}, {"MODEL": "b"}]}))
    assert [child_env(spec, i)["MODEL"] for i in range(spec.size)] == ["a", "b"]


def test_the_largest_array_is_accepted_and_one_more_is_not() -> None:
    assert spec_from_mapping(job(array={"size": MAX_ARRAY_SIZE})).size == MAX_ARRAY_SIZE
    assert refused(job(array={"size": MAX_ARRAY_SIZE + 1}))[0][0] == "array.size"
    grid = {"A": list(range(100)), "B": list(range(101))}
    assert "makes 10100 runs" in refused(job(sweep={"grid": grid}))[0][1]


@pytest.mark.parametrize(
    ("sweep", "says"),
    [
        ({"grid": {"lr": []}}, "no values"),
        ({"grid": {"lr": [1]}, "points": [{"lr": 1}]}, "either a grid or a list"),
        ({}, "either a grid or a list"),
        ({"points": [{"A": 1}, {"B": 2}]}, "does not name the parameters"),
        ({"points": [{}]}, "at least one parameter"),
        ({"grid": {"lr": [[1]]}}, "valid"),
        ({"points": [{"A": "x\nB=1"}]}, "one line"),
        ({"points": [{"A": "\x00"}]}, "NUL"),
    ],
)
def test_a_bad_sweep_is_refused(sweep: dict[str, Any], says: str) -> None:
    problems = refused(job(sweep=sweep))
    assert len(problems) == 1 and problems[0][0].startswith("sweep")
    assert says in problems[0][1]


def test_a_sweep_with_many_problems_is_refused_whole_with_one_error() -> None:
    bad = {"grid": {"lr": [None, [1], {"x": 1}], "bad name": [1], "ok": [1]}}
    problems = refused(job(sweep=bad, resources={"gpus": "two"}))
    sweep = [p for p in problems if p[0].startswith("sweep")]
    assert len(sweep) == 1 and "more in the sweep" in sweep[0][1]
    assert any(field == "resources.gpus" for field, _ in problems)  # other fields still listed


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"array": {"size": 2}, "sweep": {"points": [{"A": 1}]}}, "not both"),
        ({"sweep": {"points": [{"A": 1}]}, "env": {"A": "x"}}, "also an environment variable"),
        ({"sweep": {"points": [{"GPUFLEET_ARRAY_INDEX": 1}]}}, "also an environment variable"),
        (
            {"array": {"size": 2}, "env": {f"E{i}": "x" for i in range(MAX_ENV - 1)}},
            f"limit is {MAX_ENV}",
        ),
        ({"depends_on": [{"job": "j-" + "0" * 20, "mode": "element"}]}, "for an array"),
    ],
)
def test_an_array_that_cannot_run_as_given_is_refused(fields: dict[str, Any], says: str) -> None:
    assert says in refused(job(**fields))[0][1]


def test_jobs_come_in_dependency_order() -> None:
    submission = submission_from_mapping(
        {
            "jobs": [
                job("eval", depends_on=[{"job": "train", "on": "any"}, {"job": "prep"}]),
                job("train", array={"size": 4}, depends_on=[{"job": "prep"}]),
                job("prep", depends_on=[{"job": "j-" + "a" * 20}]),
            ]
        }
    )
    assert [spec.name for spec in submission.jobs] == ["prep", "train", "eval"]
    assert submission.children == 6


def test_a_cycle_is_refused_at_intake_naming_it() -> None:
    (problem,) = refused(
        {
            "jobs": [
                job("a", depends_on=[{"job": "b"}]),
                job("b", depends_on=[{"job": "c"}]),
                job("c", depends_on=[{"job": "a"}]),
                job("d", depends_on=[{"job": "a"}]),
            ]
        }
    )
    assert "cycle: a -> b -> c -> a" in problem[1]


@pytest.mark.parametrize(
    ("jobs", "says"),
    [
        ([job("a", depends_on=[{"job": "a"}])], "itself"),
        ([job("a", depends_on=[{"job": "nobody"}])], "neither a job id"),
        ([job("a"), job("a")], "distinct names"),
        (
            [
                job("a", array={"size": 3}),
                job("b", array={"size": 4}, depends_on=[{"job": "a", "mode": "element"}]),
            ],
            "arrays of one size",
        ),
        ([], "1 to 100"),
    ],
)
def test_a_dependency_that_cannot_hold_is_refused(jobs: list[Any], says: str) -> None:
    assert says in refused({"jobs": jobs})[0][1]


def test_a_bad_job_of_a_submission_is_named_by_its_place() -> None:
    assert refused({"jobs": [job("a"), job("b", image=3)]})[0][0] == "jobs[1].image"


def test_a_success_dependency_that_failed_cancels_with_the_reason() -> None:
    dep = Dependency(job="train")
    assert dependency_verdict([(dep, [S, R])]).readiness is Readiness.WAIT
    verdict = dependency_verdict([(dep, [S, F, R])])
    assert verdict.readiness is Readiness.CANCEL
    assert verdict.reason == "dependency train ended FAILED"
    assert dependency_verdict([(dep, [S, S])]).readiness is Readiness.RUN
    assert dependency_verdict([(dep, [C])]).reason == "dependency train ended CANCELLED"


def test_an_any_dependency_runs_once_everything_ended() -> None:
    dep = Dependency(job="train", on="any")
    assert dependency_verdict([(dep, [F, R])]).readiness is Readiness.WAIT
    assert dependency_verdict([(dep, [F, C, S])]).readiness is Readiness.RUN
    assert dependency_verdict([]).readiness is Readiness.RUN


def test_an_element_dependency_looks_at_its_own_index_only() -> None:
    dep = Dependency(job="prep", mode=DependencyMode.ELEMENT)
    statuses = [S, F, Q]
    assert dependency_verdict([(dep, statuses)], 0).readiness is Readiness.RUN
    assert dependency_verdict([(dep, statuses)], 1).readiness is Readiness.CANCEL
    assert dependency_verdict([(dep, statuses)], 2).readiness is Readiness.WAIT
    with pytest.raises(ValueError, match="no element 3"):
        dependency_verdict([(dep, statuses)], 3)


def test_every_dependency_must_be_met() -> None:
    done, running = Dependency(job="a"), Dependency(job="b", on="any")
    assert dependency_verdict([(done, [S]), (running, [R])]).readiness is Readiness.WAIT


def test_intake_queues_one_child_a_point_with_no_workflow_until_admitted() -> None:
    ports = local_ports()
    spec = job(resources={"gpus": 0, "vcpus": 2}, sweep={"grid": {"lr": [0.1, 0.01], "B": [1, 2]}})
    outcome = intake_for(ports).submit_document(spec, "delivery-1", "event:1", sent_as("vision"))
    array_id = outcome.job_id
    assert array_id is not None and outcome.job_ids == (array_id,)
    array = ports.jobs.get(array_id)
    assert array.status is JobStatus.SUBMITTED and array.spec.size == 4
    children = [ports.jobs.get(child_job_id(array_id, i)) for i in range(4)]
    assert [c.status for c in children] == [JobStatus.QUEUED] * 4
    assert [(c.array_id, c.array_index) for c in children] == [(array_id, i) for i in range(4)]
    assert [(c.spec.env["B"], c.spec.env["lr"], c.spec.env[ARRAY_INDEX_ENV]) for c in children] == [
        ("1", "0.1", "0"),
        ("1", "0.01", "1"),
        ("2", "0.1", "2"),
        ("2", "0.01", "3"),
    ]
    assert array.estimated_cost_usd == pytest.approx(4 * (children[0].estimated_cost_usd or 0))
    waiting = ports.queue.waiting()
    # In index order, each waiting with no workflow: admission starts it.
    assert [w.job.job_id for w in waiting] == [c.job_id for c in children]
    assert [w.job.array_index for w in waiting] == [0, 1, 2, 3]
    assert {w.task_token for w in waiting} == {NO_WORKFLOW_YET}
    assert cast(RecordingWorkflow, ports.workflow).inputs == {}
    # A redelivery stores nothing new and queues nothing twice.
    again = intake_for(ports).submit_document(spec, "delivery-1", "event:1", sent_as("vision"))
    assert again.job_ids == outcome.job_ids
    assert len(ports.jobs.list_jobs()) == 5 and len(ports.queue.waiting()) == 4


def test_an_array_nothing_can_run_fails_whole_with_no_children() -> None:
    ports = local_ports()
    spec = job(resources={"gpus": 8, "gpu_models": ["nope"]}, array={"size": 3})
    outcome = intake_for(ports).submit_document(spec, "delivery-1", "event:1", sent_as("vision"))
    assert outcome.job_id is not None
    assert [j.status for j in ports.jobs.list_jobs()] == [JobStatus.FAILED]
    assert ports.queue.waiting() == []


def test_children_ids_derive_from_their_array() -> None:
    ids = {child_job_id("j-00000000000000000001", i) for i in range(100)}
    assert len(ids) == 100 and all(is_job_id(i) for i in ids)
    assert child_job_id("j-00000000000000000001", 7) == child_job_id("j-00000000000000000001", 7)


def test_an_arrays_status_is_its_childrens() -> None:
    assert array_status([Q, Q]) is JobStatus.QUEUED
    assert array_status([S, Q]) is JobStatus.RUNNING
    assert array_status([R, Q]) is JobStatus.RUNNING
    assert array_status([S, S]) is JobStatus.SUCCEEDED
    assert array_status([S, C]) is JobStatus.CANCELLED
    assert array_status([C, F, S]) is JobStatus.FAILED
    counts = status_counts([S, S, Q])
    assert list(counts) == list(JobStatus)
    assert counts[JobStatus.SUCCEEDED] == 2 and counts[JobStatus.QUEUED] == 1
    assert counts[JobStatus.FAILED] == 0
    with pytest.raises(ValueError, match="at least one child"):
        array_status([])


def test_intake_refuses_a_cycle() -> None:
    ports = local_ports()
    cycle = {"jobs": [job("a", depends_on=[{"job": "b"}]), job("b", depends_on=[{"job": "a"}])]}
    outcome = intake_for(ports).submit_document(cycle, "delivery-1", "event:1", sent_as("vision"))
    assert outcome.error is not None and "cycle: a -> b -> a" in outcome.error["message"]
    assert ports.jobs.list_jobs() == []


def test_the_schema_offers_the_new_fields_with_their_limits() -> None:
    schema = json_schema()
    assert {"array", "sweep", "depends_on"} <= schema["properties"].keys()
    assert schema["properties"]["depends_on"]["maxItems"] == 20
    assert schema["$defs"]["ArraySize"]["properties"]["size"]["maximum"] == MAX_ARRAY_SIZE


class ThrottlingWorkflow(RecordingWorkflow):
    """Step Functions' StartExecution past its token bucket: `allowed` starts, then throttled."""

    allowed: int = 2

    def start(self, job_id: str, state: Mapping[str, Any], continuation: int = 0) -> None:
        if self.allowed == 0:
            raise TransientError("StartExecution was throttled")
        self.allowed -= 1
        super().start(job_id, state, continuation)


def test_a_pass_whose_starts_are_throttled_leaves_the_rest_to_the_next_pass() -> None:
    ports = replace(local_ports(), workflow=ThrottlingWorkflow())
    workflow = cast(ThrottlingWorkflow, ports.workflow)
    spec = job(resources={"gpus": 0, "vcpus": 2}, array={"size": 5})
    intake_for(ports).submit_document(spec, "delivery-1", "event:1", sent_as("vision"))
    dispatcher = build_dispatcher(ports, make_settings(), build_lifecycle(ports, make_settings()))
    admitted_at = ports.clock.now()
    first = dispatcher.run_pass()  # admits all five; Step Functions takes two starts
    assert len(first.admitted) == 5 and len(workflow.started) == 2
    assert sum(not r.notified for r in ports.queue.state().running) == 5
    workflow.allowed = 10  # the bucket refilled
    dispatcher.run_pass()
    assert sorted(workflow.started) == sorted(first.admitted)  # each started once
    admissions = [state["admission"] for state in workflow.inputs.values()]
    assert all(a["admitted"] and a["admitted_at"] == admitted_at for a in admissions)


def test_a_pass_plans_an_arrays_children_once_and_a_resized_child_apart() -> None:
    ports = local_ports()
    spec = job(resources={"gpus": 0, "vcpus": 2}, array={"size": 6})
    outcome = intake_for(ports).submit_document(spec, "delivery-1", "event:1", sent_as("vision"))
    lifecycle = build_lifecycle(ports, make_settings())
    kids = [child_job_id(outcome.job_id or "", i) for i in range(6)]
    lifecycle.resize(kids[5], {"gpus": 0, "vcpus": 4})  # waiting: its own plan input changed
    plans: list[str] = []
    planner = lifecycle._planner

    def counting(spec: JobSpec, **inputs: Any) -> Any:
        plans.append(spec.name)
        return planner(spec, **inputs)

    lifecycle._planner = counting
    dispatcher = build_dispatcher(ports, make_settings(), lifecycle)
    assert len(dispatcher.run_pass().admitted) == 6
    assert len(plans) == 2  # one for the five alike, one for the resized child
    workflow = cast(RecordingWorkflow, ports.workflow)
    first, resized = workflow.inputs[kids[0]]["plan"], workflow.inputs[kids[5]]["plan"]
    assert all(workflow.inputs[kid]["plan"] == first for kid in kids[:5]) and resized != first
