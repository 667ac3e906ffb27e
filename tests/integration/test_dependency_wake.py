"""Which ends wake an admission pass, on the embedded account with the schedules quiet (so
that no pass a minute hides a missing wake): a run's end wakes one only when jobs wait for
its share or are held on it, which its release asks in its one write (docs/arrays.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.emulator.demo import DemoResult, DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.emulator.scheduler import ScheduleRunner

_JOB = """
  - name: {name}
    team: vision
    image: public.ecr.aws/pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime
    command: ["python", "run.py"]
    resources: {{gpus: 1, gpu_memory_gib: 16}}
    expected_duration: 10m
"""


def _submitted(tmp_path: Path, *jobs: str) -> DemoResult:
    spec = tmp_path / "submission.yaml"
    spec.write_text("jobs:" + "".join(jobs))
    scenario = DemoScenario(
        name="dependency-wake",
        submissions=[Submission("s3", spec)],
        nodes=NodeScenario(default=Behaviour(3.0, 0)),
        timeout_seconds=300.0,
    )
    result = run_demo(scenario)
    assert result.completed and result.instances_running == 0
    return result


def _dispatches(result: DemoResult) -> int:
    return sum(1 for i in result.invocations if i.function_name.endswith("Dispatch"))


@pytest.fixture(autouse=True)
def quiet_schedules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ScheduleRunner, "tick", lambda self: None)


def test_a_run_nobody_waits_on_wakes_no_pass(tmp_path: Path) -> None:
    result = _submitted(tmp_path, _JOB.format(name="train"))
    assert [j["status"] for j in result.jobs] == ["SUCCEEDED"]
    assert _dispatches(result) == 0  # admitted on arrival, and its end wakes nothing


@pytest.mark.parametrize("on", ["a job", "an array"])
def test_a_run_a_job_is_held_on_wakes_the_pass_that_runs_it(tmp_path: Path, on: str) -> None:
    train = _JOB.format(name="train") + ("    array: {size: 2}\n" if on == "an array" else "")
    evaluate = _JOB.format(name="evaluate") + "    depends_on: [{job: train}]\n"
    result = _submitted(tmp_path, train, evaluate)
    by_name = {j["name"]: j for j in result.jobs}
    assert {j["status"] for j in result.jobs} == {"SUCCEEDED"}
    # Without a wake, nothing would ever move the held evaluation: the schedules are quiet.
    assert by_name["evaluate"]["status"] == "SUCCEEDED" and _dispatches(result) >= 1
