"""Multi-stage jobs through the real workflow on the embedded account: the stages demo, and a
job whose second stage reuses the first one's instance and whose third stage fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.cli.jobs import render_detail
from gpufleet.domain.catalog import load_bundled
from gpufleet.emulator.demo import DemoResult, DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from tests.integration.test_demo import by_name

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

CATALOG = load_bundled()
STAGES_JOB = "llm-pipeline"  # events/scenarios/stages/pipeline.yaml


def test_the_stages_demo_runs_each_stage_on_its_own_type_and_adds_up_their_cost(
    stages_demo: DemoResult,
) -> None:
    """The stages demo's job, in the run the least-privilege test reads too (conftest's
    `stages_demo`: other submissions beside it)."""
    result = stages_demo
    assert result.completed and result.instances_running == 0
    job = by_name(result)[STAGES_JOB]
    assert job["status"] == "SUCCEEDED"
    stages = job["stages"]
    assert [(s["name"], s["status"]) for s in stages] == [
        ("preprocess", "SUCCEEDED"),
        ("train", "SUCCEEDED"),
        ("evaluate", "SUCCEEDED"),
    ]
    types = [CATALOG.instance_type(s["instance_type"]) for s in stages]
    assert len({t.name for t in types}) == 3
    assert types[0].gpus == 0 and stages[0]["gpus"] == 0  # preprocessing: CPU-only
    # Its command really ran (the agent's docker runtime, the fake docker): no GPU flag, which
    # docker refuses on a CPU-only type, the stage's output prefix in its environment, and its
    # job's session at the credentials endpoint the agent serves it.
    line = job["container_log"][0]  # the simulated stages' lines follow
    assert line.startswith("preprocess: from ")
    assert line.endswith("/stages/preprocess/ on 0 GPU(s), with its job's session")
    assert types[1].gpus == stages[1]["gpus"] == 8 and types[1].gpu_model in ("A100", "H100")
    assert not any(s["reused_previous"] for s in stages)
    assert all(s["cost_usd"] > 0 and s["held_seconds"] > 0 for s in stages)
    assert job["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in stages), abs=1e-6)
    # Each stage's price per hour is one its instances had; the job shows none of its own (an
    # average of three types would be a price no instance had).
    assert job["hourly_usd"] is None
    for stage, instance_type in zip(stages, types, strict=True):
        prices = {
            o.hourly_usd
            for o in CATALOG.offerings("us-east-1")
            if o.instance_type.name == instance_type.name
            and o.capacity_type == stage["capacity_type"]
        }
        assert stage["hourly_usd"] in prices, stage
    # `gpufleet status ID` prints the stages as a table, not as Python dicts.
    text = render_detail(job)
    assert "{" not in text
    header, *rows = text.split("\nstages:\n")[1].splitlines()
    assert header.split()[:4] == ["stage", "status", "instance", "capacity"]
    assert [row.split()[:3] for row in rows] == [
        [s["name"], s["status"], s["instance_type"]] for s in stages
    ]


STAGED = """\
name: staged
team: nlp
image: img:1
command: [python, run.py]
stages:
  - {name: train, template: tune-small}
  - {name: evaluate, resources: {gpus: 1, gpu_memory_gib: 8}, reuse_previous: true}
  - {name: package, template: cpu-preprocess, max_retries: 1}
  - {name: publish, template: cpu-preprocess}
"""


def test_a_stage_reuses_the_last_ones_instance_and_a_failed_stage_ends_the_job(
    tmp_path: Path,
) -> None:
    (tmp_path / "staged.yaml").write_text(STAGED)
    result = run_demo(
        DemoScenario(
            name="staged",
            submissions=[Submission("s3", tmp_path / "staged.yaml")],
            nodes=NodeScenario(
                boot_seconds=0.2,
                default=Behaviour(duration_seconds=1.0),
                behaviours={"staged/package": Behaviour(duration_seconds=0.5, exit_code=4)},
            ),
            timeout_seconds=110,
        )
    )
    assert result.completed and result.instances_running == 0
    (job,) = result.to_json()["jobs"]
    assert job["status"] == "FAILED"
    assert job["failure_reason"] == "stage 'package': exit code 4"
    train, evaluate, package, publish = job["stages"]
    assert [s["status"] for s in job["stages"]] == ["SUCCEEDED", "SUCCEEDED", "FAILED", "SKIPPED"]
    assert evaluate["reused_previous"] and evaluate["instance_ids"] == train["instance_ids"]
    assert package["retries"] == 1 and package["gpus"] == 0
    assert publish["instance_type"] is None and publish["cost_usd"] == 0
    assert job["retries"] == 1
    assert job["cost_usd"] == pytest.approx(sum(s["cost_usd"] for s in job["stages"]), abs=1e-6)
