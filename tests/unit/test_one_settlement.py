"""The same runs, ended the same ways, through the Lambdas' services and through the
simulator: both settle them with `domain.settlement.settle`, so both reach the same verdicts
(how often the job went back to the queue, on which instances it ran, how it ended)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from typing import cast

import pytest

from gpufleet.adapters.local.memory import ManualClock, RecordingWorkflow
from gpufleet.domain.catalog import Offering, load_bundled
from gpufleet.domain.duration import DurationEstimate
from gpufleet.domain.launch import CapacityType
from gpufleet.domain.planning import LaunchPlan, plan_launch
from gpufleet.domain.selection import observed_hazard
from gpufleet.domain.settlement import AUTO_MAX_INTERRUPTIONS
from gpufleet.domain.spec import parse_spec
from gpufleet.services.run_reports import NodeReport
from gpufleet.services.workflow_state import Admission, WorkflowState
from gpufleet.sim.engine import EngineConfig, Workload, simulate
from gpufleet.sim.mapping import TraceMapping
from gpufleet.sim.market import Lease, MarketConfig, MarketModel
from gpufleet.sim.policies import FIFO_SPOT, build_policies
from gpufleet.sim.traces import RunExit, TraceJob
from tests.helpers import SPEC_YAML, plan_of
from tests.unit.test_services import lifecycle_with_job, started

RAN = 600.0  # every run ends ten minutes in
INTERRUPTED = "interrupted"
Run = RunExit | str  # how one run ends: its exit, or a spot interruption
SPOT_REQUIRED_YAML = SPEC_YAML + b"spot: required\n"


@dataclass(frozen=True)
class Verdicts:
    requeues: int
    instance_types: tuple[str, ...]  # of each run, in order
    capacity_types: tuple[str, ...]  # spot or on-demand, of each run
    status: str
    reason: str


def through_the_lambdas(runs: list[Run], spec_yaml: bytes = SPEC_YAML) -> Verdicts:
    """Each run launched, started, ended as given (its node's report, or a spot warning and
    then the node's report) and released by the services on the in-memory ports."""
    service, ports, job_id = lifecycle_with_job(body=spec_yaml)
    clock = cast(ManualClock, ports.clock)
    workflow = cast(RecordingWorkflow, ports.workflow)
    plan, requeues, types, capacity = plan_of(ports, job_id), 0, [], []
    for attempt, run in enumerate(runs):
        token = f"run-{attempt}"
        assert service.launch(job_id, plan, 0, attempt, token, Admission(admitted=True)) is None
        placement = ports.jobs.get(job_id).placement
        types.append(placement.instance_type)
        capacity.append(placement.capacity_type)
        instance = placement.instance_ids[0]
        service.node_report(started(job_id, instance))
        clock.advance(RAN)
        if run == INTERRUPTED:
            assert service.instance_interrupted(instance) == job_id
            exit_code, oom = 0, False  # it checkpointed and stopped, as the warning asked
        else:
            assert isinstance(run, RunExit)
            exit_code, oom = run.exit_code, run.oom
        finished = NodeReport(
            job_id=job_id,
            instance_id=instance,
            phase="finished",
            exit_code=exit_code,
            oom=oom,
            interrupted=run == INTERRUPTED,
        )
        service.node_report(finished)
        released = service.release(
            job_id, WorkflowState.model_validate({"run": workflow.completed[token]})
        )
        if not released["requeue"]:
            break
        requeues += 1
        plan = LaunchPlan.model_validate(service.requeue_input(job_id, attempt + 1)["plan"])
    job = ports.jobs.get(job_id)
    reason = job.failure_reason or ""
    return Verdicts(requeues, tuple(types), tuple(capacity), job.status.value, reason)


class ScriptedMarket(MarketModel):
    """The bundled catalog, spot always there, no launch failures; the runs the script marks
    are interrupted halfway, the others are not. Records the type of each launch."""

    def __init__(self, runs: list[Run]) -> None:
        config = MarketConfig(hazard_scale=0.0, spot_launch_failure=0.0)
        super().__init__(load_bundled(), "us-east-1", config)
        self._interrupted = [run == INTERRUPTED for run in runs]
        self.types: list[str] = []
        self.capacity_types: list[str] = []

    def launch(
        self, offering: Offering, instances: int, at: float, rng: random.Random
    ) -> Lease | None:
        lease = super().launch(offering, instances, at, rng)
        if lease is not None:
            self.types.append(offering.instance_type.name)
            self.capacity_types.append(str(offering.capacity_type))
        return lease

    def next_interruption(
        self, lease: Lease, start: float, rng: random.Random, until: float
    ) -> float | None:
        interrupted = self._interrupted.pop(0) if self._interrupted else False
        return (start + until) / 2 if interrupted else None


def through_the_simulator(runs: list[Run], spec_yaml: bytes = SPEC_YAML) -> Verdicts:
    """One trace job of the same spec whose runs end as given, replayed by the engine (FIFO,
    with the spec's own spot policy)."""
    spec = parse_spec(spec_yaml)
    trace = TraceJob(
        "j-0",
        0.0,
        RAN,
        1,
        team=spec.team,
        failed_runs=tuple(run for run in runs if isinstance(run, RunExit) and run.exit_code),
    )
    mapping = TraceMapping(region="us-east-1", high_share=0.0)
    workload = Workload((trace,), (spec,), mapping, "one job")
    [fifo] = build_policies([FIFO_SPOT], workload)
    policy = replace(fifo, spot=None)
    market = ScriptedMarket(runs)
    result = simulate(workload, policy, market=market, config=EngineConfig())
    [reason] = result.failures or {"": 0}
    status = "SUCCEEDED" if result.completed else "FAILED"
    launched = (tuple(market.types), tuple(market.capacity_types))
    return Verdicts(result.requeues, *launched, status, reason)


EXIT_0, EXIT_1 = RunExit(0), RunExit(1)
OOM = RunExit(137, oom=True)


@pytest.mark.parametrize(
    ("runs", "requeues", "status", "reason"),
    [
        ([EXIT_0], 0, "SUCCEEDED", ""),
        ([EXIT_1, EXIT_1, EXIT_1, EXIT_1], 3, "FAILED", "exit code 1"),  # max_retries: 3
        ([OOM, EXIT_0], 1, "SUCCEEDED", ""),
        ([INTERRUPTED, EXIT_1, EXIT_0], 2, "SUCCEEDED", ""),
    ],
    ids=["success", "retries-used-up", "out-of-memory", "interrupted-then-retried"],
)
def test_the_lambdas_and_the_simulator_settle_runs_alike(
    runs: list[Run], requeues: int, status: str, reason: str
) -> None:
    lambdas = through_the_lambdas(runs)
    assert (lambdas.requeues, lambdas.status, lambdas.reason) == (requeues, status, reason)
    assert through_the_simulator(runs) == lambdas


# Ten hours of work, no checkpoints: each interruption loses the run, so what the job lives
# through on spot soon makes spot dearer than on-demand in expectation.
LONG_YAML = SPEC_YAML.replace(b"timeout: 1h", b"timeout: 20h\nexpected_duration: 10h")
CHECKPOINTING_YAML = SPEC_YAML + b"checkpoint: s3://ckpt/vision/resnet/\ncheckpoint_interval: 5m\n"


def on_demand_first_after(spec_yaml: bytes, seconds_per_run: float) -> int | None:
    """After how many interruptions (each after `seconds_per_run` on spot) the plan of a
    `spot: auto` job puts on-demand first: `planning.plan_launch` at `job_observed_hazard`."""
    spec = parse_spec(spec_yaml)
    for k in range(AUTO_MAX_INTERRUPTIONS + 1):
        nodes = spec.resources.nodes
        hazard = observed_hazard(k, k * seconds_per_run, nodes)
        plan = plan_launch(
            spec,
            load_bundled(),
            "us-east-1",
            max_launch_attempts=5,
            retry_wait_seconds=30,
            boot_allowance_seconds=600,
            heartbeat_timeout_seconds=300,
            expected=DurationEstimate(spec.expected_duration_seconds or 3600, "spec"),
            observed_hazard=hazard,
        )
        if plan.steps[0].capacity_type is CapacityType.ON_DEMAND:
            return k
    return None


def test_both_move_an_auto_job_to_on_demand_when_its_interruptions_make_spot_dearer() -> None:
    """The Lambdas (Launch's plan) and the simulator move the job to on-demand after the same
    interruption, the one after which the plan's expected cost puts on-demand first, well
    before the old count (10); both complete it there."""
    switch = on_demand_first_after(LONG_YAML, RAN)
    assert switch is not None and 1 <= switch < 10
    # A simulated run is interrupted halfway: half the spot time, the same switch.
    assert on_demand_first_after(LONG_YAML, RAN / 2) == switch
    runs: list[Run] = [*[INTERRUPTED] * switch, EXIT_0]
    lambdas = through_the_lambdas(runs, LONG_YAML)
    assert (lambdas.requeues, lambdas.status, lambdas.reason) == (switch, "SUCCEEDED", "")
    assert lambdas.capacity_types == ("spot",) * switch + ("on-demand",)
    assert through_the_simulator(runs, LONG_YAML) == lambdas


def test_both_keep_a_checkpointing_auto_job_on_spot_past_ten_interruptions() -> None:
    """Checkpointing every 5 minutes, spot stays cheaper in expectation: no count moves it."""
    assert on_demand_first_after(CHECKPOINTING_YAML, RAN) is None
    runs: list[Run] = [*[INTERRUPTED] * 15, EXIT_0]
    lambdas = through_the_lambdas(runs, CHECKPOINTING_YAML)
    assert (lambdas.requeues, lambdas.status) == (15, "SUCCEEDED")
    assert set(lambdas.capacity_types) == {"spot"}
    assert through_the_simulator(runs, CHECKPOINTING_YAML) == lambdas


def test_at_the_interruption_cap_both_fail_a_spot_required_job() -> None:
    runs: list[Run] = [INTERRUPTED] * 11
    lambdas = through_the_lambdas(runs, SPOT_REQUIRED_YAML)
    verdict = (lambdas.requeues, lambdas.status, lambdas.reason)
    assert verdict == (10, "FAILED", "interrupted 11 times; giving up")
    assert set(lambdas.capacity_types) == {"spot"}
    assert through_the_simulator(runs, SPOT_REQUIRED_YAML) == lambdas


def test_out_of_memory_moves_both_to_gpus_with_more_memory() -> None:
    catalog = load_bundled()
    lambdas = through_the_lambdas([OOM, EXIT_0])
    first, second = (catalog.instance_type(name) for name in lambdas.instance_types)
    assert second.gpu_memory_gib > first.gpu_memory_gib
    assert through_the_simulator([OOM, EXIT_0]).instance_types == lambdas.instance_types
