"""Emulated instances: each one gpufleet launches in the embedded account runs the real node
agent. A job whose behaviour `runs_command` gets the agent's real `DockerRuntime`, calling the
fake docker CLI (`fake_docker`), which runs the container's command as a local process with
what the agent asked for, and refuses what the instance type could not do; each node's private
IP is a loopback address of its own (`loopback`), so the run's nodes meet over TCP as on EC2.
Every other job's container only pretends to train (`SimulatedRuntime`: duration and exit code
come from the scenario)."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.agent.aws import AwsNodeSecrets, CloudWatchMetrics, EventBridgeReporter, S3Manifests
from gpufleet.agent.credentials import job_credentials
from gpufleet.agent.docker import NEURON_ACCELERATORS, DockerRuntime
from gpufleet.agent.node import (
    JOB_METRIC_PREFIX,
    ContainerRuntime,
    JobMetrics,
    NodeAgent,
    RunManifest,
    RunOutcome,
)
from gpufleet.agent.prepare import Completed, Prepared, prepare
from gpufleet.agent.usage import NVIDIA_SMI_QUERY, UsageRecorder, UsageSampler
from gpufleet.domain.catalog import load_bundled
from gpufleet.emulator.account import JOB_ROLE_ARN, Account
from gpufleet.emulator.clock import EmulatorClock
from gpufleet.emulator.ec2_rules import put_ec2_event
from gpufleet.emulator.fake_docker import Docker, NodeHardware, install_node
from gpufleet.emulator.node_host import EmulatedHost
from gpufleet.emulator.patches import EMULATOR, NODE, acting_as
from gpufleet.errors import GpufleetError
from gpufleet.topology import (
    DETAIL_SPOT_WARNING,
    DETAIL_STATE_CHANGE,
    JOBS_TABLE,
    RUNS_PREFIX,
    TAG_JOB_ID,
    TAG_MANAGED,
    agent_log_stream,
)

# The emulator's agent log group (the stack names its own; `gpufleet emulator` exports this one).
AGENT_LOG_GROUP = "/gpufleet/agent"


@dataclass(frozen=True)
class Behaviour:
    """How a job's container behaves in the emulator."""

    duration_seconds: float = 3.0
    exit_code: int = 0
    # The machine dies mid-run without a word: no heartbeats, no finish report.
    vanishes: bool = False
    # Spot reclaims the instance this long into the job's first run: a two-minute warning
    # (scaled to `NodeScenario.notice_seconds`), then termination.
    interrupt_after_seconds: float | None = None
    # False: that reclaim comes without warning or notice and takes the node with it, as a
    # hardware failure would: its agent reports nothing, only EC2's state change tells.
    warned: bool = True
    # One node of the job's first run falls silent this long into it: its agent says nothing
    # more (no heartbeat, no finish), while its instance keeps running and its peers beat.
    falls_silent_after_seconds: float | None = None
    # Runs out of GPU memory on GPUs with less memory than this.
    needs_gpu_memory_gib: float = 0.0
    gpu_utilization: float = 90.0  # what its GPUs report while it runs
    gpu_temperature: float = 65.0
    # GPU memory in use on the node (MiB) when it starts, and how fast it grows (a leak).
    gpu_memory_mib: float = 8000.0
    gpu_memory_growth_mib_per_second: float = 0.0
    # What the job's code prints for gpufleet while it runs: `GPUFLEET_METRIC name=value`.
    prints_metrics: tuple[tuple[str, float], ...] = ()
    # A run does not end on its own before gpufleet has flagged the job: the misbehaviour
    # (idle GPUs, a leak, too few samples/s) lasts until an alarm has acted on it, as it
    # would for hours on a real node, however slowly a loaded machine runs the emulator.
    until_flagged: bool = False
    # The container's command really runs (through the agent's DockerRuntime and the fake
    # docker): its duration and exit code are the command's own, not the fields above.
    runs_command: bool = False


# How long a run held `until_flagged` waits at most before it ends unflagged.
FLAG_WAIT_SECONDS = 120.0
# How often a running container notices that its instance was terminated under it.
_ALIVE_CHECK_SECONDS = 0.5


