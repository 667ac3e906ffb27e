"""The everyday commands against `gpufleet emulator`, as a user runs them.

The emulator runs in its own process, as `gpufleet emulator --env-file --scenario`; the commands
run here with the variables it wrote, so every AWS call they make crosses HTTP to it. One
emulator serves the whole module, with few jobs that launch (they are slow): one that runs to
SUCCEEDED, one `gpufleet run` whose container exits 3; the others wait in a parked team.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest

import gpufleet
from gpufleet.cli import logs as logs_cli
from gpufleet.cli import main
from gpufleet.domain.arrays import child_job_id
from gpufleet.emulator.private import ENV_TOKEN, TOKEN_HEADER
from gpufleet.emulator.server import STACK_NAME

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

SPEC = """name: {name}
team: {team}
image: public.ecr.aws/pytorch/pytorch:2.4.0
command: [python, train.py]
resources: {{gpus: 1, gpu_memory_gib: 16}}
"""
# Team "parked" is guaranteed no GPUs and may borrow none: its jobs wait (for a booking far
# ahead: without one intake would refuse them, as nothing could ever run them), so one can be
# cancelled while it waits, whatever the timing.
CONFIG = """
queue:
  max_gpus: 16
  max_instances: 8
  reserve_share: 0
  teams:
    vision: {gpus: 8}
    parked: {gpus: 0, borrow: 0}
"""
# How the emulator's nodes run jobs, by name (the format of events/demo-scenario.json).
SCENARIO = {"boot_seconds": 1.0, "jobs": {"exits-3": {"duration_seconds": 1.0, "exit_code": 3}}}
Cli = Callable[..., tuple[int, str, str]]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cli")
    (path / "gpufleet.yaml").write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def emulator(workdir: Path) -> Iterator[dict[str, str]]:
    """`gpufleet emulator` in its own process; the variables it wrote for the user."""
    env_file = workdir / "emulator.env"
    functions = str(Path(gpufleet.__file__).resolve().parents[1])
    # A stale endpoint in the user's shell (an earlier emulator's) must not capture the
    # emulator's own calls.
    stale = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    environment = {**os.environ, **stale, "PYTHONPATH": functions}
    command = [sys.executable, "-m", "gpufleet.cli", "emulator", "--port", "0"]
    command += ["--env-file", str(env_file), "--config", str(workdir / "gpufleet.yaml")]
    (workdir / "scenario.json").write_text(json.dumps(SCENARIO))
    command += ["--scenario", str(workdir / "scenario.json")]
    # Its output goes to a file: a pipe nobody reads would fill up and stall it.
    log = workdir / "emulator.log"
    with log.open("w") as output:
        process = subprocess.Popen(command, env=environment, stdout=output, stderr=output)
    try:
        deadline = time.monotonic() + 60
        while not env_file.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the emulator did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        pairs = (line.split("=", 1) for line in env_file.read_text().splitlines())
        yield {name: shlex.split(value)[0] for name, value in pairs}  # the file is shell
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def cli(
    emulator: dict[str, str],
    workdir: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    """Run a command in a shell that exported the emulator's variables (or some of them)."""
    monkeypatch.chdir(workdir)  # the commands read ./gpufleet.yaml, as a user's would

    def run(*argv: str, only: tuple[str, ...] | None = None) -> tuple[int, str, str]:
        with exported(emulator, only):
            code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


@contextmanager
def exported(emulator: dict[str, str], only: tuple[str, ...] | None = None) -> Iterator[None]:
    """The environment of a shell that exported the emulator's variables (or `only` those)."""
    saved = dict(os.environ)
    for name in emulator:
        os.environ.pop(name, None)
    os.environ.update(emulator if only is None else {name: emulator[name] for name in only})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def wait_for(
    cli: Cli, argv: tuple[str, ...], done: Callable[[Any], bool], seconds: float = 60
) -> Any:
    deadline = time.monotonic() + seconds  # generous: CI machines can be slow
    while True:
        code, out, _ = cli(*argv)
        assert code == 0
        document = json.loads(out)
        if done(document):
            return document
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting: {document}")
        time.sleep(0.5)


