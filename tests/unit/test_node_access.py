"""A spec's volumes, secrets and registry credentials: refused at intake when malformed or when
they name what the deployment's nodes cannot reach, carried to the run manifest by reference."""

from __future__ import annotations

from typing import Any, cast

import pytest

from gpufleet.adapters.local.memory import RecordingWorkflow
from gpufleet.domain.config import DataBucket, DataSources, Efs, FleetConfig, FsxLustre
from gpufleet.domain.job import JobStatus
from gpufleet.domain.node_access import (
    access_problems,
    checkpoint_problem,
    ecr_image,
    manifest_access,
    registry_of,
)
from gpufleet.domain.spec import SpecError, spec_from_mapping
from gpufleet.services.lifecycle_base import run_manifest
from tests.helpers import intake_for, local_ports, make_settings, sent_as

VISION = sent_as("vision")

FSX = "fs-0123456789abcdef0"
EFS = "fs-0a1b2c3d"
EFS_READ_ONLY = "fs-0a1b2c3e"
ECR = "111122223333.dkr.ecr.us-east-1.amazonaws.com"
DATA = DataSources(
    fsx_lustre=[
        FsxLustre(id=FSX, dns_name=f"{FSX}.fsx.us-east-1.amazonaws.com", mount_name="abcdefgh")
    ],
    efs=[Efs(id=EFS), Efs(id=EFS_READ_ONLY, read_only=True)],
    s3=[DataBucket(uri="s3://datasets-bucket/imagenet")],
)
CONFIG = FleetConfig(data=DATA, ecr_repositories=["team/trainer"])


def _spec(**fields: Any) -> dict[str, Any]:
    return {"name": "train", "team": "vision", "image": "img:1", "command": ["python"], **fields}


def _problems(document: dict[str, Any]) -> dict[str, str]:
    with pytest.raises(SpecError) as refused:
        spec_from_mapping(document)
    return {f.field: f.message for f in refused.value.fields}


VOLUMES = [
    {"fsx_lustre": FSX, "mount": "/data"},
    {"efs": EFS, "mount": "/shared"},
    {"efs": EFS_READ_ONLY, "mount": "/models", "read_only": True},
    {"instance_store": "scratch", "mount": "/scratch"},
    {"s3": "s3://datasets-bucket/imagenet/train", "mount": "/datasets", "read_only": True},
]


def test_a_spec_with_every_kind_of_volume_and_secret_is_accepted_and_stored_by_reference() -> None:
    secrets = {"HF_TOKEN": "secretsmanager:gpufleet/hf", "WANDB_API_KEY": "ssm:/gpufleet/wandb"}
    spec = spec_from_mapping(_spec(volumes=VOLUMES, secrets=secrets))
    assert [v.kind.value for v in spec.volumes] == [
        "fsx_lustre",
        "efs",
        "efs",
        "instance_store",
        "s3",
    ]
    assert [v.is_read_only for v in spec.volumes] == [False, False, True, False, True]
    assert spec.to_document()["secrets"] == secrets
    assert access_problems(spec, CONFIG) == []


