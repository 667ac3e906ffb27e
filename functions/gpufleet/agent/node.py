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
    GPU_TEMPERATURE_METRIC,
    GPU_UTILIZATION_METRIC,
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
    resume: bool = False

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
            resume=bool(document.get("resume", False)),
        )


@dataclass(frozen=True)
class RunOutcome:
    exit_code: int | None
    reason: str = ""
    oom: bool = False  # the GPUs ran out of memory


class InstanceIdentity(Protocol):
    def instance_id(self) -> str: ...

    def tags(self) -> Mapping[str, str]: ...

    def interruption_notice(self) -> str | None:
        """The spot interruption notice on this instance (its action), if one was given."""
        ...


class ManifestSource(Protocol):
    def fetch(self, key: str) -> bytes: ...


class Reporter(Protocol):
    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None: ...


class GpuProbe(Protocol):
    def utilization_percent(self) -> float | None:
        """Mean utilization of the node's GPUs now (None: cannot tell)."""
        ...

    def temperature_celsius(self) -> float | None:
        """The hottest GPU's temperature now (None: cannot tell)."""
        ...


class MetricSink(Protocol):
    def put(self, job_id: str, name: str, value: float, unit: str) -> None: ...


class ContainerRuntime(Protocol):
    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        """Run the job's container; when `stop` is set, have it checkpoint and exit (SIGTERM,
        then SIGKILL after the grace period)."""
        ...


# Between heartbeats while the container runs. The control plane takes a node for lost after
# its own (longer) heartbeat timeout, so a few lost heartbeats are harmless.
DEFAULT_HEARTBEAT_SECONDS = 300.0
DEFAULT_METRICS_SECONDS = 60.0
# How often the agent looks for a checkpoint instruction; well inside the grace period.
DEFAULT_CONTROL_POLL_SECONDS = 10.0


class NodeAgent:
    def __init__(
        self,
        identity: InstanceIdentity,
        manifests: ManifestSource,
        reporter: Reporter,
        runtime: ContainerRuntime,
        heartbeat_seconds: float = DEFAULT_HEARTBEAT_SECONDS,
        control_poll_seconds: float = DEFAULT_CONTROL_POLL_SECONDS,
        gpu_probe: GpuProbe | None = None,
        metrics: MetricSink | None = None,
        metrics_seconds: float = DEFAULT_METRICS_SECONDS,
    ) -> None:
        self._identity = identity
        self._manifests = manifests
        self._reporter = reporter
        self._runtime = runtime
        self._heartbeat_seconds = heartbeat_seconds
        self._control_poll_seconds = control_poll_seconds
        self._gpu_probe = gpu_probe
        self._metrics = metrics
        self._metrics_seconds = metrics_seconds

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
        finished, stop, interrupted = threading.Event(), threading.Event(), threading.Event()
        helpers = [
            threading.Thread(target=self._heartbeat, args=(base, finished), daemon=True),
            threading.Thread(target=self._publish_metrics, args=(job_id, finished), daemon=True),
            threading.Thread(
                target=self._watch_control,
                args=(job_id, finished, stop, interrupted),
                daemon=True,
            ),
        ]
        for helper in helpers:
            helper.start()
        try:
            outcome = self._runtime.run(manifest, stop)
        finally:
            finished.set()
            for helper in helpers:
                helper.join()
        self._report(DETAIL_NODE_FINISHED, base, "finished", outcome, interrupted.is_set())
        return outcome

    def _heartbeat(self, base: dict[str, str], finished: threading.Event) -> None:
        while not finished.wait(self._heartbeat_seconds):
            try:
                self._report(DETAIL_NODE_HEARTBEAT, base, "heartbeat")
            except Exception:  # noqa: S112 - a missed heartbeat is retried at the next one
                continue

    def _publish_metrics(self, job_id: str, finished: threading.Event) -> None:
        """GPU utilization of the job, one datapoint per interval: what the idle and busy
        alarms watch."""
        if self._gpu_probe is None or self._metrics is None:
            return
        while not finished.wait(self._metrics_seconds):
            try:
                utilization = self._gpu_probe.utilization_percent()
                if utilization is not None:
                    self._metrics.put(job_id, GPU_UTILIZATION_METRIC, utilization, "Percent")
                temperature = self._gpu_probe.temperature_celsius()
                if temperature is not None:
                    self._metrics.put(job_id, GPU_TEMPERATURE_METRIC, temperature, "None")
            except Exception:  # noqa: S112 - a missed datapoint is sent at the next interval
                continue

    def _watch_control(
        self,
        job_id: str,
        finished: threading.Event,
        stop: threading.Event,
        interrupted: threading.Event,
    ) -> None:
        """The control plane asks a node to checkpoint and stop (preemption, spot interruption)
        by writing runs/<job>/control.json; the node has no inbound connection to be told. The
        node also watches the metadata service for its own spot interruption notice, in case
        the control plane's event comes late."""
        while not finished.wait(self._control_poll_seconds):
            try:
                if self._identity.interruption_notice():
                    interrupted.set()
                    stop.set()
                    return
            except Exception:  # noqa: S110 - the metadata service is asked again next round
                pass
            try:
                document = json.loads(self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/control.json"))
            except Exception:  # noqa: S112 - no instruction yet (or unreadable): look again
                continue
            if document.get("action") == "checkpoint":
                stop.set()
                return

    def _report(
        self,
        detail_type: str,
        base: dict[str, str],
        phase: str,
        outcome: RunOutcome | None = None,
        interrupted: bool = False,
    ) -> None:
        detail: dict[str, Any] = {**base, "phase": phase}
        if outcome is not None:
            detail.update(exit_code=outcome.exit_code, reason=outcome.reason[:2000])
        if interrupted:
            detail["interrupted"] = True
        if outcome is not None and outcome.oom:
            detail["oom"] = True
        self._reporter.report(AGENT_SOURCE, detail_type, detail)
