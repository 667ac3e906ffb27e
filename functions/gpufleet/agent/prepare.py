"""What the node does before a job's container starts: log in to its registry, mount its
volumes, read its secrets (docs/data.md).

Every command is an argv list handed to a `CommandRunner` (never a shell, never a string built
from the spec); a password goes on the runner's stdin, never on a command line (`ps` shows those
to every user). The AWS calls go through `NodeSecrets`. Both are seams: tests check the exact
argv, the embedded account answers the lookups from its Secrets Manager and Parameter Store.

`prepare` returns what `docker create` adds: `--volume host:container[:ro]` arguments, and the
secrets' values, which DockerRuntime writes into the container's root-only env file with the
job's env. A value is never logged, reported or stored: a failure names the secret, not its
value.
"""

from __future__ import annotations

import base64
import json
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, Protocol

from gpufleet.errors import GpufleetError

if TYPE_CHECKING:
    from gpufleet.agent.node import RunManifest

# Where the node mounts a run's volumes: one directory per run and volume, so that a stage run
# later on the same instance mounts its own (the instance ends with the job).
DEFAULT_HOST_ROOT = PurePosixPath("/mnt/gpufleet")
# The RAID0 array striped over several instance-store disks.
SCRATCH_ARRAY = "/dev/md/gpufleet-scratch"
# What `lsblk` calls an NVMe instance-store disk on Nitro instances (EBS volumes are "Amazon
# Elastic Block Store").
INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
# How long one preparation command may take (an image pull is not one of them).
COMMAND_TIMEOUT_SECONDS = 600
# How much of a failed command's stderr a run's failure reason quotes.
_STDERR_QUOTED = 300


@dataclass(frozen=True)
class VolumeMount:
    """A volume of the run manifest, resolved against the deployment's config."""

    kind: str  # fsx_lustre, efs, instance_store, s3
    id: str  # the file system id, "scratch", or the s3:// URI
    mount: str  # the path in the container
    read_only: bool = False
    dns_name: str | None = None  # FSx for Lustre
    mount_name: str | None = None  # FSx for Lustre
    bucket: str | None = None  # S3
    prefix: str = ""  # S3: empty or ending in "/"

    @classmethod
    def from_document(cls, document: Mapping[str, Any]) -> VolumeMount:
        return cls(
            kind=str(document["kind"]),
            id=str(document["id"]),
            mount=str(document["mount"]),
            read_only=bool(document.get("read_only", False)),
            dns_name=_optional(document, "dns_name"),
            mount_name=_optional(document, "mount_name"),
            bucket=_optional(document, "bucket"),
            prefix=str(document.get("prefix", "")),
        )


@dataclass(frozen=True)
class RegistryLogin:
    """The registry the node logs in to before it pulls: ECR with the instance role
    (`ecr_account`, `region`), or another one with a Secrets Manager secret's {username,
    password} (`secret`)."""

    registry: str
    ecr_account: str | None = None
    region: str | None = None
    secret: str | None = None

    @classmethod
    def from_document(cls, document: Mapping[str, Any] | None) -> RegistryLogin | None:
        if not document:
            return None
        return cls(
            registry=str(document["registry"]),
            ecr_account=_optional(document, "ecr_account"),
            region=_optional(document, "region"),
            secret=_optional(document, "secret"),
        )


def _optional(document: Mapping[str, Any], key: str) -> str | None:
    value = document.get(key)
    return None if value is None else str(value)


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str = ""
    stderr: str = ""


class CommandRunner(Protocol):
    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> Completed:
        """Run `argv` (no shell), `stdin` on its standard input; how it ended."""
        ...


class NodeSecrets(Protocol):
    """The AWS lookups of the preparation, with the instance role."""

    def secret_string(self, secret_id: str) -> str:
        """A Secrets Manager secret's SecretString, by name or ARN."""
        ...

    def parameter(self, name: str) -> str:
        """An SSM parameter's value, decrypted (SecureString)."""
        ...

    def ecr_password(self, account: str, region: str) -> str:
        """The password of an ECR registry's login (user AWS), from GetAuthorizationToken."""
        ...


