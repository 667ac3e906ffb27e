"""A `docker` CLI for the embedded account's nodes: the real agent's real `DockerRuntime` calls
it as it calls docker on an instance, and it runs each container's command as a local process.

`python -m gpufleet.emulator.fake_docker SUBCOMMAND ...` (or the `docker` program
`install_node` writes) takes the subcommands and options `DockerRuntime` uses: `create`,
`start --attach`, `stop --time`, `kill`, `rm -f`, `logs --tail`, `login`, `pull`, `inspect`.
Its state lives in `$DOCKER_CONFIG`, one folder per node, as docker keeps its own there
(`config.json` holds the registries logged in to, never a password): `node.json` says what
the node is (its instance type's GPUs and devices, from the emulator), `containers/` holds each
container, its log and its working folder.

A container is its command run as a process with the environment of its `--env-file` and `-e`
(plus the image's own PATH and, as if the image had it installed, the gpufleet package on
PYTHONPATH), on the host network: it reaches its peers at their private IPs, which in the
emulator are loopback addresses (`loopback`). What a real node refuses, it refuses, with
docker's own message and exit status 125:

- `--gpus` on a node without GPUs (docker has no NVIDIA runtime to select there);
- a `--device` the node does not have;
- a `--mount` bind whose source does not exist (`-v` creates a missing source folder, as docker
  does);
- an image of a private ECR registry (`<account>.dkr.ecr.<region>.amazonaws.com/...`) without a
  `docker login` to that registry on this node first;
- a second container under a name already in use.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gpufleet.errors import RefusedInput

# docker's exit status when the daemon refused the request (the container never ran).
DAEMON_REFUSED = 125
_PRIVATE_ECR = re.compile(r"^[0-9]{12}\.dkr\.ecr(-fips)?\.[a-z0-9-]+\.amazonaws\.com(\.cn)?$")
# Options of `docker create` that take a value (as the next argument or after '=').
_VALUED = {
    "--name",
    "--gpus",
    "--device",
    "--network",
    "--ipc",
    "--log-driver",
    "--log-opt",
    "--env-file",
    "-e",
    "--env",
    "-v",
    "--volume",
    "--mount",
    "--shm-size",
    "--ulimit",
    "--user",
    "-u",
    "--workdir",
    "-w",
    "--runtime",
    "--cap-add",
    "--security-opt",
    "--cgroup-parent",
}
_FLAGS = {"--init", "--rm", "--privileged", "-t", "-i", "--tty", "--interactive"}


class Refused(RefusedInput):
    """What the docker daemon answers with an error (the CLI prints it, exits 125)."""


@dataclass(frozen=True)
class NodeHardware:
    """What the node is, as the emulator tells it (`node.json`)."""

    instance_type: str = ""
    gpus: int = 0
    devices: tuple[str, ...] = ()


@dataclass
class CreateRequest:
    name: str = ""
    image: str = ""
    command: list[str] = field(default_factory=list)
    gpus: str | None = None
    devices: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[tuple[str, str]] = field(default_factory=list)  # (source, target)
    volumes: list[str] = field(default_factory=list)  # sources of -v binds


def registry_of(image: str) -> str:
    """The registry an image reference names (Docker Hub when its first part is no host)."""
    first, slash, _rest = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def needs_login(image: str) -> bool:
    """Whether pulling `image` needs credentials: an account's private ECR registry does."""
    return bool(_PRIVATE_ECR.match(registry_of(image)))


def read_env_file(path: Path) -> dict[str, str]:
    """docker's `--env-file`: NAME=value a line, taken as it is; `#` lines and blank lines
    skipped; a bare NAME takes the CLI's own value of it, when it has one."""
    env: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, equals, value = line.partition("=")
        if equals:
            env[name] = value
        elif name in os.environ:
            env[name] = os.environ[name]
    return env


