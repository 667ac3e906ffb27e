"""What a job's node reaches besides its image: the volumes it mounts, the secrets it reads, the
registry it logs in to (docs/data.md), and where its container may keep checkpoints.

The spec names them (`volumes`, `secrets`, `registry_credentials`); the deployment's config
(gpufleet.yaml) says which file systems, buckets and secrets the nodes' role can reach. Intake
refuses a spec that names anything else (`check_access`), so a job fails at submission, not on a
node an hour later; likewise a `checkpoint` outside its team's folder of the deployment's
checkpoint location (`checkpoint_problem`). The run manifest carries what the agent needs to
act (`manifest_access`): the volumes resolved against the config, the secrets' references and
the registry login, never a secret's value (the agent reads those on the node, at start).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from gpufleet.domain.config import DataSources, FleetConfig
from gpufleet.domain.spec import FieldError, JobSpec, SpecError, Volume, VolumeKind, split_s3_uri
from gpufleet.domain.tenancy import team_checkpoint_prefix

# An image in a private ECR registry: ACCOUNT.dkr.ecr[-fips].REGION.amazonaws.com[.cn]/REPO...
_ECR_IMAGE = re.compile(
    r"^(?P<registry>(?P<account>[0-9]{12})\.dkr\.ecr(?:-fips)?\.(?P<region>[a-z0-9-]+)"
    r"\.amazonaws\.com(?:\.cn)?)/(?P<repository>[^:@]+)"
)
DOCKER_HUB = "docker.io"

SecretStore = Literal["secretsmanager", "ssm"]


@dataclass(frozen=True)
class SecretReference:
    """Where a secret's value is read: `store` and the name (or ARN) to ask it for."""

    store: SecretStore
    name: str

    @property
    def path(self) -> str:
        """The name the secrets prefix applies to: a secret's name (from its ARN too), a
        parameter's path without its leading slash."""
        if self.store == "ssm":
            return self.name[1:]
        if self.name.startswith("arn:"):
            return self.name.split(":secret:", 1)[1]
        return self.name


def secret_reference(reference: str) -> SecretReference:
    """`secretsmanager:NAME`, a Secrets Manager ARN or `ssm:/path` (as the spec's pattern
    admits them) as a store and a name."""
    if reference.startswith("ssm:"):
        return SecretReference("ssm", reference[len("ssm:") :])
    return SecretReference("secretsmanager", reference.removeprefix("secretsmanager:"))


@dataclass(frozen=True)
class EcrImage:
    registry: str
    account: str
    region: str
    repository: str


def ecr_image(image: str) -> EcrImage | None:
    """The ECR registry an image is pulled from, or None for any other registry."""
    match = _ECR_IMAGE.match(image)
    if match is None:
        return None
    return EcrImage(
        registry=match["registry"],
        account=match["account"],
        region=match["region"],
        repository=match["repository"],
    )


def registry_of(image: str) -> str:
    """The registry host an image reference names (Docker Hub when its first step is no host,
    as docker reads it)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return DOCKER_HUB


def access_problems(spec: JobSpec, config: FleetConfig) -> list[FieldError]:
    """What the spec names that the deployment's nodes cannot reach, by field."""
    problems = [
        FieldError(field=f"volumes[{index}].{volume.kind.value}", message=message)
        for index, volume in enumerate(spec.volumes)
        if (message := _volume_problem(volume, config)) is not None
    ]
    prefix = config.secrets_prefix
    for name, reference in sorted(spec.secrets.items()):
        if not secret_reference(reference).path.startswith(prefix):
            problems.append(FieldError(field=f"secrets.{name}", message=_outside(prefix)))
    if spec.registry_credentials is not None:
        credentials = SecretReference("secretsmanager", spec.registry_credentials)
        if not credentials.path.startswith(prefix):
            problems.append(FieldError(field="registry_credentials", message=_outside(prefix)))
        if ecr_image(spec.image) is not None:
            problems.append(
                FieldError(
                    field="registry_credentials",
                    message="an ECR image is pulled with the node's role: drop "
                    "registry_credentials",
                )
            )
    images = [("image", spec.image)] + [
        (f"stages[{index}].image", stage.image)
        for index, stage in enumerate(spec.stages)
        if stage.image is not None
    ]
    for field, image in images:
        ecr = ecr_image(image)
        if ecr and config.ecr_repositories and ecr.repository not in config.ecr_repositories:
            problems.append(
                FieldError(
                    field=field,
                    message=f"ECR repository {ecr.repository!r} is not one of the "
                    "deployment's ecr_repositories",
                )
            )
    return problems


