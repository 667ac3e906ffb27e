"""Multi-stage jobs: the spec, template resolution, and the lifecycle of each stage on the
in-memory adapters (own instances, reuse of the previous stage's, retries, cost per stage)."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.adapters.local.memory import (
    FakeFleet,
    InMemoryObjects,
    ManualClock,
    RecordingWorkflow,
)
from gpufleet.agent.node import NodeAgent, RunManifest, RunOutcome
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.cost import run_cost_usd
from gpufleet.domain.fair_share import usage_by_team
from gpufleet.domain.job import JobStatus
from gpufleet.domain.planning import LaunchPlan
from gpufleet.domain.spec import Resources, SpecError, parse_spec
from gpufleet.domain.stages import ENV_STAGE_INPUT, ENV_STAGE_OUTPUT
from gpufleet.domain.templates import apply_template
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.services.lifecycle import LifecycleService
from gpufleet.services.lifecycle_base import control_key, run_manifest_key
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import WorkflowState
from gpufleet.topology import (
    CONTROL_RUN_STAGE,
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_STARTED,
    JOB_LIFECYCLE,
)
from tests.helpers import local_ports, make_settings, plan_of
from tests.node_keys import NODE_KEY_DOCUMENT, is_node_key

TEMPLATES = {
    "cpu-preprocess": Resources(gpus=0, vcpus=32, memory_gib=64),
    "gpu-train": Resources(gpus=8, gpu_memory_gib=40, gpu_models=["A100", "H100"], vcpus=64),
    "gpu-train-large": Resources(gpus=8, gpu_memory_gib=40, gpu_models=["A100"], nodes=2),
    "tune-small": Resources(gpus=1, gpu_memory_gib=16, vcpus=4, memory_gib=16),
}
SETTINGS = make_settings(config=FleetConfig(templates=TEMPLATES))
CATALOG = load_bundled()

HEAD = """\
name: pipeline
team: nlp
image: img:1
command: [python, run.py]
env: {DATASET: s3://data/set/}
"""

THREE_STAGES = (
    HEAD
    + """\
stages:
  - {name: preprocess, template: cpu-preprocess, command: [python, run.py, prep]}
  - {name: train, template: gpu-train, command: [python, run.py, train], max_retries: 1}
  - {name: evaluate, template: tune-small, env: {SPLIT: test}}
"""
)


def spec_of(text: str) -> Any:
    return apply_template(parse_spec(text), TEMPLATES)


# -- the spec ---------------------------------------------------------------------------------


def test_a_stage_takes_what_it_leaves_out_from_the_job_and_merges_the_environment() -> None:
    spec = spec_of(THREE_STAGES)
    evaluate = spec.for_stage(2)
    assert evaluate.command == ["python", "run.py"]  # the job's default
    assert evaluate.env == {"DATASET": "s3://data/set/", "SPLIT": "test"}
    assert evaluate.resources == TEMPLATES["tune-small"]
    train = spec.for_stage(1)
    assert train.command == ["python", "run.py", "train"]
    assert (train.max_retries, spec.for_stage(0).max_retries) == (1, 3)


@pytest.mark.parametrize(
    ("stages", "field_name", "message"),
    [
        ("[{name: a}, {name: a}]", "stages", "unique"),
        ("[{name: a, reuse_previous: true}]", "stages", "no previous stage"),
        ("[{name: a, command: python run.py}]", "stages[0].command", "argv list"),
        (json.dumps([{"name": f"s{i}"} for i in range(11)]), "stages", "at most 10"),
    ],
)
def test_bad_stages_are_refused_naming_the_field(
    stages: str, field_name: str, message: str
) -> None:
    with pytest.raises(SpecError) as refused:
        parse_spec(HEAD + f"stages: {stages}\n")
    assert [(f.field, message in f.message) for f in refused.value.fields] == [(field_name, True)]


def test_stage_resources_are_resolved_at_intake_over_their_template_or_the_jobs() -> None:
    spec = spec_of(
        HEAD
        + """\
resources: {gpus: 2, gpu_memory_gib: 24, vcpus: 8}
stages:
  - {name: prep, template: cpu-preprocess, resources: {vcpus: 8}}
  - {name: train, resources: {gpus: 4}}
  - {name: score}
"""
    )
    prep, train, score = (stage.resources for stage in spec.stages)
    assert prep == Resources(gpus=0, vcpus=8, memory_gib=64)
    assert train == Resources(gpus=4, gpu_memory_gib=24, vcpus=8)  # the job's, gpus overridden
    assert score == spec.resources
    # Stored resolved: what the job store reads back is the same spec.
    assert parse_spec(json.dumps(spec.to_document())) == spec


@pytest.mark.parametrize(
    ("stage", "field_name"),
    [
        ("{name: a, template: gpu-trian}", "stages[0].template"),
        ("{name: a, template: gpu-train-large, resources: {gpus: 0}}", "stages[0].resources"),
    ],
)
def test_a_stage_with_an_unknown_template_or_invalid_overrides_is_refused(
    stage: str, field_name: str
) -> None:
    with pytest.raises(SpecError) as refused:
        spec_of(HEAD + f"stages: [{stage}]\n")
    assert refused.value.fields[0].field == field_name


# -- the lifecycle, stage by stage -----------------------------------------------------------


class World:
    """Intake and the lifecycle steps over in-memory ports, driven as the state machine does."""

    def __init__(self, fleet: FakeFleet | None = None) -> None:
        self.ports = local_ports(fleet)
        self.lifecycle: LifecycleService = build_lifecycle(self.ports, SETTINGS)
        self.intake = build_intake(self.ports, SETTINGS, self.lifecycle)
        self.tokens = 0
        self.attempt = 0

    @property
    def clock(self) -> ManualClock:
        return cast(ManualClock, self.ports.clock)

    @property
    def fleet(self) -> FakeFleet:
        return cast(FakeFleet, self.ports.fleet)

    @property
    def objects(self) -> dict[str, bytes]:
        return cast(InMemoryObjects, self.ports.objects).objects

    def submit(self, spec: str) -> tuple[str, LaunchPlan]:
        self.objects["jobs/nlp/p.yaml"] = spec.encode()
        job_id = self.intake.submit_object(
            "jobs/nlp/p.yaml", "p#1", "s3://bucket/jobs/nlp/p.yaml"
        ).job_id
        assert job_id is not None
        return job_id, plan_of(self.ports, job_id)

    def token(self) -> str:
        self.tokens += 1
        return f"token-{self.tokens}"

    def launch(self, job_id: str, plan: LaunchPlan) -> str:
        """The Launch task: returns the token that waits for the node's report."""
        token = self.token()
        assert self.lifecycle.launch(job_id, plan, 0, self.attempt, token) is None
        return token

    def run(self, job_id: str, token: str, seconds: float, exit_code: int = 0) -> dict[str, Any]:
        """The job's node runs its current stage and reports; the workflow's state after."""
        job = self.ports.jobs.get(job_id)
        assert job.placement is not None
        instance, stage = job.placement.instance_ids[0], job.stage_name
        self.lifecycle.node_report(
            NodeReport(job_id=job_id, instance_id=instance, phase="started", stage=stage)
        )
        self.clock.advance(seconds)
        self.lifecycle.node_report(
            NodeReport(
                job_id=job_id,
                instance_id=instance,
                phase="finished",
                exit_code=exit_code,
                stage=stage,
            )
        )
        run = cast(RecordingWorkflow, self.ports.workflow).completed[token]
        return {"run": run, "launch": {"step": 0, "attempt": self.attempt}}

    def stage(self, job_id: str, plan: LaunchPlan, seconds: float, exit_code: int = 0) -> Any:
        """Launch, run and release one stage; the next plan when the job is requeued."""
        state = self.run(job_id, self.launch(job_id, plan), seconds, exit_code)
        released = self.lifecycle.release(job_id, WorkflowState.model_validate(state))
        self.attempt += 1
        return self.lifecycle.requeue(job_id) if released["requeue"] else released

    def manifest(self, job_id: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.objects[run_manifest_key(job_id)])
        return document


def types_of(plan: LaunchPlan) -> set[str]:
    return {o.instance_type for step in plan.steps for o in step.overrides}


def test_each_stage_is_planned_for_its_own_resources_and_a_cpu_stage_gets_only_cpu_types() -> None:
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    assert {CATALOG.instance_type(t).gpus for t in types_of(plan)} == {0}
    train_plan = world.stage(job_id, plan, 600)
    assert all(CATALOG.instance_type(t).gpus >= 8 for t in types_of(train_plan))
    evaluate_plan = world.stage(job_id, train_plan, 3600)
    assert all(CATALOG.instance_type(t).gpus == 1 for t in types_of(evaluate_plan))


def test_stages_run_in_order_on_new_instances_released_between_them_with_cost_per_stage() -> None:
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    held = {"preprocess": 600.0, "train": 3600.0, "evaluate": 300.0}
    expected_cost = {}
    for name, seconds in held.items():
        token = world.launch(job_id, plan)
        job = world.ports.jobs.get(job_id)
        assert job.stage_name == name and job.placement is not None
        assert world.fleet.live == dict.fromkeys(job.placement.instance_ids, job_id)
        env = world.manifest(job_id)["env"]
        assert env[ENV_STAGE_OUTPUT] == f"s3://bucket/runs/{job_id}/stages/{name}/"
        expected_cost[name] = run_cost_usd(job.placement, world.clock.now() + seconds)
        state = world.run(job_id, token, seconds)
        released = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
        assert world.fleet.live == {}  # every stage's instances go when it ends
        if name != "evaluate":
            assert released["requeue"] and not released["next_stage"]["here"]
            assert world.ports.jobs.get(job_id).status is JobStatus.RUNNING
            plan = world.lifecycle.requeue(job_id)
            assert world.ports.jobs.get(job_id).status is JobStatus.QUEUED
    job = world.ports.jobs.get(job_id)
    assert job.status is JobStatus.SUCCEEDED
    stages = job.summary()["stages"]
    assert [(s["name"], s["status"]) for s in stages] == [
        ("preprocess", "SUCCEEDED"),
        ("train", "SUCCEEDED"),
        ("evaluate", "SUCCEEDED"),
    ]
    assert [s["gpus"] for s in stages] == [0, 8, 1]
    assert [s["held_seconds"] for s in stages] == list(held.values())
    for line in stages:
        assert line["cost_usd"] == pytest.approx(expected_cost[line["name"]], abs=1e-6)
    assert job.cost_usd == pytest.approx(sum(s["cost_usd"] for s in stages), abs=1e-6)
    assert len({s["instance_type"] for s in stages}) == 3


def test_a_stage_reads_the_previous_stages_output_prefix() -> None:
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    token = world.launch(job_id, plan)
    assert ENV_STAGE_INPUT not in world.manifest(job_id)["env"]
    world.lifecycle.release(job_id, WorkflowState.model_validate(world.run(job_id, token, 60)))
    world.launch(job_id, world.lifecycle.requeue(job_id))
    manifest = world.manifest(job_id)
    assert manifest["stage"] == "train" and manifest["command"] == ["python", "run.py", "train"]
    assert manifest["env"][ENV_STAGE_INPUT] == f"s3://bucket/runs/{job_id}/stages/preprocess/"
    assert manifest["env"]["DATASET"] == "s3://data/set/"


def test_a_failed_stage_is_retried_per_its_policy_then_fails_the_job_and_no_later_one_runs() -> (
    None
):
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    # The preprocessing stage fails once and is retried (job default: 3 retries) ...
    plan = world.stage(job_id, plan, 60, exit_code=1)
    assert world.ports.jobs.get(job_id).retries == 1
    plan = world.stage(job_id, plan, 60)
    # ... and the training stage starts with its own count: one retry, then the job fails.
    assert world.ports.jobs.get(job_id).retries == 0
    plan = world.stage(job_id, plan, 60, exit_code=2)
    ended = world.stage(job_id, plan, 60, exit_code=2)
    assert ended["requeue"] is False
    job = world.ports.jobs.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason == "stage 'train': exit code 2"
    assert [(s["name"], s["status"], s["retries"]) for s in job.summary()["stages"]] == [
        ("preprocess", "SUCCEEDED", 1),
        ("train", "FAILED", 1),
        ("evaluate", "SKIPPED", 0),
    ]
    assert world.fleet.live == {}
    assert job.total("retries") == 2
    assert job.cost_usd == pytest.approx(sum(s["cost_usd"] for s in job.summary()["stages"]))


def test_a_job_cancelled_between_stages_keeps_the_cost_of_those_that_ran() -> None:
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    world.stage(job_id, plan, 600)  # preprocess done; the job waits for its train stage
    world.lifecycle.cancel(job_id)
    world.lifecycle.release(
        job_id, WorkflowState.model_validate({"admission": {"cancelled": True}})
    )
    job = world.ports.jobs.get(job_id)
    stages = job.summary()["stages"]
    assert [s["status"] for s in stages] == ["SUCCEEDED", "CANCELLED", "SKIPPED"]
    assert stages[0]["cost_usd"] > 0 and stages[1]["cost_usd"] == 0
    assert job.cost_usd == stages[0]["cost_usd"]


def test_a_stage_nothing_can_run_fails_the_job_at_intake_naming_the_stage() -> None:
    world = World()
    spec = HEAD + "stages: [{name: a}, {name: b, resources: {gpus: 1, gpu_models: [Z999]}}]\n"
    world.objects["jobs/nlp/p.yaml"] = spec.encode()
    job_id = world.intake.submit_object("jobs/nlp/p.yaml", "p#1", "s3://b/jobs/nlp/p.yaml").job_id
    assert job_id is not None
    job = world.ports.jobs.get(job_id)
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None and job.failure_reason.startswith("stage 'b': ")
    assert cast(RecordingWorkflow, world.ports.workflow).started == []


REUSE = (
    HEAD
    + """\
stages:
  - {name: train, template: tune-small}
  - {name: evaluate, resources: {gpus: 1, gpu_memory_gib: 8}, reuse_previous: true}
  - {name: report, template: cpu-preprocess}
"""
)


def test_a_stage_that_fits_reuses_the_previous_stages_instances() -> None:
    world = World()
    job_id, plan = world.submit(REUSE)
    state = world.run(job_id, world.launch(job_id, plan), 1200)
    instance = world.ports.jobs.get(job_id).placement.instance_ids  # type: ignore[union-attr]
    train_gpus = world.ports.jobs.get(job_id).effective_spec.resources.total_gpus
    released = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    assert released["requeue"] is False and released["terminated"] == []
    # The stage's GPU-hours are its team's, though the next stage keeps the share.
    half_life = SETTINGS.config.queue.fair_share_half_life_seconds
    usage = usage_by_team(world.ports.queue.state().team_usage, world.ports.clock.now(), half_life)
    assert usage == {"nlp": pytest.approx(train_gpus * 1200 / 3600, rel=1e-3)}
    here = released["next_stage"]
    assert here["here"] is True
    assert (here["launch"]["step"], here["launch"]["attempt"]) == (0, 1)
    job = world.ports.jobs.get(job_id)
    assert job.stage_name == "evaluate" and job.status is JobStatus.RUNNING
    assert world.fleet.live == dict.fromkeys(instance, job_id)  # kept
    control = json.loads(world.objects[control_key(job_id)])
    assert control == {"action": CONTROL_RUN_STAGE, "stage": "evaluate"}
    assert world.manifest(job_id)["stage"] == "evaluate"
    # Back in Launch: the instances are there, so the token just waits for the node's report.
    launches = len(world.fleet.requests)
    next_plan = LaunchPlan.model_validate(here["plan"])
    token = world.launch(job_id, next_plan)
    assert len(world.fleet.requests) == launches
    state = world.run(job_id, token, 600)
    assert (
        world.lifecycle.release(job_id, WorkflowState.model_validate(state))["requeue"] is True
    )  # report: a CPU type
    assert world.fleet.live == {}
    train, evaluate = world.ports.jobs.get(job_id).stage_records
    assert (train.held_seconds, evaluate.held_seconds) == (1200, 600)
    assert (train.reused_previous, evaluate.reused_previous) == (False, True)
    assert evaluate.instance_ids == train.instance_ids
    assert evaluate.cost_usd == pytest.approx(train.cost_usd / 2, rel=1e-3)


def test_the_workflow_takes_a_next_stage_here_straight_back_to_launch_with_its_plan() -> None:
    states = json.loads(JOB_LIFECYCLE.definition())["States"]
    selected = {key.removesuffix(".$") for key in states["Release"]["ResultSelector"]}
    world = World()
    job_id, plan = world.submit(REUSE)
    here = world.lifecycle.release(
        job_id, WorkflowState.model_validate(world.run(job_id, world.launch(job_id, plan), 60))
    )
    token = world.launch(job_id, LaunchPlan.model_validate(here["next_stage"]["plan"]))
    elsewhere = world.lifecycle.release(
        job_id, WorkflowState.model_validate(world.run(job_id, token, 60))
    )
    # Both kinds of answer carry what the ResultSelector picks (the handler adds the status).
    assert selected - {"status"} <= set(here) and selected - {"status"} <= set(elsewhere)
    assert states["Requeue?"]["Choices"][0] == {
        "Variable": "$.release.next_stage.here",
        "BooleanEquals": True,
        "Next": "NextStageHere",
    }
    next_stage_here = states["NextStageHere"]
    assert next_stage_here["Next"] == "Launch"
    read = {
        path.split(".")[1]
        for path in states["Launch"]["Parameters"]["Payload"].values()
        if path.startswith("$.")
    }
    assert read <= {key.removesuffix(".$") for key in next_stage_here["Parameters"]}


def test_a_repeated_release_after_moving_on_to_the_same_instances_changes_nothing() -> None:
    world = World()
    job_id, plan = world.submit(REUSE)
    state = world.run(job_id, world.launch(job_id, plan), 60)
    first = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    charged = world.ports.queue.state().team_usage
    again = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    assert again["next_stage"]["here"] is True and again["next_stage"] == first["next_stage"]
    assert world.ports.queue.state().team_usage == charged  # charged once
    job = world.ports.jobs.get(job_id)
    assert job.stage_index == 1 and [r.name for r in job.stage_records] == ["train"]


def test_reports_about_a_stage_the_job_moved_past_are_ignored() -> None:
    world = World()
    job_id, plan = world.submit(REUSE)
    state = world.run(job_id, world.launch(job_id, plan), 60)
    world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    instance = world.ports.jobs.get(job_id).placement.instance_ids[0]  # type: ignore[union-attr]
    late = NodeReport(
        job_id=job_id, instance_id=instance, phase="finished", exit_code=0, stage="train"
    )
    world.lifecycle.node_report(late)  # a duplicate of the first stage's finish
    assert world.ports.jobs.get(job_id).run_result is None


def test_a_stage_that_does_not_fit_on_the_previous_instances_gets_new_ones() -> None:
    world = World()
    spec = HEAD + (
        "stages:\n  - {name: prep, template: cpu-preprocess}\n"
        "  - {name: train, template: tune-small, reuse_previous: true}\n"
    )
    job_id, plan = world.submit(spec)
    state = world.run(job_id, world.launch(job_id, plan), 60)
    released = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    assert released["requeue"] is True and released["terminated"]
    assert world.fleet.live == {}


def test_a_stage_on_fewer_nodes_keeps_only_those_it_needs() -> None:
    world = World()
    spec = HEAD + (
        "stages:\n  - {name: train, template: gpu-train-large}\n"
        "  - {name: evaluate, resources: {nodes: 1}, reuse_previous: true}\n"
    )
    job_id, plan = world.submit(spec)
    state = world.run(job_id, world.launch(job_id, plan), 60)
    first, second = world.ports.jobs.get(job_id).placement.instance_ids  # type: ignore[union-attr]
    released = world.lifecycle.release(job_id, WorkflowState.model_validate(state))
    assert released["next_stage"]["here"] is True and released["terminated"] == [second]
    assert world.fleet.live == {first: job_id}
    assert world.ports.jobs.get(job_id).placement.instance_ids == [first]  # type: ignore[union-attr]


def test_stage_records_survive_the_job_store() -> None:
    world = World()
    job_id, plan = world.submit(THREE_STAGES)
    world.stage(job_id, plan, 60)
    job = world.ports.jobs.get(job_id)
    assert job.stage_records and item_to_job(job_to_item(job)) == job


# -- the node agent ----------------------------------------------------------------------------

JOB_ID = "j-0123456789abcdef0123"


@dataclass
class Identity:
    def instance_id(self) -> str:
        return "i-1"

    def tags(self) -> Mapping[str, str]:
        return {"gpufleet:job-id": JOB_ID}

    def interruption_notice(self) -> str | None:
        return None


@dataclass
class Objects:
    documents: dict[str, bytes] = field(default_factory=dict)
    fetched: list[str] = field(default_factory=list)

    def fetch(self, key: str) -> bytes:
        self.fetched.append(key)
        if is_node_key(key) and key not in self.documents:
            return NODE_KEY_DOCUMENT  # every run has one
        return self.documents[key]

    def put(self, key: str, document: Mapping[str, Any]) -> None:
        self.documents[key] = json.dumps(document).encode()


@dataclass
class Reports:
    details: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.details.append((detail_type, dict(detail)))


def stage_manifest(stage: str, await_next: bool) -> dict[str, Any]:
    return {
        "job_id": JOB_ID,
        "name": "pipeline",
        "image": "img:1",
        "command": ["python", stage],
        "stage": stage,
        "await_next_stage": await_next,
    }


@dataclass
class StageRuntime:
    """Runs each stage at once; after `train`, does what the release step does."""

    objects: Objects
    exit_code: int = 0
    ran: list[list[str]] = field(default_factory=list)

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        self.ran.append(manifest.command)
        if manifest.stage == "train":
            self.objects.put(run_manifest_key(JOB_ID), stage_manifest("evaluate", False))
            self.objects.put(
                control_key(JOB_ID), {"action": CONTROL_RUN_STAGE, "stage": "evaluate"}
            )
        return RunOutcome(exit_code=self.exit_code)


def agent_for(
    objects: Objects, runtime: StageRuntime | WorkerRuntime, reports: Reports
) -> NodeAgent:
    return NodeAgent(
        Identity(),
        objects,
        reports,
        runtime,
        control_poll_seconds=0.01,
        stage_wait_seconds=0.05,
    )


def staged_objects() -> Objects:
    objects = Objects()
    objects.put(run_manifest_key(JOB_ID), stage_manifest("train", True))
    objects.put(control_key(JOB_ID), {"action": "run"})
    return objects


def test_the_agent_runs_the_next_stage_when_the_control_plane_says_so() -> None:
    objects, reports = staged_objects(), Reports()
    runtime = StageRuntime(objects)
    assert agent_for(objects, runtime, reports).run().exit_code == 0
    assert runtime.ran == [["python", "train"], ["python", "evaluate"]]
    phases = [
        (kind, detail["stage"])
        for kind, detail in reports.details
        if kind in (DETAIL_NODE_STARTED, DETAIL_NODE_FINISHED)
    ]
    assert phases == [
        (DETAIL_NODE_STARTED, "train"),
        (DETAIL_NODE_FINISHED, "train"),
        (DETAIL_NODE_STARTED, "evaluate"),
        (DETAIL_NODE_FINISHED, "evaluate"),
    ]


def test_the_agent_stops_waiting_when_no_next_stage_comes() -> None:
    objects, reports = staged_objects(), Reports()
    runtime = StageRuntime(objects)
    objects.put(run_manifest_key(JOB_ID), stage_manifest("prep", True))  # nothing follows it
    assert agent_for(objects, runtime, reports).run().exit_code == 0
    assert runtime.ran == [["python", "prep"]]


def test_the_agent_does_not_wait_after_a_failed_stage() -> None:
    objects, reports = staged_objects(), Reports()
    runtime = StageRuntime(objects, exit_code=1)
    assert agent_for(objects, runtime, reports).run().exit_code == 1
    assert runtime.ran == [["python", "train"]]


@dataclass
class WorkerRuntime:
    """A worker node of a multi-node stage: its `train` runs until it is stopped, and the main
    node's end moves the job to `evaluate` meanwhile (what the release step writes)."""

    objects: Objects
    ran: list[list[str]] = field(default_factory=list)

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        self.ran.append(manifest.command)
        if manifest.stage != "train":
            return RunOutcome(exit_code=0)
        self.objects.put(run_manifest_key(JOB_ID), stage_manifest("evaluate", False))
        self.objects.put(control_key(JOB_ID), {"action": CONTROL_RUN_STAGE, "stage": "evaluate"})
        assert stop.wait(5), "the worker was never told to stop"
        return RunOutcome(exit_code=143, reason="checkpointed on request")  # died of SIGTERM


def test_a_worker_still_running_when_the_job_moves_on_stops_and_runs_the_next_stage() -> None:
    objects, reports = staged_objects(), Reports()
    runtime = WorkerRuntime(objects)
    assert agent_for(objects, runtime, reports).run().exit_code == 0
    assert runtime.ran == [["python", "train"], ["python", "evaluate"]]
