"""The real container runtime on the instance: `docker create` then `docker start`, with the
instance's accelerators (every GPU, the Neuron devices, none on a CPU-only type), no shell.
The docker CLI gets an allowlist of the agent's environment and nothing of the job's; the
job's env reaches only the container, through a file only root can read, removed as soon as
the container exists (never a command line: `ps` shows those to every user).

The container's stdout passes through the agent line by line (on to the agent's own stdout, the
journal), so that the lines the job prints for gpufleet (`GPUFLEET_METRIC ...`) reach `output`.
Its stderr is left alone. With `ContainerLogs`, Docker's awslogs driver also ships stdout and
stderr to the agent log group, one stream per job and instance (what `gpufleet logs` reads);
Docker keeps a local copy too (dual logging), which `docker logs` reads after an exit.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpufleet.agent.node import RunManifest, RunOutcome
from gpufleet.agent.prepare import PreparationFailed, Prepared
from gpufleet.domain.rendezvous import Peer, node_environment
from gpufleet.topology import JOBS_SLICE, agent_log_stream

RESUME_VARIABLE = "GPUFLEET_RESUME_FROM"
# What PyTorch, TensorFlow, JAX and CUDA libraries print when the GPU runs out of memory.
_OOM_MARKERS = (
    "CUDA out of memory",
    "OutOfMemoryError",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "RESOURCE_EXHAUSTED: Out of memory",
    "cudaErrorMemoryAllocation",
)


def looks_like_gpu_oom(log_tail: str) -> bool:
    return any(marker in log_tail for marker in _OOM_MARKERS)


def container_name(manifest: RunManifest) -> str:
    return f"gpufleet-{manifest.job_id}"


# What the docker CLI, which runs as root, gets of the agent's environment: where its binaries
# are, its configuration (registry credentials), which daemon it drives and how. Nothing else:
# not the agent's own variables (its credentials), and none of the job's, which would steer it
# (PATH, LD_PRELOAD, DOCKER_HOST, GODEBUG, proxies ...). The job's reach only the container.
DOCKER_CLI_VARIABLES = (
    "PATH",
    "HOME",
    "DOCKER_CONFIG",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
)


def docker_cli_environment(agent: Mapping[str, str]) -> dict[str, str]:
    """The docker CLI's whole environment, from the agent's."""
    return {name: agent[name] for name in DOCKER_CLI_VARIABLES if name in agent}


# Where a single node's rendezvous listens before the control plane has named the run's nodes
# (a single-node run does not wait for it): the node itself.
_SOLO = Peer(instance_id="", private_ip="127.0.0.1")


def container_environment(manifest: RunManifest) -> dict[str, str]:
    """What the job's container gets: the job's env, where to resume from, and how to meet the
    run's other nodes (`domain/rendezvous.py`; these names are gpufleet's, not the job's)."""
    env = dict(manifest.env)
    if manifest.resume and manifest.checkpoint:
        # The job resumes from its checkpoint: its code reads where from the environment.
        env[RESUME_VARIABLE] = manifest.checkpoint
    peers = manifest.peers or (_SOLO,)
    env.update(node_environment(peers, manifest.rank, manifest.gpus, manifest.port))
    return env


NEURON_ACCELERATORS = frozenset({"trainium", "inferentia"})


def device_options(manifest: RunManifest) -> list[str]:
    """What gives the container the instance's accelerators: every NVIDIA GPU (`--gpus all`),
    each Neuron device of a Trainium or Inferentia instance (`--device /dev/neuronN`, as the
    Neuron containers take them), nothing for a CPU-only run (docker refuses `--gpus` where
    there is no NVIDIA runtime)."""
    if manifest.accelerator in NEURON_ACCELERATORS:
        devices = range(manifest.accelerator_devices)
        return [option for n in devices for option in ("--device", f"/dev/neuron{n}")]
    if manifest.accelerator == "nvidia" and manifest.gpus > 0:
        return ["--gpus", "all"]
    return []


# A name docker's env file takes as one: without '=', whitespace or anything else.
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def env_file_text(env: Mapping[str, str]) -> str:
    """`env` as docker's `--env-file` reads it: one NAME=value a line, taken as it is (no
    quotes, no escapes), in UTF-8. Raises ValueError for what such a file cannot carry: a line
    break in a value (it would end the line), a name that is not one."""
    lines = []
    for name, value in sorted(env.items()):
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a variable name")
        if "\n" in value or "\r" in value or "\0" in value:
            raise ValueError(f"the value of {name} holds a line break or NUL")
        lines.append(f"{name}={value}\n")
    text = "".join(lines)
    text.encode("utf-8")  # UnicodeEncodeError (a ValueError) for what is no text
    return text


