"""cfn-lint and cdk-nag (AwsSolutions) over the synthesized stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from aws_cdk import Validations
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint
from infra.app import build_app
from infra.constructs import nag

from constructs import IConstruct

if TYPE_CHECKING:
    from conftest import Synth

LINT_REGIONS = ["us-east-1", "us-west-2", "eu-west-1"]


def test_cfn_lint_has_no_errors(synth: Synth) -> None:
    matches = lint(
        synth.template_path.read_text(encoding="utf-8"),
        config=ManualArgs(regions=LINT_REGIONS),
    )
    errors = [m for m in matches if m.rule.id.startswith("E")]
    warnings = sorted({f"{m.rule.id}: {m.rule.shortdesc}" for m in matches} - set(errors))
    for warning in warnings:
        print("cfn-lint warning", warning)
    assert not errors, "\n".join(f"{m.rule.id} {m.path} {m.message}" for m in errors)


def _findings(scope: IConstruct) -> list[tuple[str, str, str]]:
    report = AwsSolutionsChecks().validate_scope(scope)
    return [
        (v.rule_name, r.construct_path or "", v.severity or "")
        for v in report.violations
        for r in v.violating_resources
    ]


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> IConstruct:
    """The app as `cdk synth` builds it (the session's `synth` is read from disk: it has no
    constructs)."""
    built, _ = build_app(outdir=str(tmp_path_factory.mktemp("nag.cdk.out")))
    return built


def test_cdk_nag_has_no_unacknowledged_findings(app: IConstruct) -> None:
    findings = _findings(app)
    assert not findings, "\n".join(f"{sev} {rule} at {path}" for rule, path, sev in findings)


def _acknowledgments(scope: IConstruct) -> Iterator[tuple[str, str, str]]:
    key = Validations.ACKNOWLEDGED_RULES_METADATA_KEY
    for construct in scope.node.find_all():
        for entry in construct.node.metadata:
            if entry.type == key:
                data: dict[str, Any] = entry.data
                for rule_id, reason in data.items():
                    yield construct.node.path, rule_id, str(reason)


def test_every_acknowledgment_has_a_written_reason(app: IConstruct) -> None:
    acknowledgments = list(_acknowledgments(app))
    assert acknowledgments
    for path, rule_id, reason in acknowledgments:
        assert len(reason.strip()) >= nag.MIN_REASON_LENGTH, (path, rule_id)


def test_every_acknowledgment_is_needed_also_with_the_optional_features(
    tmp_path: Path,
) -> None:
    """Without acknowledgments, each one must match a real finding and cover all of them.

    Built with the context switches that add resources (checkpoint grants) or remove them
    (intra-fleet rules), so those variants are checked by cdk-nag too. No synth: cdk-nag
    walks the construct tree.
    """
    recorded: list[tuple[str, str]] = []

    def record(scope: IConstruct, rule_id: str, reason: str) -> None:
        assert len(reason.strip()) >= nag.MIN_REASON_LENGTH
        recorded.append((scope.node.path, rule_id))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(nag, "acknowledge", record)
        app, _ = build_app(
            context={"checkpoint_uri": "s3://ckpt-bucket/gpufleet", "intra_fleet_traffic": "false"},
            outdir=str(tmp_path),
        )
    findings = {(rule, path) for rule, path, _ in _findings(app)}

    def covers(ack: tuple[str, str], finding: tuple[str, str]) -> bool:
        path, rule_id = ack
        rule, finding_path = finding
        return rule == rule_id and (finding_path == path or finding_path.startswith(path + "/"))

    stale = [ack for ack in recorded if not any(covers(ack, f) for f in findings)]
    uncovered = [f for f in findings if not any(covers(ack, f) for ack in recorded)]
    assert len(findings) > 10  # the check really ran without acknowledgments
    assert any("Checkpoints" in str(ack) or "ckpt-bucket" in ack[1] for ack in recorded)
    assert not stale, f"acknowledged but not found: {stale}"
    assert not uncovered, f"found but not acknowledged: {uncovered}"
