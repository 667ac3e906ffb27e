"""The demo runs that several test modules read, each made once per test session
(`tests.helpers.shared`: a demo takes half a minute to a minute and a half of the suite, and
xdist spreads the modules that read one over separate worker processes)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import botocore.handlers

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.domain.job import Job
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import (
    EVENTS_DIR,
    DemoResult,
    DemoScenario,
    Submission,
    preemption_scenario,
    run_demo,
    spot_scenario,
    stages_scenario,
    sweep_scenario,
)
from gpufleet.emulator.nodes import Behaviour
from gpufleet.topology import JOBS_TABLE
from tests.helpers import every_requeue_continues_as_new


@dataclass(frozen=True)
class SpotRun:
    """The spot demo, and the parameters of every GetMetricData the control plane sent in it
    (MetricWatch's passes over the running jobs)."""

    result: DemoResult
    metric_requests: list[dict[str, Any]]


def spot_run() -> SpotRun:
    """The spot demo, with the extra submissions that take both intake functions (one is
    rejected)."""
    spot = spot_scenario()
    extra = [
        Submission("event", EVENTS_DIR / "submit-job-event.json"),
        Submission("s3", EVENTS_DIR / "jobs" / "broken-spec.yaml"),
    ]
    requests: list[dict[str, Any]] = []

    def keep(params: dict[str, Any], **_: Any) -> None:
        requests.append(dict(params))

    entry = ("provide-client-params.cloudwatch.GetMetricData", keep)
    botocore.handlers.BUILTIN_HANDLERS.append(entry)
    try:
        result = run_demo(dataclasses.replace(spot, submissions=[*spot.submissions, *extra]))
    finally:
        botocore.handlers.BUILTIN_HANDLERS.remove(entry)
    assert result.completed, f"the spot demo did not finish: {result.to_json()}"
    assert requests, "no MetricWatch pass read the demo's running jobs"
    return SpotRun(result, requests)


def preemption_run() -> DemoResult:
    """The preemption demo with every requeue past its execution's budget
    (docs/aws-fidelity.md F5): the preempted job's Requeue starts its next execution."""
    with every_requeue_continues_as_new():
        result = run_demo(preemption_scenario())
    assert result.completed, f"the preemption demo did not finish: {result.to_json()}"
    return result


# A job of the basic demo whose workflow the run stops once it runs: the backstop ends it.
STOPPED = "resnet-baseline"
SHARDS = "tokenize-shards"  # an array of 4 (events/scenarios/sweep/nlp-shards.yaml)
EVENT_SHARDS = "asr-eval-shards"  # an array of 3 (events/submit-array-event.json)


def stages_with_intake_paths() -> DemoScenario:
    """The stages demo, plus the basic demo's event submission and broken upload (both intake
    functions, and the error report a refused spec gets), a job whose workflow is stopped
    under it (the backstop) and an array by each intake (children queued at intake, their
    workflows started at admission), without more demos' minutes."""
    scenario = stages_scenario()
    extra = [
        Submission("event", EVENTS_DIR / "submit-job-event.json"),
        Submission("s3", EVENTS_DIR / "jobs" / "broken-spec.yaml"),
        Submission("s3", EVENTS_DIR / "jobs" / f"{STOPPED}.yaml"),
        Submission("s3", EVENTS_DIR / "scenarios" / "sweep" / "nlp-shards.yaml"),
        Submission("event", EVENTS_DIR / "submit-array-event.json"),
    ]
    nodes = dataclasses.replace(
        scenario.nodes,
        behaviours={
            **scenario.nodes.behaviours,
            STOPPED: Behaviour(duration_seconds=60.0),
            SHARDS: Behaviour(duration_seconds=1.0),
            EVENT_SHARDS: Behaviour(duration_seconds=1.0),
        },
    )
    return dataclasses.replace(
        scenario,
        submissions=[*scenario.submissions, *extra],
        nodes=nodes,
        stop_workflows=frozenset({STOPPED}),
    )


def stages_run() -> DemoResult:
    result = run_demo(stages_with_intake_paths())
    assert result.completed, f"the stages demo did not finish: {result.to_json()}"
    return result


@dataclass(frozen=True)
class SweepRun:
    """The sweep demo, and every job record its account held at the end."""

    result: DemoResult
    records: list[Job]


def sweep_run() -> SweepRun:
    records: list[Job] = []

    def keep_records(account: Account) -> None:
        store = DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
        records.extend(store.list_jobs())

    return SweepRun(run_demo(sweep_scenario(), before_teardown=keep_records), records)