@contextmanager
def private_env_file(text: str) -> Iterator[Path]:
    """`text` in a file only its owner (root) can read, in a directory only it can enter,
    removed with the directory when the block ends."""
    directory = Path(tempfile.mkdtemp(prefix="gpufleet-env-"))  # mode 0700
    try:
        path = directory / "env"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(text)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def exit_status(returncode: int) -> int:
    """A process's exit status as Linux and docker report it (0-255): Python gives a death by
    signal n as -n, the shell convention (and docker's) is 128 + n."""
    return 128 - returncode if returncode < 0 else returncode


@dataclass(frozen=True)
class ContainerLogs:
    """Where Docker's awslogs driver sends a container's output."""

    group: str
    region: str
    instance_id: str

    def options(self, job_id: str) -> list[str]:
        stream = agent_log_stream(job_id, self.instance_id)
        return [
            "--log-driver",
            "awslogs",
            "--log-opt",
            f"awslogs-region={self.region}",
            "--log-opt",
            f"awslogs-group={self.group}",
            "--log-opt",
            f"awslogs-stream={stream}",
        ]


def create_argv(
    manifest: RunManifest,
    env_file: Path,
    logs: ContainerLogs | None = None,
    volume_args: Sequence[str] = (),
    docker: str = "docker",
) -> list[str]:
    """The argv for `docker create`: with the instance's accelerators, on the host network
    (the run's nodes reach each other at their private IPs) in JOBS_SLICE, the job's env read from
    `env_file` (no value is ever on a command line: `ps` shows command lines), the volumes the
    node prepared (`volume_args`), the image and the command as one argv element each, after
    `--`."""
    # No --rm: the container's last log lines are read after it exits (out-of-memory?).
    argv = [docker, "create", "--name", container_name(manifest), *device_options(manifest)]
    argv += ["--network", "host", "--ipc", "host", "--cgroup-parent", JOBS_SLICE]
    if logs is not None:
        argv += logs.options(manifest.job_id)
    argv += [*volume_args, "--env-file", str(env_file), "--", manifest.image, *manifest.command]
    return argv


def start_argv(manifest: RunManifest, docker: str = "docker") -> list[str]:
    """The argv that runs the created container, attached: its stdout comes to the agent, and
    the CLI exits with the container's exit status."""
    return [docker, "start", "--attach", container_name(manifest)]


def relay(stream: IO[str], output: Callable[[str], None], journal: IO[str] | None = None) -> None:
    """Copy the container's stdout to the journal (ours when not given) and hand each line to
    `output`, until it closes."""
    journal = journal or sys.stdout
    for line in stream:
        journal.write(line)
        output(line)
    journal.flush()


# How often a wait for docker looks at the stop event and the deadline.
_POLL_SECONDS = 1.0


