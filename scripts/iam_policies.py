"""The least-privilege policies of docs/iam/, derived rather than written by hand.

`cdk deploy` deploys through the CDK bootstrap's roles: the person deploying only assumes the
ones the cloud assembly names (the stack's deploy role, each asset's publishing role:
docs/iam/deployer.json), and CloudFormation creates the stack's resources with the
*execution* role, whose policies `cdk bootstrap --cloudformation-execution-policies` sets
(AdministratorAccess unless told otherwise). Those policies are `cfn-execution-N.json`, derived
from the synthesized template:

- every resource type in it, and those gpufleet.yaml may add (`CONFIG_RESOURCE_TYPES`): the
  permissions its CloudFormation registry schema lists for the create, read, update and delete
  handlers (cfn-lint ships the schemas);
- a custom resource (`Custom::...`): `lambda:InvokeFunction` (CloudFormation invokes its
  handler with the execution role's permissions);
- a parameter of type `AWS::SSM::Parameter::Value<...>`: `ssm:GetParameters`;
- less the actions in `NOT_NEEDED`, each with the reason this stack never needs it (a schema
  lists what a handler may call for *any* value of its properties).

IAM actions are scoped to the stack's own roles and instance profiles (CloudFormation names them
`<stack name>-<logical id>-<suffix>`): the policies say `STACK_NAME`, `ACCOUNT_ID` and
`REGION`, filled in as docs/deploy.md shows. A managed policy holds at most 6,144 characters, so
the actions are spread over as many files as they need, a service never split.

    python scripts/iam_policies.py     # rewrite docs/iam/{deployer,cfn-execution-*}.json

tests/infrastructure/test_iam_policies.py fails when the files are not what this derives.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
IAM_DIR = ROOT / "docs" / "iam"
EXECUTION_POLICY = "cfn-execution-{}.json"
DEPLOYER_POLICY = "deployer.json"
# The pseudo parameters of the assembly's role ARNs, as the policies' placeholders say them.
_PLACEHOLDERS = {
    "${AWS::Partition}": "aws",
    "${AWS::AccountId}": "ACCOUNT_ID",
    "${AWS::Region}": "REGION",
}
# IAM's limit on a managed policy document, without whitespace.
MAX_POLICY_CHARACTERS = 6144
HANDLERS = ("create", "read", "update", "delete")
SSM_PARAMETER_TYPE = "AWS::SSM::Parameter::Value<"

# Actions the schemas list that this stack never needs, and why: each must be one the schemas
# list for a type of the template (the test checks it), else it is stale and goes.
_NO_METADATA_TABLES = "no S3 metadata or table buckets (AWS::S3::Bucket's MetadataConfiguration)"
NOT_NEEDED: dict[str, str] = {
    **dict.fromkeys(
        (
            "iam:DeleteGroupPolicy",
            "iam:DeleteUserPolicy",
            "iam:GetGroupPolicy",
            "iam:GetUserPolicy",
            "iam:PutGroupPolicy",
            "iam:PutUserPolicy",
        ),
        "the stack's AWS::IAM::Policy attach to roles, never to users or groups",
    ),
    "iam:CreateServiceLinkedRole": "the stack creates no service-linked role (the Launch "
    "function may create EC2's two, at run time, with its own role)",
    "iam:PutRolePermissionsBoundary": "no role of the stack has a permissions boundary",
    "iam:DeleteRolePermissionsBoundary": "no role of the stack has a permissions boundary",
    "elasticfilesystem:DescribeMountTargets": "no function mounts EFS",
    "s3files:ListMountTargets": "no function mounts S3 Files",
    "kinesis:DescribeStream": "no log group streams to Kinesis",
    "kinesis:PutRecords": "no log group streams to Kinesis",
    "firehose:TagDeliveryStream": "no log group streams to Firehose",
    "lambda:PassCapacityProvider": "no function runs on a capacity provider",
    "lambda:AssociateRuntimeAlias": "no function uses a runtime alias",
    "s3:CreateBucketMetadataTableConfiguration": _NO_METADATA_TABLES,
    "s3:DeleteBucketMetadataTableConfiguration": _NO_METADATA_TABLES,
    "s3:GetBucketMetadataTableConfiguration": _NO_METADATA_TABLES,
    "s3:UpdateBucketMetadataInventoryTableConfiguration": _NO_METADATA_TABLES,
    "s3:UpdateBucketMetadataJournalTableConfiguration": _NO_METADATA_TABLES,
    "s3:UpdateBucketMetadataAnnotationTableConfiguration": _NO_METADATA_TABLES,
    **{
        f"s3tables:{operation}": _NO_METADATA_TABLES
        for operation in (
            "CreateNamespace",
            "CreateTable",
            "CreateTableBucket",
            "GetTable",
            "GetTableMetadataLocation",
            "PutTableBucketPolicy",
            "PutTableEncryption",
            "PutTablePolicy",
            "UpdateTableMetadataLocation",
        )
    },
}
# Resource types gpufleet.yaml may add to the template, which the policies cover whatever the
# config: the subscriptions of the teams' e-mail addresses (`teams.<team>.notify`).
CONFIG_RESOURCE_TYPES = ("AWS::SNS::Subscription",)
# IAM actions on the stack's roles and instance profiles: scoped to them.
_IAM_RESOURCES = [
    "arn:aws:iam::ACCOUNT_ID:role/STACK_NAME-*",
    "arn:aws:iam::ACCOUNT_ID:instance-profile/STACK_NAME-*",
]


def _schemas() -> tuple[Path, dict[str, str]]:
    import cfnlint

    data = Path(cfnlint.__file__).parent / "data" / "schemas"
    index: dict[str, str] = json.loads((data / "providers" / "us-east-1.json").read_text())
    return data / "resources", index


def needed_actions(template: Mapping[str, Any]) -> dict[str, set[str]]:
    """Every action CloudFormation may call to create, read, update and delete the template's
    resources and resolve its parameters, with the resource types (or parameters) that need it."""
    folder, index = _schemas()
    needed: dict[str, set[str]] = {}
    types = {r["Type"] for r in template["Resources"].values()} | set(CONFIG_RESOURCE_TYPES)
    for resource_type in sorted(types):
        if resource_type.startswith("Custom::"):
            actions = ["lambda:InvokeFunction"]
        else:
            schema = json.loads((folder / f"{index[resource_type]}.json").read_text())
            handlers = schema.get("handlers", {})
            actions = [a for h in HANDLERS for a in handlers.get(h, {}).get("permissions", [])]
        for action in actions:
            needed.setdefault(action, set()).add(resource_type)
    for name, parameter in template.get("Parameters", {}).items():
        if str(parameter.get("Type", "")).startswith(SSM_PARAMETER_TYPE):
            needed.setdefault("ssm:GetParameters", set()).add(f"parameter {name}")
    return needed


def execution_actions(template: Mapping[str, Any]) -> list[str]:
    return sorted(set(needed_actions(template)) - set(NOT_NEEDED))


def _statements(actions: Iterable[str]) -> list[dict[str, Any]]:
    """One statement per service; IAM's scoped to the stack's roles and instance profiles."""
    by_service: dict[str, list[str]] = {}
    for action in sorted(actions):
        by_service.setdefault(action.split(":")[0], []).append(action)
    return [
        {
            "Sid": f"Deploy{service.title().replace('-', '')}",
            "Effect": "Allow",
            "Action": listed,
            "Resource": _IAM_RESOURCES if service == "iam" else "*",
        }
        for service, listed in by_service.items()
    ]


def _size(document: Mapping[str, Any]) -> int:
    return len(json.dumps(document, separators=(",", ":")))


def execution_policies(template: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The execution role's policies: the statements packed, in order, into documents that each
    fit a managed policy."""
    documents: list[dict[str, Any]] = []
    for statement in _statements(execution_actions(template)):
        if documents:
            grown = {**documents[-1], "Statement": [*documents[-1]["Statement"], statement]}
            if _size(grown) <= MAX_POLICY_CHARACTERS:
                documents[-1] = grown
                continue
        document = {"Version": "2012-10-17", "Statement": [statement]}
        if _size(document) > MAX_POLICY_CHARACTERS:
            raise ValueError(f"{statement['Sid']} alone is over {MAX_POLICY_CHARACTERS} characters")
        documents.append(document)
    return documents


