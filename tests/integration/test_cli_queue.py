"""`gpufleet queue`, `cancel`, `resize` and `book` against the embedded account, and what the
account does with forged node reports."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.cli import main
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import Job, JobStatus
from gpufleet.domain.node_reports import NodeKey, node_key_object, sign_report
from gpufleet.domain.queueing import QueuePolicy, TeamQuota
from gpufleet.emulator.account import Account, embedded_account
from gpufleet.topology import (
    AGENT_SOURCE,
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_HEARTBEAT,
    JOBS_TABLE,
    NODE_REPORT,
)
from tests.helpers import stop_running_executions, with_passes

CONFIG = FleetConfig(
    queue=QueuePolicy(
        max_gpus=16, max_instances=8, reserve_share=0.0, teams={"vision": TeamQuota(gpus=4)}
    )
)


@pytest.fixture(scope="module")
def account() -> Iterator[Account]:
    with embedded_account(config=CONFIG) as created:
        yield created
        stop_running_executions(created)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("config") / "gpufleet.yaml"
    path.write_text(json.dumps(CONFIG.model_dump(mode="json")))  # JSON is YAML
    return str(path)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code, out, _err = refusal(capsys, *argv)
    return code, out


def refusal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """A command's exit code, stdout and stderr (where a refusal says why)."""
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def submit(account: Account, name: str, team: str = "vision", gpus: int = 4) -> None:
    body = f"name: {name}\nteam: {team}\nimage: img\ncommand: [x]\nresources: {{gpus: {gpus}}}\n"
    account.client("s3").put_object(
        Bucket=account.bucket, Key=f"jobs/{team}/{name}.yaml", Body=body
    )


def settled_queue(
    account: Account, capsys: pytest.CaptureFixture[str], config_file: str, count: int
) -> list[dict]:
    """The queue once every submission is in it and the dispatcher has had its say."""

    def settled() -> list[dict] | None:
        code, out = cli(capsys, "queue", "--json", "--config", config_file)
        assert code == 0
        waiting: list[dict] = json.loads(out)["waiting"]
        done = len(waiting) == count and all(w["reason"] != "next" for w in waiting)
        return waiting if done else None

    return with_passes(account, settled, "the queue settling")


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


def _hence(hours: float) -> str:
    """An ISO time `hours` from now (bookings are for windows that have not ended)."""
    return (datetime.now(UTC) + timedelta(hours=hours)).isoformat(timespec="minutes")


def book(capsys: pytest.CaptureFixture[str], config_file: str, *flags: str) -> tuple[int, str, str]:
    return refusal(capsys, "book", *flags, "--json", "--config", config_file)


def bookings(capsys: pytest.CaptureFixture[str], config_file: str) -> list[dict]:
    listed: list[dict] = json.loads(cli(capsys, "queue", "--json", "--config", config_file)[1])[
        "bookings"
    ]
    return listed