def parse_create(args: list[str]) -> CreateRequest:
    request = CreateRequest()
    index = 0
    while index < len(args):
        arg = args[index]
        if arg == "--":
            index += 1
            break
        if not arg.startswith("-"):
            break
        name, equals, value = arg.partition("=")
        if name in _FLAGS:
            index += 1
            continue
        if name not in _VALUED:
            raise SystemExit(f"unknown flag: {name}")
        if not equals:
            index += 1
            if index >= len(args):
                raise SystemExit(f"flag needs an argument: {name}")
            value = args[index]
        index += 1
        _take_option(request, name, value)
    if index >= len(args):
        raise SystemExit('"docker create" requires at least 1 argument.')
    request.image, request.command = args[index], list(args[index + 1 :])
    return request


def _take_option(request: CreateRequest, name: str, value: str) -> None:
    if name == "--name":
        request.name = value
    elif name == "--gpus":
        request.gpus = value
    elif name == "--device":
        request.devices.append(value.split(":", 1)[0])
    elif name == "--env-file":
        request.env.update(read_env_file(Path(value)))
    elif name in ("-e", "--env"):
        key, equals, text = value.partition("=")
        if equals:
            request.env[key] = text
        elif key in os.environ:
            request.env[key] = os.environ[key]
    elif name in ("-v", "--volume"):
        source = value.split(":", 1)[0]
        if source.startswith("/"):
            request.volumes.append(source)
    elif name == "--mount":
        fields = dict(part.partition("=")[::2] for part in value.split(","))
        if fields.get("type", "volume") == "bind":
            source = fields.get("source") or fields.get("src") or ""
            target = fields.get("target") or fields.get("dst") or fields.get("destination") or ""
            request.mounts.append((source, target))


