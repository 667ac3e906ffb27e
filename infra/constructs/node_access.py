"""What the nodes' role and security group grant beyond the control plane's own data: the
registries, secrets, file systems and buckets gpufleet.yaml names (docs/data.md), and nothing
else. Intake refuses a spec that names anything outside them (domain/node_access.py).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_iam as iam

from constructs import Construct
from gpufleet.domain.config import FleetConfig
from infra.constructs import nag

# Lustre clients reach the file servers on 988, and on 1018-1023 (FSx for Lustre's
# documented client ports); NFS for EFS on 2049.
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))
EFS_PORT = ec2.Port.tcp(2049)


def grant_node_access(
    scope: Construct,
    role: iam.Role,
    security_group: ec2.SecurityGroup,
    fleet_config: FleetConfig,
) -> None:
    """Registry pulls and secrets reads always (scoped to the account's repositories and the
    secrets prefix); file systems and buckets only as configured."""
    stack = Stack.of(scope)
    _grant_registry(stack, role, fleet_config)
    _grant_secrets(stack, role, fleet_config)
    data = fleet_config.data
    if data.fsx_lustre:
        # Mounting FSx for Lustre takes no IAM: only the network (the file system's own security
        # group admits the nodes).
        for port in LUSTRE_PORTS:
            security_group.add_egress_rule(ec2.Peer.any_ipv4(), port, "FSx for Lustre clients")
    if data.efs:
        security_group.add_egress_rule(ec2.Peer.any_ipv4(), EFS_PORT, "EFS (NFS over TLS)")
        _grant_efs(stack, role, fleet_config)
    if data.s3:
        _grant_buckets(stack, role, fleet_config)


def _arn(stack: Stack, service: str, resource: str, name: str, *, sep: str = "/") -> str:
    arn: str = stack.format_arn(
        service=service,
        resource=resource,
        resource_name=name,
        arn_format=ArnFormat.SLASH_RESOURCE_NAME if sep == "/" else ArnFormat.COLON_RESOURCE_NAME,
    )
    return arn


def _grant_registry(stack: Stack, role: iam.Role, config: FleetConfig) -> None:
    role.add_to_policy(
        iam.PolicyStatement(
            sid="RegistryLogin",
            actions=["ecr:GetAuthorizationToken"],  # no resource-level permissions
            resources=["*"],
        )
    )
    repositories = [_arn(stack, "ecr", "repository", name) for name in config.ecr_repositories] or [
        _arn(stack, "ecr", "repository", "*")
    ]
    role.add_to_policy(
        iam.PolicyStatement(
            sid="PullImages",
            actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"],
            resources=repositories,
        )
    )
    policy = role.node.try_find_child("DefaultPolicy")
    assert policy is not None
    nag.acknowledge_all(
        policy,
        nag.wildcard_resources("*"),
        "ecr:GetAuthorizationToken has no resource-level permissions; the pulls it allows are "
        "scoped to the account's repositories by PullImages.",
    )
    if not config.ecr_repositories:
        nag.acknowledge_all(
            policy,
            nag.wildcard_resources(
                "arn:<AWS::Partition>:ecr:<AWS::Region>:<AWS::AccountId>:repository/*"
            ),
            "Jobs pull their images from the account's own ECR repositories; gpufleet.yaml "
            "ecr_repositories narrows this to named ones.",
        )


def _grant_secrets(stack: Stack, role: iam.Role, config: FleetConfig) -> None:
    prefix = config.secrets_prefix
    secrets = _arn(stack, "secretsmanager", "secret", f"{prefix}*", sep=":")
    parameters = _arn(stack, "ssm", "parameter", f"{prefix}*")
    role.add_to_policy(
        iam.PolicyStatement(
            sid="ReadSecrets", actions=["secretsmanager:GetSecretValue"], resources=[secrets]
        )
    )
    role.add_to_policy(
        iam.PolicyStatement(
            sid="ReadParameters",
            actions=["ssm:GetParameter", "ssm:GetParameters"],
            resources=[parameters],
        )
    )
    if config.secrets_kms_keys:
        # Customer managed keys only through the two services (AWS managed keys need no grant).
        role.add_to_policy(
            iam.PolicyStatement(
                sid="DecryptSecrets",
                actions=["kms:Decrypt"],
                resources=list(config.secrets_kms_keys),
                conditions={
                    "StringEquals": {
                        "kms:ViaService": [
                            f"secretsmanager.{stack.region}.amazonaws.com",
                            f"ssm.{stack.region}.amazonaws.com",
                        ]
                    }
                },
            )
        )
    policy = role.node.try_find_child("DefaultPolicy")
    assert policy is not None
    account = "arn:<AWS::Partition>:{service}:<AWS::Region>:<AWS::AccountId>:{resource}"
    nag.acknowledge_all(
        policy,
        nag.wildcard_resources(
            account.format(service="secretsmanager", resource=f"secret:{prefix}*"),
            account.format(service="ssm", resource=f"parameter/{prefix}*"),
        ),
        "Jobs name their secrets by name under the deployment's secrets_prefix; intake "
        "refuses any other, and the prefix is the narrowest grant for names not known yet.",
    )


def _grant_efs(stack: Stack, role: iam.Role, config: FleetConfig) -> None:
    file_systems = {
        fs.id: _arn(stack, "elasticfilesystem", "file-system", fs.id) for fs in config.data.efs
    }
    role.add_to_policy(
        iam.PolicyStatement(
            sid="MountEfs",
            actions=["elasticfilesystem:ClientMount"],
            resources=sorted(file_systems.values()),
        )
    )
    writable = sorted(file_systems[fs.id] for fs in config.data.efs if not fs.read_only)
    if writable:
        role.add_to_policy(
            iam.PolicyStatement(
                sid="WriteEfs", actions=["elasticfilesystem:ClientWrite"], resources=writable
            )
        )


def _grant_buckets(stack: Stack, role: iam.Role, config: FleetConfig) -> None:
    partition = stack.partition
    objects = [
        f"arn:{partition}:s3:::{location.bucket}/{location.prefix}*" for location in config.data.s3
    ]
    role.add_to_policy(
        iam.PolicyStatement(sid="ReadDatasets", actions=["s3:GetObject"], resources=objects)
    )
    for index, location in enumerate(config.data.s3):
        listing = iam.PolicyStatement(
            sid=f"ListDatasets{index}",
            actions=["s3:ListBucket"],
            resources=[f"arn:{partition}:s3:::{location.bucket}"],
        )
        if location.prefix:
            listing.add_condition("StringLike", {"s3:prefix": [f"{location.prefix}*"]})
        role.add_to_policy(listing)
    policy = role.node.try_find_child("DefaultPolicy")
    assert policy is not None
    nag.acknowledge_all(
        policy,
        nag.wildcard_resources(
            *(f"arn:<AWS::Partition>:s3:::{o.split(':::', 1)[1]}" for o in objects)
        ),
        "A dataset is every object under the configured S3 location; Mountpoint for Amazon S3 "
        "reads them (read-only) as the job opens them.",
    )
