"""The nodes' role reaches the registries, secrets, file systems and buckets gpufleet.yaml names,
and only those: without a `data:` section it holds no file system or dataset grant at all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from cdk_nag import AwsSolutionsChecks
from infra.app import ROOT, build_app
from infra.stack import STACK_NAME

if TYPE_CHECKING:
    from conftest import Synth

FSX = "fs-0123456789abcdef0"
EFS_WRITABLE = "fs-0a1b2c3d"
EFS_READ_ONLY = "fs-0a1b2c3e"
KMS_KEY = "arn:aws:kms:us-east-1:111122223333:key/0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
DATA_CONFIG = f"""
data:
  fsx_lustre: [{{id: {FSX}, dns_name: {FSX}.fsx.us-east-1.amazonaws.com, mount_name: abcdefgh}}]
  efs: [{{id: {EFS_WRITABLE}}}, {{id: {EFS_READ_ONLY}, read_only: true}}]
  s3: [{{uri: s3://datasets-bucket/imagenet}}, {{uri: s3://whole-bucket}}]
secrets_prefix: ml/prod/
secrets_kms_keys: [{KMS_KEY}]
ecr_repositories: [team/trainer]
"""


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    folder = tmp_path_factory.mktemp("node-access")
    config = folder / "gpufleet.yaml"
    config.write_text(
        (ROOT / "gpufleet.yaml").read_text(encoding="utf-8") + DATA_CONFIG, encoding="utf-8"
    )
    app, _ = build_app(context={"config_file": str(config)}, outdir=str(folder / "cdk.out"))
    app.synth()
    doc = json.loads(Path(folder / "cdk.out" / f"{STACK_NAME}.template.json").read_text())
    return app, doc


def _instance_role_statements(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    resources = doc["Resources"]
    [profile] = [r for r in resources.values() if r["Type"] == "AWS::IAM::InstanceProfile"]
    [role] = profile["Properties"]["Roles"]
    statements: list[dict[str, Any]] = []
    for resource in resources.values():
        if resource["Type"] == "AWS::IAM::Policy" and role in resource["Properties"]["Roles"]:
            statements += resource["Properties"]["PolicyDocument"]["Statement"]
    return {s["Sid"]: s for s in statements}


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _egress_ports(doc: dict[str, Any]) -> set[tuple[int, int]]:
    [group] = [r for r in doc["Resources"].values() if r["Type"] == "AWS::EC2::SecurityGroup"]
    return {
        (rule["FromPort"], rule["ToPort"])
        for rule in group["Properties"]["SecurityGroupEgress"]
        if rule.get("CidrIp") == "0.0.0.0/0"
    }


def test_without_data_the_role_mounts_nothing_and_reads_secrets_under_the_prefix_only(
    synth: Synth,
) -> None:
    statements = _instance_role_statements(synth.doc)
    assert not {"MountEfs", "WriteEfs", "ReadDatasets"} & statements.keys()
    assert not any(sid.startswith("ListDatasets") for sid in statements)
    assert _egress_ports(synth.doc) == {(443, 443)}
    assert "secret:gpufleet/*" in _text(statements["ReadSecrets"]["Resource"])
    assert "parameter/gpufleet/*" in _text(statements["ReadParameters"]["Resource"])
    assert statements["RegistryLogin"]["Resource"] == "*"
    assert _text(statements["PullImages"]["Resource"]).count("repository/*") == 1
    assert "DecryptSecrets" not in statements


def test_configured_file_systems_buckets_and_secrets_are_granted_and_nothing_more(
    configured: tuple[Any, dict[str, Any]],
) -> None:
    _, doc = configured
    statements = _instance_role_statements(doc)
    mount = statements["MountEfs"]
    assert mount["Action"] == "elasticfilesystem:ClientMount"
    assert [_text(r).count("file-system/") for r in mount["Resource"]] == [1, 1]
    assert EFS_WRITABLE in _text(mount["Resource"]) and EFS_READ_ONLY in _text(mount["Resource"])
    # The read-only file system may be mounted, never written.
    write = statements["WriteEfs"]
    assert EFS_WRITABLE in _text(write["Resource"])
    assert EFS_READ_ONLY not in _text(write["Resource"])
    objects = _text(statements["ReadDatasets"]["Resource"])
    assert "datasets-bucket/imagenet/*" in objects and "whole-bucket/*" in objects
    assert statements["ReadDatasets"]["Action"] == "s3:GetObject"
    assert statements["ListDatasets0"]["Condition"] == {"StringLike": {"s3:prefix": ["imagenet/*"]}}
    assert "Condition" not in statements["ListDatasets1"]  # the whole bucket is configured
    assert "secret:ml/prod/*" in _text(statements["ReadSecrets"]["Resource"])
    assert "parameter/ml/prod/*" in _text(statements["ReadParameters"]["Resource"])
    decrypt = statements["DecryptSecrets"]
    assert decrypt["Resource"] == KMS_KEY
    assert "kms:ViaService" in decrypt["Condition"]["StringEquals"]
    pulls = _text(statements["PullImages"]["Resource"])
    assert "repository/team/trainer" in pulls and "repository/*" not in pulls
    # FSx for Lustre takes no IAM to mount: its client ports; EFS its NFS port.
    assert not any("fsx:" in _text(s["Action"]) for s in statements.values())
    # Port 80: the Ubuntu archive, for the EFS and S3 mount tools' packages (below).
    assert _egress_ports(doc) == {(80, 80), (443, 443), (988, 988), (1018, 1023), (2049, 2049)}


def _user_data_scripts(doc: dict[str, Any]) -> list[str]:
    """Every launch template's user data, its literal parts (the deployment's refs left out)."""
    return [
        "".join(
            part
            for part in resource["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"][
                "Fn::Join"
            ][1]
            if isinstance(part, str)
        )
        for resource in doc["Resources"].values()
        if resource["Type"] == "AWS::EC2::LaunchTemplate"
    ]


def _installs(script: str) -> dict[str, bool]:
    return {
        "mdadm": "apt-get install -y -q mdadm" in script,
        "efs": "dnf install -y -q amazon-efs-utils" in script and "./build-deb.sh" in script,
        "s3": "mountpoint-s3-release/latest/${arch}/mount-s3.deb" in script,
        "lustre": "dnf install -y -q lustre-client" in script
        and '"lustre-client-modules-$(uname -r)"' in script,
    }


def test_the_boot_script_installs_the_volume_tools_the_configured_data_sources_need(
    synth: Synth, configured: tuple[Any, dict[str, Any]]
) -> None:
    _, doc = configured
    scripts = _user_data_scripts(doc)
    assert len(scripts) > 1 and len(set(scripts)) == 1  # one script for every image
    assert _installs(scripts[0]) == {"mdadm": True, "efs": True, "s3": True, "lustre": True}
    # Only where the image lacks the tool, and before the agent starts (its first run mounts).
    script = scripts[0]
    assert "if ! [ -x /sbin/mount.efs ]; then" in script
    assert "if ! modinfo lustre >/dev/null 2>&1; then" in script
    assert script.index("mount-s3.deb") < script.index("systemctl enable --now gpufleet-agent")
    # EC2 takes at most 16 KB of user data before base64; the deployment's names (left out
    # here) add a few hundred bytes.
    assert len(script.encode()) < 12 * 1024
    # Nothing from gpufleet.yaml's data section reaches the script: no id, bucket or DNS name.
    for configured_value in (FSX, EFS_WRITABLE, "datasets-bucket", "abcdefgh"):
        assert configured_value not in script
    # Without a data section only mdadm (instance-store scratch needs no configuration).
    [plain] = set(_user_data_scripts(synth.doc))
    assert _installs(plain) == {"mdadm": True, "efs": False, "s3": False, "lustre": False}
    assert "mount-s3" not in plain and "efs-utils" not in plain and "lustre" not in plain


def test_cdk_nag_has_no_unacknowledged_findings_with_data_sources(
    configured: tuple[Any, dict[str, Any]],
) -> None:
    app, _ = configured
    report = AwsSolutionsChecks().validate_scope(app)
    findings = [
        f"{v.rule_name} at {r.construct_path}"
        for v in report.violations
        for r in v.violating_resources
    ]
    assert not findings, "\n".join(findings)
