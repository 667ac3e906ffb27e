"""The node agent: what runs on each instance gpufleet launches.

It learns which job it serves from the instance's tags (a warm-pool instance waits until a
launch claims it and tags it with its job), fetches the job's run manifest, reports that it
started, runs the container with the instance's accelerators (every GPU, or its Neuron
devices) and its rank among the run's nodes, and reports how it ended. User input (argv and
environment) goes to the container runtime as a list and an environment mapping; nothing is
ever passed through a shell.

While the container runs, the agent publishes the job's GPU utilization, temperature and memory
used, and the metrics the job's own code prints on its stdout as `GPUFLEET_METRIC name=value`
lines (`JobMetrics`), to CloudWatch (`GpuFleet/Jobs`, dimension `JobId`). With a usage recorder
(`agent/usage.py`) it also keeps each minute of the node's GPU, CPU and memory use, and marks on
the run's timeline (started, checkpoint, interrupted, finished), in the job's
`runs/<job>/usage/<instance>.json`.

A stage of a multi-stage job whose next stage may reuse the instance (`await_next_stage` in its
manifest) then waits, for a bounded time, for the control plane to say so (`run-stage` in
control.json), and runs the next stage's manifest the same way.

Each run happens at most once on a node (`RunLedger`): a restarted agent never runs it again.
How the job ended is the job's business, never the agent's: `run` returns normally whatever
the container did, and raises only when the agent itself failed (what a restart may fix). After
its finish report the agent sends the same report again every `finish_resend_seconds`, a few
times, for as long as its instance lives: the control plane releases the instance within
seconds of the first report that arrives, so the copies stop with the instance, and a report
lost on the way (an event that ended in a dead-letter queue) is made up for by the next copy.
A manifest that cannot be read is reported once, and the agent stops.

Every report is signed with the run's key (`runs/<job>/node-key`, which the instance role reads
and the job's container cannot: `domain/node_reports.py`); the control plane hears no other.
A key that cannot be read is reported as the manifest's failure is, unsigned (the control
plane refuses it: the run's task times out, as for a node never heard), and nothing runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.agent.ledger import RunLedger, manifest_key, run_key
from gpufleet.agent.prepare import RegistryLogin, VolumeMount
from gpufleet.domain.node_reports import InvalidNodeKey, NodeKey, node_key_object, sign_report
from gpufleet.domain.rendezvous import MASTER_PORT, Peer
from gpufleet.domain.usage_layout import (
    EVENT_CHECKPOINT,
    EVENT_FINISHED,
    EVENT_INTERRUPTED,
    EVENT_STARTED,
)
from gpufleet.topology import (
    AGENT_METRICS,
    AGENT_SOURCE,
    CONTROL_RUN_STAGE,
    DETAIL_NODE_FINISHED,
    DETAIL_NODE_HEARTBEAT,
    DETAIL_NODE_STARTED,
    GPU_MEMORY_METRIC,
    GPU_TEMPERATURE_METRIC,
    GPU_UTILIZATION_METRIC,
    RUNS_PREFIX,
    TAG_JOB_ID,
)

if TYPE_CHECKING:
    from gpufleet.agent.usage import UsageRecorder


@dataclass(frozen=True)
class RunManifest:
    job_id: str
    name: str
    image: str
    command: list[str]
    team: str = ""  # whose credentials the container gets (agent/credentials.py)
    env: dict[str, str] = field(default_factory=dict)
    gpus: int = 1  # per node
    timeout_seconds: int = 86400
    checkpoint: str | None = None
    resume: bool = False
    stage: str | None = None  # of a multi-stage job
    await_next_stage: bool = False  # the next stage may run on this instance
    nodes: int = 1
    # The run's nodes in rank order, once the control plane knows them (after the launch).
    peers: tuple[Peer, ...] = ()
    port: int = MASTER_PORT
    # The instance type's accelerator ("nvidia", "trainium", "inferentia", "none", ...) and how
    # many devices of it the instance has.
    accelerator: str = "nvidia"
    accelerator_devices: int = 0
    rank: int = 0  # this node's: see `on_node`
    # Prepared on the node before the container starts (agent/prepare.py): secrets by
    # reference (environment name -> where its value is read), never by value.
    volumes: tuple[VolumeMount, ...] = ()
    secrets: dict[str, str] = field(default_factory=dict)
    registry_login: RegistryLogin | None = None

    @classmethod
    def from_json(cls, raw: bytes) -> RunManifest:
        document = json.loads(raw)
        gpus = int(document.get("gpus", 1))
        return cls(
            job_id=str(document["job_id"]),
            name=str(document.get("name", "")),
            team=str(document.get("team", "")),
            image=str(document["image"]),
            command=[str(arg) for arg in document["command"]],
            env={str(k): str(v) for k, v in document.get("env", {}).items()},
            gpus=gpus,
            timeout_seconds=int(document.get("timeout_seconds", 86400)),
            checkpoint=document.get("checkpoint"),
            resume=bool(document.get("resume", False)),
            stage=None if document.get("stage") is None else str(document["stage"]),
            await_next_stage=bool(document.get("await_next_stage", False)),
            nodes=int(document.get("nodes", 1)),
            peers=tuple(
                Peer(str(peer["instance_id"]), str(peer["private_ip"]))
                for peer in document.get("peers", [])
            ),
            port=int(document.get("port", MASTER_PORT)),
            accelerator=str(document.get("accelerator", "nvidia" if gpus else "none")),
            accelerator_devices=int(document.get("accelerator_devices", gpus)),
            volumes=tuple(VolumeMount.from_document(v) for v in document.get("volumes", [])),
            secrets={str(k): str(v) for k, v in document.get("secrets", {}).items()},
            registry_login=RegistryLogin.from_document(document.get("registry_login")),
        )

    def on_node(self, instance_id: str) -> RunManifest | None:
        """The manifest as the node `instance_id` runs it, with its rank; None while the
        manifest of a run of several nodes does not name this one yet (it is written again
        once the launch knows the instances)."""
        ranked = [peer.instance_id for peer in self.peers]
        if instance_id in ranked:
            return replace(self, rank=ranked.index(instance_id))
        return self if self.nodes == 1 else None


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

    def memory_used_mib(self) -> float | None:
        """GPU memory in use on the node, all its GPUs together, MiB (None: cannot tell)."""
        ...


class MetricSink(Protocol):
    def put(self, job_id: str, name: str, value: float, unit: str) -> None: ...


class ContainerRuntime(Protocol):
    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        """Run the job's container; when `stop` is set, have it checkpoint and exit (SIGTERM,
        then SIGKILL after the grace period)."""
        ...


class Clock(Protocol):
    """The agent's time: what it reads, and how it waits (tests drive one by hand)."""

    def now(self) -> float:
        """Seconds on a monotonic clock."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Wait until `event` is set or `seconds` have passed; whether it is set."""
        ...