class Docker:
    """The daemon's side, for one node: its state under `root` ($DOCKER_CONFIG)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.containers = root / "containers"

    # -- what the node is, and who it logged in to ------------------------------------------

    def hardware(self) -> NodeHardware:
        path = self.root / "node.json"
        if not path.exists():
            return NodeHardware()
        document = json.loads(path.read_text())
        return NodeHardware(
            instance_type=str(document.get("instance_type", "")),
            gpus=int(document.get("gpus", 0)),
            devices=tuple(str(d) for d in document.get("devices", [])),
        )

    def _config(self) -> dict[str, Any]:
        path = self.root / "config.json"
        config: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        return config

    def logged_in(self) -> set[str]:
        return set(self._config().get("auths", {}))

    def login(self, registry: str, username: str, password: str) -> None:
        if not password:
            raise Refused("Error: Cannot perform an interactive login from a non TTY device")
        config = self._config()
        # Only that a login happened, and as whom: the password is never written down here.
        config.setdefault("auths", {})[registry] = {"username": username}
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.json").write_text(json.dumps(config))

    def pull(self, image: str) -> None:
        registry = registry_of(image)
        if needs_login(image) and registry not in self.logged_in():
            repository = image.split("/", 1)[1].split(":")[0].split("@")[0]
            raise Refused(
                f'Error response from daemon: Head "https://{registry}/v2/{repository}/'
                'manifests/latest": no basic auth credentials'
            )

    # -- containers ---------------------------------------------------------------------------

    def _record_path(self, name: str) -> Path:
        if not re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]*", name):
            raise Refused(f'Error response from daemon: Invalid container name ("{name}")')
        return self.containers / f"{name}.json"

    def record(self, name: str) -> dict[str, Any]:
        path = self._record_path(name)
        if not path.exists():
            raise Refused(f"Error response from daemon: No such container: {name}")
        record: dict[str, Any] = json.loads(path.read_text())
        return record

    def _save(self, name: str, record: Mapping[str, Any]) -> None:
        self.containers.mkdir(parents=True, exist_ok=True)
        path = self._record_path(name)
        temporary = path.with_suffix(".tmp")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:  # it holds the job's env: root's only
            json.dump(record, file)
        temporary.replace(path)

    def create(self, request: CreateRequest) -> str:
        if not request.name:
            request.name = f"c{secrets.token_hex(6)}"
        if self._record_path(request.name).exists():
            raise Refused(
                f'Error response from daemon: Conflict. The container name "/{request.name}" '
                "is already in use"
            )
        hardware = self.hardware()
        if request.gpus is not None and hardware.gpus == 0:
            raise Refused(
                'Error response from daemon: could not select device driver "" with '
                "capabilities: [[gpu]]"
            )
        for device in request.devices:
            if device not in hardware.devices:
                raise Refused(
                    "Error response from daemon: error gathering device information while "
                    f'adding custom device "{device}": no such file or directory'
                )
        for source, _target in request.mounts:
            if not source or not Path(source).exists():
                raise Refused(
                    'Error response from daemon: invalid mount config for type "bind": bind '
                    f"source path does not exist: {source}"
                )
        for source in request.volumes:  # -v creates a missing host folder, as docker does
            Path(source).mkdir(parents=True, exist_ok=True)
        self.pull(request.image)
        container_id = secrets.token_hex(32)
        self._save(
            request.name,
            {
                "id": container_id,
                "name": request.name,
                "image": request.image,
                "command": request.command,
                "env": request.env,
                "gpus": request.gpus,
                "devices": request.devices,
                "mounts": [list(mount) for mount in request.mounts],
                "status": "created",
                "pid": None,
                "exit_code": None,
            },
        )
        return container_id

    def _log_path(self, name: str) -> Path:
        return self.containers / f"{name}.log"

    def start_attached(self, name: str, out: IO[str]) -> int:
        """Run the container's command, its stdout to `out` (and its log), until it exits;
        its exit status."""
        record = self.record(name)
        if record["status"] != "created":
            raise Refused(f"Error response from daemon: container {name} is {record['status']}")
        if not record["command"]:
            raise Refused("Error response from daemon: no command specified")
        workdir = self.containers / f"{name}.work"
        workdir.mkdir(parents=True, exist_ok=True)
        env = {**self._image_environment(workdir), **record["env"]}
        log = self._log_path(name).open("a", encoding="utf-8")
        try:
            process = subprocess.Popen(  # noqa: S603 - the container's argv, no shell
                record["command"],
                env=env,
                cwd=workdir,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                errors="replace",
                start_new_session=True,  # its own process group: stop and kill reach it all
            )
        except OSError as exc:
            log.close()
            raise Refused(f"Error response from daemon: failed to create task: {exc}") from exc
        self._save(name, {**record, "status": "running", "pid": process.pid})
        relays = [
            threading.Thread(target=_copy, args=(process.stdout, (out, log)), daemon=True),
            threading.Thread(target=_copy, args=(process.stderr, (sys.stderr, log)), daemon=True),
        ]
        for relay in relays:
            relay.start()
        returncode = process.wait()
        for relay in relays:
            relay.join(timeout=5)
        log.close()
        status = 128 - returncode if returncode < 0 else returncode
        if self._record_path(name).exists():
            self._save(name, {**self.record(name), "status": "exited", "exit_code": status})
        return status

    @staticmethod
    def _image_environment(workdir: Path) -> dict[str, str]:
        """What the image itself sets: its PATH, its HOME, and gpufleet installed."""
        package_root = str(Path(__file__).resolve().parents[2])
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": str(workdir),
            "PYTHONPATH": package_root,
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def signal(self, name: str, signum: int) -> bool:
        """Send `signum` to the running container's processes; whether it was running."""
        record = self.record(name)
        pid = record.get("pid")
        if record["status"] != "running" or not isinstance(pid, int):
            return False
        try:
            os.killpg(pid, signum)
        except ProcessLookupError:
            return False
        return True

    def running(self, name: str) -> bool:
        try:
            return bool(self.record(name)["status"] == "running")
        except Refused:
            return False

    def stop(self, name: str, grace_seconds: float) -> None:
        if not self.signal(name, signal.SIGTERM):
            return
        deadline = time.monotonic() + grace_seconds
        while self.running(name) and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.running(name):
            self.signal(name, signal.SIGKILL)

    def remove(self, name: str, force: bool) -> None:
        record = self.record(name)
        if record["status"] == "running":
            if not force:
                raise Refused(
                    f"Error response from daemon: cannot remove container {name}: container is "
                    "running: stop the container before removing or force remove"
                )
            self.signal(name, signal.SIGKILL)
        self._record_path(name).unlink(missing_ok=True)
        self._log_path(name).unlink(missing_ok=True)
        shutil.rmtree(self.containers / f"{name}.work", ignore_errors=True)

    def logs(self, name: str, tail: int | None) -> list[str]:
        self.record(name)
        path = self._log_path(name)
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True) if path.exists() else []
        return lines if tail is None else lines[-tail:] if tail else []

    def kill_all(self) -> None:
        """What the machine's end does to its containers: every one killed."""
        if not self.containers.exists():
            return
        for path in self.containers.glob("*.json"):
            self.signal(path.stem, signal.SIGKILL)


