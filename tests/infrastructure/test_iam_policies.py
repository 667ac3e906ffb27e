"""docs/iam/deployer.json and cfn-execution-*.json against what `cdk deploy` of the synthesized
assembly needs (scripts/iam_policies.py derives them; this says when they are stale)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from infra.stack import STACK_NAME

if TYPE_CHECKING:
    from conftest import Synth

ROOT = Path(__file__).resolve().parents[2]
IAM = ROOT / "docs" / "iam"


@pytest.fixture(scope="module")
def policies() -> ModuleType:
    spec = importlib.util.spec_from_file_location("iam_policies", ROOT / "scripts/iam_policies.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_deploy_policies_are_what_the_assembly_needs(
    synth: Synth, policies: ModuleType
) -> None:
    derived = policies.derived(synth.outdir, STACK_NAME, synth.template_path.name)
    written = {
        path.name: json.loads(path.read_text())
        for path in [IAM / policies.DEPLOYER_POLICY, *IAM.glob("cfn-execution-*.json")]
        if path.exists()
    }
    assert written == derived, "stale: run python scripts/iam_policies.py"


def test_every_resource_type_is_covered_and_each_file_fits_a_managed_policy(
    synth: Synth, policies: ModuleType
) -> None:
    needed = policies.needed_actions(synth.doc)
    granted = {
        action
        for path in IAM.glob("cfn-execution-*.json")
        for statement in json.loads(path.read_text())["Statement"]
        for action in statement["Action"]
    }
    for path in IAM.glob("*.json"):
        compact = json.dumps(json.loads(path.read_text()), separators=(",", ":"))
        assert len(compact) <= policies.MAX_POLICY_CHARACTERS, path.name
    types = {r["Type"] for r in synth.resources.values()}
    uncovered = {t for t in types if not any(t in needed[a] for a in granted if a in needed)}
    assert uncovered == set()
    assert "iam:PassRole" in granted  # the functions', the workflow's and the nodes' roles


def test_every_action_left_out_is_one_a_schema_of_the_template_lists(
    synth: Synth, policies: ModuleType
) -> None:
    stale = set(policies.NOT_NEEDED) - set(policies.needed_actions(synth.doc))
    assert stale == set(), "no longer listed by any resource type: drop from NOT_NEEDED"


def test_the_deployer_only_assumes_the_bootstrap_roles(policies: ModuleType) -> None:
    (statement,) = json.loads((IAM / policies.DEPLOYER_POLICY).read_text())["Statement"]
    assert statement["Action"] == ["sts:AssumeRole"]
    assert {r.split(":role/")[1].split("-role-")[0] for r in statement["Resource"]} == {
        "cdk-hnb659fds-deploy",
        "cdk-hnb659fds-file-publishing",
    }
