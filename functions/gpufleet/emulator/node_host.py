"""The host side of an emulated node's preparation (agent/prepare.py's CommandRunner): what the
instance's mount, mdadm, lsblk and docker login commands do in the embedded account.

A mount succeeds only for what the account holds, as on AWS: an EFS or FSx file system that
exists (moto's EFS and FSx), a bucket that exists (moto's S3); anything else fails with the
exit status and message the real tool gives. Mount directories are real directories under the
emulated host's root, so a container runtime can check that a `--volume` source exists. The
instance store has the NVMe disks the instance type's catalog entry records. A `docker login`
is noted per registry and, on a node whose containers really run, lands in that node's fake
docker (as the real CLI writes its config.json, which the pull then needs); its password is
read from stdin and never kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpufleet.agent.prepare import INSTANCE_STORE_MODEL, Completed
from gpufleet.domain.catalog import InstanceType
from gpufleet.emulator.fake_docker import Docker
from gpufleet.emulator.patches import NODE, acting_as

# mount(8) and mount-s3's status for a mount that failed.
MOUNT_FAILED = 32
USAGE = 2


class EmulatedHost:
    """Runs the preparation's commands against the embedded account (as the node). Its mount
    directories lie under `root`, a local directory standing for the host's /mnt/gpufleet
    (prepare's `host_root`): a path outside it is refused. `instance_type`: the instance's
    catalog entry (None: no instance-store disks); `docker`: the node's docker, where a login
    lands."""

    def __init__(
        self,
        client: Any,
        root: Path,
        instance_type: InstanceType | None = None,
        docker: Docker | None = None,
    ) -> None:
        self._client = client  # (service) -> a boto3 client of the embedded account
        self.root = root
        self._docker = docker
        disks = instance_type.instance_store_disks if instance_type is not None else 0
        nvme = instance_type is not None and instance_type.has_nvme_instance_store
        self._disks = [f"/dev/nvme{n + 1}n1" for n in range(disks if nvme else 0)]
        self.logins: set[str] = set()
        self.mounted: dict[str, str] = {}  # host directory -> what is mounted there

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> Completed:
        program, *args = argv
        if program == "mkdir" and args[:1] == ["-p"] and len(args) == 2:
            return self._mkdir(args[1])
        if program == "lsblk":
            disks = [
                {"name": d, "model": INSTANCE_STORE_MODEL, "mountpoint": None} for d in self._disks
            ]
            return Completed(0, stdout=json.dumps({"blockdevices": disks}))
        if program in ("mdadm", "mkfs.ext4"):
            named = [a for a in args if a.startswith("/dev/nvme")]
            if program == "mdadm" and (not named or set(named) - set(self._disks)):
                return Completed(1, stderr="mdadm: cannot open device: No such file or directory")
            return Completed(0)
        if program == "mount":
            return self._mount(list(args))
        if program == "mount-s3":
            return self._mount_s3(list(args))
        if program == "docker" and args[:1] == ["login"] and "--password-stdin" in args:
            if not stdin:
                return Completed(1, stderr="Error: Cannot perform an interactive login")
            registry = args[-1]
            if self._docker is not None:
                username = args[args.index("--username") + 1] if "--username" in args else ""
                self._docker.login(registry, username, stdin)
            self.logins.add(registry)
            return Completed(0, stdout="Login Succeeded\n")
        return Completed(127, stderr=f"{program}: command not found")

    def _mkdir(self, path: str) -> Completed:
        directory = Path(path)
        if not directory.is_relative_to(self.root):
            return Completed(1, stderr=f"mkdir: cannot create directory '{path}': outside the host")
        directory.mkdir(parents=True, exist_ok=True)
        return Completed(0)

    def _mount(self, args: list[str]) -> Completed:
        *_, source, target = args
        if not Path(target).is_dir():
            return Completed(MOUNT_FAILED, stderr=f"mount: {target}: mount point does not exist.")
        kind = args[args.index("-t") + 1] if "-t" in args else "device"
        if kind == "efs":
            file_system = source.split(":", 1)[0]
            problem = self._missing(
                "efs", lambda efs: efs.describe_file_systems(FileSystemId=file_system)
            )
        elif kind == "lustre":
            file_system = source.split(".", 1)[0]
            problem = self._missing(
                "fsx", lambda fsx: fsx.describe_file_systems(FileSystemIds=[file_system])
            )
        else:
            problem = (
                None if source in self._disks or source.startswith("/dev/md/") else "no such device"
            )
        if problem is not None:
            return Completed(MOUNT_FAILED, stderr=f"mount: {source}: {problem}")
        self.mounted[target] = source
        return Completed(0)

    def _mount_s3(self, args: list[str]) -> Completed:
        bucket, target = args[-2], args[-1]
        if "--read-only" not in args:
            return Completed(USAGE, stderr="gpufleet mounts S3 read-only")
        problem = self._missing("s3", lambda s3: s3.head_bucket(Bucket=bucket))
        if problem is not None:
            return Completed(MOUNT_FAILED, stderr=f"Failed to create mount process: {problem}")
        self.mounted[target] = f"s3://{bucket}"
        return Completed(0)

    def _missing(self, service: str, call: Any) -> str | None:
        with acting_as(NODE):
            try:
                call(self._client(service))
            except Exception as exc:  # the service's own answer: not found, denied
                return f"{type(exc).__name__}: {exc}"
        return None