def _copy(stream: IO[str] | None, sinks: Iterable[IO[str]]) -> None:
    if stream is None:
        return
    for line in stream:
        for sink in sinks:
            sink.write(line)
            sink.flush()


def install_node(root: Path, hardware: NodeHardware) -> Path:
    """Prepare a node's docker: its state folder with what the node is, and a `docker` program
    that runs this module (no shell). The path of that program."""
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    (root / "node.json").write_text(
        json.dumps(
            {
                "instance_type": hardware.instance_type,
                "gpus": hardware.gpus,
                "devices": list(hardware.devices),
            }
        )
    )
    program = root / "bin" / "docker"
    program.parent.mkdir(exist_ok=True)
    package_root = Path(__file__).resolve().parents[2]
    program.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        f"sys.path.insert(0, {str(package_root)!r})\n"
        "from gpufleet.emulator.fake_docker import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    program.chmod(0o700)
    return program


def main(argv: list[str]) -> int:
    root = Path(os.environ.get("DOCKER_CONFIG", Path.home() / ".docker"))
    docker = Docker(root)
    if not argv:
        print("Usage: docker COMMAND", file=sys.stderr)
        return 1
    command, args = argv[0], argv[1:]
    try:
        return _run(docker, command, args)
    except Refused as refused:
        print(f"docker: {refused}" if command == "create" else str(refused), file=sys.stderr)
        return DAEMON_REFUSED if command in ("create", "start", "pull") else 1


def _run(docker: Docker, command: str, args: list[str]) -> int:
    if command == "create":
        print(docker.create(parse_create(args)))
        return 0
    if command == "start":
        names = [arg for arg in args if not arg.startswith("-")]
        if "--attach" in args or "-a" in args:
            return docker.start_attached(names[0], sys.stdout)
        raise Refused("the fake docker starts containers attached only")
    if command == "stop":
        grace = float(_option(args, "--time", "-t") or 10)
        docker.stop(_last(args), grace)
        print(_last(args))
        return 0
    if command == "kill":
        if not docker.signal(_last(args), signal.SIGKILL):
            raise Refused(f"Error response from daemon: container {_last(args)} is not running")
        return 0
    if command == "rm":
        force = "-f" in args or "--force" in args
        try:
            docker.remove(_last(args), force)
        except Refused:
            if force:
                return 0  # `rm -f` of a container that is not there: nothing to do
            raise
        return 0
    if command == "logs":
        tail = _option(args, "--tail", "-n")
        sys.stdout.writelines(
            docker.logs(_last(args), None if tail in (None, "all") else int(tail))
        )
        return 0
    if command == "login":
        username = _option(args, "--username", "-u") or ""
        password = sys.stdin.read().strip() if "--password-stdin" in args else ""
        docker.login(_last(args), username, password)
        print("Login Succeeded")
        return 0
    if command == "pull":
        docker.pull(_last(args))
        return 0
    if command == "inspect":
        record = docker.record(_last(args))
        record.pop("env", None)  # the job's values stay in the container
        print(json.dumps([record]))
        return 0
    print(f"docker: '{command}' is not a docker command.", file=sys.stderr)
    return 1


def _option(args: list[str], *names: str) -> str | None:
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(f"{name}="):
                return arg.split("=", 1)[1]
    return None


def _last(args: list[str]) -> str:
    if not args:
        raise Refused("requires at least 1 argument")
    return args[-1]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
