"""The first `cdk deploy` with the defaults gives working functions, and deploys repeat.

- The code zip carries what the functions import and neither the Lambda runtime nor the
  Powertools layer provides (PyYAML); a `lambda_asset` folder without it is refused at synth.
- The Powertools layer is the one AWS's public SSM parameter names when the stack is deployed,
  or the ARN given as `-c powertools_layer_arn=...`.
- A stack created again under the same name, after a rollback or a `cdk destroy`, finds no name
  taken by what the first one retained: no retained resource has a fixed physical name.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aws_cdk as cdk
import pytest
from infra.app import build_app
from infra.config import ConfigError, GpuFleetConfig
from infra.constructs.functions import powertools_layer
from infra.stack import STACK_NAME

from gpufleet import topology
from gpufleet.domain.catalog import load_bundled
from gpufleet.domain.readiness import vcpu_needs
from gpufleet.emulator.account import repository_config

if TYPE_CHECKING:
    from conftest import Synth

# -- the code zip ------------------------------------------------------------------------------


def _code_folder(synth: Synth) -> Path:
    """The staged folder of the zip the functions run, as the cloud assembly holds it."""
    code = synth.props(synth.function_id(topology.LAUNCH.construct_id))["Code"]
    asset_hash: str = code["S3Key"].removesuffix(".zip")
    return synth.outdir / f"asset.{asset_hash}"


def test_the_code_zip_carries_pyyaml_built_for_any_python(synth: Synth) -> None:
    folder = _code_folder(synth)
    assert (folder / "gpufleet" / "__init__.py").is_file()
    assert (folder / "yaml" / "__init__.py").is_file()
    # Only pure-Python files: a module compiled for this interpreter would not load in Lambda.
    compiled = [p for p in folder.rglob("*") if p.suffix in (".so", ".pyd", ".dylib")]
    assert compiled == []
    assert not list(folder.rglob("__pycache__"))


def test_yaml_imports_from_the_zip_alone(synth: Synth) -> None:
    """Without site-packages (-S), with the zip first on the path, as in the Lambda runtime."""
    program = (
        "import sys; sys.path.insert(0, sys.argv[1]); import yaml; "
        "assert yaml.__file__.startswith(sys.argv[1]), yaml.__file__; "
        "print(yaml.safe_load('gpus: 8')['gpus'])"
    )
    result = subprocess.run(
        [sys.executable, "-S", "-c", program, str(_code_folder(synth))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (result.returncode, result.stdout.strip()) == (0, "8"), result.stderr


def test_a_lambda_asset_without_pyyaml_is_refused_at_synth(tmp_path: Path) -> None:
    asset, outdir = tmp_path / "asset", str(tmp_path / "cdk.out")
    (asset / "gpufleet").mkdir(parents=True)
    (asset / "gpufleet" / "__init__.py").write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"lacks _yaml, yaml.*Leave lambda_asset unset"):
        build_app(context={"lambda_asset": str(asset)}, outdir=outdir)
    with pytest.raises(ConfigError, match="not a directory"):
        build_app(context={"lambda_asset": str(tmp_path / "none")}, outdir=outdir)


# -- the Powertools layer ----------------------------------------------------------------------

POWERTOOLS_PARAMETER = "/aws/service/powertools/python/x86_64/python3.12/latest"


def test_every_function_runs_the_layer_the_public_parameter_names(synth: Synth) -> None:
    layers = {
        json.dumps(synth.props(synth.function_id(f.construct_id))["Layers"])
        for f in topology.FUNCTIONS
    }
    ((layer,),) = [json.loads(text) for text in layers]
    assert synth.doc["Parameters"][layer["Ref"]] == {
        "Type": "AWS::SSM::Parameter::Value<String>",
        "Default": POWERTOOLS_PARAMETER,
    }


def test_an_explicit_layer_arn_replaces_the_parameter() -> None:
    arn = (
        "arn:aws:lambda:eu-west-1:017000801446:layer:AWSLambdaPowertoolsPythonV3-python312-x86_64:7"
    )
    stack = cdk.Stack(cdk.App(), "LayerTest")
    layer = powertools_layer(stack, GpuFleetConfig.from_context({"powertools_layer_arn": arn}))
    assert stack.resolve(layer.layer_version_arn) == arn
    default = cdk.Stack(cdk.App(), "LayerDefault")
    ref = default.resolve(powertools_layer(default, GpuFleetConfig()).layer_version_arn)
    assert set(ref) == {"Ref"}


# -- deploying again under the same name -------------------------------------------------------

RETAINING = ("Retain", "RetainExceptOnCreate")
ACCOUNT, REGION = "123456789012", "us-east-1"


def _stack_id(deployment: int) -> str:
    return (
        f"arn:aws:cloudformation:{REGION}:{ACCOUNT}:stack/{STACK_NAME}/"
        f"{deployment:08d}-0000-4000-8000-000000000000"
    )


def _resolve(value: Any, deployment: int, doc: dict[str, Any]) -> Any:
    """A value as CloudFormation resolves it when it creates stack `deployment` (1 or 2) under
    the same name, account and region: only the stack id and the new resources differ."""
    if isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, list):
        return [_resolve(item, deployment, doc) for item in value]
    ((function, argument),) = value.items()
    if function == "Ref":
        pseudo = {
            "AWS::StackName": STACK_NAME,
            "AWS::StackId": _stack_id(deployment),
            "AWS::AccountId": ACCOUNT,
            "AWS::Region": REGION,
            "AWS::Partition": "aws",
            "AWS::URLSuffix": "amazonaws.com",
        }
        if argument in pseudo:
            return pseudo[argument]
        if argument in doc.get("Parameters", {}):
            return doc["Parameters"][argument].get("Default")
        return f"{argument}@{deployment}"  # every resource of a new stack is new
    if function == "Fn::GetAtt":
        return f"{'.'.join(argument)}@{deployment}"
    if function == "Fn::Join":
        separator, parts = argument
        return str(separator).join(str(_resolve(p, deployment, doc)) for p in parts)
    if function == "Fn::Select":
        index, items = argument
        return _resolve(items, deployment, doc)[int(index)]
    if function == "Fn::Split":
        separator, text = argument
        return str(_resolve(text, deployment, doc)).split(separator)
    if function == "Fn::Sub" and isinstance(argument, str):
        text = argument
        for name in ("AWS::StackName", "AWS::StackId", "AWS::AccountId", "AWS::Region"):
            text = text.replace(f"${{{name}}}", str(_resolve({"Ref": name}, deployment, doc)))
        assert "${" not in text, f"teach this test {text}"
        return text
    raise AssertionError(f"teach this test to resolve {function}")


def _retained_names(doc: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Each physical name of a retained resource, as each of two deployments resolves it."""
    names: dict[str, tuple[Any, Any]] = {}
    for logical_id, resource in doc["Resources"].items():
        policies = (resource.get("DeletionPolicy"), resource.get("UpdateReplacePolicy"))
        if not set(policies) & set(RETAINING):
            continue
        for key, value in resource.get("Properties", {}).items():
            if key.endswith("Name"):  # LogGroupName, TableName, BucketName, TopicName, ...
                names[f"{logical_id}.{key}"] = (_resolve(value, 1, doc), _resolve(value, 2, doc))
    return names