def write_spec(workdir: Path, name: str, team: str, extra: str = "") -> Path:
    path = workdir / f"{name}.yaml"
    path.write_text(SPEC.format(name=name, team=team) + extra)
    return path


@pytest.fixture(scope="module")
def finished(emulator: dict[str, str], workdir: Path) -> dict[str, Any]:
    """A job submitted with `gpufleet submit` and run to the end: its submit and status."""
    with exported(emulator):
        path = write_spec(workdir, "resnet", "vision")
        config = ["--config", str(workdir / "gpufleet.yaml")]
        code, submitted = _json_of(["submit", str(path), "--json", *config])
        assert code == 0
        deadline = time.monotonic() + 60
        while True:
            code, status = _json_of(["status", submitted["job_id"], "--json"])
            if status["status"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                break
            assert time.monotonic() < deadline, status
            time.sleep(0.5)
    return {"submitted": submitted, "status": status}


def _json_of(argv: list[str]) -> tuple[int, Any]:
    """For module fixtures, which cannot use capsys: the command's stdout as JSON."""
    buffer = StringIO()
    with redirect_stdout(buffer):
        code = main(argv)
    return code, json.loads(buffer.getvalue())


def test_submit_prints_the_id_the_control_plane_gave_and_the_job_runs_to_the_end(
    finished: dict[str, Any],
) -> None:
    submitted, status = finished["submitted"], finished["status"]
    assert submitted["accepted"] is True
    assert submitted["key"] == "jobs/vision/resnet.yaml"
    assert submitted["status"] is not None  # intake had recorded it when submit returned
    assert status["id"] == submitted["job_id"]
    assert status["status"] == "SUCCEEDED"


def test_a_human_submit_prints_the_id_and_where_the_spec_went(cli: Cli, workdir: Path) -> None:
    code, out, _ = cli("submit", str(write_spec(workdir, "bert", "nlp")))
    assert code == 0
    job_id = out.split()[0]
    assert job_id.startswith("j-")
    assert "jobs/nlp/bert.yaml" in out
    code, out, _ = cli("status", job_id, "--json")
    assert code == 0 and json.loads(out)["name"] == "bert"


def test_an_invalid_spec_is_refused_with_its_fields_and_never_uploaded(
    cli: Cli, workdir: Path, emulator: dict[str, str]
) -> None:
    bad = workdir / "broken.yaml"
    bad.write_text("name: Not A Name\nteam: vision\nimage: img\ncommand: python train.py\n")
    code, out, err = cli("submit", str(bad), "--json")
    assert (code, out) == (2, "")
    refusal = json.loads(err)  # the contract's error, on stderr
    assert refusal["error"] == "InvalidJobSpec"
    assert refusal["details"]["key"] == "jobs/vision/broken.yaml"
    assert {f["field"] for f in refusal["details"]["fields"]} == {"name", "command"}
    code, _, err = cli("submit", str(bad))
    assert code == 2 and "name:" in err and "command:" in err
    s3 = boto3.client(
        "s3",
        endpoint_url=emulator["AWS_ENDPOINT_URL"],
        region_name=emulator["AWS_REGION"],
        aws_access_key_id=emulator["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=emulator["AWS_SECRET_ACCESS_KEY"],
    )
    listed = s3.list_objects_v2(Bucket=emulator["INTAKE_BUCKET"], Prefix="jobs/vision/broken")
    assert listed.get("KeyCount", 0) == 0


def test_status_shows_where_the_job_ran_what_it_cost_and_what_happened(
    cli: Cli, finished: dict[str, Any]
) -> None:
    status = finished["status"]
    assert status["team"] == "vision" and status["priority"] == "normal"
    assert status["instance_type"] and status["capacity_type"] == "spot"
    assert status["instances"] and status["exit_code"] == 0
    assert status["held_seconds"] > 0 and status["cost_usd"] > 0
    assert status["waited_seconds"] >= 0
    assert (status["retries"], status["interruptions"], status["preemptions"]) == (0, 0, 0)
    assert status["failure_reason"] is None and status["flags"] == []
    code, out, _ = cli("status", status["id"])
    assert code == 0
    record = out.partition("\nusage (")[0]
    fields = dict(line.split(":", 1) for line in record.splitlines())
    assert fields["status"].strip() == "SUCCEEDED"
    assert fields["instance_type"].strip() == status["instance_type"]
    assert float(fields["cost_usd"]) == pytest.approx(status["cost_usd"], abs=1e-6)


def test_status_prints_the_peaks_and_means_of_the_usage_its_node_kept(
    cli: Cli, finished: dict[str, Any]
) -> None:
    usage = finished["status"]["usage"]
    # The emulated node's GPUs say 90 % and 8,000 MiB (the scenario's default), each second.
    assert usage["nodes"] == 1 and usage["samples"] >= 1
    assert usage["gpu_util_percent_peak"] == usage["gpu_util_percent_mean"] == 90.0
    assert usage["gpu_mem_mib_peak"] == 8000.0 and usage["gpu_mem_total_mib"] > 8000.0
    code, out, _ = cli("status", finished["status"]["id"])
    assert code == 0
    table = out.partition("\nusage (1 node(s), ")[2]
    rows = {line.rsplit(None, 2)[0]: line.split()[-2:] for line in table.splitlines()[2:]}
    assert rows["GPU utilization %"] == ["90", "90"]


def test_report_writes_the_usage_curves_and_the_timeline_as_png_and_html(
    cli: Cli, finished: dict[str, Any], workdir: Path
) -> None:
    out = workdir / "report"
    code, printed, _ = cli("report", finished["status"]["id"], "--out", str(out), "--json")
    assert code == 0
    assert sorted(Path(f).name for f in json.loads(printed)["files"]) == [
        "index.html",
        "timeline.png",
        "usage.png",
    ]
    for image in ("usage.png", "timeline.png"):
        assert (out / image).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    page = (out / "index.html").read_text()
    assert 'src="usage.png"' in page and 'src="timeline.png"' in page
    for phase in ("queued", "launching", "running", "released"):
        assert f"<td>{phase}</td>" in page


def test_review_reads_the_records_and_the_usage_the_nodes_kept(
    cli: Cli, finished: dict[str, Any], workdir: Path
) -> None:
    out = workdir / "review"
    code, printed, _ = cli(
        "review", "--since", "1d", "--team", "vision", "--json", "--out", str(out),
        "--capacity-block", "p5.48xlarge=27.5",
    )  # fmt: skip
    assert code == 0
    document = json.loads(printed)
    assert document["jobs"] >= 1 and document["with_usage"] >= 1
    [block] = document["capacity_block_break_even"]
    assert block["instance_type"] == "p5.48xlarge"
    assert block["break_even_utilization"] == round(27.5 / block["on_demand_usd_per_hour"], 3)
    assert "p5.48xlarge: a block at $27.5/h" in (out / "index.html").read_text()
    assert {"right_size", "waste", "commitments", "capacity_blocks"} <= set(document)
    # What the node published: its GPU at 90 % (never idle), 8,000 MiB used of a type already
    # the cheapest that holds it with headroom: no idle GPU-hours, no type to move to (how long
    # its release took after the finish depends on the machine's load: not asserted).
    assert [w for w in document["waste"] if w["idle_gpu_hours"] > 0] == []
    assert document["right_size"] == []
    assert "<h2>Right-size</h2>" in (out / "index.html").read_text()
    code, _, err = cli("review", "--since", "soon")
    assert code == 2 and "--since" in err
    code, _, err = cli("review", "--capacity-block", "p5.48xlarge=-1")
    assert code == 2 and "--capacity-block" in err


def test_an_unknown_job_is_a_clear_error(cli: Cli) -> None:
    code, _, err = cli("status", "j-00000000000000000000")
    assert code == 2 and "does not exist" in err


def test_list_filters_by_status_and_team_and_prints_a_table(
    cli: Cli, finished: dict[str, Any]
) -> None:
    job_id = finished["status"]["id"]
    code, out, _ = cli("list", "--status", "SUCCEEDED", "--team", "vision", "--json")
    assert code == 0
    assert job_id in [job["id"] for job in json.loads(out)]
    code, out, _ = cli("list", "--team", "nobody", "--json")
    assert code == 0 and json.loads(out) == []
    code, out, _ = cli("list", "--limit", "50")
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["job", "name", "team", "status"]
    row = next(r for r in rows if r.startswith(job_id))
    assert row.split()[1:4] == ["resnet", "vision", "SUCCEEDED"]
    # `status` without an id is the same listing.
    assert cli("status", "--limit", "50")[1].splitlines()[0] == header


def test_logs_print_the_containers_output_from_cloudwatch(
    cli: Cli, finished: dict[str, Any]
) -> None:
    status = finished["status"]
    code, out, _ = cli("logs", status["id"], "--json")
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]
    assert events, "the node wrote no output"
    assert {e["event"] for e in events} == {"log"}
    assert {e["instance_id"] for e in events} == set(status["instances"])
    assert events[-1]["message"] == "training finished, exit code 0"
    assert [e["time"] for e in events] == sorted(e["time"] for e in events)
    # Following a job that has ended prints the same, says how it ended, exits with its code.
    code, followed, err = cli("logs", status["id"], "--follow")
    assert code == 0
    assert followed.splitlines()[-1].endswith("training finished, exit code 0")
    assert status["instances"][0] in followed
    assert f"{status['id']}: SUCCEEDED on {status['instance_type']} (spot), exit code 0" in err
    code, followed, _ = cli("logs", status["id"], "--follow", "--json")
    end = json.loads(followed.splitlines()[-1])
    assert (code, end["event"], end["status"], end["exit_code"]) == (0, "ended", "SUCCEEDED", 0)


def test_cost_adds_up_by_team_job_and_day(cli: Cli, finished: dict[str, Any]) -> None:
    status = finished["status"]
    code, out, _ = cli("cost", "--by", "job", "--json")
    assert code == 0
    report = json.loads(out)
    line = next(row for row in report["rows"] if row["job"] == status["id"])
    assert line["cost_usd"] == pytest.approx(status["cost_usd"])
    assert line["held_seconds"] == pytest.approx(status["held_seconds"])
    assert report["total"]["jobs"] == len(report["rows"])

    by_team = json.loads(cli("cost", "--by", "team", "--json")[1])
    vision = next(row for row in by_team["rows"] if row["team"] == "vision")
    vision_jobs = [row for row in report["rows"] if row["team"] == "vision"]
    assert vision["jobs"] == len(vision_jobs)
    assert vision["cost_usd"] == pytest.approx(sum(r["cost_usd"] or 0 for r in vision_jobs))
    assert "hourly_usd" not in vision

    today = datetime.now(UTC).date()
    by_day = json.loads(cli("cost", "--by", "day", "--since", today.isoformat(), "--json")[1])
    assert [row["day"] for row in by_day["rows"]] == [today.isoformat()]
    tomorrow = (today + timedelta(days=1)).isoformat()
    assert json.loads(cli("cost", "--since", tomorrow, "--json")[1])["rows"] == []

    code, table, _ = cli("cost")
    assert code == 0
    header, *rows = table.splitlines()
    assert header.split()[:2] == ["team", "jobs"] and "cost_usd" in header.split()
    assert rows[-1].split()[0] == "total"


def park(cli: Cli) -> None:
    """A booking far ahead for team "parked": intake takes its jobs, which then wait."""
    window = ("--from", "2099-01-01T00:00Z", "--to", "2099-01-01T01:00Z")
    assert cli("book", "--team", "parked", "--gpus", "1", *window)[0] == 0


def waiting_row(cli: Cli, job_id: str) -> dict[str, Any]:
    """The job's row in `gpufleet queue --json`, once it waits there."""
    listing = wait_for(
        cli,
        ("queue", "--json"),
        lambda doc: any(w["job_id"] == job_id and w["reason"] == "quota" for w in doc["waiting"]),
    )
    row: dict[str, Any] = next(w for w in listing["waiting"] if w["job_id"] == job_id)
    return row


def test_queue_shows_a_waiting_job_and_cancel_takes_it_out(cli: Cli, workdir: Path) -> None:
    park(cli)
    path = write_spec(workdir, "parked-job", "parked")
    code, out, _ = cli("submit", str(path), "--json")
    assert code == 0
    job_id = json.loads(out)["job_id"]
    row = waiting_row(cli, job_id)
    assert row["team"] == "parked"
    # A waiting job's status counts the wait so far (the queue counts from the submission).
    waited = json.loads(cli("status", job_id, "--json")[1])["waited_seconds"]
    later = waiting_row(cli, job_id)["waited_seconds"]
    assert 0 < waited <= later + 0.1
    # The same file again is a new upload, hence a new job, as docs/cli.md says.
    code, out, _ = cli("submit", str(path), "--json")
    again = json.loads(out)["job_id"]
    assert code == 0 and again != job_id
    for cancelled in (job_id, again):
        code, out, _ = cli("cancel", cancelled, "--json")
        assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    status = json.loads(cli("status", job_id, "--json")[1])
    assert status["status"] == "CANCELLED"
    assert status["waited_seconds"] >= waited  # the wait it ended is kept
    remaining = json.loads(cli("queue", "--json")[1])["waiting"]
    assert not {job_id, again} & {w["job_id"] for w in remaining}


def test_a_jobs_list_is_submitted_at_once_and_a_dependant_of_a_cancelled_job_is_cancelled(
    cli: Cli, workdir: Path
) -> None:
    park(cli)
    path = workdir / "pipeline.yaml"
    path.write_text(
        "jobs:\n"
        + "".join(
            "  - " + SPEC.format(name=name, team="parked").replace("\n", "\n    ") + extra + "\n"
            for name, extra in (("then", "depends_on: [{job: first}]"), ("first", ""))
        )
    )
    code, out, _ = cli("submit", str(path), "--json")
    submitted = json.loads(out)
    assert code == 0 and submitted["key"] == "jobs/parked/pipeline.yaml"
    first, then = submitted["job_ids"]  # each after the job it depends on
    assert submitted["job_id"] == first
    waiting_row(cli, first)  # it waits for room; `then` waits for it, out of the policy's sight
    listing = wait_for(
        cli,
        ("queue", "--json"),
        lambda doc: any(w["job_id"] == then for w in doc["waiting"]),
    )
    assert [w["reason"] for w in listing["waiting"] if w["job_id"] == then] == ["dependencies"]
    code, out, _ = cli("cancel", first, "--json")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    # Its end wakes a pass (`Job Status Changed`): no capacity was freed, `then` ends all the same.
    status = wait_for(cli, ("status", then, "--json"), lambda doc: doc["status"] == "CANCELLED")
    assert status["failure_reason"] == f"dependency {first} ended CANCELLED"
    assert status["instances"] == []
    code, out, _ = cli("submit", str(path))  # a new upload: new jobs
    assert code == 0 and out.splitlines()[1].startswith("and 1 more: j-")
    assert cli("cancel", out.split()[0])[0] == 0  # and its dependant with it


def test_list_array_counts_the_children_and_cancel_of_the_array_cancels_them(
    cli: Cli, workdir: Path
) -> None:
    park(cli)
    path = write_spec(
        workdir, "parked-sweep", "parked", "sweep: {grid: {lr: [0.1, 0.01, 0.001]}}\n"
    )
    code, out, _ = cli("submit", str(path), "--json")
    assert code == 0
    array_id = json.loads(out)["job_id"]
    progress = wait_for(
        cli, ("list", "--array", array_id, "--json"), lambda doc: doc["counts"]["QUEUED"] == 3
    )
    assert (progress["size"], progress["status"]) == (3, "QUEUED")
    code, out, _ = cli("list", "--array", array_id)
    assert code == 0 and out.splitlines()[0].endswith("QUEUED, 3 children")
    assert ["QUEUED", "3"] in [row.split() for row in out.splitlines()]
    assert "ended" not in out  # no progress bar: stdout is not a terminal here
    code, out, _ = cli("cancel", array_id, "--json")
    assert code == 0 and json.loads(out)["status"] == "CANCELLED"
    assert json.loads(out)["cancelled"] == 3
    progress = json.loads(cli("list", "--array", array_id, "--json")[1])
    assert progress["status"] == "CANCELLED" and progress["counts"]["CANCELLED"] == 3
    # A child is a job, no array.
    code, _, err = cli("list", "--array", child_job_id(array_id, 0))
    assert code == 2 and "not an array" in err


def test_run_shows_the_status_changes_then_the_output_and_exits_with_the_jobs_code(
    cli: Cli, workdir: Path
) -> None:
    path = write_spec(workdir, "exits-3", "vision", "max_retries: 0\n")
    code, out, err = cli("run", str(path), "--poll-seconds", "0.5")
    assert code == 3  # the container's exit code
    progress = err.splitlines()
    job_id = progress[0].split()[1]
    statuses = [line.split()[3] for line in progress[1:-1]]
    # Each change once, in order (a poll may miss a short one), and the end.
    order = ["QUEUED", "LAUNCHING", "RUNNING", "FAILED"]
    assert statuses[-1] == "FAILED" and len(statuses) >= 2
    assert [order.index(status) for status in statuses] == sorted(
        {order.index(status) for status in statuses}
    )
    assert out.splitlines()[-1].endswith("training finished, exit code 3")
    assert progress[-1].startswith(f"gpufleet: {job_id}: FAILED on ")
    assert progress[-1].count("exit code 3") == 1
    # Following it again says the same, as JSON lines.
    code, out, _ = cli("logs", job_id, "--follow", "--json")
    events = [json.loads(line) for line in out.splitlines()]
    assert code == 3 and events[-1]["event"] == "ended"
    assert (events[-1]["status"], events[-1]["exit_code"]) == ("FAILED", 3)


def test_ctrl_c_detaches_from_run_unless_asked_to_cancel(
    cli: Cli, workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(_seconds: float) -> None:
        raise KeyboardInterrupt  # Ctrl-C while run waits for the job's next change

    park(cli)
    with monkeypatch.context() as patched:
        patched.setattr(logs_cli, "time", SimpleNamespace(sleep=interrupted))
        code, out, _ = cli("run", str(write_spec(workdir, "detached", "parked")), "--json")
        assert code == 130
        detached = json.loads(out.splitlines()[-1])
        assert detached["event"] == "detached"
        code, out, _ = cli(
            "run", str(write_spec(workdir, "dropped", "parked")), "--cancel-on-interrupt"
        )
        assert code == 130
    parked = json.loads(cli("list", "--team", "parked", "--json")[1])
    # (Other tests park jobs of their own in the team.)
    by_name = {
        job["name"]: job["status"] for job in parked if job["name"] in ("detached", "dropped")
    }
    assert by_name == {"detached": "QUEUED", "dropped": "CANCELLED"}
    # The detached job runs on (waits, here); `logs --follow` sees it to its end.
    assert cli("cancel", detached["job_id"])[0] == 0
    code, _, err = cli("logs", detached["job_id"], "--follow")
    assert code == 126 and f"{detached['job_id']}: CANCELLED" in err


def test_the_stack_name_and_endpoint_flag_find_the_same_gpufleet(
    cli: Cli, finished: dict[str, Any], emulator: dict[str, str]
) -> None:
    """Only credentials and a region exported: `--stack` reads the outputs the emulator
    published, as it reads a deployed stack's, and `--endpoint-url` points every call there."""
    job_id = finished["status"]["id"]
    argv = ("status", job_id, "--json", "--stack", STACK_NAME)
    credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")
    code, out, _ = cli(*argv, "--endpoint-url", emulator["AWS_ENDPOINT_URL"], only=credentials)
    assert code == 0 and json.loads(out)["status"] == "SUCCEEDED"
    code, out, _ = cli(
        "logs", job_id, "--stack", STACK_NAME, only=(*credentials, "AWS_ENDPOINT_URL")
    )
    assert code == 0 and "training finished" in out


# -- the emulator is private -------------------------------------------------------------------


def _ask(
    emulator: dict[str, str], method: str, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP request to the emulator's loopback port, as a browser or a script makes it."""
    endpoint = urlsplit(emulator["AWS_ENDPOINT_URL"])
    connection = http.client.HTTPConnection(endpoint.hostname or "", endpoint.port, timeout=30)
    try:
        connection.request(method, path, headers=headers or {})
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


def _cors(headers: dict[str, str]) -> list[str]:
    return [name for name in headers if name.lower().startswith("access-control-")]


def test_the_emulator_listens_on_loopback_and_its_env_file_is_its_owners_only(
    emulator: dict[str, str], workdir: Path
) -> None:
    assert urlsplit(emulator["AWS_ENDPOINT_URL"]).hostname == "127.0.0.1"
    mode = stat.S_IMODE((workdir / "emulator.env").stat().st_mode)
    assert mode == 0o600  # it holds the token
    assert len(emulator[ENV_TOKEN]) >= 32


def test_a_web_page_can_neither_read_the_account_nor_reset_it(
    emulator: dict[str, str], finished: dict[str, Any]
) -> None:
    page = {"Origin": "https://evil.example"}
    # The cross-origin reset a page can send without asking (a "simple" request) ...
    status, headers, _ = _ask(emulator, "POST", "/moto-api/reset", page)
    assert status == 403 and _cors(headers) == []
    # ... and the preflight and reads it would need, are refused without any CORS header.
    preflight = {**page, "Access-Control-Request-Method": "POST"}
    for method, path, extra in [("OPTIONS", "/", preflight), ("GET", "/", page)]:
        status, headers, _ = _ask(emulator, method, path, extra)
        assert status == 403 and _cors(headers) == []
    # A page whose own name points at 127.0.0.1 (DNS rebinding) names its host.
    status, _, _ = _ask(emulator, "GET", "/", {"Host": "evil.example:80"})
    assert status == 403
    # The account is as it was: the job is still there.
    with exported(emulator):
        code, job = _json_of(["status", finished["submitted"]["job_id"], "--json"])
    assert code == 0 and job["status"] == "SUCCEEDED"


def test_the_control_endpoints_need_the_token_from_the_env_file(
    emulator: dict[str, str], finished: dict[str, Any]
) -> None:
    status, _, body = _ask(emulator, "POST", "/moto-api/reset")
    assert status == 403 and TOKEN_HEADER.encode() in body
    status, _, _ = _ask(emulator, "POST", "/moto-api/reset", {TOKEN_HEADER: "guessed"})
    assert status == 403
    # With the token (a read of moto's configuration: the module's account stays as it is).
    status, headers, body = _ask(
        emulator, "GET", "/moto-api/config", {TOKEN_HEADER: emulator[ENV_TOKEN]}
    )
    assert status == 201 and _cors(headers) == []  # moto answers its config with 201
    assert "lambda" in json.loads(body)
