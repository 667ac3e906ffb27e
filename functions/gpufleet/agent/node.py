"""The node agent: what runs on each instance gpufleet launches.

It learns which job it serves from the instance's tags, fetches the job's run manifest, reports
that it started, runs the container with every GPU, and reports how it ended. User input (argv
and environment) goes to the container runtime as a list and an environment mapping; nothing is
ever passed through a shell.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.topology import (
    AGENT_SOURCE,
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_HEARTBEAT,
    DETAIL_NODE_STARTED,
    RUNS_PREFIX,
    TAG_JOB_ID,
)


@dataclass(frozen=True)
class RunManifest:
    job_id: str
    name: str
    image: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    timeout_seconds: int = 86400
    checkpoint: str | None = None

    @classmethod
    def from_json(cls, raw: bytes) -> RunManifest:
        document = json.loads(raw)
        return cls(
            job_id=str(document["job_id"]),
            name=str(document.get("name", "")),
            image=str(document["image"]),
            command=[str(arg) for arg in document["command"]],
            env={str(k): str(v) for k, v in document.get("env", {}).items()},
            gpus=int(document.get("gpus", 1)),
            timeout_seconds=int(document.get("timeout_seconds", 86400)),
            checkpoint=document.get("checkpoint"),
        )


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int | None
    reason: str = ""


class InstanceIdentity(Protocol):
    def instance_id(self) -> str: ...

    def tags(self) -> Mapping[str, str]: ...


class ManifestSource(Protocol):
    def fetch(self, key: str) -> bytes: ...


class Reporter(Protocol):
    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None: ...


class ContainerRuntime(Protocol):
    def run(self, manifest: RunManifest) -> RunOutcome: ...


# Between heartbeats while the container runs. The control plane takes a node for lost after
# its own (longer) heartbeat timeout, so a few lost heartbeats are harmless.
DEFAULT_HEARTBEAT_SECONDS = 300.0


class NodeAgent:
    def __init__(
        self,
        identity: InstanceIdentity,
        manifests: ManifestSource,
        reporter: Reporter,
        runtime: ContainerRuntime,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
    ) -> None:
        self._identity = identity
        self._manifests = manifests
        self._reporter = reporter
        self._runtime = runtime
        self._heartbeat_seconds = heartbeat_seconds

    def run(self) -> RunOutcome:
        instance_id = self._identity.instance_id()
        job_id = self._identity.tags()[TAG_JOB_ID]
        base = {"job_id": job_id, "instance_id": instance_id}
        try:
            raw = self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/run.json")
            manifest = RunManifest.from_json(raw)
        except Exception as exc:  # the job cannot run; say why rather than hang
            outcome = RunOutcome(exit_code=None, reason=f"could not read the run manifest: {exc}")
            self._report(DETAIL_NODE_FINISHED, base, "finished", outcome)
            return outcome
        self._report(DETAIL_NODE_STARTED, base, "started")
        finished = threading.Event()
        beat = threading.Thread(target=self._heartbeat, args=(base, finished), daemon=True)
        beat.start()
        try:
            outcome = self._runtime.run(manifest)
        finally:
            finished.set()
            beat.join()
        self._report(DETAIL_NODE_FINISHED, base, "finished", outcome)
        return outcome

    def _heartbeat(self, base: dict[str, str], finished: threading.Event) -> None:
        while not finished.wait(self._heartbeat_seconds):
            try:
                self._report(DETAIL_NODE_HEARTBEAT, base, "heartbeat")
            except Exception:  # noqa: S112 - a missed heartbeat is retried at the next one
                continue

    def _report(
        self, detail_type: str, base: dict[str, str], phase: str, outcome: RunOutcome | None = None
    ) -> None:
        detail: dict[str, Any] = {**base, "phase": phase}
        if outcome is not None:
            detail.update(exit_code=outcome.exit_code, reason=outcome.reason[:2000])
        self._reporter.report(AGENT_SOURCE, detail_type, detail)
