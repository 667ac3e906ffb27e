"""Arrays and sweeps through the real workflow on the embedded account (docs/arrays.md): one
upload of an array of 5 and one event of a 2x2 sweep make 9 children, each admitted, launched
and run (its command really runs and prints its index and values) to SUCCEEDED; a redelivery of
the upload makes nothing twice; `gpufleet list --array` counts the children; cancelling an
array cancels every child not ended."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.aws.runtime import aws_ports
from gpufleet.domain.arrays import child_job_id
from gpufleet.domain.job import JobStatus, s3_delivery_key
from gpufleet.domain.submitters import spec_upload_key
from gpufleet.emulator.account import Account
from gpufleet.emulator.demo import DemoScenario, Submission, run_demo
from gpufleet.emulator.nodes import Behaviour, NodeScenario
from gpufleet.services.arrays import array_progress
from gpufleet.services.factory import build_intake, build_lifecycle
from gpufleet.settings import Settings
from gpufleet.topology import JOB_LIFECYCLE

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

PROGRAM = ["python", "-m", "gpufleet.emulator.programs.sweep_point"]
ARRAY = {
    "name": "shards",
    "team": "nlp",
    "image": "img:1",
    "command": PROGRAM,
    "template": "cpu-preprocess",
    "array": {"size": 5},
}
SWEEP = {
    "name": "lr-sweep",
    "team": "nlp",
    "image": "img:1",
    "command": [*PROGRAM, "lr", "batch"],
    "template": "cpu-preprocess",
    "sweep": {"grid": {"lr": [0.1, 0.01], "batch": [32, 64]}},
}


def executions(account: Account) -> list[str]:
    sfn = account.client("stepfunctions")
    arn = account.state_machine_arns[JOB_LIFECYCLE.construct_id]
    return sorted(e["name"] for e in sfn.list_executions(stateMachineArn=arn)["executions"])


def test_an_array_and_a_sweep_run_every_child_once_with_its_index_and_values(
    tmp_path: Path,
) -> None:
    (tmp_path / "shards.json").write_text(json.dumps(ARRAY))
    event = {"Source": "gpufleet.team.nlp", "DetailType": "Job Submitted", "Detail": SWEEP}
    (tmp_path / "sweep.json").write_text(json.dumps(event))
    after: dict[str, Any] = {}

    def redeliver(account: Account) -> None:
        """The upload delivered again once everything ended: same ids, nothing new."""
        settings = Settings.from_env(account.environment())
        ports = aws_ports(settings)
        intake = build_intake(ports, settings, build_lifecycle(ports, settings))
        key = spec_upload_key((tmp_path / "shards.json").read_bytes(), "shards.json")
        version = account.client("s3").head_object(Bucket=account.bucket, Key=key)["VersionId"]
        before = (len(ports.jobs.list_jobs()), executions(account))
        outcome = intake.submit_object(
            key, s3_delivery_key(account.bucket, key, version), f"s3://{account.bucket}/{key}"
        )
        after["job_ids"] = outcome.job_ids
        after["unchanged"] = before == (len(ports.jobs.list_jobs()), executions(account))
        after["progress"] = {
            job.spec.name: array_progress(ports.jobs, job)
            for job in ports.jobs.list_jobs()
            if job.spec.is_array
        }
        after["queued"] = len(ports.queue.waiting())

    result = run_demo(
        DemoScenario(
            name="arrays",
            submissions=[
                Submission("s3", tmp_path / "shards.json"),
                Submission("event", tmp_path / "sweep.json"),
            ],
            nodes=NodeScenario(
                boot_seconds=0.2,
                behaviours={
                    "shards": Behaviour(runs_command=True),
                    "lr-sweep": Behaviour(runs_command=True),
                },
            ),
            timeout_seconds=170,
        ),
        before_teardown=redeliver,
    )
    assert result.completed and result.instances_running == 0 and result.rejected == 0
    jobs = result.to_json()["jobs"]
    arrays = {j["name"]: j for j in jobs if "array_id" not in j}
    children = [j for j in jobs if "array_id" in j]
    assert {name: j["status"] for name, j in arrays.items()} == {
        "shards": "SUCCEEDED",
        "lr-sweep": "SUCCEEDED",
    }
    assert len(children) == 9 and {j["status"] for j in children} == {"SUCCEEDED"}
    printed = {
        (j["name"], j["array_index"]): [line for line in j["container_log"] if "index=" in line]
        for j in children
    }
    assert printed == {
        **{("shards", i): [f"index={i} batch_index={i}"] for i in range(5)},
        ("lr-sweep", 0): ["index=0 batch_index=0 lr=0.1 batch=32"],
        ("lr-sweep", 1): ["index=1 batch_index=1 lr=0.01 batch=32"],
        ("lr-sweep", 2): ["index=2 batch_index=2 lr=0.1 batch=64"],
        ("lr-sweep", 3): ["index=3 batch_index=3 lr=0.01 batch=64"],
    }
    # Each child's id derives from its array's; one execution per child, none for an array.
    for j in children:
        assert j["id"] == child_job_id(j["array_id"], j["array_index"])
    assert after["job_ids"] == (arrays["shards"]["id"],) and after["unchanged"]
    assert after["queued"] == 0
    assert after["progress"]["shards"]["counts"]["SUCCEEDED"] == 5
    assert after["progress"]["lr-sweep"] == {
        "id": arrays["lr-sweep"]["id"],
        "name": "lr-sweep",
        "team": "nlp",
        "size": 4,
        "status": "SUCCEEDED",
        "counts": {s.value: (4 if s is JobStatus.SUCCEEDED else 0) for s in JobStatus},
    }


def test_cancelling_an_array_cancels_every_child_not_ended(account: Account) -> None:
    settings = Settings.from_env(account.environment())
    ports = aws_ports(settings)
    body = json.dumps({**ARRAY, "name": "cancelled", "array": {"size": 4}}).encode()
    key = spec_upload_key(body, "cancelled.json")
    account.client("s3").put_object(Bucket=account.bucket, Key=key, Body=body)
    array = None
    deadline = time.monotonic() + 60
    while array is None and time.monotonic() < deadline:
        array = next((j for j in ports.jobs.list_jobs() if j.spec.is_array), None)
        time.sleep(0.2)
    assert array is not None and array.spec.name == "cancelled"
    summary = build_lifecycle(ports, settings).cancel(array.job_id)
    assert summary["status"] == "CANCELLED" and summary["cancelled"] == 4
    progress = array_progress(ports.jobs, ports.jobs.get(array.job_id))
    assert progress["status"] == "CANCELLED" and progress["counts"]["CANCELLED"] == 4
    assert ports.queue.waiting() == []