@dataclass
class NodeScenario:
    boot_seconds: float = 1.0
    heartbeat_seconds: float = 60.0
    metrics_seconds: float = 0.5  # between GPU utilization datapoints
    usage_seconds: float = 1.0  # between usage samples (a minute on EC2)
    notice_seconds: float = 2.0  # EC2 gives two minutes between warning and termination
    # By job name, or "job/stage" for one stage of a multi-stage job.
    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    default: Behaviour = field(default_factory=Behaviour)
    # How long a node that finished a stage waits to be told to run the next one there.
    stage_wait_seconds: float = 10.0
    # The agent sends its finish report again this often, this many times at most, while its
    # instance lives (every 2 minutes on EC2; the emulator's minutes are seconds).
    finish_resend_seconds: float = 10.0
    finish_resends: int = 10

    def runs_commands(self, job_name: str) -> bool:
        """Whether the job's containers, or one of its stages', really run their command."""
        return any(
            behaviour.runs_command
            for key, behaviour in self.behaviours.items()
            if key == job_name or key.startswith(f"{job_name}/")
        )

    def behaviour(self, job_name: str, stage: str | None = None) -> Behaviour:
        if stage is not None and f"{job_name}/{stage}" in self.behaviours:
            return self.behaviours[f"{job_name}/{stage}"]
        return self.behaviours.get(job_name, self.default)


def _instance(ec2: Any, instance_id: str) -> dict[str, Any]:
    reservations = ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
    instance: dict[str, Any] = reservations[0]["Instances"][0]
    return instance


class EmulatedIdentity:
    """What IMDS would tell the agent, read from the emulated EC2."""

    def __init__(self, ec2: Any, instance_id: str, notices: dict[str, str]) -> None:
        self._ec2 = ec2
        self._instance_id = instance_id
        self._notices = notices

    def interruption_notice(self) -> str | None:
        return self._notices.get(self._instance_id)

    def instance_id(self) -> str:
        return self._instance_id

    def tags(self) -> Mapping[str, str]:
        with acting_as(EMULATOR):
            instance = _instance(self._ec2, self._instance_id)
        return {tag["Key"]: tag["Value"] for tag in instance.get("Tags", [])}


class ContainerLog:
    """What Docker's awslogs driver does with a container's output on a real node: one stream
    per job and instance in the agent log group, written through the CloudWatch Logs API."""

    def __init__(self, logs: Any, job_id: str, instance_id: str) -> None:
        self._logs = logs
        self._stream = agent_log_stream(job_id, instance_id)
        self._created = False

    def write(self, *lines: str) -> None:
        with acting_as(NODE):
            if not self._created:
                self._logs.create_log_stream(
                    logGroupName=AGENT_LOG_GROUP, logStreamName=self._stream
                )
                self._created = True
            now = int(time.time() * 1000)
            self._logs.put_log_events(
                logGroupName=AGENT_LOG_GROUP,
                logStreamName=self._stream,
                logEvents=[{"timestamp": now, "message": line} for line in lines],
            )


class NodeVanished(GpufleetError):
    """The simulated machine is gone; its agent dies with it."""