class PreparationFailed(GpufleetError):
    """The node could not be prepared for the run: the run fails with this reason (its finish
    report says it; the control plane settles it as any failed run), which names what failed
    and never a secret's value."""


@dataclass(frozen=True)
class Prepared:
    docker_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)


class SubprocessRunner:
    """The real runner: the command with only `environment` (the docker CLI's, so that a login
    lands where `docker create` reads it)."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self._environment = dict(environment)

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> Completed:
        try:
            completed = subprocess.run(  # noqa: S603 - argv list, no shell
                list(argv),
                input=stdin,
                env=self._environment,
                capture_output=True,
                text=True,
                errors="replace",
                check=False,
                timeout=COMMAND_TIMEOUT_SECONDS,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Completed(returncode=127, stderr=str(exc))
        return Completed(completed.returncode, completed.stdout, completed.stderr)


def prepare(
    manifest: RunManifest,
    runner: CommandRunner,
    aws: NodeSecrets,
    host_root: PurePosixPath = DEFAULT_HOST_ROOT,
) -> Prepared:
    """Log in, mount, read secrets, in that order; raise PreparationFailed at the first thing
    that fails. Each volume is mounted under `host_root`/<job>/<stage>/<index>."""
    if manifest.registry_login is not None:
        _login(manifest.registry_login, runner, aws)
    run_directory = host_root / manifest.job_id / (manifest.stage or "run")
    docker_args: list[str] = []
    for index, volume in enumerate(manifest.volumes):
        host = _mount(volume, run_directory / str(index), runner)
        docker_args += ["--volume", f"{host}:{volume.mount}" + (":ro" if volume.read_only else "")]
    return Prepared(docker_args=docker_args, env=resolve_secrets(manifest.secrets, aws))


def resolve_secrets(secrets: Mapping[str, str], aws: NodeSecrets) -> dict[str, str]:
    """Each environment name's value, read from where its reference says."""
    values: dict[str, str] = {}
    for name, reference in sorted(secrets.items()):
        try:
            if reference.startswith("ssm:"):
                values[name] = aws.parameter(reference[len("ssm:") :])
            else:
                values[name] = aws.secret_string(reference.removeprefix("secretsmanager:"))
        except Exception as exc:  # the lookup's own error names the secret, not a value
            raise PreparationFailed(
                f"could not read secret {name} ({reference}): {type(exc).__name__}"
            ) from None
        if "\n" in values[name] or "\r" in values[name] or "\0" in values[name]:
            # The env file holds one NAME=value a line: such a value cannot reach the container.
            raise PreparationFailed(f"secret {name} ({reference}) holds a line break or NUL")
    return values


def _login(login: RegistryLogin, runner: CommandRunner, aws: NodeSecrets) -> None:
    try:
        if login.ecr_account is not None and login.region is not None:
            username, password = "AWS", aws.ecr_password(login.ecr_account, login.region)
        elif login.secret is not None:
            username, password = _credentials(aws.secret_string(login.secret))
        else:
            raise PreparationFailed(f"no way to log in to {login.registry}")
    except PreparationFailed:
        raise
    except Exception as exc:
        raise PreparationFailed(
            f"could not get the credentials of {login.registry}: {type(exc).__name__}"
        ) from None
    argv = ["docker", "login", "--username", username, "--password-stdin", login.registry]
    _check(runner(argv, stdin=password), f"docker login {login.registry}")


def _credentials(secret: str) -> tuple[str, str]:
    try:
        document = json.loads(secret)
        username, password = document["username"], document["password"]
    except (ValueError, TypeError, KeyError):
        raise PreparationFailed(
            "registry_credentials is no JSON object with username and password"
        ) from None
    if not isinstance(username, str) or not isinstance(password, str):
        raise PreparationFailed("registry_credentials' username and password are strings")
    return username, password


def decode_ecr_token(token: str) -> str:
    """The password of GetAuthorizationToken's base64 `AWS:password`."""
    user, _, password = base64.b64decode(token).decode("utf-8").partition(":")
    if user != "AWS" or not password:
        raise ValueError("an ECR authorization token is base64 of AWS:password")
    return password


