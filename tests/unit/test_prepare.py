"""The node's preparation before a container starts (agent/prepare.py): the exact argv of each
mount and login, passwords only on stdin, secrets read by reference and carried only in the
container's private env file."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gpufleet.agent.node import RunManifest
from gpufleet.agent.prepare import (
    INSTANCE_STORE_MODEL,
    SCRATCH_ARRAY,
    Completed,
    PreparationFailed,
    RegistryLogin,
    VolumeMount,
    decode_ecr_token,
    prepare,
)
from gpufleet.domain.rendezvous import Peer, node_environment
from tests.unit.test_agent import fake_docker

JOB = "j-0123456789abcdef0123"
ROOT = PurePosixPath("/mnt/gpufleet")
SECRET_VALUE = "hf_s3cr3t-value-never-stored"
PASSWORD = "registry-password-xyz"


@dataclass
class RecordingRunner:
    """Answers every command with success (lsblk with `disks`), recording argv and stdin."""

    disks: list[dict[str, Any]] = field(default_factory=list)
    fail: str | None = None  # the program that fails
    calls: list[tuple[list[str], str | None]] = field(default_factory=list)

    def __call__(self, argv: Sequence[str], stdin: str | None = None) -> Completed:
        self.calls.append((list(argv), stdin))
        if argv[0] == self.fail:
            return Completed(32, stderr="mount error(13): permission denied")
        if argv[0] == "lsblk":
            return Completed(0, stdout=json.dumps({"blockdevices": self.disks}))
        return Completed(0)

    @property
    def argvs(self) -> list[list[str]]:
        return [argv for argv, _ in self.calls]


@dataclass
class FakeSecrets:
    secrets: dict[str, str] = field(default_factory=dict)
    parameters: dict[str, str] = field(default_factory=dict)
    ecr_logins: list[tuple[str, str]] = field(default_factory=list)

    def secret_string(self, secret_id: str) -> str:
        return self.secrets[secret_id]

    def parameter(self, name: str) -> str:
        return self.parameters[name]

    def ecr_password(self, account: str, region: str) -> str:
        self.ecr_logins.append((account, region))
        return PASSWORD


def _manifest(**fields: Any) -> RunManifest:
    return RunManifest(job_id=JOB, name="t", image="img:1", command=["python"], **fields)


def _disk(name: str, mountpoint: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"name": name, "model": INSTANCE_STORE_MODEL + "  ", "mountpoint": mountpoint, **extra}


EBS_ROOT = {"name": "/dev/nvme0n1", "model": "Amazon Elastic Block Store", "mountpoint": None}


def test_each_volume_is_mounted_with_a_fixed_argv_and_bound_at_its_path() -> None:
    runner = RecordingRunner(disks=[EBS_ROOT, _disk("/dev/nvme2n1"), _disk("/dev/nvme1n1")])
    volumes = (
        VolumeMount(
            "fsx_lustre",
            "fs-0123456789abcdef0",
            "/data",
            dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
            mount_name="abcdefgh",
        ),
        VolumeMount("efs", "fs-0a1b2c3d", "/shared", read_only=True),
        VolumeMount(
            "s3", "s3://datasets/imagenet", "/datasets", True, bucket="datasets", prefix="imagenet/"
        ),
        VolumeMount("instance_store", "scratch", "/scratch"),
    )
    prepared = prepare(_manifest(volumes=volumes, stage="train"), runner, FakeSecrets(), ROOT)
    base = f"/mnt/gpufleet/{JOB}/train"
    assert runner.argvs == [
        ["mkdir", "-p", f"{base}/0"],
        ["mount", "-t", "lustre", "-o", "relatime,flock,rw",
         "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh", f"{base}/0"],
        ["mkdir", "-p", f"{base}/1"],
        ["mount", "-t", "efs", "-o", "tls,iam,ro", "fs-0a1b2c3d:/", f"{base}/1"],
        ["mkdir", "-p", f"{base}/2"],
        ["mount-s3", "--read-only", "--allow-other", "--prefix", "imagenet/", "datasets",
         f"{base}/2"],
        ["lsblk", "--json", "--paths", "--output", "NAME,MODEL,MOUNTPOINT"],
        ["mkdir", "-p", f"{base}/3"],
        ["lsblk", "--json", "--paths", "--output", "NAME,MODEL,MOUNTPOINT"],
        # Two disks: striped, RAID0; the EBS root volume is never touched.
        ["mdadm", "--create", SCRATCH_ARRAY, "--run", "--level=0", "--force",
         "--raid-devices=2", "/dev/nvme1n1", "/dev/nvme2n1"],
        ["mkfs.ext4", "-F", "-q", "-E", "nodiscard", SCRATCH_ARRAY],
        ["mount", "-o", "noatime", SCRATCH_ARRAY, f"{base}/3"],
    ]  # fmt: skip
    assert prepared.docker_args == [
        "--volume", f"{base}/0:/data",
        "--volume", f"{base}/1:/shared:ro",
        "--volume", f"{base}/2:/datasets:ro",
        "--volume", f"{base}/3:/scratch",
    ]  # fmt: skip
    assert all(stdin is None for _, stdin in runner.calls)


def test_one_instance_store_disk_is_formatted_without_an_array() -> None:
    runner = RecordingRunner(disks=[_disk("/dev/nvme1n1")])
    volumes = (VolumeMount("instance_store", "scratch", "/scratch"),)
    prepare(_manifest(volumes=volumes), runner, FakeSecrets(), ROOT)
    assert [argv[0] for argv in runner.argvs] == ["lsblk", "mkdir", "lsblk", "mkfs.ext4", "mount"]
    assert runner.argvs[3][-1] == "/dev/nvme1n1"


def test_an_instance_store_already_mounted_is_bound_where_it_is() -> None:
    # A stage before this one (or the AMI) set it up: no second array, no reformat.
    array = {"name": "/dev/md127", "mountpoint": "/opt/dlami/nvme"}
    runner = RecordingRunner(disks=[_disk("/dev/nvme1n1", children=[array]), _disk("/dev/nvme2n1")])
    volumes = (VolumeMount("instance_store", "scratch", "/scratch"),)
    prepared = prepare(_manifest(volumes=volumes), runner, FakeSecrets(), ROOT)
    assert [argv[0] for argv in runner.argvs] == ["lsblk"]
    assert prepared.docker_args == ["--volume", "/opt/dlami/nvme:/scratch"]


def test_an_instance_without_instance_store_fails_the_preparation() -> None:
    runner = RecordingRunner(disks=[EBS_ROOT])
    volumes = (VolumeMount("instance_store", "scratch", "/scratch"),)
    with pytest.raises(PreparationFailed, match="no NVMe instance-store disks"):
        prepare(_manifest(volumes=volumes), runner, FakeSecrets(), ROOT)
    assert not [argv for argv in runner.argvs if argv[0] in ("mkfs.ext4", "mdadm", "mount")]


def test_a_failed_mount_names_the_volume_and_stops_there() -> None:
    runner = RecordingRunner(fail="mount")
    volumes = (
        VolumeMount("efs", "fs-0a1b2c3d", "/shared"),
        VolumeMount("efs", "fs-0a1b2c3e", "/other"),
    )
    with pytest.raises(PreparationFailed, match=r"mounting efs fs-0a1b2c3d failed \(exit 32\)"):
        prepare(_manifest(volumes=volumes), runner, FakeSecrets(), ROOT)
    assert runner.argvs[-1][:3] == ["mount", "-t", "efs"] and len(runner.argvs) == 2


def test_ecr_images_log_in_with_the_role_and_the_password_goes_on_stdin_only() -> None:
    runner, secrets = RecordingRunner(), FakeSecrets()
    registry = "111122223333.dkr.ecr.eu-west-1.amazonaws.com"
    login = RegistryLogin(registry=registry, ecr_account="111122223333", region="eu-west-1")
    prepare(_manifest(registry_login=login), runner, secrets, ROOT)
    assert secrets.ecr_logins == [("111122223333", "eu-west-1")]
    assert runner.calls == [
        (["docker", "login", "--username", "AWS", "--password-stdin", registry], PASSWORD)
    ]


def test_other_registries_log_in_with_the_named_secret() -> None:
    runner = RecordingRunner()
    secrets = FakeSecrets(
        secrets={"gpufleet/ghcr": json.dumps({"username": "bot", "password": PASSWORD})}
    )
    login = RegistryLogin(registry="ghcr.io", secret="gpufleet/ghcr")
    prepare(_manifest(registry_login=login), runner, secrets, ROOT)
    [(argv, stdin)] = runner.calls
    assert argv == ["docker", "login", "--username", "bot", "--password-stdin", "ghcr.io"]
    assert stdin == PASSWORD and not [arg for arg in argv if PASSWORD in arg]


@pytest.mark.parametrize("secret", ["not json", json.dumps({"username": "bot"}), "[1, 2]"])
def test_registry_credentials_that_are_no_username_and_password_fail_without_a_login(
    secret: str,
) -> None:
    runner = RecordingRunner()
    login = RegistryLogin(registry="ghcr.io", secret="gpufleet/ghcr")
    with pytest.raises(PreparationFailed, match="username and password"):
        prepare(
            _manifest(registry_login=login), runner, FakeSecrets({"gpufleet/ghcr": secret}), ROOT
        )
    assert runner.calls == []


def test_secrets_are_read_by_reference_and_a_failure_names_the_secret_not_a_value() -> None:
    arn = "arn:aws:secretsmanager:us-east-1:111122223333:secret:gpufleet/db-AbCdEf"
    secrets = FakeSecrets(
        secrets={"gpufleet/hf": SECRET_VALUE, arn: "db"},
        parameters={"/gpufleet/wandb": "wandb-key"},
    )
    references = {
        "HF_TOKEN": "secretsmanager:gpufleet/hf",
        "DB": arn,
        "WANDB_API_KEY": "ssm:/gpufleet/wandb",
    }
    prepared = prepare(_manifest(secrets=references), RecordingRunner(), secrets, ROOT)
    assert prepared.env == {"HF_TOKEN": SECRET_VALUE, "DB": "db", "WANDB_API_KEY": "wandb-key"}
    missing = {"MISSING": "secretsmanager:gpufleet/gone", **references}
    with pytest.raises(PreparationFailed) as failure:
        prepare(_manifest(secrets=missing), RecordingRunner(), secrets, ROOT)
    assert "MISSING" in str(failure.value) and "gpufleet/gone" in str(failure.value)
    assert SECRET_VALUE not in str(failure.value)


def test_a_secret_with_a_line_break_cannot_reach_the_env_file() -> None:
    secrets = FakeSecrets(secrets={"gpufleet/pem": "-----BEGIN-----\nabc"})
    run = _manifest(secrets={"PEM": "secretsmanager:gpufleet/pem"})
    with pytest.raises(PreparationFailed, match=r"PEM .* line break"):
        prepare(run, RecordingRunner(), secrets, ROOT)


def test_an_ecr_token_is_base64_of_aws_and_the_password() -> None:
    assert decode_ecr_token(base64.b64encode(b"AWS:pw:with:colons").decode()) == "pw:with:colons"
    with pytest.raises(ValueError, match="AWS:password"):
        decode_ecr_token(base64.b64encode(b"root:pw").decode())


def test_the_manifest_reads_volumes_secrets_and_login_back() -> None:
    document = {
        "job_id": JOB,
        "image": "img:1",
        "command": ["python"],
        "volumes": [
            {
                "kind": "s3",
                "id": "s3://b/p",
                "mount": "/d",
                "read_only": True,
                "bucket": "b",
                "prefix": "p/",
            }
        ],
        "secrets": {"TOKEN": "ssm:/gpufleet/t"},
        "registry_login": {"registry": "ghcr.io", "secret": "gpufleet/ghcr"},
    }
    run = RunManifest.from_json(json.dumps(document).encode())
    assert run.volumes == (VolumeMount("s3", "s3://b/p", "/d", True, bucket="b", prefix="p/"),)
    assert run.secrets == {"TOKEN": "ssm:/gpufleet/t"}
    assert run.registry_login == RegistryLogin(registry="ghcr.io", secret="gpufleet/ghcr")
    bare = RunManifest.from_json(
        json.dumps({"job_id": JOB, "image": "i", "command": ["x"]}).encode()
    )
    assert (bare.volumes, bare.secrets, bare.registry_login) == ((), {}, None)


RENDEZVOUS_NAMES = frozenset(node_environment([Peer("", "127.0.0.1")], 0, 1))


def test_docker_gets_the_volumes_and_the_secret_only_through_the_private_env_file(
    tmp_path: Path,
) -> None:
    docker = fake_docker(tmp_path)
    secrets = FakeSecrets(secrets={"gpufleet/hf": SECRET_VALUE})
    runner = RecordingRunner()
    run = _manifest(
        env={"MODE": "x"},
        secrets={"HF_TOKEN": "secretsmanager:gpufleet/hf"},
        volumes=(VolumeMount("efs", "fs-0a1b2c3d", "/shared"),),
    )
    outcome = docker.run(run, preparation=lambda m: prepare(m, runner, secrets, ROOT))
    assert outcome.exit_code == 0
    [create] = [call for call in docker.calls() if call["argv"][1] == "create"]
    argv = create["argv"]
    assert argv[argv.index("--volume") + 1] == f"/mnt/gpufleet/{JOB}/run/0:/shared"
    assert argv.index("--volume") < argv.index("--")  # an option, never the command's
    # The job's own names beside gpufleet's (rank, peers: domain/rendezvous.py).
    env = dict(line.split("=", 1) for line in create["env_file"].splitlines())
    jobs_own = {name: value for name, value in env.items() if name not in RENDEZVOUS_NAMES}
    assert jobs_own == {"HF_TOKEN": SECRET_VALUE, "MODE": "x"}
    assert not [arg for call in docker.calls() for arg in call["argv"] if SECRET_VALUE in arg]


def test_a_failed_preparation_fails_the_run_before_docker_creates_anything(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path)
    run = _manifest(secrets={"HF_TOKEN": "secretsmanager:gpufleet/missing"})
    outcome = docker.run(
        run, preparation=lambda m: prepare(m, RecordingRunner(), FakeSecrets(), ROOT)
    )
    assert outcome.exit_code is None
    assert outcome.reason.startswith("could not prepare the node: could not read secret HF_TOKEN")
    assert not (tmp_path / "calls.jsonl").exists()


def test_a_secret_never_replaces_what_the_agent_sets_itself(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path)
    secrets = FakeSecrets(secrets={"gpufleet/x": "s3://elsewhere/"})
    run = _manifest(
        resume=True,
        checkpoint="s3://ckpt/j/",
        secrets={"GPUFLEET_RESUME_FROM": "secretsmanager:gpufleet/x"},
    )
    docker.run(run, preparation=lambda m: prepare(m, RecordingRunner(), secrets, ROOT))
    [create] = [call for call in docker.calls() if call["argv"][1] == "create"]
    assert "GPUFLEET_RESUME_FROM=s3://ckpt/j/" in create["env_file"].splitlines()


def test_a_runtime_without_preparation_never_runs_a_job_that_needs_one(tmp_path: Path) -> None:
    docker = fake_docker(tmp_path)
    outcome = docker.run(_manifest(secrets={"T": "ssm:/gpufleet/t"}))
    assert outcome.exit_code is None and "runs no preparation" in outcome.reason
    assert not (tmp_path / "calls.jsonl").exists()
    assert docker.run(_manifest()).exit_code == 0  # nothing to prepare: it runs