@pytest.mark.parametrize(
    ("volume", "field", "message"),
    [
        ({"efs": "fs-12", "mount": "/d"}, "volumes[0].efs", "pattern"),
        ({"efs": "FS-0A1B2C3D", "mount": "/d"}, "volumes[0].efs", "pattern"),
        ({"efs": EFS, "mount": "data"}, "volumes[0].mount", "absolute"),
        ({"efs": EFS, "mount": "/"}, "volumes[0].mount", "absolute"),
        ({"efs": EFS, "mount": "/data/"}, "volumes[0].mount", "trailing slash"),
        ({"efs": EFS, "mount": "/a/../etc"}, "volumes[0].mount", "'..'"),
        ({"efs": EFS, "mount": "/a//b"}, "volumes[0].mount", "doubled"),
        ({"efs": EFS, "mount": "/data:rw"}, "volumes[0].mount", "':'"),
        ({"efs": EFS, "mount": "/proc/self"}, "volumes[0].mount", "/proc"),
        ({"efs": EFS, "mount": "/usr"}, "volumes[0].mount", "/usr"),
        ({"efs": EFS, "mount": "/var"}, "volumes[0].mount", "/var/run"),
        ({"efs": EFS, "fsx_lustre": FSX, "mount": "/d"}, "volumes[0]", "exactly one"),
        ({"mount": "/d"}, "volumes[0]", "exactly one"),
        ({"instance_store": "disk", "mount": "/d"}, "volumes[0].instance_store", "scratch"),
        ({"instance_store": "scratch", "mount": "/d", "read_only": True}, "volumes[0]", "written"),
        ({"s3": "s3://datasets-bucket/x", "mount": "/d", "read_only": False},
         "volumes[0]", "read-only"),
        ({"s3": "https://datasets-bucket/x", "mount": "/d"}, "volumes[0].s3", "s3://bucket"),
        ({"s3": "s3://Datasets/x", "mount": "/d"}, "volumes[0].s3", "lowercase"),
        ({"s3": "s3://my..bucket/x", "mount": "/d"}, "volumes[0].s3", "adjacent dots"),
        ({"s3": "s3://192.168.1.1/x", "mount": "/d"}, "volumes[0].s3", "IP address"),
        ({"s3": "s3://data-s3alias/x", "mount": "/d"}, "volumes[0].s3", "reserves"),
        ({"s3": "s3://datasets-bucket/a b", "mount": "/d"}, "volumes[0].s3", "S3 prefix"),
        ({"efs": EFS, "mount": "/d", "size": 3}, "volumes[0].size", "Extra inputs"),
    ],
)  # fmt: skip
def test_a_malformed_volume_is_refused_naming_its_field(
    volume: dict[str, Any], field: str, message: str
) -> None:
    problems = _problems(_spec(volumes=[volume]))
    assert field in problems, problems
    assert message in problems[field]


@pytest.mark.parametrize(
    ("mounts", "message"),
    [
        (["/data", "/data"], "overlap"),
        (["/data", "/data/train"], "overlap"),
    ],
)
def test_volumes_cannot_share_or_nest_their_mounts(mounts: list[str], message: str) -> None:
    volumes = [{"efs": EFS, "mount": mount} for mount in mounts]
    assert message in _problems(_spec(volumes=volumes))["volumes"]


def test_the_instance_store_is_listed_once_and_neighbouring_names_do_not_overlap() -> None:
    twice = [{"instance_store": "scratch", "mount": m} for m in ("/a", "/b")]
    assert "once" in _problems(_spec(volumes=twice))["volumes"]
    apart = [{"efs": EFS, "mount": "/data"}, {"efs": EFS, "mount": "/data2"}]
    assert len(spec_from_mapping(_spec(volumes=apart)).volumes) == 2


@pytest.mark.parametrize(
    "reference",
    [
        "gpufleet/hf",  # no store named
        "secretsmanager:",
        "secretsmanager:has space",
        "ssm:relative/path",
        "ssm:/a//b",
        "vault:/gpufleet/x",
        "arn:aws:s3:::bucket/key",
    ],
)
def test_a_malformed_secret_reference_is_refused(reference: str) -> None:
    assert "secrets.TOKEN" in _problems(_spec(secrets={"TOKEN": reference}))


