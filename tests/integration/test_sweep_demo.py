"""`gpufleet demo --scenario sweep`: a sweep of 20 runs and an evaluation depending on all of
them, beside another team's array of 4, sharing one fleet of 6 GPUs (events/scenarios/sweep).
It ends with every job terminal, the evaluation admitted only once every run's instances went,
and no instance running."""

from __future__ import annotations

import pytest

from gpufleet.cli import main
from tests.integration.demo_runs import SweepRun

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)


def test_the_sweep_demo_runs_every_point_then_the_evaluation_last(sweep_demo: SweepRun) -> None:
    result, records = sweep_demo.result, sweep_demo.records
    assert result.completed and result.instances_running == 0 and result.rejected == 0
    runs = [j for j in records if j.spec.name == "lr-sweep" and j.array_id is not None]
    shards = [j for j in records if j.spec.name == "tokenize-shards" and j.array_id is not None]
    (evaluation,) = [j for j in records if j.spec.name == "evaluate"]
    assert len(runs) == 20 and len(shards) == 4
    assert all(j.status.terminal for j in records if not j.spec.is_array)
    assert {j.status.value for j in [*runs, *shards, evaluation]} == {"SUCCEEDED"}
    # Every point of the grid ran once, with its values.
    points = {(j.spec.env["lr"], j.spec.env["batch"]) for j in runs}
    assert len(points) == 20 and ("0.001", "256") in points
    # The evaluation was admitted only once every run had given its instances back.
    released = [j.released_at for j in runs]
    assert evaluation.first_admitted_at is not None and None not in released
    assert evaluation.first_admitted_at >= max(r for r in released if r is not None)
    # Both teams ran on the fleet at once: nlp's shards did not wait for the sweep to end.
    first_shard = min(j.first_admitted_at or float("inf") for j in shards)
    assert first_shard < max(r for r in released if r is not None)
    arrays = {j["name"]: j for j in result.to_json()["jobs"] if j.get("children")}
    assert {name: j["status"] for name, j in arrays.items()} == {
        "lr-sweep": "SUCCEEDED",
        "tokenize-shards": "SUCCEEDED",
    }
    assert arrays["lr-sweep"]["children"]["SUCCEEDED"] == 20


def test_the_demo_command_offers_the_sweep_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--scenario", "nope"]) == 2
    assert "'sweep'" in capsys.readouterr().err