def fixed_names_of_retained_resources(doc: dict[str, Any]) -> list[str]:
    return [
        f"{where} = {first!r}"
        for where, (first, second) in _retained_names(doc).items()
        if first == second
    ]


def test_no_retained_resource_has_a_fixed_name(synth: Synth) -> None:
    retained = [r for r in synth.resources.values() if r.get("DeletionPolicy") in RETAINING]
    # What holds data is retained: tables, buckets, every log group.
    assert {r["Type"] for r in retained} >= {
        "AWS::DynamoDB::Table",
        "AWS::S3::Bucket",
        "AWS::Logs::LogGroup",
    }
    assert len([r for r in retained if r["Type"] == "AWS::Logs::LogGroup"]) == len(
        synth.of_type("AWS::Logs::LogGroup")
    )
    assert fixed_names_of_retained_resources(synth.doc) == []


def test_the_state_machine_logs_stay_under_vendedlogs_with_a_name_per_stack(synth: Synth) -> None:
    """/aws/vendedlogs/ keeps Step Functions off the size limit of the Logs resource policy."""
    names = {
        where: pair
        for where, pair in _retained_names(synth.doc).items()
        if where.endswith(".LogGroupName")
    }
    ((first, second),) = names.values()
    prefix = f"/aws/vendedlogs/states/{STACK_NAME}-{topology.JOB_LIFECYCLE.construct_id}-"
    assert first.startswith(prefix) and second.startswith(prefix) and first != second


def test_the_check_finds_a_fixed_name() -> None:
    doc = {
        "Resources": {
            "Logs": {
                "Type": "AWS::Logs::LogGroup",
                "DeletionPolicy": "Retain",
                "Properties": {
                    "LogGroupName": {"Fn::Join": ["", ["/x/", {"Ref": "AWS::StackName"}]]}
                },
            },
            "Table": {
                "Type": "AWS::DynamoDB::Table",
                "UpdateReplacePolicy": "Retain",
                "Properties": {"TableName": "jobs"},
            },
            "Deleted": {
                "Type": "AWS::Logs::LogGroup",
                "DeletionPolicy": "Delete",
                "Properties": {"LogGroupName": "/fixed/but/deleted"},
            },
        }
    }
    assert fixed_names_of_retained_resources(doc) == [
        f"Logs.LogGroupName = '/x/{STACK_NAME}'",
        "Table.TableName = 'jobs'",
    ]


def test_the_cdk_cli_is_pinned_to_one_release_the_guide_names() -> None:
    root = Path(__file__).resolve().parents[2]
    package = json.loads((root / "package.json").read_text())
    pinned = package["devDependencies"]["aws-cdk"]
    assert pinned.replace(".", "").isdigit(), f"{pinned}: a range, not one release"
    assert package["engines"]["node"] == ">=22"  # Node 22 LTS: Node 20 is past its end of life
    assert f"`aws-cdk` {pinned}" in (root / "docs" / "deploy.md").read_text()


def test_the_guide_s_quota_table_is_what_doctor_works_out_for_the_shipped_config() -> None:
    guide = (Path(__file__).resolve().parents[2] / "docs" / "deploy.md").read_text()
    table = dict(re.findall(r"^\| [^|]+ \| `(L-[0-9A-F]+)` \| (\d+) \|", guide, re.MULTILINE))
    needs = vcpu_needs(repository_config(), load_bundled(), "us-east-1")
    assert table == {code: str(need.vcpus) for code, need in needs.items()}