class MonotonicClock:
    def now(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


# Between heartbeats while the container runs. The control plane takes a node for lost after
# its own (longer) heartbeat timeout, so a few lost heartbeats are harmless.
DEFAULT_HEARTBEAT_SECONDS = 300.0
DEFAULT_METRICS_SECONDS = 60.0
DEFAULT_USAGE_SECONDS = 60.0  # a sample of the node's usage each minute
# How often the agent looks for a checkpoint instruction; well inside the grace period.
DEFAULT_CONTROL_POLL_SECONDS = 10.0
# How often an idle warm-pool instance looks at its tags for the job that claimed it.
DEFAULT_CLAIM_POLL_SECONDS = 2.0
# How long a node that finished a stage waits to be told to run the next one there. The release
# step decides within seconds of the finish report; an instance it releases is terminated.
DEFAULT_STAGE_WAIT_SECONDS = 300.0
# After a run: its finish report again every 2 minutes, 10 times at most (20 minutes), unless
# the instance is gone by then. Within the Launch task's heartbeat timeout (node silence
# allowance plus boot allowance: 30 minutes by default), so a lost report is made up for before
# the control plane would take the node for lost.
DEFAULT_FINISH_RESEND_SECONDS = 120.0
DEFAULT_FINISH_RESENDS = 10
# A run manifest that cannot be fetched is tried this many times, the waits doubling from
# `manifest_retry_seconds` (the network may not be up yet at boot); one that is not valid is
# not tried again.
MANIFEST_FETCH_ATTEMPTS = 5
DEFAULT_MANIFEST_RETRY_SECONDS = 2.0

JOB_METRIC_PREFIX = "GPUFLEET_METRIC "
# Each name is a custom CloudWatch metric (billed per metric and month): a run gets this many.
MAX_JOB_METRICS = 10
MAX_JOB_METRIC_LINE = 1024
_JOB_METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,62}$")  # as a spec's scale_on.metric


