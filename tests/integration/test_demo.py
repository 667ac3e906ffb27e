"""The whole lifecycle on the embedded account: the demo, a job nothing can hold, and a crash."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.handlers
import pytest

from gpufleet.emulator.demo import (
    DemoResult,
    DemoScenario,
    Submission,
    basic_scenario,
    run_demo,
)
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.topology import REQUEUE

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

JOB_FIELDS = {
    "id",
    "name",
    "status",
    "instance_type",
    "capacity_type",
    "hourly_usd",
    "held_seconds",
    "cost_usd",
}


@pytest.fixture(scope="module")
def demo() -> DemoResult:
    return run_demo(basic_scenario())


def by_name(result: DemoResult) -> dict[str, dict[str, Any]]:
    return {job["name"]: job for job in result.jobs}


def test_the_demo_ends_with_every_job_terminal_and_no_instance_running(demo: DemoResult) -> None:
    assert demo.completed
    assert demo.instances_running == 0
    assert {job["status"] for job in demo.jobs} <= {"SUCCEEDED", "FAILED", "CANCELLED"}
    assert demo.rejected == 1
    assert len(demo.jobs) == 4  # three uploads and one event; the broken spec made no job


def test_the_demo_json_has_the_documented_shape(demo: DemoResult) -> None:
    document = demo.to_json()
    assert {"jobs", "rejected", "instances_running", "api_calls", "state_transitions"} <= set(
        document
    )
    for job in document["jobs"]:
        assert set(job) >= JOB_FIELDS
    assert {"dynamodb", "states", "lambda", "ec2", "events", "s3"} <= set(document["api_calls"])
    assert document["state_transitions"] >= 8 * len(document["jobs"])


def test_each_job_went_where_its_spec_and_the_market_sent_it(demo: DemoResult) -> None:
    jobs = by_name(demo)
    assert jobs["resnet-baseline"]["status"] == "SUCCEEDED"
    assert jobs["resnet-baseline"]["capacity_type"] == "spot"
    # Spot had no capacity for this one (injected); its spec allows on-demand.
    assert jobs["llm-finetune"]["status"] == "SUCCEEDED"
    assert jobs["llm-finetune"]["capacity_type"] == "on-demand"
    assert demo.capacity_errors_injected >= 1
    # spot: never, and a non-zero exit: FAILED, instance still released and paid for.
    assert jobs["eval-sweep"]["capacity_type"] == "on-demand"
    assert jobs["eval-sweep"]["status"] == "FAILED"
    assert jobs["eval-sweep"]["failure_reason"] == "exit code 3"
    assert jobs["speech-asr"]["status"] == "SUCCEEDED"
    # Each ran in a zone of the account's subnets, also when its price is the region's.
    assert all(job["zone"] and job["zone"].startswith("us-east-1") for job in demo.jobs)


def test_cost_is_the_hourly_price_for_the_seconds_held_plus_storage(demo: DemoResult) -> None:
    for job in demo.jobs:
        assert job["held_seconds"] > 0
        assert job["storage_usd"] > 0  # each node's EBS root volume, for the same seconds
        assert job["cost_usd"] == pytest.approx(
            job["hourly_usd"] * job["held_seconds"] / 3600 + job["storage_usd"],
            rel=1e-3,
            abs=1e-6,
        )
        assert job["estimated_cost_usd"] > 0


@pytest.fixture
def crash_after_first_fleet() -> Iterator[list[int]]:
    """The Launch function dies right after CreateFleet succeeded, once."""
    crashes: list[int] = []

    def crash(**_: Any) -> None:
        if not crashes:
            crashes.append(1)
            raise RuntimeError("injected crash after CreateFleet")

    entry = ("after-call.ec2.CreateFleet", crash)
    botocore.handlers.BUILTIN_HANDLERS.append(entry)
    yield crashes
    botocore.handlers.BUILTIN_HANDLERS.remove(entry)


def test_failures_and_crashes_lose_no_job_and_leak_no_instance(
    tmp_path: Path, crash_after_first_fleet: list[int]
) -> None:
    (tmp_path / "impossible.yaml").write_text(
        "name: impossible\nteam: t\nimage: img\ncommand: [x]\n"
        "resources: {gpus: 16, gpu_memory_gib: 500}\n"
    )
    (tmp_path / "crashy.yaml").write_text(
        "name: crashy\nteam: t\nimage: img\ncommand: [x]\nresources: {gpus: 1}\n"
    )
    result = run_demo(
        DemoScenario(
            name="faults",
            submissions=[
                Submission("s3", tmp_path / "impossible.yaml"),
                Submission("s3", tmp_path / "crashy.yaml"),
            ],
            nodes=NodeScenario(boot_seconds=0.2, default=Behaviour(duration_seconds=1.0)),
            timeout_seconds=120,
        )
    )
    assert crash_after_first_fleet == [1]
    assert result.completed and result.instances_running == 0
    jobs = by_name(result)
    assert jobs["impossible"]["status"] == "FAILED"
    assert "no instance type" in jobs["impossible"]["failure_reason"]
    assert jobs["crashy"]["status"] == "SUCCEEDED"
    # The retried Launch kept the fleet the crashed one launched: the crash cost no run.
    assert jobs["crashy"]["retries"] == 0 and jobs["crashy"]["attempts"] == 1


def test_a_node_that_goes_silent_is_taken_for_lost_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUFLEET_NODE_HEARTBEAT_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("GPUFLEET_BOOT_ALLOWANCE_SECONDS", "2")
    (tmp_path / "ghost.yaml").write_text(
        # No retries: this test is about noticing the loss, not retrying it.
        "name: ghost\nteam: t\nimage: img\ncommand: [x]\nresources: {gpus: 1}\nmax_retries: 0\n"
    )
    (tmp_path / "steady.yaml").write_text(
        "name: steady\nteam: t\nimage: img\ncommand: [x]\nresources: {gpus: 1}\n"
    )
    result = run_demo(
        DemoScenario(
            name="lost-node",
            submissions=[
                Submission("s3", tmp_path / "ghost.yaml"),
                Submission("s3", tmp_path / "steady.yaml"),
            ],
            nodes=NodeScenario(
                boot_seconds=0.2,
                heartbeat_seconds=0.5,
                behaviours={
                    "ghost": Behaviour(duration_seconds=0.5, vanishes=True),
                    # Runs past the heartbeat timeout: its heartbeats keep it alive.
                    "steady": Behaviour(duration_seconds=6.0),
                },
            ),
            timeout_seconds=90,
        )
    )
    assert result.completed and result.instances_running == 0
    jobs = by_name(result)
    assert jobs["ghost"]["status"] == "FAILED"
    assert "heartbeats stopped" in jobs["ghost"]["failure_reason"]
    assert jobs["steady"]["status"] == "SUCCEEDED"


def test_a_silent_node_of_a_two_node_run_fails_the_run_for_both_though_its_peer_beats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One node's agent stops reporting while its instance runs and the other node keeps
    beating: the run's task heartbeat is withheld, the run fails for both nodes, and the job is
    retried as one run on new instances (without the per-node rule the main node would have
    finished the first run well, with the silent node unnoticed)."""
    monkeypatch.setenv("GPUFLEET_NODE_HEARTBEAT_TIMEOUT_SECONDS", "2")
    monkeypatch.setenv("GPUFLEET_BOOT_ALLOWANCE_SECONDS", "2")
    (tmp_path / "pair.yaml").write_text(
        "name: pair\nteam: t\nimage: img\ncommand: [x]\n"
        "resources: {gpus: 1, nodes: 2}\nspot: never\nmax_retries: 1\n"
    )
    result = run_demo(
        DemoScenario(
            name="silent-node",
            submissions=[Submission("s3", tmp_path / "pair.yaml")],
            nodes=NodeScenario(
                boot_seconds=0.2,
                heartbeat_seconds=0.5,
                behaviours={
                    # Runs past the heartbeat timeout: only the silent node can end it early.
                    "pair": Behaviour(duration_seconds=8.0, falls_silent_after_seconds=0.5)
                },
            ),
            timeout_seconds=120,
        )
    )
    assert result.completed and result.instances_running == 0
    pair = by_name(result)["pair"]
    assert (pair["status"], pair["retries"], pair["attempts"]) == ("SUCCEEDED", 1, 2)


def test_the_preemption_demo_preempts_the_low_job_and_resumes_it_from_its_checkpoint(
    preemption_demo: DemoResult,
) -> None:
    """With every requeue past its execution's budget (docs/aws-fidelity.md F5): the preempted
    job's Requeue starts its next execution, which runs it to the end."""
    result = preemption_demo
    assert result.completed and result.instances_running == 0
    jobs = by_name(result)
    low, high = jobs["low-sweep"], jobs["high-urgent"]
    continued = {
        call.params["name"]
        for call in result.calls
        if call.function == REQUEUE.construct_id and call.operation == "StartExecution"
    }
    assert continued == {f"{low['id']}-1"}
    assert (low["priority"], high["priority"]) == ("low", "high")
    assert low["status"] == high["status"] == "SUCCEEDED"
    assert low["preemptions"] == 1 and high["preemptions"] == 0
    assert low["resumed_from_checkpoint"] and not high["resumed_from_checkpoint"]
    # The low job waited for the high one to finish; both runs of it were paid for.
    assert low["wait_seconds"] >= 2.0
    assert low["cost_usd"] == pytest.approx(
        low["hourly_usd"] * low["held_seconds"] / 3600 + low["storage_usd"], rel=1e-3
    )
