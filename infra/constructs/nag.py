"""Acknowledging cdk-nag findings, always with a written reason.

cdk-nag 3 reads CDK's native acknowledgments (`Validations.of(scope).acknowledge`). Findings of
rules that report several per resource carry the finding in brackets, e.g.
`AwsSolutions-IAM5[Resource::*]`; each one is acknowledged on its own. The helpers below build
those ids the way cdk-nag prints them, so a changed resource or action shows up as a new,
unacknowledged finding instead of being silently covered.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from aws_cdk import Acknowledgment, CfnElement, Stack, Validations

from constructs import IConstruct

MIN_REASON_LENGTH = 20


def acknowledge(scope: IConstruct, rule_id: str, reason: str) -> None:
    """Acknowledge one cdk-nag finding on `scope` (and everything below it)."""
    if len(reason.strip()) < MIN_REASON_LENGTH:
        raise ValueError(f"acknowledging {rule_id} needs a real reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=rule_id, reason=reason))


def acknowledge_all(scope: IConstruct, rule_ids: Iterable[str], reason: str) -> None:
    for rule_id in rule_ids:
        acknowledge(scope, rule_id, reason)


def wildcard_actions(*actions: str) -> list[str]:
    """Finding ids of AwsSolutions-IAM5 for wildcard actions such as `ec2:Describe*`."""
    return [f"AwsSolutions-IAM5[Action::{action}]" for action in actions]


def wildcard_resources(*resources: str) -> list[str]:
    """Finding ids of AwsSolutions-IAM5 for wildcard resources, as cdk-nag renders them.

    Use `arn_of(element)` for a `GetAtt X.Arn` and `ref_of(element)` for a `Ref X`.
    """
    return [f"AwsSolutions-IAM5[Resource::{resource}]" for resource in resources]


def with_policy_variables(resource: str) -> str:
    """How cdk-nag prints a resource that names IAM policy variables: `${aws:X}` as `<aws:X>`."""
    return re.sub(r"\$\{([^}]*)\}", r"<\1>", resource)


def arn_of(element: IConstruct) -> str:
    """How cdk-nag prints `{"Fn::GetAtt": [<logical id>, "Arn"]}`."""
    return f"<{_logical_id(element)}.Arn>"


def ref_of(element: IConstruct) -> str:
    """How cdk-nag prints `{"Ref": <logical id>}`."""
    return f"<{_logical_id(element)}>"


def _logical_id(element: IConstruct) -> str:
    cfn = element if isinstance(element, CfnElement) else element.node.default_child
    if not isinstance(cfn, CfnElement):
        raise TypeError(f"{element.node.path} has no CloudFormation resource")
    return Stack.of(cfn).resolve(cfn.logical_id)  # type: ignore[no-any-return]