def _outside(prefix: str) -> str:
    return (
        f"the nodes can read secrets under {prefix!r} only (secrets_prefix; SSM parameters "
        f"under /{prefix})"
    )


def _volume_problem(volume: Volume, config: FleetConfig) -> str | None:
    data = config.data
    if volume.kind is VolumeKind.FSX_LUSTRE and data.fsx(volume.source) is None:
        return f"{volume.source} is not one of the deployment's data.fsx_lustre file systems"
    if volume.kind is VolumeKind.EFS:
        efs = data.efs_file_system(volume.source)
        if efs is None:
            return f"{volume.source} is not one of the deployment's data.efs file systems"
        if efs.read_only and not volume.is_read_only:
            return f"{volume.source} is configured read-only: mount it with read_only: true"
    if volume.kind is VolumeKind.S3:
        bucket, prefix = split_s3_uri(volume.source)
        if not any(
            bucket == allowed.bucket and prefix.startswith(allowed.prefix) for allowed in data.s3
        ):
            return f"{volume.source} is not under one of the deployment's data.s3 locations"
    return None


def checkpoint_problem(spec: JobSpec, checkpoint_uri: str) -> FieldError | None:
    """Why the job's container could not keep its checkpoints where the spec says, or None.
    Its session (infra/constructs/job_role.py) writes only its team's folder of the
    deployment's checkpoint location (`s3://bucket/prefix`; empty: the deployment keeps none),
    so anything else is refused at submission, not denied at its first checkpoint."""
    if spec.checkpoint is None:
        return None
    if not checkpoint_uri:
        return FieldError(
            field="checkpoint",
            message="this deployment keeps no checkpoints: its operator sets the stack's "
            "checkpoint_uri (docs/deploy.md)",
        )
    bucket, prefix = split_s3_uri(checkpoint_uri)
    folder = f"s3://{bucket}/{team_checkpoint_prefix(prefix.rstrip('/'), spec.team)}"
    if (spec.checkpoint.rstrip("/") + "/").startswith(folder):
        return None
    return FieldError(
        field="checkpoint", message=f"team {spec.team}'s jobs keep checkpoints under {folder}"
    )


def check_access(spec: JobSpec, config: FleetConfig, checkpoint_uri: str) -> JobSpec:
    """`spec` when its nodes can reach everything it names and its container may write its
    checkpoints; else SpecError by field."""
    problems = access_problems(spec, config)
    checkpoint = checkpoint_problem(spec, checkpoint_uri)
    if checkpoint is not None:
        problems.append(checkpoint)
    if problems:
        raise SpecError(
            f"{len(problems)} field(s) name what the deployment's nodes cannot reach", problems
        )
    return spec


def manifest_access(spec: JobSpec, data: DataSources) -> dict[str, Any]:
    """The run manifest's `volumes`, `secrets` and `registry_login`: what the agent mounts,
    reads and logs in to before the container starts. Secrets by reference only."""
    return {
        "volumes": [_manifest_volume(volume, data) for volume in spec.volumes],
        "secrets": dict(spec.secrets),
        "registry_login": _registry_login(spec),
    }


def _manifest_volume(volume: Volume, data: DataSources) -> dict[str, Any]:
    resolved: dict[str, Any] = {
        "kind": volume.kind.value,
        "id": volume.source,
        "mount": volume.mount,
        "read_only": volume.is_read_only,
    }
    if volume.kind is VolumeKind.FSX_LUSTRE:
        # Intake checked it against the config; one redeployed without it since leaves the
        # agent nothing to mount, and it fails the run saying so.
        fsx = data.fsx(volume.source)
        if fsx is not None:
            resolved.update(dns_name=fsx.dns_name, mount_name=fsx.mount_name)
    if volume.kind is VolumeKind.S3:
        resolved["bucket"], resolved["prefix"] = split_s3_uri(volume.source)
    return resolved


def _registry_login(spec: JobSpec) -> dict[str, str] | None:
    ecr = ecr_image(spec.image)
    if ecr is not None:
        return {"registry": ecr.registry, "ecr_account": ecr.account, "region": ecr.region}
    if spec.registry_credentials is not None:
        return {"registry": registry_of(spec.image), "secret": spec.registry_credentials}
    return None