class DockerRuntime:
    """Runs a manifest's container: `docker create` with the job's env in a private file,
    removed once the container exists, then `docker start --attach`. Every docker CLI call
    gets only DOCKER_CLI_VARIABLES of the agent's environment (`environment`, default: the
    agent's own). `docker` is the CLI it runs (found on that PATH unless a path): any program
    that takes docker's arguments, such as the embedded account's `emulator/fake_docker.py`.
    `journal`: where the container's stdout is copied (the agent's stdout when not given)."""

    def __init__(
        self,
        grace_seconds: int = 110,
        output: Callable[[str], None] = lambda _line: None,
        logs: ContainerLogs | None = None,
        environment: Mapping[str, str] | None = None,
        preparation: Callable[[RunManifest], Prepared] | None = None,
        docker: str = "docker",
        journal: IO[str] | None = None,
        credentials: Callable[[RunManifest], AbstractContextManager[Mapping[str, str]]]
        | None = None,
    ) -> None:
        """`preparation` logs in, mounts the volumes and reads the secrets before the container
        is created (agent/prepare.py); without one, a run that needs any of them fails.
        `credentials` serves the job's own credentials while its container runs and gives the
        container's environment for them (agent/credentials.py); without it the container gets
        no AWS credentials from the agent."""
        self._credentials = credentials or _no_credentials
        self._docker_cli = docker
        self._journal = journal
        self._grace_seconds = grace_seconds
        self._output = output
        self._logs = logs
        self._cli_env = docker_cli_environment(os.environ if environment is None else environment)
        self._preparation = preparation or _nothing_to_prepare

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        with self._credentials(manifest) as job_credentials:
            return self._run(manifest, stop, job_credentials)

    def _run(
        self, manifest: RunManifest, stop: threading.Event, job_credentials: Mapping[str, str]
    ) -> RunOutcome:
        deadline = time.monotonic() + manifest.timeout_seconds
        try:
            prepared = self._preparation(manifest)
        except PreparationFailed as exc:
            return RunOutcome(exit_code=None, reason=f"could not prepare the node: {exc}")
        try:
            # The secrets' values join the job's env here, in the private file only; what the
            # agent sets itself (where to resume from, where its credentials are) is never
            # replaced by one.
            env_text = env_file_text(
                {**prepared.env, **container_environment(manifest), **job_credentials}
            )
        except ValueError as exc:
            return RunOutcome(exit_code=None, reason=f"the job's env cannot reach docker: {exc}")
        with private_env_file(env_text) as env_file:
            not_created = self._create(manifest, env_file, stop, deadline, prepared.docker_args)
        # The file is gone: docker read it before it created the container.
        if not_created is not None:
            return not_created
        try:
            process = self._popen(
                start_argv(manifest, self._docker_cli),
                stdout=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            self._remove(manifest)
            return RunOutcome(exit_code=None, reason=f"could not start docker: {exc}")
        assert process.stdout is not None
        relaying = threading.Thread(
            target=relay, args=(process.stdout, self._output, self._journal), daemon=True
        )
        relaying.start()
        try:
            return self._supervise(manifest, process, stop, deadline)
        finally:
            relaying.join(timeout=10)

    def _create(
        self,
        manifest: RunManifest,
        env_file: Path,
        stop: threading.Event,
        deadline: float,
        volume_args: Sequence[str] = (),
    ) -> RunOutcome | None:
        """Create the container (pulling its image, which can take minutes); None when it
        exists, else how the run ended."""
        try:
            process = self._popen(
                create_argv(manifest, env_file, self._logs, volume_args, self._docker_cli),
                stdout=subprocess.DEVNULL,
            )
        except OSError as exc:
            return RunOutcome(exit_code=None, reason=f"could not start docker: {exc}")
        interrupted = _wait(process, stop, deadline)
        if interrupted is not None:
            process.kill()
            process.wait()
            self._remove(manifest)  # it may have got as far as creating it
            if interrupted == _STOPPED:
                interrupted = "stopped before the container started"
            return RunOutcome(exit_code=None, reason=interrupted)
        if process.returncode != 0:
            return RunOutcome(
                exit_code=exit_status(process.returncode),
                reason="docker could not create the container",
            )
        return None

    def _supervise(
        self,
        manifest: RunManifest,
        process: subprocess.Popen[str],
        stop: threading.Event,
        deadline: float,
    ) -> RunOutcome:
        interrupted = _wait(process, stop, deadline)
        if interrupted == _STOPPED:
            # SIGTERM: the job writes its checkpoint and exits; SIGKILL after the grace.
            self._docker("stop", "--time", str(self._grace_seconds), container_name(manifest))
            process.wait()
            return RunOutcome(
                exit_code=exit_status(process.returncode), reason="checkpointed on request"
            )
        if interrupted is not None:
            process.kill()  # the CLI; the container runs on until it is removed
            process.wait()
            self._remove(manifest)
            return RunOutcome(exit_code=None, reason=interrupted)
        return self._finished(manifest, exit_status(process.returncode))

    def _finished(self, manifest: RunManifest, exit_code: int) -> RunOutcome:
        oom = False
        if exit_code != 0:
            logs = self._docker("logs", "--tail", "200", container_name(manifest))
            oom = looks_like_gpu_oom(logs.stdout + logs.stderr)
        self._remove(manifest)
        return RunOutcome(exit_code=exit_code, reason="GPU out of memory" if oom else "", oom=oom)

    def _remove(self, manifest: RunManifest) -> None:
        self._docker("rm", "-f", container_name(manifest))

    def _popen(self, argv: list[str], **options: Any) -> subprocess.Popen[str]:
        return subprocess.Popen(argv, env=self._cli_env, **options)  # noqa: S603 - argv list

    def _docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        """A docker CLI call with a fixed argv, its output captured."""
        return subprocess.run(  # noqa: S603 - argv list, no shell
            [self._docker_cli, *args],
            env=self._cli_env,
            capture_output=True,
            text=True,
            errors="replace",
            check=False,
        )


@contextmanager
def _no_credentials(_manifest: RunManifest) -> Iterator[Mapping[str, str]]:
    yield {}


def _nothing_to_prepare(manifest: RunManifest) -> Prepared:
    """A runtime that cannot prepare a node: never a run without the volumes, secrets or login
    its manifest asks for."""
    if manifest.volumes or manifest.secrets or manifest.registry_login:
        raise PreparationFailed("this node runs no preparation (volumes, secrets, login)")
    return Prepared()


_STOPPED = "checkpointed on request"
_TIMED_OUT = "the run exceeded its timeout"


def _wait(process: subprocess.Popen[Any], stop: threading.Event, deadline: float) -> str | None:
    """Wait for `process` to exit: None once it has; the reason, with it still running, when
    the agent is told to stop (_STOPPED) or the run's time is up (_TIMED_OUT)."""
    while True:
        try:
            process.wait(timeout=_POLL_SECONDS)
            return None
        except subprocess.TimeoutExpired:
            pass
        if stop.is_set():
            return _STOPPED
        if time.monotonic() > deadline:
            return _TIMED_OUT
