"""`gpufleet queue`, `cancel` and `book` against the embedded account."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpufleet.cli import main
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.topology import JOB_LIFECYCLE

CONFIG = FleetConfig(
    queue=QueuePolicy(
        max_gpus=16, max_instances=8, reserve_share=0.0, teams={"vision": TeamQuota(gpus=4)}
    )
)


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account(config=CONFIG) as created:
        yield created
        sfn = created.client("stepfunctions")
        arn = created.state_machine_arns[JOB_LIFECYCLE.construct_id]
        for execution in sfn.list_executions(stateMachineArn=arn, statusFilter="RUNNING")[
            "executions"
        ]:
            sfn.stop_execution(executionArn=execution["executionArn"])


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("config") / "gpufleet.yaml"
    path.write_text(json.dumps(CONFIG.model_dump(mode="json")))  # JSON is YAML
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


def submit(account: Account, name: str) -> None:
    body = f"name: {name}\nteam: vision\nimage: img\ncommand: [x]\nresources: {{gpus: 4}}\n"
    account.client("s3").put_object(Bucket=account.bucket, Key=f"jobs/{name}.yaml", Body=body)


def settled_queue(
    account: Account, capsys: pytest.CaptureFixture[str], config_file: str, count: int
) -> list[dict]:
    """The queue once every submission is in it and the dispatcher has had its say."""
    deadline = time.monotonic() + 60  # generous: CI machines can be slow
    waiting: list[dict] = []
    while time.monotonic() < deadline:
        code, out = cli(capsys, "queue", "--json", "--config", config_file)
        assert code == 0
        waiting = json.loads(out)["waiting"]
        if len(waiting) == count and all(w["reason"] != "next" for w in waiting):
            return waiting
        if any(w["reason"] == "next" for w in waiting):
            # What the one-minute schedule does in AWS: another admission pass.
            account.client("lambda").invoke(FunctionName=account.function_arns["Dispatch"])
        time.sleep(0.2)
    raise AssertionError(f"the queue never settled: {waiting}")


def test_queue_shows_waiting_jobs_with_reasons_and_cancel_takes_one_out(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("first", "second", "third"):
        submit(account, name)
    waiting = settled_queue(account, capsys, config_file, 2)
    # Team vision may hold 4 GPUs: one job runs, two wait for quota, in submission order.
    assert [w["reason"] for w in waiting] == ["quota", "quota"]
    assert [w["position"] for w in waiting] == [1, 2]
    code, table = cli(capsys, "queue", "--config", config_file)
    assert code == 0 and "quota" in table

    victim = waiting[-1]["job_id"]
    code, out = cli(capsys, "cancel", victim, "--json", "--config", config_file)
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    remaining = json.loads(cli(capsys, "queue", "--json", "--config", config_file)[1])["waiting"]
    assert victim not in [w["job_id"] for w in remaining]
    # Cancelling it again is a clear error.
    assert cli(capsys, "cancel", victim, "--config", config_file)[0] == 2


def test_book_then_queue_shows_the_booking(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = cli(
        capsys,
        "book",
        "--team",
        "nlp",
        "--gpus",
        "8",
        "--from",
        "2026-12-01T08:00Z",
        "--to",
        "2026-12-01T20:00Z",
        "--json",
        "--config",
        config_file,
    )
    assert code == 0
    booking = json.loads(out)
    bookings = json.loads(cli(capsys, "queue", "--json", "--config", config_file)[1])["bookings"]
    assert booking in bookings
    assert (
        cli(
            capsys,
            "book",
            "--team",
            "nlp",
            "--gpus",
            "8",
            "--from",
            "2026-12-02T00:00Z",
            "--to",
            "2026-12-01T00:00Z",
            "--config",
            config_file,
        )[0]
        == 2
    )


def test_without_a_target_the_cli_says_what_it_needs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.delenv("QUEUE_TABLE")
    code = main(["queue", "--config", str(tmp_path / "none.yaml")])
    assert code == 2
    assert "--stack" in capsys.readouterr().err