class SimulatedRuntime:
    """Runs for the scenario's duration, unless the instance is terminated under it or the
    emulator stops (`stopping`: the machine ends with the account, before the account's AWS
    goes; a run that outlived it would call the real AWS)."""

    def __init__(
        self,
        ec2: Any,
        instance_id: str,
        scenario: NodeScenario,
        resumed: set[str],
        log: ContainerLog,
        flagged: Callable[[str], bool],
        clock: EmulatorClock,
        stopping: threading.Event,
        output: Callable[[str], None] = lambda _line: None,
    ) -> None:
        self._ec2 = ec2
        self._stopping = stopping
        self._clock = clock
        self._flagged = flagged
        self._instance_id = instance_id
        self._scenario = scenario
        self.resumed = resumed
        self._log = log
        self._output = output  # the container's stdout, line by line, as the agent reads it

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        behaviour = self._scenario.behaviour(manifest.name, manifest.stage)
        if manifest.resume:
            self.resumed.add(manifest.job_id)
            self._log.write(f"resuming from {manifest.checkpoint}")
        self._log.write(f"{manifest.image}: {' '.join(manifest.command)} on {manifest.gpus} GPU(s)")
        if behaviour.needs_gpu_memory_gib > self._gpu_memory_gib():
            self._clock.sleep(min(behaviour.duration_seconds, 0.5))
            self._log.write("torch.OutOfMemoryError: CUDA out of memory")
            return RunOutcome(
                exit_code=1, reason="torch.OutOfMemoryError: CUDA out of memory", oom=True
            )
        started = self._clock.now()
        deadline = started + min(behaviour.duration_seconds, manifest.timeout_seconds)
        looked = started
        while self._clock.now() < deadline or self._held(behaviour, manifest.job_id, started):
            self._print_metrics(behaviour)
            if self._clock.wait(stop, 0.1):
                self._log.write("SIGTERM: checkpoint written, exiting")
                return RunOutcome(exit_code=0, reason="checkpointed on request")
            if self._stopping.is_set():
                raise NodeVanished(self._instance_id)
            # A DescribeInstances is much of a busy emulator's CPU: asked twice a second.
            if self._clock.now() - looked >= _ALIVE_CHECK_SECONDS:
                looked = self._clock.now()
                if not self._alive():
                    if not behaviour.warned:
                        raise NodeVanished(self._instance_id)  # gone with its machine
                    return RunOutcome(exit_code=None, reason="the instance was terminated")
        if behaviour.vanishes:
            raise NodeVanished(self._instance_id)
        self._log.write(f"training finished, exit code {behaviour.exit_code}")
        return RunOutcome(exit_code=behaviour.exit_code)

    def _held(self, behaviour: Behaviour, job_id: str, started: float) -> bool:
        if not behaviour.until_flagged or self._clock.now() > started + FLAG_WAIT_SECONDS:
            return False
        with acting_as(EMULATOR):
            return not self._flagged(job_id)

    def _print_metrics(self, behaviour: Behaviour) -> None:
        if behaviour.prints_metrics:
            pairs = " ".join(f"{name}={value:g}" for name, value in behaviour.prints_metrics)
            self._output(f"{JOB_METRIC_PREFIX}{pairs}\n")

    def _gpu_memory_gib(self) -> float:
        with acting_as(EMULATOR):
            instance_type = _instance(self._ec2, self._instance_id)["InstanceType"]
        return load_bundled().instance_type(instance_type).gpu_memory_gib

    def _alive(self) -> bool:
        with acting_as(EMULATOR):
            state = _instance(self._ec2, self._instance_id)["State"]["Name"]
        return state in ("pending", "running")


class SimulatedGpus:
    """What nvidia-smi would say: the scenario's utilization and temperature for the job."""

    def __init__(self, behaviour: Behaviour, clock: EmulatorClock) -> None:
        self._behaviour = behaviour
        self._clock = clock
        self._started = clock.now()

    def utilization_percent(self) -> float | None:
        return self._behaviour.gpu_utilization

    def temperature_celsius(self) -> float | None:
        return self._behaviour.gpu_temperature

    def memory_used_mib(self) -> float | None:
        growth = self._behaviour.gpu_memory_growth_mib_per_second
        return self._behaviour.gpu_memory_mib + growth * (self._clock.now() - self._started)


class FakeNvidiaSmi:
    """The node's nvidia-smi behind the agent's command runner: answers the agent's usage query
    (`NVIDIA_SMI_QUERY`) for each of the instance type's GPUs with what `SimulatedGpus` says
    (the node's GPU memory shared evenly); any other command is not found, as on a node
    without it."""

    def __init__(self, gpus: SimulatedGpus, count: int, memory_total_mib: float) -> None:
        self._gpus = gpus
        self._count = count
        self._total = memory_total_mib

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> Completed:  # noqa: ARG002
        if tuple(argv) != NVIDIA_SMI_QUERY or not self._count:
            return Completed(returncode=127, stderr=f"{argv[0]}: command not found")
        util = self._gpus.utilization_percent() or 0.0
        used = min((self._gpus.memory_used_mib() or 0.0) / self._count, self._total)
        lines = [f"{i}, {util:.0f}, {used:.0f}, {self._total:.0f}" for i in range(self._count)]
        return Completed(returncode=0, stdout="\n".join(lines) + "\n")


class _Discarded(io.StringIO):
    """A text stream that keeps nothing."""

    def write(self, text: str) -> int:
        return len(text)


