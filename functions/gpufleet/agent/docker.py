"""The real container runtime on the instance: `docker run` with every GPU, no shell.

The container's stdout passes through the agent line by line (on to the agent's own stdout, the
journal), so that the lines the job prints for gpufleet (`GPUFLEET_METRIC ...`) reach `output`.
Its stderr is left alone. With `ContainerLogs`, Docker's awslogs driver also ships stdout and
stderr to the agent log group, one stream per job and instance (what `gpufleet logs` reads);
Docker keeps a local copy too (dual logging), which `docker logs` reads after an exit.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from gpufleet.agent.node import RunManifest, RunOutcome
from gpufleet.topology import agent_log_stream

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


# Variables that would change how the docker CLI itself runs (as root) if it inherited them:
# which binaries it finds, which libraries it loads, which daemon and credentials it uses.
_CLI_VARIABLES = frozenset(
    {"PATH", "HOME", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy"}
)


def changes_the_docker_cli(name: str) -> bool:
    return name in _CLI_VARIABLES or name.startswith(("DOCKER_", "LD_", "BUILDKIT_"))


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


def docker_argv(manifest: RunManifest, logs: ContainerLogs | None = None) -> list[str]:
    """The argv for `docker run`. Environment values are not on the command line: `-e NAME`
    makes docker read NAME from its own environment, which `run` sets; the few names that would
    change how the docker CLI itself runs are given as `-e NAME=VALUE` instead (still one argv
    element, never through a shell), so the CLI never inherits them."""
    # No --rm: the container's last log lines are read after it exits (out-of-memory?).
    argv = ["docker", "run", "--name", container_name(manifest), "--gpus", "all"]
    argv += ["--network", "host", "--ipc", "host"]
    if logs is not None:
        argv += logs.options(manifest.job_id)
    if manifest.resume and manifest.checkpoint:
        # The job resumes from its checkpoint: its code reads where from the environment.
        argv += ["-e", RESUME_VARIABLE]
    for name, value in sorted(manifest.env.items()):
        argv += ["-e", f"{name}={value}" if changes_the_docker_cli(name) else name]
    argv += ["--", manifest.image, *manifest.command]
    return argv


def relay(stream: IO[str], output: Callable[[str], None]) -> None:
    """Copy the container's stdout to ours and hand each line to `output`, until it closes."""
    for line in stream:
        sys.stdout.write(line)
        output(line)
    sys.stdout.flush()


class DockerRuntime:
    def __init__(
        self,
        grace_seconds: int = 110,
        output: Callable[[str], None] = lambda _line: None,
        logs: ContainerLogs | None = None,
    ) -> None:
        self._grace_seconds = grace_seconds
        self._output = output
        self._logs = logs

    def run(self, manifest: RunManifest, stop: threading.Event) -> RunOutcome:
        job_env = {k: v for k, v in manifest.env.items() if not changes_the_docker_cli(k)}
        env = {**os.environ, **job_env}
        if manifest.resume and manifest.checkpoint:
            env[RESUME_VARIABLE] = manifest.checkpoint
        try:
            process = subprocess.Popen(  # noqa: S603 - argv list
                docker_argv(manifest, self._logs),
                env=env,
                stdout=subprocess.PIPE,
                text=True,
                errors="replace",
            )
        except OSError as exc:
            return RunOutcome(exit_code=None, reason=f"could not start docker: {exc}")
        assert process.stdout is not None
        relaying = threading.Thread(target=relay, args=(process.stdout, self._output), daemon=True)
        relaying.start()
        try:
            return self._supervise(manifest, process, stop)
        finally:
            relaying.join(timeout=10)

    def _supervise(
        self, manifest: RunManifest, process: subprocess.Popen[str], stop: threading.Event
    ) -> RunOutcome:
        deadline = time.monotonic() + manifest.timeout_seconds
        while process.poll() is None:
            if stop.wait(1.0):
                # SIGTERM: the job writes its checkpoint and exits; SIGKILL after the grace.
                stop_argv = ["docker", "stop", "--time", str(self._grace_seconds)]
                stop_argv.append(container_name(manifest))
                subprocess.run(stop_argv, check=False)  # noqa: S603 - fixed argv
                process.wait()
                return RunOutcome(exit_code=process.returncode, reason="checkpointed on request")
            if time.monotonic() > deadline:
                process.kill()
                process.wait()
                return RunOutcome(exit_code=None, reason="the run exceeded its timeout")
        return self._finished(manifest, process.returncode)

    def _finished(self, manifest: RunManifest, exit_code: int) -> RunOutcome:
        name = container_name(manifest)
        oom = False
        if exit_code != 0:
            logs = subprocess.run(  # noqa: S603 - fixed argv, no shell
                ["docker", "logs", "--tail", "200", name],  # noqa: S607
                capture_output=True,
                text=True,
                check=False,
            )
            oom = looks_like_gpu_oom(logs.stdout + logs.stderr)
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)  # noqa: S603, S607
        return RunOutcome(exit_code=exit_code, reason="GPU out of memory" if oom else "", oom=oom)