def deployer_roles(manifest: Mapping[str, Any], assets: Mapping[str, Any], stack: str) -> list[str]:
    """The bootstrap roles `cdk deploy` assumes for the stack: its deploy role (which hands
    CloudFormation the execution role) and the publishing role of each asset's destination."""
    roles = {manifest["artifacts"][stack]["properties"]["assumeRoleArn"]}
    for kind in ("files", "dockerImages"):
        for asset in assets.get(kind, {}).values():
            roles |= {d["assumeRoleArn"] for d in asset["destinations"].values()}
    placeheld = set()
    for arn in roles:
        for pseudo, placeholder in _PLACEHOLDERS.items():
            arn = arn.replace(pseudo, placeholder)
        placeheld.add(arn)
    return sorted(placeheld)


def deployer_policy(roles: Iterable[str]) -> dict[str, Any]:
    return {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Sid": "AssumeTheBootstrapRoles",
                "Effect": "Allow",
                "Action": ["sts:AssumeRole"],
                "Resource": list(roles),
            }
        ],
    }


def derived(outdir: Path, stack: str, template_file: str) -> dict[str, dict[str, Any]]:
    """Every policy file of docs/iam/ this script writes, by name, from a synthesized assembly."""
    manifest = json.loads((outdir / "manifest.json").read_text())
    assets_file = next(
        a["properties"]["file"]
        for a in manifest["artifacts"].values()
        if a["type"] == "cdk:asset-manifest" and a["properties"]["file"].startswith(f"{stack}.")
    )
    assets = json.loads((outdir / assets_file).read_text())
    template = json.loads((outdir / template_file).read_text())
    files = {DEPLOYER_POLICY: deployer_policy(deployer_roles(manifest, assets, stack))}
    for number, document in enumerate(execution_policies(template), start=1):
        files[EXECUTION_POLICY.format(number)] = document
    return files


def render(document: Mapping[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"


def main() -> int:
    sys.path[:0] = [str(ROOT / "functions"), str(ROOT)]
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    import tempfile

    from infra.app import build_app

    with tempfile.TemporaryDirectory() as outdir:
        app, stack = build_app(outdir=outdir)
        app.synth()
        files = derived(Path(outdir), stack.artifact_id, stack.template_file)
    for stale in IAM_DIR.glob(EXECUTION_POLICY.format("*")):
        stale.unlink()
    for name, document in files.items():
        path = IAM_DIR / name
        path.write_text(render(document), encoding="utf-8")
        print(f"wrote {path.relative_to(ROOT)} ({_size(document)} characters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