def test_book_then_queue_shows_the_booking(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    window = ["--from", _hence(24), "--to", _hence(36)]
    code, out, _ = book(capsys, config_file, "--team", "vision", "--gpus", "8", *window)
    assert code == 0
    booking = json.loads(out)
    assert booking in bookings(capsys, config_file)
    # Times are ISO 8601 in every command's JSON, as given (to the second, UTC).
    assert booking["start"] == datetime.fromisoformat(window[1]).isoformat(timespec="seconds")
    assert datetime.fromisoformat(booking["end"]) == datetime.fromisoformat(window[3])


def test_book_list_and_cancel(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    window = ["--from", _hence(24), "--to", _hence(36)]
    _, out, _ = book(capsys, config_file, "--team", "vision", "--gpus", "8", *window)
    booking = json.loads(out)
    code, out, _ = book(capsys, config_file, "--list")
    assert code == 0 and booking in json.loads(out)["bookings"]
    code, out, _ = book(capsys, config_file, "--cancel", booking["booking_id"])
    assert code == 0 and json.loads(out) == booking
    assert booking not in bookings(capsys, config_file)
    code, out, err = book(capsys, config_file, "--cancel", booking["booking_id"])
    assert code != 0 and out == "" and "does not exist" in err


@pytest.mark.parametrize(
    ("flags", "problem"),
    [
        # Each rule is in tests/unit/test_operator_commands.py; here, the CLI's verdict.
        (["--team", "vision", "--gpus", "8", "--from", "{-48}", "--to", "{-40}"], "ended already"),
        (["--team", "nlp", "--gpus", "8", "--from", "{+40}", "--to", "{+48}"], "team 'nlp'"),
        (["--team", "vision", "--gpus", "8", "--from", "tomorrow", "--to", "{+48}"], "bad time"),
    ],
)
def test_a_booking_that_cannot_be_honoured_is_refused_and_nothing_is_booked(
    account: Account,
    config_file: str,
    capsys: pytest.CaptureFixture[str],
    flags: list[str],
    problem: str,
) -> None:
    before = bookings(capsys, config_file)
    argv = [_hence(float(flag[1:-1])) if flag.startswith("{") else flag for flag in flags]
    code, out, err = book(capsys, config_file, *argv)
    assert (code, out) == (2, "")
    assert problem in err
    assert bookings(capsys, config_file) == before


def launched(account: Account, name: str) -> Job:
    """The job named `name`, once it is launched."""
    store = DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])

    def look() -> Job | None:
        found = [job for job in store.list_jobs() if job.spec.name == name]
        return found[0] if found and found[0].status is JobStatus.LAUNCHING else None

    return with_passes(account, look, f"the launch of {name}")


def test_a_resize_to_a_shape_nothing_can_hold_is_refused_as_plan_refuses_it(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    submit(account, "shapely", team="ops", gpus=1)  # a team of its own: nothing waits for it
    job = launched(account, "shapely")
    shape = ["--gpus", "16", "--gpu-memory-gib", "200"]
    code, _, refused = refusal(capsys, "resize", job.job_id, *shape, "--config", config_file)
    assert code == 2
    planned, _, said = refusal(capsys, "plan", *shape)
    assert planned == 2 and "16 GPUs with >= 200 GiB" in said
    assert refused.removeprefix("gpufleet: ") == said.removeprefix("gpufleet: ")
    assert launched(account, "shapely") == job  # not a field changed: no checkpoint, no requeue


# Each test below that runs a command asks for the account: the command's target is the
# environment the account sets, and a test that leans on another test's account fails when it
# runs without it (picked alone, rerun with --lf, or handed on by xdist after a worker crash).
@pytest.mark.parametrize("job_id", ["j-" + "0" * 20, ""])
def test_cancel_of_a_job_that_does_not_exist_is_a_clear_refusal(
    account: Account, config_file: str, capsys: pytest.CaptureFixture[str], job_id: str
) -> None:
    code, out, err = refusal(capsys, "cancel", job_id, "--config", config_file)
    assert (code, out) == (2, "")
    assert f"job {job_id} does not exist" in err


def test_without_a_target_the_cli_says_what_it_needs(
    account: Account,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # The account's deployment, but for one variable: that one alone is refused.
    monkeypatch.delenv("QUEUE_TABLE")
    code = main(["queue", "--config", str(tmp_path / "none.yaml")])
    assert code == 2
    err = capsys.readouterr().err
    assert "--stack" in err and "QUEUE_TABLE" in err


def test_forged_node_reports_cost_one_invocation_each_and_are_counted(account: Account) -> None:
    """Reports for jobs that do not exist, or with an exit code no process has: each is logged,
    counted and dropped by one run of the NodeReport function, which Lambda does not retry."""
    forged = [
        (DETAIL_NODE_FINISHED, {"job_id": "j-" + "0" * 20, "instance_id": "i-0a", "exit_code": 0}),
        (DETAIL_NODE_HEARTBEAT, {"job_id": "j-" + "1" * 20, "instance_id": "i-0a"}),
        (
            DETAIL_NODE_FINISHED,
            {"job_id": "j-" + "2" * 20, "instance_id": "i-0a", "exit_code": 10**40},
        ),
    ]
    phases = {DETAIL_NODE_FINISHED: "finished", DETAIL_NODE_HEARTBEAT: "heartbeat"}
    function = f"gpufleet-{NODE_REPORT.construct_id}"
    before = len(account.recorder.invocations)
    response = account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": AGENT_SOURCE,
                "DetailType": detail_type,
                "Detail": json.dumps({**detail, "phase": phases[detail_type]}),
            }
            for detail_type, detail in forged
        ]
    )
    assert response["FailedEntryCount"] == 0
    runs = [i for i in account.recorder.invocations[before:] if i.function_name == function]
    assert len(runs) == len(forged)  # once each: none failed, so none was retried
    assert not [run for run in runs if run.errored]
    logged = account.client("logs").filter_log_events(logGroupName=f"/aws/lambda/{function}")
    metrics = [
        json.loads(event["message"])
        for event in logged["events"]
        if '"NodeReportsDropped"' in event["message"]
    ]
    # A job that never launched has no run key: nothing can be a report of its run.
    assert sorted(m["Problem"] for m in metrics) == ["invalid", "other-run", "other-run"]