def test_a_name_in_both_env_and_secrets_is_refused_also_in_a_stage() -> None:
    secrets = {"TOKEN": "ssm:/gpufleet/t"}
    assert "TOKEN" in _problems(_spec(env={"TOKEN": "x"}, secrets=secrets))["(document)"]
    stages = [{"name": "a", "env": {"TOKEN": "x"}}]
    assert "TOKEN" in _problems(_spec(stages=stages, secrets=secrets))["(document)"]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"volumes": [{"fsx_lustre": "fs-0fffffffffffffff0", "mount": "/d"}]},
         "volumes[0].fsx_lustre", "data.fsx_lustre"),
        ({"volumes": [{"efs": "fs-0fffffff", "mount": "/d"}]}, "volumes[0].efs", "data.efs"),
        ({"volumes": [{"efs": EFS_READ_ONLY, "mount": "/d"}]}, "volumes[0].efs", "read-only"),
        ({"volumes": [{"s3": "s3://datasets-bucket/other", "mount": "/d"}]},
         "volumes[0].s3", "data.s3"),
        ({"volumes": [{"s3": "s3://datasets-bucket/imagenet-extra", "mount": "/d"}]},
         "volumes[0].s3", "data.s3"),
        ({"volumes": [{"s3": "s3://other-bucket/imagenet", "mount": "/d"}]},
         "volumes[0].s3", "data.s3"),
        ({"secrets": {"T": "secretsmanager:prod/db"}}, "secrets.T", "'gpufleet/'"),
        ({"secrets": {"T": "secretsmanager:gpufleet"}}, "secrets.T", "'gpufleet/'"),
        ({"secrets": {"T": "arn:aws:secretsmanager:us-east-1:111122223333:secret:prod/db-AbCdEf"}},
         "secrets.T", "'gpufleet/'"),
        ({"secrets": {"T": "ssm:/prod/db"}}, "secrets.T", "/gpufleet/"),
        ({"registry_credentials": "prod/ghcr", "image": "ghcr.io/org/img:1"},
         "registry_credentials", "'gpufleet/'"),
        ({"registry_credentials": "gpufleet/ghcr", "image": f"{ECR}/team/trainer:1"},
         "registry_credentials", "node's role"),
        ({"image": f"{ECR}/other/repo:1"}, "image", "ecr_repositories"),
        ({"stages": [{"name": "a", "image": f"{ECR}/other/repo@sha256:ab"}]},
         "stages[0].image", "ecr_repositories"),
    ],
)  # fmt: skip
def test_what_the_nodes_cannot_reach_is_refused_by_field(
    fields: dict[str, Any], field: str, message: str
) -> None:
    problems = {
        p.field: p.message for p in access_problems(spec_from_mapping(_spec(**fields)), CONFIG)
    }
    assert field in problems, problems
    assert message in problems[field]


def test_secrets_under_the_prefix_are_reachable_in_every_form() -> None:
    secrets = {
        "A": "secretsmanager:gpufleet/a",
        "B": "arn:aws:secretsmanager:us-east-1:111122223333:secret:gpufleet/team/b-AbCdEf",
        "C": "secretsmanager:arn:aws:secretsmanager:us-east-1:111122223333:secret:gpufleet/c",
        "D": "ssm:/gpufleet/d",
    }
    spec = spec_from_mapping(_spec(secrets=secrets, image=f"{ECR}/team/trainer:1"))
    assert access_problems(spec, CONFIG) == []
    other = FleetConfig(secrets_prefix="ml/")
    assert {p.field for p in access_problems(spec, other)} == {f"secrets.{n}" for n in secrets}


def test_images_name_their_registry_as_docker_reads_them() -> None:
    assert ecr_image(f"{ECR}/team/trainer:1") is not None
    assert ecr_image("public.ecr.aws/pytorch/pytorch:2.4.0") is None
    assert registry_of("ghcr.io/org/img:1") == "ghcr.io"
    assert registry_of("localhost:5000/img") == "localhost:5000"
    assert registry_of("pytorch/pytorch:2.4.0") == "docker.io"
    assert registry_of("ubuntu") == "docker.io"