def _mount(volume: VolumeMount, host: PurePosixPath, runner: CommandRunner) -> str:
    """Mount `volume` on the host (at `host`, or where the instance store already is); the
    host directory docker binds."""
    if volume.kind == "instance_store":
        existing = _mounted_scratch(runner)
        if existing is not None:
            return existing  # an earlier run on this instance set it up (or the AMI did)
    _check(runner(["mkdir", "-p", str(host)]), f"mkdir {host}")
    for argv in _mount_commands(volume, str(host), runner):
        _check(runner(argv), f"mounting {volume.kind} {volume.id}")
    return str(host)


def _mount_commands(volume: VolumeMount, host: str, runner: CommandRunner) -> list[list[str]]:
    options = "ro" if volume.read_only else "rw"
    if volume.kind == "fsx_lustre":
        if volume.dns_name is None or volume.mount_name is None:
            raise PreparationFailed(
                f"{volume.id} is no longer one of the deployment's file systems"
            )
        source = f"{volume.dns_name}@tcp:/{volume.mount_name}"
        return [["mount", "-t", "lustre", "-o", f"relatime,flock,{options}", source, host]]
    if volume.kind == "efs":
        # amazon-efs-utils: TLS in transit, the instance role's IAM authorization.
        return [["mount", "-t", "efs", "-o", f"tls,iam,{options}", f"{volume.id}:/", host]]
    if volume.kind == "s3":
        if volume.bucket is None:
            raise PreparationFailed(f"{volume.id} names no bucket")
        argv = ["mount-s3", "--read-only", "--allow-other"]
        if volume.prefix:
            argv += ["--prefix", volume.prefix]
        return [[*argv, volume.bucket, host]]
    if volume.kind == "instance_store":
        return _scratch_commands(_instance_store_disks(runner), host)
    raise PreparationFailed(f"unknown volume kind {volume.kind!r}")


def _scratch_commands(disks: list[str], host: str) -> list[list[str]]:
    if not disks:
        raise PreparationFailed("this instance type has no NVMe instance-store disks")
    device = disks[0]
    commands: list[list[str]] = []
    if len(disks) > 1:
        device = SCRATCH_ARRAY
        raid = ["mdadm", "--create", SCRATCH_ARRAY, "--run", "--level=0", "--force"]
        commands.append([*raid, f"--raid-devices={len(disks)}", *disks])
    commands.append(["mkfs.ext4", "-F", "-q", "-E", "nodiscard", device])
    commands.append(["mount", "-o", "noatime", device, host])
    return commands


def _block_devices(runner: CommandRunner) -> list[dict[str, Any]]:
    completed = runner(["lsblk", "--json", "--paths", "--output", "NAME,MODEL,MOUNTPOINT"])
    _check(completed, "lsblk")
    try:
        devices = json.loads(completed.stdout)["blockdevices"]
    except (ValueError, KeyError, TypeError):
        raise PreparationFailed("lsblk printed no device list") from None
    return [device for device in devices if isinstance(device, dict)]


def _is_instance_store(device: Mapping[str, Any]) -> bool:
    return str(device.get("model") or "").strip() == INSTANCE_STORE_MODEL


def _instance_store_disks(runner: CommandRunner) -> list[str]:
    return sorted(str(d["name"]) for d in _block_devices(runner) if _is_instance_store(d))


def _mounted_scratch(runner: CommandRunner) -> str | None:
    """Where the instance store is mounted already (a disk, or the array on them), if it is."""
    for device in _block_devices(runner):
        if not _is_instance_store(device):
            continue
        for node in [device, *device.get("children", [])]:
            if isinstance(node, dict) and node.get("mountpoint"):
                return str(node["mountpoint"])
    return None


def _check(completed: Completed, what: str) -> None:
    if completed.returncode != 0:
        detail = " ".join(completed.stderr.split())[:_STDERR_QUOTED]
        raise PreparationFailed(f"{what} failed (exit {completed.returncode}): {detail}")