def _put_report(account: Account, detail: dict[str, Any]) -> None:
    response = account.client("events").put_events(
        Entries=[
            {
                "EventBusName": account.bus,
                "Source": AGENT_SOURCE,
                "DetailType": DETAIL_NODE_FINISHED,
                "Detail": json.dumps(detail),
            }
        ]
    )
    assert response["FailedEntryCount"] == 0


def _run_key(account: Account, job_id: str) -> NodeKey:
    body = account.client("s3").get_object(Bucket=account.bucket, Key=node_key_object(job_id))
    return NodeKey.from_document(body["Body"].read())


def test_a_report_forged_for_another_job_is_refused_and_that_job_is_unaffected(
    account: Account,
) -> None:
    """End to end, through the bus and the NodeReport function: a finish for job B that B's
    agent did not sign (unsigned, signed with job A's run key, A's own report re-addressed to
    B) is dropped and B is as it was; the report B's agent signs is heard."""
    submit(account, "forger", team="ops", gpus=1)
    submit(account, "victim", team="ops", gpus=1)
    forger, victim = launched(account, "forger"), launched(account, "victim")
    assert forger.placement is not None and victim.placement is not None
    victims_instance = victim.placement.instance_ids[0]
    finish = {
        "job_id": victim.job_id,
        "instance_id": victims_instance,
        "phase": "finished",
        "exit_code": 0,
        "reason": "",
    }
    forgers_key = _run_key(account, forger.job_id)
    forgers_own = sign_report(
        {**finish, "job_id": forger.job_id, "instance_id": forger.placement.instance_ids[0]},
        forgers_key,
        sent_ms=int(time.time() * 1000),
    )
    function = f"gpufleet-{NODE_REPORT.construct_id}"
    before = len(account.recorder.invocations)
    for forged in (
        finish,
        sign_report(finish, forgers_key, sent_ms=int(time.time() * 1000)),
        {**forgers_own, "job_id": victim.job_id, "instance_id": victims_instance},
    ):
        _put_report(account, forged)
    runs = [i for i in account.recorder.invocations[before:] if i.function_name == function]
    assert len(runs) == 3 and not [run for run in runs if run.errored]
    assert launched(account, "victim") == victim  # not a field changed: still launching
    logged = account.client("logs").filter_log_events(logGroupName=f"/aws/lambda/{function}")
    problems = [
        json.loads(event["message"])["Problem"]
        for event in logged["events"]
        if '"NodeReportsDropped"' in event["message"]
    ]
    assert problems[-3:] == ["unsigned", "bad-signature", "bad-signature"]
    # The agent's own report, signed with the victim's run key, is heard.
    _put_report(
        account, sign_report(finish, _run_key(account, victim.job_id), int(time.time() * 1000))
    )
    store = DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])
    heard = store.get(victim.job_id)
    assert heard.run_result is not None and heard.run_result["exit_code"] == 0
    assert store.get(forger.job_id) == forger