def test_the_manifest_carries_resolved_volumes_references_and_the_login() -> None:
    spec = spec_from_mapping(
        _spec(
            volumes=VOLUMES,
            secrets={"HF_TOKEN": "secretsmanager:gpufleet/hf"},
            image=f"{ECR}/team/trainer:1",
        )
    )
    access = manifest_access(spec, DATA)
    assert access["volumes"][0] == {
        "kind": "fsx_lustre",
        "id": FSX,
        "mount": "/data",
        "read_only": False,
        "dns_name": f"{FSX}.fsx.us-east-1.amazonaws.com",
        "mount_name": "abcdefgh",
    }
    assert access["volumes"][4] == {
        "kind": "s3",
        "id": "s3://datasets-bucket/imagenet/train",
        "mount": "/datasets",
        "read_only": True,
        "bucket": "datasets-bucket",
        "prefix": "imagenet/train/",
    }
    assert access["secrets"] == {"HF_TOKEN": "secretsmanager:gpufleet/hf"}
    assert access["registry_login"] == {
        "registry": ECR,
        "ecr_account": "111122223333",
        "region": "us-east-1",
    }
    ghcr = spec_from_mapping(_spec(image="ghcr.io/o/i:1", registry_credentials="gpufleet/ghcr"))
    assert manifest_access(ghcr, DATA)["registry_login"] == {
        "registry": "ghcr.io",
        "secret": "gpufleet/ghcr",
    }
    assert manifest_access(spec_from_mapping(_spec()), DATA)["registry_login"] is None


def test_intake_refuses_what_the_nodes_cannot_reach_and_stores_nothing() -> None:
    ports = local_ports()
    intake = intake_for(ports, make_settings(config=CONFIG))
    refused = intake.submit_document(
        _spec(secrets={"DB": "secretsmanager:prod/db"}), "delivery-1", "event:1", VISION
    )
    assert not refused.accepted and refused.error is not None
    assert [f["field"] for f in refused.error["fields"]] == ["secrets.DB"]
    assert ports.jobs.list_jobs() == []


def test_an_accepted_job_is_stored_and_run_with_references_only() -> None:
    ports = local_ports()
    intake = intake_for(ports, make_settings(config=CONFIG))
    secrets = {"HF_TOKEN": "secretsmanager:gpufleet/hf"}
    accepted = intake.submit_document(
        _spec(volumes=VOLUMES[:1], secrets=secrets), "delivery-2", "event:2", VISION
    )
    assert accepted.job_id is not None
    job = ports.jobs.get(accepted.job_id)
    assert job.status is JobStatus.QUEUED
    assert job.spec.secrets == secrets
    manifest = run_manifest(job, "bucket", DATA)
    assert manifest["secrets"] == secrets and manifest["env"] == {}
    assert manifest["volumes"][0]["dns_name"] == f"{FSX}.fsx.us-east-1.amazonaws.com"


@pytest.mark.parametrize(
    ("location", "checkpoint"),
    [
        ("s3://ckpt", "s3://ckpt/vision/"),
        ("s3://ckpt", "s3://ckpt/vision"),
        ("s3://ckpt", "s3://ckpt/vision/resnet/run-1/"),
        ("s3://ckpt/teams", "s3://ckpt/teams/vision/resnet/"),
        ("s3://ckpt/teams/", "s3://ckpt/teams/vision/resnet/"),
    ],
)
def test_a_checkpoint_in_its_teams_folder_is_accepted(location: str, checkpoint: str) -> None:
    spec = spec_from_mapping(_spec(checkpoint=checkpoint))
    assert checkpoint_problem(spec, location) is None