def parse_job_metric_line(line: str) -> dict[str, float]:
    """`GPUFLEET_METRIC samples_per_second=1234 loss=0.31` -> {name: value}. Anything else (other
    output, malformed pairs, non-finite values, the agent's own metric names) yields nothing."""
    if not line.startswith(JOB_METRIC_PREFIX) or len(line) > MAX_JOB_METRIC_LINE:
        return {}
    values: dict[str, float] = {}
    for pair in line[len(JOB_METRIC_PREFIX) :].split():
        name, equals, text = pair.partition("=")
        if not equals or not _JOB_METRIC_NAME.match(name) or name in AGENT_METRICS:
            continue
        try:
            value = float(text)
        except ValueError:
            continue
        if math.isfinite(value):
            values[name] = value
    return values


class JobMetrics:
    """What the job's code reports on its stdout, averaged per name between two publications.
    Fed line by line by the container runtime (from its own thread)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: set[str] = set()
        self._sums: dict[str, tuple[float, int]] = {}

    def feed(self, line: str) -> None:
        for name, value in parse_job_metric_line(line.rstrip("\n")).items():
            with self._lock:
                if name not in self._names and len(self._names) >= MAX_JOB_METRICS:
                    continue
                self._names.add(name)
                total, count = self._sums.get(name, (0.0, 0))
                self._sums[name] = (total + value, count + 1)

    def take_means(self) -> dict[str, float]:
        """The mean of each metric reported since the last call."""
        with self._lock:
            sums, self._sums = self._sums, {}
        return {name: total / count for name, (total, count) in sums.items()}


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
        job_metrics: JobMetrics | None = None,
        claim_poll_seconds: float = DEFAULT_CLAIM_POLL_SECONDS,
        stage_wait_seconds: float = DEFAULT_STAGE_WAIT_SECONDS,
        ledger: RunLedger | None = None,
        finish_resend_seconds: float = DEFAULT_FINISH_RESEND_SECONDS,
        finish_resends: int = 0,
        manifest_retry_seconds: float = DEFAULT_MANIFEST_RETRY_SECONDS,
        going: threading.Event | None = None,
        clock: Clock | None = None,
        usage: Callable[[str, str], UsageRecorder] | None = None,
        usage_seconds: float = DEFAULT_USAGE_SECONDS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`ledger` keeps what ran on this instance (in memory when not given); after each run
        its finish report is sent `finish_resends` more times (the entry point sends
        DEFAULT_FINISH_RESENDS); `going`, when set, tells the agent its node is going away: it
        stops waiting and returns. Every wait and every reading of time goes through `clock`
        (the system's monotonic clock when not given). `usage` makes the recorder of a job's
        usage on this node (job id, instance id), which samples every `usage_seconds` and
        stamps its samples and marks with `wall_clock` (epoch seconds)."""
        self._identity = identity
        self._manifests = manifests
        self._reporter = reporter
        self._runtime = runtime
        self._heartbeat_seconds = heartbeat_seconds
        self._control_poll_seconds = control_poll_seconds
        self._gpu_probe = gpu_probe
        self._metrics = metrics
        self._metrics_seconds = metrics_seconds
        self._job_metrics = job_metrics
        self._claim_poll_seconds = claim_poll_seconds
        self._stage_wait_seconds = stage_wait_seconds
        self._ledger = ledger or RunLedger()
        self._finish_resend_seconds = finish_resend_seconds
        self._finish_resends = finish_resends
        self._manifest_retry_seconds = manifest_retry_seconds
        self._going = going or threading.Event()
        self._clock = clock or MonotonicClock()
        self._usage_factory = usage
        self._usage_seconds = usage_seconds
        self._wall_clock = wall_clock
        self._usage: UsageRecorder | None = None
        self._key: NodeKey | None = None  # the run's, read with its manifest

    def run(self) -> RunOutcome:
        """Run the job's runs on this instance, each at most once, and report how each ended.
        Returns the last run's outcome however the job did; raises only when the agent itself
        cannot go on (its reports cannot be sent)."""
        instance_id = self._identity.instance_id()
        job_id = self._claimed_job()
        base = {"job_id": job_id, "instance_id": instance_id}
        manifest = self._manifest(job_id, base)
        if isinstance(manifest, RunOutcome):
            return manifest
        if self._usage_factory is not None:
            self._usage = self._usage_factory(job_id, instance_id)
        while True:
            finish = self._run_at_most_once(manifest, base)
            outcome = _outcome_of(finish)
            # A stage that ended well, or that the main node ended for all (this one was stopped
            # because the job moved to its next stage): the next stage may run here.
            ended_well = outcome.exit_code == 0 or bool(finish.get(_MOVED_ON))
            may_continue = ended_well and manifest.await_next_stage
            following = self._after_run(manifest, finish, may_continue)
            if following is None:
                return outcome
            manifest = following

    def _manifest(self, job_id: str, base: dict[str, str]) -> RunManifest | RunOutcome:
        """The job's run manifest; when it cannot be read, the outcome that says so, reported
        once (a restarted agent does not report it again) and without a run."""
        key = f"{RUNS_PREFIX}{job_id}/run.json"
        problem = ""
        for attempt in range(MANIFEST_FETCH_ATTEMPTS):
            if attempt:
                self._clock.wait(self._going, self._manifest_retry_seconds * 2 ** (attempt - 1))
            reading = "the run's node key"
            try:
                if self._key is None:
                    self._key = NodeKey.from_document(
                        self._manifests.fetch(node_key_object(job_id))
                    )
                reading = "the run manifest"
                raw = self._manifests.fetch(key)
            except InvalidNodeKey as exc:  # for good
                problem = f"the run's node key is not valid: {exc}"
                break
            except Exception as exc:  # not there, or not reachable: tried again
                problem = f"could not read {reading}: {exc}"
                continue
            try:
                manifest = RunManifest.from_json(raw)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:  # invalid: for good
                problem = f"the run manifest is not valid: {exc!r}"
                break
            on_node = manifest.on_node(base["instance_id"])
            if on_node is not None:
                return on_node
            problem = "the run manifest does not name this node among the run's nodes"
        outcome = RunOutcome(exit_code=None, reason=problem)
        ledger_key = manifest_key(job_id)
        if self._ledger.finish_report(ledger_key) is None:
            detail = self._report(DETAIL_NODE_FINISHED, base, "finished", outcome)
            self._ledger.note_finished(ledger_key, detail)
        return outcome

    def _run_at_most_once(self, manifest: RunManifest, job_base: dict[str, str]) -> dict[str, Any]:
        """Run the manifest unless this node already did; the run's finish report, sent. A run
        that finished before a restart is not run again: its finish report is sent again. A run
        the agent died in (its container may even run on) is not started again: it is reported
        as failed, and the control plane decides (a retry launches new instances)."""
        base = _base_of(manifest, job_base)
        key = run_key(manifest.job_id, manifest.stage)
        finish = self._ledger.finish_report(key)
        if finish is None and self._ledger.started(key):
            restarted = RunOutcome(
                exit_code=None,
                reason="the node agent restarted during the run; the run is not started again",
            )
            finish = self._signed(_detail(base, "finished", restarted))
            self._ledger.note_finished(key, finish)
        if finish is None:
            return self._run_once(manifest, base, key)
        self._reporter.report(AGENT_SOURCE, DETAIL_NODE_FINISHED, finish)
        return finish

    def _after_run(
        self, manifest: RunManifest, finish: dict[str, Any], wait: bool
    ) -> RunManifest | None:
        """After a run: send its finish report again every `finish_resend_seconds` while the
        instance lives (`finish_resends` times at most), and when the next stage may run here
        (`wait`), look for the control plane's word for up to `stage_wait_seconds`. The next
        stage's manifest, or None when there is none (the instance is released, or about to
        be)."""
        now = self._clock.now()
        stage_deadline = now + (self._stage_wait_seconds if wait else 0.0)
        next_resend = now + self._finish_resend_seconds
        resends = 0
        while True:
            now = self._clock.now()
            waiting = now < stage_deadline
            if waiting:
                following = self._next_stage(manifest.job_id, manifest.stage)
                if following is not None:
                    return following
            if now >= next_resend and resends < self._finish_resends:
                resends += 1
                next_resend += self._finish_resend_seconds
                self._reporter.report(AGENT_SOURCE, DETAIL_NODE_FINISHED, finish)
            if not waiting and resends >= self._finish_resends:
                return None
            wake = next_resend if resends < self._finish_resends else stage_deadline
            if waiting:
                wake = min(wake, now + self._control_poll_seconds)
            if self._clock.wait(self._going, max(0.0, wake - self._clock.now())):
                return None

    def _next_stage(self, job_id: str, finished: str | None) -> RunManifest | None:
        """The next stage's manifest when the control plane has this instance run the stage
        after `finished` (None: not, or not yet)."""
        try:
            control = json.loads(self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/control.json"))
            stage = control.get("stage") if control.get("action") == CONTROL_RUN_STAGE else None
            if stage is not None and stage != finished:
                raw = self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/run.json")
                manifest = RunManifest.from_json(raw)
                if manifest.stage == stage:
                    return manifest.on_node(self._identity.instance_id())
        except Exception:  # noqa: S110 - no instruction yet (or unreadable): look again
            pass
        return None

    def _run_once(self, manifest: RunManifest, base: dict[str, str], key: str) -> dict[str, Any]:
        """Run one manifest's container, with heartbeats, metrics and the control watch, and
        report its start and its end (noted in the ledger before it is sent); the finish
        report."""
        job_id = manifest.job_id
        self._report(DETAIL_NODE_STARTED, base, "started")
        # Noted once its start is told (a start that could not be is no run: a restart runs it).
        self._ledger.note_started(key)
        self._mark_usage(EVENT_STARTED)
        finished, stop, interrupted = threading.Event(), threading.Event(), threading.Event()
        moved_on = threading.Event()
        helpers = [
            threading.Thread(target=self._heartbeat, args=(base, finished), daemon=True),
            threading.Thread(target=self._publish_metrics, args=(job_id, finished), daemon=True),
            threading.Thread(target=self._record_usage, args=(finished,), daemon=True),
            threading.Thread(
                target=self._watch_control,
                args=(job_id, manifest.stage, finished, stop, interrupted, moved_on),
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
        finish = _detail(base, "finished", outcome, interrupted.is_set())
        self._mark_usage(EVENT_FINISHED)
        if moved_on.is_set():
            finish[_MOVED_ON] = True
        finish = self._signed(finish)
        self._ledger.note_finished(key, finish)
        self._reporter.report(AGENT_SOURCE, DETAIL_NODE_FINISHED, finish)
        return finish

    def _claimed_job(self) -> str:
        """The job this instance runs: tagged at launch, or when a launch claims a warm-pool
        instance, which waits idle until then (the pool releases it if none comes)."""
        while True:
            job_id = self._identity.tags().get(TAG_JOB_ID)
            if job_id:
                return job_id
            self._clock.wait(self._going, self._claim_poll_seconds)

    def _heartbeat(self, base: dict[str, str], finished: threading.Event) -> None:
        while not self._clock.wait(finished, self._heartbeat_seconds):
            try:
                self._report(DETAIL_NODE_HEARTBEAT, base, "heartbeat")
            except Exception:  # noqa: S112 - a missed heartbeat is retried at the next one
                continue

    def _publish_metrics(self, job_id: str, finished: threading.Event) -> None:
        """One datapoint per interval of each metric: what the job's alarms watch."""
        if self._metrics is None:
            return
        while not self._clock.wait(finished, self._metrics_seconds):
            try:
                for name, value, unit in self._datapoints():
                    self._metrics.put(job_id, name, value, unit)
            except Exception:  # noqa: S112 - a missed datapoint is sent at the next interval
                continue

    def _record_usage(self, finished: threading.Event) -> None:
        """A sample of the node's usage every `usage_seconds` while the container runs."""
        if self._usage is None:
            return
        while not self._clock.wait(finished, self._usage_seconds):
            try:
                self._usage.sample(self._wall_clock())
            except Exception:  # noqa: S112 - a missed sample is taken at the next interval
                continue

    def _mark_usage(self, event: str) -> None:
        """A mark on the run's usage timeline; never a reason for the run to fail."""
        if self._usage is None:
            return
        with contextlib.suppress(Exception):
            self._usage.mark(self._wall_clock(), event)

    def _datapoints(self) -> list[tuple[str, float, str]]:
        points: list[tuple[str, float | None, str]] = []
        if self._gpu_probe is not None:
            points += [
                (GPU_UTILIZATION_METRIC, self._gpu_probe.utilization_percent(), "Percent"),
                (GPU_TEMPERATURE_METRIC, self._gpu_probe.temperature_celsius(), "None"),
                (GPU_MEMORY_METRIC, self._gpu_probe.memory_used_mib(), "Megabytes"),
            ]
        if self._job_metrics is not None:
            points += [(n, v, "None") for n, v in sorted(self._job_metrics.take_means().items())]
        return [(name, value, unit) for name, value, unit in points if value is not None]

    def _watch_control(
        self,
        job_id: str,
        stage: str | None,
        finished: threading.Event,
        stop: threading.Event,
        interrupted: threading.Event,
        moved_on: threading.Event,
    ) -> None:
        """The control plane asks a node to checkpoint and stop (preemption, spot interruption)
        by writing runs/<job>/control.json; the node has no inbound connection to be told. The
        node also watches the metadata service for its own spot interruption notice, in case
        the control plane's event comes late. A node of several whose run the main node ended
        (the control plane moved the job to its next stage here) stops its container too."""
        while not self._clock.wait(finished, self._control_poll_seconds):
            try:
                if self._identity.interruption_notice():
                    self._mark_usage(EVENT_INTERRUPTED)
                    interrupted.set()
                    stop.set()
                    return
            except Exception:  # noqa: S110 - the metadata service is asked again next round
                pass
            try:
                document = json.loads(self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/control.json"))
            except Exception:  # noqa: S112 - no instruction yet (or unreadable): look again
                continue
            if document.get("action") == CONTROL_RUN_STAGE and document.get("stage") != stage:
                moved_on.set()
            if document.get("action") == "checkpoint" or moved_on.is_set():
                if document.get("action") == "checkpoint":
                    self._mark_usage(EVENT_CHECKPOINT)
                stop.set()
                return

    def _report(
        self,
        detail_type: str,
        base: dict[str, str],
        phase: str,
        outcome: RunOutcome | None = None,
    ) -> dict[str, Any]:
        detail = self._signed(_detail(base, phase, outcome))
        self._reporter.report(AGENT_SOURCE, detail_type, detail)
        return detail

    def _signed(self, detail: dict[str, Any]) -> dict[str, Any]:
        """The report signed with the run's key (unsigned when it could not be read)."""
        if self._key is None:
            return detail
        return sign_report(detail, self._key, sent_ms=int(self._wall_clock() * 1000))


def _base_of(manifest: RunManifest, job_base: dict[str, Any]) -> dict[str, Any]:
    """What every report of a run names: the job and instance, the stage it ran, and how many
    nodes the run has (the control plane then reads which node this is)."""
    base = {**job_base, "stage": manifest.stage} if manifest.stage else dict(job_base)
    if manifest.nodes > 1:
        base["nodes"] = manifest.nodes
    return base


# A finish report's mark of a run stopped because the job moved to its next stage.
_MOVED_ON = "stopped_for_next_stage"


def _detail(
    base: Mapping[str, Any],
    phase: str,
    outcome: RunOutcome | None = None,
    interrupted: bool = False,
) -> dict[str, Any]:
    """A report's detail: the run it is about, the phase and, at the end, how it ended."""
    detail: dict[str, Any] = {**base, "phase": phase}
    if outcome is not None:
        detail.update(exit_code=outcome.exit_code, reason=outcome.reason[:2000])
    if interrupted:
        detail["interrupted"] = True
    if outcome is not None and outcome.oom:
        detail["oom"] = True
    return detail


def _outcome_of(detail: Mapping[str, Any]) -> RunOutcome:
    """The outcome a finish report tells of."""
    exit_code = detail.get("exit_code")
    return RunOutcome(
        exit_code=exit_code if isinstance(exit_code, int) else None,
        reason=str(detail.get("reason", "")),
        oom=bool(detail.get("oom", False)),
    )
