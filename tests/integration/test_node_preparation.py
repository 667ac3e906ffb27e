"""The node's preparation on the embedded account. A job's secrets, end to end: submitted by
reference, read on the node from the account's Secrets Manager and Parameter Store at start, and
handed to the container through its private env file; their values reach no table item,
manifest or other object, workflow state or log. Volumes on the emulated host: only what the
account holds mounts."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from gpufleet.adapters.aws.job_store import DynamoJobStore
from gpufleet.agent.aws import AwsNodeSecrets, S3Manifests
from gpufleet.agent.node import RunManifest
from gpufleet.agent.prepare import SCRATCH_ARRAY as SCRATCH
from gpufleet.agent.prepare import PreparationFailed, prepare
from gpufleet.domain.catalog import load_bundled
from gpufleet.emulator.account import Account
from gpufleet.emulator.fake_docker import Docker, Refused
from gpufleet.emulator.node_host import EmulatedHost
from gpufleet.emulator.patches import EMULATOR, NODE, acting_as
from gpufleet.topology import JOBS_TABLE, RUNS_PREFIX
from tests.helpers import everything_stored, jobs_from, wait_for
from tests.unit.test_agent import fake_docker
from tests.unit.test_prepare import RecordingRunner

CATALOG = load_bundled()
HF_TOKEN = "hf_value-that-must-stay-on-the-node"
WANDB_KEY = "wandb-value-that-must-stay-on-the-node"
SPEC = {
    "name": "with-secrets",
    "team": "nlp",
    "image": "img:1",
    "command": ["python", "train.py"],
    "resources": {"gpus": 1, "gpu_memory_gib": 16},
    "env": {"MODE": "train"},
    "secrets": {"HF_TOKEN": "secretsmanager:gpufleet/hf", "WANDB_API_KEY": "ssm:/gpufleet/wandb"},
}


def _manifest_of(account: Account, job_id: str) -> bytes:
    with acting_as(NODE):
        return S3Manifests(account.client("s3"), account.bucket).fetch(
            f"{RUNS_PREFIX}{job_id}/run.json"
        )


@pytest.fixture(scope="module")
def launched(account: Account) -> tuple[str, bytes]:
    """A job with two secrets, submitted to the account and launched: its id and manifest."""
    account.client("secretsmanager").create_secret(Name="gpufleet/hf", SecretString=HF_TOKEN)
    account.client("ssm").put_parameter(
        Name="/gpufleet/wandb", Value=WANDB_KEY, Type="SecureString"
    )
    key = "jobs/nlp/with-secrets.json"
    account.client("s3").put_object(Bucket=account.bucket, Key=key, Body=json.dumps(SPEC))
    store = DynamoJobStore(account.client("dynamodb"), account.table_names[JOBS_TABLE.construct_id])
    [job] = wait_for(lambda: jobs_from(store, f"s3://{account.bucket}/{key}"))

    def manifest() -> bytes | None:
        try:
            return _manifest_of(account, job.job_id)
        except Exception:
            return None

    return job.job_id, wait_for(manifest, 60)


@pytest.fixture(scope="module")
def created(
    account: Account, launched: tuple[str, bytes], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    """The node's run of the manifest, with the real preparation against the account: the
    docker CLI calls it made (a stand-in CLI records them)."""
    run = RunManifest.from_json(launched[1])
    docker = fake_docker(tmp_path_factory.mktemp("node"))
    with acting_as(NODE):
        secrets = AwsNodeSecrets(lambda service, **_: account.client(service))
        outcome = docker.run(run, preparation=lambda m: prepare(m, RecordingRunner(), secrets))
    assert outcome.exit_code == 0
    return docker.calls()


def test_the_node_reads_the_values_and_only_the_containers_env_file_holds_them(
    launched: tuple[str, bytes], created: list[dict[str, Any]]
) -> None:
    assert RunManifest.from_json(launched[1]).secrets == SPEC["secrets"]
    [create] = [call for call in created if call["argv"][1] == "create"]
    assert f"HF_TOKEN={HF_TOKEN}\n" in create["env_file"]
    assert f"WANDB_API_KEY={WANDB_KEY}\n" in create["env_file"]
    assert "MODE=train\n" in create["env_file"]
    for call in created:
        assert not [arg for arg in call["argv"] if HF_TOKEN in arg or WANDB_KEY in arg]


def test_a_secret_the_account_does_not_hold_fails_the_run_naming_it(
    account: Account, launched: tuple[str, bytes]
) -> None:
    document = json.loads(launched[1])
    document["secrets"] = {"DB": "secretsmanager:gpufleet/missing"}
    run = RunManifest.from_json(json.dumps(document).encode())
    with acting_as(NODE), pytest.raises(PreparationFailed, match=r"DB .*gpufleet/missing"):
        prepare(run, RecordingRunner(), AwsNodeSecrets(lambda s, **_: account.client(s)))


def test_no_value_reaches_a_table_the_manifest_the_workflow_or_a_log(
    account: Account, launched: tuple[str, bytes], created: list[dict[str, Any]]
) -> None:
    job_id, raw = launched
    assert created  # the node has read the values and started the container
    stored = everything_stored(account, job_id)
    assert "secretsmanager:gpufleet/hf" in stored  # the references are kept ...
    assert HF_TOKEN not in stored and WANDB_KEY not in stored  # ... never the values
    assert HF_TOKEN not in raw.decode()


# -- volumes on the emulated host: only what the account holds mounts -------------------------


def test_the_emulated_host_mounts_what_the_account_holds_and_refuses_the_rest(
    account: Account, launched: tuple[str, bytes], tmp_path: Path
) -> None:
    with acting_as(EMULATOR):
        efs = account.client("efs").create_file_system(CreationToken="data")["FileSystemId"]
        account.client("s3").create_bucket(Bucket="datasets-bucket")
    # p3dn.24xlarge: two NVMe instance-store disks, striped.
    host = EmulatedHost(account.client, tmp_path, CATALOG.instance_type("p3dn.24xlarge"))
    document = json.loads(launched[1])
    document["secrets"] = {}
    document["volumes"] = [
        {"kind": "efs", "id": efs, "mount": "/shared", "read_only": False},
        {
            "kind": "s3",
            "id": "s3://datasets-bucket/x",
            "mount": "/d",
            "read_only": True,
            "bucket": "datasets-bucket",
            "prefix": "x/",
        },
        {"kind": "instance_store", "id": "scratch", "mount": "/scratch", "read_only": False},
    ]
    run = RunManifest.from_json(json.dumps(document).encode())
    secrets = AwsNodeSecrets(lambda s, **_: account.client(s))
    prepared = prepare(run, host, secrets, PurePosixPath(tmp_path))
    sources = prepared.docker_args[1::2]
    assert [Path(s.split(":")[0]).is_dir() for s in sources] == [True, True, True]
    assert sorted(host.mounted.values()) == sorted([f"{efs}:/", "s3://datasets-bucket", SCRATCH])
    for missing in (
        {"kind": "efs", "id": "fs-0fffffff", "mount": "/x"},
        {
            "kind": "s3",
            "id": "s3://no-such-bucket",
            "mount": "/x",
            "read_only": True,
            "bucket": "no-such-bucket",
        },
    ):
        document["volumes"] = [missing]
        run = RunManifest.from_json(json.dumps(document).encode())
        with pytest.raises(PreparationFailed, match=f"mounting {missing['kind']}"):
            prepare(run, host, secrets, PurePosixPath(tmp_path))
    no_disks = EmulatedHost(account.client, tmp_path, CATALOG.instance_type("p3.2xlarge"))
    document["volumes"] = [{"kind": "instance_store", "id": "scratch", "mount": "/scratch"}]
    run = RunManifest.from_json(json.dumps(document).encode())
    with pytest.raises(PreparationFailed, match="no NVMe instance-store disks"):
        prepare(run, no_disks, secrets, PurePosixPath(tmp_path / "other"))


def test_a_login_on_the_emulated_host_needs_the_password_on_stdin(
    account: Account, tmp_path: Path
) -> None:
    docker = Docker(tmp_path / "docker")
    host = EmulatedHost(account.client, tmp_path, docker=docker)
    registry = "123456789012.dkr.ecr.us-east-1.amazonaws.com"
    argv = ["docker", "login", "--username", "AWS", "--password-stdin", registry]
    assert host(argv).returncode != 0 and host.logins == set()
    with pytest.raises(Refused, match="no basic auth credentials"):
        docker.pull(f"{registry}/train:1")
    assert host(argv, stdin="token").returncode == 0 and host.logins == {registry}
    # The login lands in the node's docker, so its pull of a private image goes through.
    assert docker.logged_in() == {registry}
    docker.pull(f"{registry}/train:1")
    assert "token" not in (tmp_path / "docker" / "config.json").read_text()
