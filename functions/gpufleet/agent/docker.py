"""The real container runtime on the instance: `docker run` with every GPU, no shell."""

from __future__ import annotations

import os
import subprocess

from gpufleet.agent.node import RunManifest, RunOutcome


def docker_argv(manifest: RunManifest) -> list[str]:
    """The argv for `docker run`. Environment values are not on the command line: `-e NAME`
    makes docker read NAME from its own environment, which `run` sets."""
    argv = ["docker", "run", "--rm", "--gpus", "all", "--network", "host", "--ipc", "host"]
    for name in sorted(manifest.env):
        argv += ["-e", name]
    argv += ["--", manifest.image, *manifest.command]
    return argv


class DockerRuntime:
    def run(self, manifest: RunManifest) -> RunOutcome:
        env = {**os.environ, **manifest.env}
        try:
            completed = subprocess.run(  # noqa: S603 - argv list, no shell
                docker_argv(manifest), env=env, timeout=manifest.timeout_seconds, check=False
            )
        except subprocess.TimeoutExpired:
            return RunOutcome(exit_code=None, reason="the run exceeded its timeout")
        except OSError as exc:
            return RunOutcome(exit_code=None, reason=f"could not start docker: {exc}")
        return RunOutcome(exit_code=completed.returncode)
