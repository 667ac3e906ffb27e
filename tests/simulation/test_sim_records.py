"""`gpufleet simulate --records DIR` then `gpufleet review --records DIR`: the review of the
simulated records spends what the simulator says it spent, and the records are the job store's
items."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.adapters.local.records import RecordsFolder
from gpufleet.cli import main
from gpufleet.domain.job import JobStatus
from tests.simulation.test_simulator import DATA_FREE, synthetic_jobs, write_philly_csv


def test_review_of_simulated_records_spends_what_the_simulator_spent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = write_philly_csv(tmp_path / "philly.csv", synthetic_jobs())
    records = tmp_path / "records"
    argv = ["simulate", "--trace", str(trace), "--format", "philly", "--seed", "1"]
    assert main([*argv, "--compare", "none", "--records", str(records), "--json", *DATA_FREE]) == 0
    simulated = json.loads(capsys.readouterr().out)["policies"]
    assert len(simulated) == 1
    (figures,) = simulated.values()

    assert main(["review", "--records", str(records), "--json"]) == 0
    spend = json.loads(capsys.readouterr().out)["spend"]
    assert spend["jobs"] == figures["jobs"] == 20
    assert spend["cost_usd"] == pytest.approx(figures["cost_usd"], abs=0.01)
    assert spend["gpu_hours"] == pytest.approx(figures["gpu_hours_paid"], abs=0.01)

    lines = (records / "jobs.jsonl").read_text(encoding="utf-8").splitlines()
    jobs = RecordsFolder(records).list_jobs()
    assert len(lines) == len(jobs) == 20
    by_id = {job.job_id: job for job in jobs}
    for line in lines:
        item = json.loads(line)["Item"]
        job = item_to_job(item)
        assert job_to_item(job) == item
        assert by_id[job.job_id] == job


LIVE_HOLDING = {JobStatus.RUNNING, JobStatus.LAUNCHING}
SAMPLE = Path(str(resources.files("gpufleet").joinpath("sim/data/philly-sample")))
DAY = 86400.0


def test_review_of_two_simulated_philly_days_is_the_store_at_their_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two days of the Philly sample simulated and reviewed: the records are the store as it
    stood at the window's end (Philly's runs last days: some still run, none after the end),
    and every section of the review is there, its figures consistent with each other."""
    records = tmp_path / "records"
    argv = ["simulate", "--trace", str(SAMPLE), "--format", "philly", "--days", "2"]
    assert main([*argv, "--compare", "none", "--records", str(records), *DATA_FREE]) == 0
    capsys.readouterr()
    folder = RecordsFolder(records)
    end = folder.export.end
    assert end - folder.export.start == 2 * DAY
    jobs = folder.list_jobs(limit=100_000)
    live = [job for job in jobs if not job.status.terminal]
    assert {job.status for job in live} >= {JobStatus.RUNNING}
    for job in jobs:
        assert job.created_at < end
        if job.placement is not None:
            assert job.placement.launched_at < end
            # Held at the end: not released yet; else released by then.
            assert (job.released_at is None) == (job.status in LIVE_HOLDING)
        assert job.released_at is None or job.released_at <= end
    for job in live:
        for node in folder.of_job(job.job_id):
            assert all(sample.t <= end for sample in node.samples)
            assert "finished" not in {name for _, name in node.events}

    assert main(["review", "--records", str(records), "--since", "2d", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["jobs"] == len(jobs)
    spend = document["spend"]
    assert spend["gpu_hours"] > 0 and spend["cost_usd"] > 0
    wasted = sum(w["idle_gpu_hours"] + w["held_after_hours"] for w in document["waste"])
    assert wasted <= spend["gpu_hours"]
    for row in document["right_size"]:
        assert row["suggested_hourly_usd"] < row["hourly_usd"]
        # Never more than the type's on-demand difference, and in all, less than was spent.
        at_most = row["node_hours"] * (row["hourly_usd"] - row["suggested_hourly_usd"])
        assert 0 <= row["saving_usd"] <= at_most + 0.01
    assert sum(row["saving_usd"] for row in document["right_size"]) < spend["cost_usd"]
    on_demand = {c["family"]: c["on_demand_usd"] for c in document["commitments"]}
    assert sum(on_demand.values()) <= spend["cost_usd"]
    assert all(c["saving_usd"] >= 0 for c in document["commitments"])
    forecast = document["forecast_gpu_hours"]
    assert set(forecast) == {job.spec.team for job in jobs if job.placement is not None}
    assert all(len(days) == 7 and min(days) >= 0 for days in forecast.values())
    assert sum(map(sum, forecast.values())) > 0
    assert document["forecast_backtest"]["wape"] is None  # two days: no week to test on

    assert main(["review", "--records", str(records), "--since", "2d"]) == 0
    assert "forecast error: needs two weeks of history to backtest" in capsys.readouterr().out