class _AsNode:
    """Calls made by the agent's own threads count as the node's, not the control plane's.
    With `silent_once`: a node whose machine is gone, or whose agent fell silent, says nothing
    more."""

    def __init__(
        self,
        manifests: S3Manifests,
        reporter: EventBridgeReporter,
        metrics: CloudWatchMetrics,
        silent_once: threading.Event | None = None,
    ) -> None:
        self._manifests = manifests
        self._reporter = reporter
        self._metrics = metrics
        self._silent_once = silent_once

    def put(self, job_id: str, name: str, value: float, unit: str) -> None:
        with acting_as(NODE):
            self._metrics.put(job_id, name, value, unit)

    def fetch(self, key: str) -> bytes:
        with acting_as(NODE):
            return self._manifests.fetch(key)

    def store(self, key: str, body: bytes) -> None:
        if self._silent_once is not None and self._silent_once.is_set():
            return
        with acting_as(NODE):
            self._manifests.store(key, body)

    def report(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        if self._silent_once is not None and self._silent_once.is_set():
            return
        with acting_as(NODE):
            self._reporter.report(source, detail_type, detail)


class NodeSimulator:
    """Watches for instances gpufleet launches and boots a node agent on each."""

    def __init__(self, account: Account, scenario: NodeScenario) -> None:
        self._account = account
        self._scenario = scenario
        self._clock = account.clock
        self._ec2 = account.client("ec2")
        # Each node's boot reads its job's manifest: one client for all (an S3 client takes
        # tens of milliseconds to build).
        self._manifests = S3Manifests(account.client("s3"), account.bucket)
        self._jobs = DynamoJobStore(
            account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id]
        )
        self._seen: set[str] = set()
        # Jobs whose containers were started to resume from a checkpoint.
        self.resumed: set[str] = set()
        # Spot interruption notices (instance id -> IMDS instance-action), and the jobs whose
        # instances spot reclaimed (each only once).
        self.notices: dict[str, str] = {}
        self.interrupted_jobs: set[str] = set()
        # Jobs one of whose nodes fell silent (each only once).
        self.silenced_jobs: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        # Per instance, set once it no longer runs: its agent stops waiting (it would be dead).
        self._gone: dict[str, threading.Event] = {}
        # Per instance whose containers really run: its docker (killed with the machine).
        self._dockers: dict[str, Docker] = {}
        self._docker_root = Path(tempfile.mkdtemp(prefix="gpufleet-nodes-"))
        # The nodes' journal (a real node's agent copies its container's stdout there): not
        # this process's stdout, which `gpufleet demo --json` keeps for its JSON.
        self._journal = _Discarded()
        self._threads: list[threading.Thread] = []
        self._watcher = threading.Thread(target=self._watch, name="node-watcher", daemon=True)

    def start(self) -> None:
        # The stack creates the agent log group; nodes only add their streams to it.
        logs = self._account.client("logs")
        with (
            acting_as(EMULATOR),
            contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException),
        ):
            logs.create_log_group(logGroupName=AGENT_LOG_GROUP)
        self._watcher.start()

    def stop(self) -> None:
        self._stop.set()
        for gone in list(self._gone.values()):
            gone.set()
        for docker in list(self._dockers.values()):
            docker.kill_all()
        self._watcher.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
        shutil.rmtree(self._docker_root, ignore_errors=True)

    def running_instances(self) -> list[str]:
        with acting_as(EMULATOR):
            return [
                instance["InstanceId"]
                for instance in self._managed_instances()
                if instance["State"]["Name"] in ("pending", "running")
            ]

    def _managed_instances(self) -> list[dict[str, Any]]:
        response = self._ec2.describe_instances(
            Filters=[{"Name": f"tag:{TAG_MANAGED}", "Values": ["true"]}]
        )
        return [i for r in response["Reservations"] for i in r["Instances"]]

    def _watch(self) -> None:
        with acting_as(EMULATOR):
            while not self._stop.is_set():
                instances = self._managed_instances()
                running = {i["InstanceId"] for i in instances if i["State"]["Name"] == "running"}
                for instance_id, gone in list(self._gone.items()):
                    if instance_id not in running and not gone.is_set():
                        gone.set()
                        docker = self._dockers.get(instance_id)
                        if docker is not None:
                            docker.kill_all()  # its containers end with the machine
                for instance in instances:
                    instance_id = instance["InstanceId"]
                    if instance_id in self._seen or instance_id not in running:
                        continue
                    self._seen.add(instance_id)
                    self._gone[instance_id] = threading.Event()
                    thread = threading.Thread(
                        target=self._boot, args=(instance_id,), name=instance_id, daemon=True
                    )
                    self._threads.append(thread)
                    thread.start()
                self._clock.wait(self._stop, 0.1)

    def _boot(self, instance_id: str) -> None:
        if self._clock.wait(self._stop, self._scenario.boot_seconds):
            return  # the emulator stopped while the machine booted
        with acting_as(NODE):
            identity = EmulatedIdentity(self._ec2, instance_id, self.notices)
            if not self._claimed(identity):
                return  # a warm instance released before any launch took it
            job_id = identity.tags().get(TAG_JOB_ID, "")
            with acting_as(EMULATOR):
                behaviour = self._scenario.behaviour(*self._job_run(job_id))
            gone = self._gone[instance_id]
            node = _AsNode(
                S3Manifests(self._account.client("s3"), self._account.bucket),
                EventBridgeReporter(self._account.client("events"), self._account.bus),
                CloudWatchMetrics(self._account.client("cloudwatch")),
                silent_once=gone if behaviour.runs_command else self._silence(job_id, behaviour),
            )
            self._schedule_interruption(instance_id, job_id, behaviour)
            job_metrics = JobMetrics()
            log = ContainerLog(self._account.client("logs"), job_id, instance_id)
            runtime: ContainerRuntime
            if behaviour.runs_command:
                runtime = self._docker_runtime(instance_id, log, job_metrics)
            else:
                runtime = SimulatedRuntime(
                    self._ec2,
                    instance_id,
                    self._scenario,
                    self.resumed,
                    log,
                    flagged=self._flagged,
                    clock=self._clock,
                    stopping=self._stop,
                    output=job_metrics.feed,
                )
            gpus = SimulatedGpus(behaviour, self._clock)
            agent = NodeAgent(
                identity=identity,
                manifests=node,
                reporter=node,
                runtime=runtime,
                heartbeat_seconds=self._scenario.heartbeat_seconds,
                control_poll_seconds=0.2,
                gpu_probe=gpus,
                metrics=node,
                metrics_seconds=self._scenario.metrics_seconds,
                job_metrics=job_metrics,
                stage_wait_seconds=self._scenario.stage_wait_seconds,
                finish_resend_seconds=self._scenario.finish_resend_seconds,
                finish_resends=self._scenario.finish_resends,
                going=self._gone[instance_id],
                clock=self._clock,
                usage=functools.partial(
                    UsageRecorder,
                    UsageSampler(self._nvidia_smi(instance_id, gpus)),
                    node,
                    interval_seconds=self._scenario.usage_seconds,
                ),
                usage_seconds=self._scenario.usage_seconds,
            )
            with contextlib.suppress(NodeVanished):
                agent.run()

    def _nvidia_smi(self, instance_id: str, gpus: SimulatedGpus) -> FakeNvidiaSmi:
        with acting_as(EMULATOR):
            instance_type = load_bundled().instance_type(
                _instance(self._ec2, instance_id)["InstanceType"]
            )
        count = instance_type.gpus if instance_type.accelerator == "nvidia" else 0
        return FakeNvidiaSmi(gpus, count, instance_type.gpu_memory_gib * 1024)

    def _docker_runtime(
        self, instance_id: str, log: ContainerLog, job_metrics: JobMetrics
    ) -> DockerRuntime:
        """The agent's own runtime, on this node's fake docker: told what the instance type
        has (its GPUs, its Neuron devices), the container's stdout to the job's log stream,
        and the agent's own preparation (registry login, volumes, secrets) on the emulated
        host, its AWS lookups made as the node; the container gets its job's session of the
        job role at the credentials endpoint, as on a node (`job_sessions` judges it)."""
        with acting_as(EMULATOR):
            instance_type = load_bundled().instance_type(
                _instance(self._ec2, instance_id)["InstanceType"]
            )
        neuron = instance_type.accelerator in NEURON_ACCELERATORS
        hardware = NodeHardware(
            instance_type=instance_type.name,
            gpus=instance_type.gpus if instance_type.accelerator == "nvidia" else 0,
            devices=tuple(f"/dev/neuron{n}" for n in range(instance_type.gpus if neuron else 0)),
        )
        root = self._docker_root / instance_id
        program = install_node(root, hardware)
        docker = self._dockers[instance_id] = Docker(root)
        host = EmulatedHost(self._account.client, root / "host", instance_type, docker)
        secrets = AwsNodeSecrets(lambda service, **_: self._account.client(service))

        def preparation(manifest: RunManifest) -> Prepared:
            with acting_as(NODE):
                return prepare(manifest, host, secrets, PurePosixPath(host.root))

        def output(line: str) -> None:
            job_metrics.feed(line)
            log.write(line.rstrip("\n"))

        environment = {"PATH": os.environ.get("PATH", ""), "HOME": str(root)}
        return DockerRuntime(
            grace_seconds=2,
            output=output,
            environment={**environment, "DOCKER_CONFIG": str(root)},
            preparation=preparation,
            credentials=functools.partial(
                job_credentials, sts=_NodeSts(self._account.client("sts")), role_arn=JOB_ROLE_ARN
            ),
            docker=str(program),
            journal=self._journal,
        )

    def _flagged(self, job_id: str) -> bool:
        return bool(self._jobs.get(job_id).flags)

    def _claimed(self, identity: EmulatedIdentity) -> bool:
        """Whether the instance has a job: a warm-pool instance idles until a launch tags it
        (the agent would wait too, but the simulated GPUs and log need the job first)."""
        while TAG_JOB_ID not in identity.tags():
            if self._stop.is_set() or not self._alive(identity.instance_id()):
                return False
            self._clock.wait(self._stop, 0.2)
        return True

    def _alive(self, instance_id: str) -> bool:
        with acting_as(EMULATOR):
            return _instance(self._ec2, instance_id)["State"]["Name"] in ("pending", "running")

    def _schedule_interruption(self, instance_id: str, job_id: str, behaviour: Behaviour) -> None:
        with self._lock:  # two instances of one job can boot at once
            if behaviour.interrupt_after_seconds is None or job_id in self.interrupted_jobs:
                return
            self.interrupted_jobs.add(job_id)
        threading.Thread(
            target=self._interrupt,
            args=(instance_id, behaviour.warned, behaviour.interrupt_after_seconds),
            name=f"reclaim-{instance_id}",
            daemon=True,
        ).start()

    def _silence(self, job_id: str, behaviour: Behaviour) -> threading.Event | None:
        """What mutes this node's agent, for the first node of a job one of whose nodes falls
        silent: set `falls_silent_after_seconds` from now (its boot), the instance left running."""
        with self._lock:  # two instances of one job can boot at once
            if behaviour.falls_silent_after_seconds is None or job_id in self.silenced_jobs:
                return None
            self.silenced_jobs.add(job_id)
        muted = threading.Event()
        after = behaviour.falls_silent_after_seconds

        def fall_silent() -> None:
            self._clock.sleep(after)
            muted.set()

        threading.Thread(target=fall_silent, name=f"silence-{job_id}", daemon=True).start()
        return muted

    def _job_run(self, job_id: str) -> tuple[str, str | None]:
        """The job's name and the stage its manifest runs now (a node's runtime is chosen at
        its boot, for the stage it boots for)."""
        try:
            raw = self._manifests.fetch(f"{RUNS_PREFIX}{job_id}/run.json")
        except Exception:  # no manifest: an instance no job launched; default behaviour
            return "", None
        document = json.loads(raw)
        stage = document.get("stage")
        return str(document.get("name", "")), None if stage is None else str(stage)

    def _interrupt(self, instance_id: str, warned: bool, after_seconds: float) -> None:
        """What EC2 does when it reclaims a spot instance `after_seconds` into its run: the
        warning event and IMDS notice, two minutes later the termination and its state-change
        event (unwarned: only the termination and its event)."""
        self._clock.sleep(after_seconds)
        with acting_as(EMULATOR):
            if warned:
                self.notices[instance_id] = json.dumps({"action": "terminate"})
                self._aws_event(
                    DETAIL_SPOT_WARNING,
                    {"instance-id": instance_id, "instance-action": "terminate"},
                )
                self._clock.sleep(self._scenario.notice_seconds)
            self._ec2.terminate_instances(InstanceIds=[instance_id])
            self._aws_event(
                DETAIL_STATE_CHANGE, {"instance-id": instance_id, "state": "terminated"}
            )

    def _aws_event(self, detail_type: str, detail: dict[str, str]) -> None:
        instance_arn = f"arn:aws:ec2:{self._account.region}::instance/{detail['instance-id']}"
        put_ec2_event(self._account.client("events"), detail_type, detail, instance_arn)


class _NodeSts:
    """The node's STS client for its job sessions: the credentials endpoint assumes the job
    role on its own request threads, which are the node's calls, not the control plane's."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def assume_role(self, **request: Any) -> Any:
        with acting_as(NODE):
            return self._client.assume_role(**request)
