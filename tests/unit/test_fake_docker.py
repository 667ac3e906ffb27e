"""The embedded account's docker CLI, driven by the agent's real DockerRuntime: it runs the
container's command as a local process with what the agent asked for, and refuses what a real
node refuses (emulator/fake_docker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from gpufleet.agent.credentials import FULL_URI_VARIABLE, TOKEN_VARIABLE
from gpufleet.agent.docker import DockerRuntime
from gpufleet.agent.node import RunManifest, RunOutcome
from gpufleet.domain.rendezvous import Peer
from gpufleet.emulator.fake_docker import NodeHardware, install_node

PRIVATE_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/team/train:1"
PRINT_ENV = ["python", "-c", "import os; print(os.environ['NODE_RANK'], os.environ['MODE'])"]


def node(tmp_path: Path, hardware: NodeHardware) -> tuple[str, dict[str, str]]:
    root = tmp_path / "docker"
    program = install_node(root, hardware)
    return str(program), {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "DOCKER_CONFIG": str(root),
    }


def run_on(
    tmp_path: Path, hardware: NodeHardware, manifest: RunManifest, **options: Any
) -> tuple[RunOutcome, list[str]]:
    program, environment = node(tmp_path, hardware)
    lines: list[str] = []
    runtime = DockerRuntime(
        grace_seconds=1,
        output=lines.append,
        environment=environment,
        docker=program,
        journal=open(os.devnull, "w"),  # noqa: SIM115 - the test's process ends it
        **options,
    )
    return runtime.run(manifest, threading.Event()), lines


def manifest(**fields: object) -> RunManifest:
    values: dict[str, object] = {
        "job_id": "j-0123456789abcdef0123",
        "name": "t",
        "image": "public.ecr.aws/docker/library/python:3.12",
        "command": PRINT_ENV,
        "env": {"MODE": "x $(reboot)"},
        "gpus": 0,
        "accelerator": "none",
    }
    return RunManifest(**{**values, **fields})  # type: ignore[arg-type]


GPU_NODE = NodeHardware("g6.xlarge", gpus=1)
CPU_NODE = NodeHardware("c6i.large")
TRN_NODE = NodeHardware("trn1.2xlarge", devices=("/dev/neuron0",))


def test_the_command_runs_as_a_process_with_the_env_the_agent_gave_it(tmp_path: Path) -> None:
    peers = (Peer("i-0a", "127.0.0.1"), Peer("i-0b", "127.0.0.2"))
    run = manifest(nodes=2, peers=peers, rank=1, gpus=1, accelerator="nvidia")
    outcome, lines = run_on(tmp_path, GPU_NODE, run)
    assert outcome == RunOutcome(exit_code=0)
    assert lines == ["1 x $(reboot)\n"]  # its rank, and the job's value as it is


def test_the_container_gets_its_jobs_credentials_endpoint_and_no_agent_keys(
    tmp_path: Path,
) -> None:
    served: list[str] = []

    @contextmanager
    def endpoint(run: RunManifest) -> Iterator[dict[str, str]]:
        served.append(run.job_id)
        yield {FULL_URI_VARIABLE: "http://127.0.0.1:9/gpufleet/p", TOKEN_VARIABLE: "t0k"}

    show = [
        "python",
        "-c",
        "import os; print(os.environ.get('AWS_CONTAINER_CREDENTIALS_FULL_URI'), "
        "os.environ.get('AWS_CONTAINER_AUTHORIZATION_TOKEN'), "
        "os.environ.get('AWS_ACCESS_KEY_ID'))",
    ]
    # The job's env cannot point the SDK elsewhere: the agent's values win.
    forged = {FULL_URI_VARIABLE: "http://169.254.169.254/", TOKEN_VARIABLE: "mine"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AWS_ACCESS_KEY_ID", "AKIAAGENT")  # the agent's own keys stay its own
        outcome, lines = run_on(
            tmp_path, CPU_NODE, manifest(command=show, env=forged), credentials=endpoint
        )
    assert outcome == RunOutcome(exit_code=0)
    assert lines == ["http://127.0.0.1:9/gpufleet/p t0k None\n"]
    assert served == ["j-0123456789abcdef0123"]


def test_the_exit_status_is_the_commands(tmp_path: Path) -> None:
    outcome, _ = run_on(tmp_path, CPU_NODE, manifest(command=["python", "-c", "exit(3)"]))
    assert outcome.exit_code == 3


def test_a_cpu_stage_runs_without_a_gpu_flag_and_a_gpu_flag_there_is_refused(
    tmp_path: Path,
) -> None:
    assert run_on(tmp_path / "a", CPU_NODE, manifest())[0].exit_code == 0
    refused, _ = run_on(tmp_path / "b", CPU_NODE, manifest(gpus=1, accelerator="nvidia"))
    assert (refused.exit_code, refused.reason) == (125, "docker could not create the container")


def test_neuron_devices_must_be_on_the_node(tmp_path: Path) -> None:
    one = manifest(gpus=1, accelerator="trainium", accelerator_devices=1)
    assert run_on(tmp_path / "a", TRN_NODE, one)[0].exit_code == 0
    two = manifest(gpus=2, accelerator="trainium", accelerator_devices=2)
    assert run_on(tmp_path / "b", TRN_NODE, two)[0].exit_code == 125


def docker(
    program: str, environment: dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [program, *args], env=environment, input=stdin, capture_output=True, text=True, check=False
    )


def test_a_private_ecr_image_needs_a_login_to_its_registry_on_this_node(tmp_path: Path) -> None:
    program, environment = node(tmp_path, CPU_NODE)
    refused = docker(program, environment, "create", "--name", "a", "--", PRIVATE_IMAGE, "true")
    assert refused.returncode == 125 and "no basic auth credentials" in refused.stderr
    registry = PRIVATE_IMAGE.split("/")[0]
    login = ("login", "--username", "AWS", "--password-stdin", registry)
    assert docker(program, environment, *login, stdin="token-value\n").returncode == 0
    assert "token-value" not in (tmp_path / "docker" / "config.json").read_text()
    created = docker(program, environment, "create", "--name", "a", "--", PRIVATE_IMAGE, "true")
    assert created.returncode == 0, created.stderr


@pytest.mark.parametrize("exists", [True, False])
def test_a_bind_mount_needs_its_source(tmp_path: Path, exists: bool) -> None:
    program, environment = node(tmp_path, CPU_NODE)
    source = tmp_path / "data"
    if exists:
        source.mkdir()
    mount = f"type=bind,source={source},target=/data"
    created = docker(program, environment, "create", "--mount", mount, "--", "img", "true")
    assert created.returncode == (0 if exists else 125)
    if not exists:
        assert "bind source path does not exist" in created.stderr


def test_a_name_in_use_is_refused_and_rm_frees_it(tmp_path: Path) -> None:
    program, environment = node(tmp_path, CPU_NODE)
    create = ("create", "--name", "n", "--", "img", "true")
    assert docker(program, environment, *create).returncode == 0
    assert docker(program, environment, *create).returncode == 125
    assert docker(program, environment, "rm", "-f", "n").returncode == 0
    assert docker(program, environment, *create).returncode == 0


def test_a_stop_request_reaches_the_running_command(tmp_path: Path) -> None:
    program, environment = node(tmp_path, CPU_NODE)
    lines: list[str] = []
    stop = threading.Event()
    waits = ["python", "-c", "import time; print('up', flush=True); time.sleep(60)"]
    runtime = DockerRuntime(
        grace_seconds=1,
        output=lambda line: (lines.append(line), stop.set()),
        environment=environment,
        docker=program,
        journal=sys.stderr,
    )
    outcome = runtime.run(manifest(command=waits), stop)
    # SIGTERM, which the command does not handle: it dies of it (128 + 15).
    assert (outcome.exit_code, outcome.reason) == (143, "checkpointed on request")
