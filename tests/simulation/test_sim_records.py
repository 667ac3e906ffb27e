"""`gpufleet simulate --records DIR` then `gpufleet review --records DIR`: the review of the
simulated records spends what the simulator says it spent, and the records are the job store's
items."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpufleet.adapters.aws.job_store import item_to_job, job_to_item
from gpufleet.adapters.local.records import RecordsFolder
from gpufleet.cli import main
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