@pytest.mark.parametrize(
    ("location", "checkpoint", "message"),
    [
        # Another team's folder, a folder whose name only begins like the team's, another
        # bucket, the location's root, outside the configured prefix.
        ("s3://ckpt", "s3://ckpt/nlp/llm/", "under s3://ckpt/vision/"),
        ("s3://ckpt", "s3://ckpt/vision-old/resnet/", "under s3://ckpt/vision/"),
        ("s3://ckpt", "s3://other-bucket/vision/resnet/", "under s3://ckpt/vision/"),
        ("s3://ckpt", "s3://ckpt/", "under s3://ckpt/vision/"),
        ("s3://ckpt/teams", "s3://ckpt/vision/resnet/", "under s3://ckpt/teams/vision/"),
        ("", "s3://ckpt/vision/", "this deployment keeps no checkpoints"),
    ],
)
def test_a_checkpoint_the_teams_session_cannot_write_is_refused(
    location: str, checkpoint: str, message: str
) -> None:
    problem = checkpoint_problem(spec_from_mapping(_spec(checkpoint=checkpoint)), location)
    assert problem is not None and problem.field == "checkpoint"
    assert message in problem.message


def test_a_job_without_a_checkpoint_needs_no_checkpoint_location() -> None:
    assert checkpoint_problem(spec_from_mapping(_spec()), "") is None


def test_intake_refuses_another_teams_checkpoint_and_stores_nothing() -> None:
    ports = local_ports()
    intake = intake_for(ports, make_settings(checkpoint_uri="s3://ckpt"))
    refused = intake.submit_document(
        _spec(checkpoint="s3://ckpt/nlp/llm/"), "delivery-4", "event:4", VISION
    )
    assert not refused.accepted and refused.error is not None
    assert refused.error["fields"] == [
        {
            "field": "checkpoint",
            "message": "team vision's jobs keep checkpoints under s3://ckpt/vision/",
        }
    ]
    assert ports.jobs.list_jobs() == []
    assert cast(RecordingWorkflow, ports.workflow).started == []
    own = intake.submit_document(
        _spec(checkpoint="s3://ckpt/vision/resnet/"), "delivery-5", "event:5", VISION
    )
    assert own.job_id is not None


SCRATCH = [{"instance_store": "scratch", "mount": "/scratch"}]


def test_intake_fails_a_scratch_job_no_type_with_nvme_instance_store_can_run() -> None:
    ports = local_ports()
    intake = intake_for(ports, make_settings(config=CONFIG))
    # The catalog's CPU-only families (c5, m6i, c7g, ...) are all EBS-only.
    cpu = _spec(volumes=SCRATCH, resources={"gpus": 0, "vcpus": 4})
    outcome = intake.submit_document(cpu, "delivery-3", "event:3", VISION)
    job = ports.jobs.get(outcome.job_id or "")
    assert job.status is JobStatus.FAILED
    assert job.failure_reason is not None
    assert "instance_store volume" in job.failure_reason
    assert "no matching instance type in us-east-1 has NVMe instance-store disks" in (
        job.failure_reason
    )
    # The same job without the scratch volume is queued.
    plain = intake.submit_document(
        _spec(resources={"gpus": 0, "vcpus": 4}), "delivery-4", "e:4", VISION
    )
    assert ports.jobs.get(plain.job_id or "").status is JobStatus.QUEUED


def test_a_scratch_job_is_planned_only_on_types_with_nvme_instance_store() -> None:
    ports = local_ports()
    intake = intake_for(ports, make_settings(config=CONFIG))
    v100 = {"gpus": 1, "gpu_models": ["V100"]}  # p3.2xlarge is EBS-only, p3dn has NVMe disks
    for delivery, volumes in (("delivery-5", []), ("delivery-6", SCRATCH)):
        outcome = intake.submit_document(
            _spec(volumes=volumes, resources=v100), delivery, "e", VISION
        )
        assert ports.jobs.get(outcome.job_id or "").status is JobStatus.QUEUED
    workflow = cast(RecordingWorkflow, ports.workflow)
    planned = [
        {o["instance_type"] for step in state["plan"]["steps"] for o in step["overrides"]}
        for state in (workflow.inputs[name] for name in workflow.started)
    ]
    assert "p3.2xlarge" in planned[0]
    assert planned[1] == {"p3dn.24xlarge"}
