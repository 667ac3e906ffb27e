"""Synthesize the gpufleet app once per test session and share the result (the `synth`
fixture, tests/conftest.py), and the stacks of other configs."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
for _path in (str(ROOT / "functions"), str(ROOT)):
    if _path not in sys.path:
        sys.path.insert(0, _path)
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

import aws_cdk as cdk  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402
from infra.app import build_app  # noqa: E402
from infra.stack import STACK_NAME, GpuFleetStack  # noqa: E402

from gpufleet import topology  # noqa: E402

Resource = dict[str, Any]


@dataclass
class Synth:
    """A synthesized stack: its cloud assembly on disk and its template. `app` and `stack` are
    the live constructs only where this process synthesized it (None for the session's shared
    synth, read from the folder another process wrote)."""

    outdir: Path
    template_path: Path
    doc: dict[str, Any]
    app: cdk.App | None = None
    stack: GpuFleetStack | None = None
    _by_handler: dict[str, str] = field(default_factory=dict)

    @cached_property
    def template(self) -> Template:
        return Template.from_json(self.doc)

    @property
    def resources(self) -> dict[str, Resource]:
        resources: dict[str, Resource] = self.doc["Resources"]
        return resources

    def of_type(self, resource_type: str) -> dict[str, Resource]:
        return {k: r for k, r in self.resources.items() if r["Type"] == resource_type}

    def props(self, logical_id: str) -> dict[str, Any]:
        properties: dict[str, Any] = self.resources[logical_id].get("Properties", {})
        return properties

    def function_id(self, construct_id: str) -> str:
        """Logical id of the Lambda function of a topology function, found by its handler."""
        spec = next(f for f in topology.FUNCTIONS if f.construct_id == construct_id)
        matches = [
            k
            for k, r in self.of_type("AWS::Lambda::Function").items()
            if r["Properties"].get("Handler") == spec.handler
        ]
        assert len(matches) == 1, f"{construct_id}: {matches}"
        return matches[0]

    def function_env(self, construct_id: str) -> dict[str, Any]:
        env: dict[str, Any] = self.props(self.function_id(construct_id))["Environment"]["Variables"]
        return env

    def role_of_function(self, construct_id: str) -> str:
        role = self.props(self.function_id(construct_id))["Role"]
        logical_id: str = role["Fn::GetAtt"][0]
        return logical_id

    def statements_of_role(self, role_id: str) -> list[dict[str, Any]]:
        statements: list[dict[str, Any]] = []
        # CDK moves what exceeds a role's inline policy size into customer managed policies
        # attached to the role (OverflowPolicy): those are the role's too.
        policies = [*self.of_type("AWS::IAM::Policy").values()]
        policies += self.of_type("AWS::IAM::ManagedPolicy").values()
        for policy in policies:
            if {"Ref": role_id} in policy["Properties"].get("Roles", []):
                statements += _listify(policy["Properties"]["PolicyDocument"]["Statement"])
        for inline in self.props(role_id).get("Policies", []):
            statements += _listify(inline["PolicyDocument"]["Statement"])
        return statements

    def overflow_policies_of_role(self, role_id: str) -> list[str]:
        """The managed policies CDK split off the role's inline policy (its estimate passed
        10,000 characters): logical ids."""
        return [
            logical_id
            for logical_id, policy in self.of_type("AWS::IAM::ManagedPolicy").items()
            if {"Ref": role_id} in policy["Properties"].get("Roles", [])
        ]

    def all_statements(self) -> Iterator[tuple[str, dict[str, Any]]]:
        for logical_id, resource in self.resources.items():
            if resource["Type"] in ("AWS::IAM::Policy", "AWS::IAM::ManagedPolicy"):
                for statement in _listify(resource["Properties"]["PolicyDocument"]["Statement"]):
                    yield logical_id, statement
            if resource["Type"] == "AWS::IAM::Role":
                for inline in resource["Properties"].get("Policies", []):
                    for statement in _listify(inline["PolicyDocument"]["Statement"]):
                        yield logical_id, statement

    def ref_target(self, env_var: str) -> str:
        """The logical id an environment variable of the functions refers to."""
        value = self.function_env(topology.ENQUEUE.construct_id)[env_var]
        logical_id: str = value["Ref"]
        return logical_id

    def launch_template_ids(self) -> dict[str, str]:
        """The launch templates every function gets (ENV_LAUNCH_TEMPLATES): logical id by
        template key."""
        env = self.function_env(topology.LAUNCH.construct_id)
        templates, key = {}, ""
        for part in env[topology.ENV_LAUNCH_TEMPLATES]["Fn::Join"][1]:
            if isinstance(part, str):
                key = part.lstrip(",").removesuffix("=")
            else:
                templates[key] = part["Ref"]
        return templates

    # -- helpers, reachable from the fixture so test modules never import conftest ---------------
    @staticmethod
    def actions_of(statement: dict[str, Any]) -> list[str]:
        return [str(a) for a in _listify(statement.get("Action", []))]

    @staticmethod
    def resources_of(statement: dict[str, Any]) -> list[Any]:
        return _listify(statement.get("Resource", []))

    @staticmethod
    def render(value: Any) -> str:
        """A CloudFormation value as text, intrinsics as <LogicalId> / <LogicalId.Attr>."""
        return _render(value)


def _listify(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if isinstance(value, dict) and "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return str(separator).join(_render(p) for p in parts)
    if isinstance(value, dict) and "Fn::Sub" in value:
        return str(value["Fn::Sub"])
    return json.dumps(value, sort_keys=True)


def synthesize(outdir: Path, context: dict[str, Any] | None = None) -> Synth:
    app, stack = build_app(context=context, outdir=str(outdir))
    app.synth()
    return dataclasses.replace(synthesized(outdir), app=app, stack=stack)


def synthesized(outdir: Path) -> Synth:
    """The stack synthesized into `outdir` already."""
    template_path = outdir / f"{STACK_NAME}.template.json"
    doc = json.loads(template_path.read_text(encoding="utf-8"))
    return Synth(outdir=outdir, template_path=template_path, doc=doc)


@pytest.fixture(scope="session")
def synth_with_config(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Synth]:
    """Synthesize the app for gpufleet.yaml followed by `extra` (YAML: a warm pool, ...)."""

    def with_config(extra: str) -> Synth:
        folder = tmp_path_factory.mktemp("config")
        config = folder / "gpufleet.yaml"
        base = (ROOT / "gpufleet.yaml").read_text(encoding="utf-8")
        config.write_text(base + extra, encoding="utf-8")
        return synthesize(folder / "cdk.out", {"config_file": str(config)})

    return with_config
