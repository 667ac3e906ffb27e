"""`gpufleet doctor`: read what the first job needs from the account, and judge it.

The reads go through an `AccountProbe` (read-only; `adapters/aws/account_probe.py` on AWS and on
the emulator); each verdict is a function of `domain.readiness`. A check whose read failed
fails with what could not be read; a check that needs what an earlier one could not give
(credentials, the stack's outputs) is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gpufleet import topology
from gpufleet.domain import readiness
from gpufleet.domain.catalog import Catalog
from gpufleet.domain.readiness import (
    Check,
    CheckStatus,
    Identity,
    Network,
    ProbeError,
    StackFacts,
    Subscription,
)
from gpufleet.settings import Settings


class AccountProbe(Protocol):
    def identity(self) -> Identity: ...
    def stack(self, name: str) -> StackFacts: ...
    def ssm_parameters(self, names: Sequence[str]) -> dict[str, str]: ...
    def role_exists(self, name: str) -> bool: ...
    def vcpu_quota(self, code: str) -> float: ...
    def lambda_concurrency(self) -> int: ...
    def network(self, subnet_ids: Sequence[str]) -> Network: ...
    def subscriptions(self, topic_arn: str) -> list[Subscription]: ...


@dataclass(frozen=True)
class Target:
    """What the CLI resolved: the region, the stack named (if any), and the deployment's
    settings, or why there are none."""

    region: str | None
    stack_name: str | None
    settings: Settings | None
    error: str | None = None


def diagnose(probe: AccountProbe, target: Target, catalog: Catalog) -> list[Check]:
    """Every check, in the order a user fixes them."""
    try:
        identity = probe.identity()
    except ProbeError as exc:
        credentials = exc.as_check(readiness.CREDENTIALS, readiness.CREDENTIALS_FIX)
        return [credentials, *_skip_rest("needs working credentials")]
    credentials = readiness.check_credentials(identity, target.region)
    if credentials.status is CheckStatus.FAIL or target.region is None:
        return [credentials, *_skip_rest("needs a region")]
    region = target.region

    checks = [credentials]
    stack: StackFacts | None = None
    if target.stack_name:
        try:
            stack = probe.stack(target.stack_name)
            checks.append(readiness.check_stack(stack, topology.STACK_OUTPUTS))
        except ProbeError as exc:
            checks.append(exc.as_check(readiness.STACK))
    else:
        checks.append(readiness.check_environment_target(target.error))
    checks.append(_ssm_parameters(probe, stack, target, region))
    checks.append(_read(readiness.SPOT_ROLE, lambda: _spot_role(probe)))
    checks.append(
        _read(
            readiness.LAMBDA_CONCURRENCY,
            lambda: readiness.check_lambda_concurrency(probe.lambda_concurrency(), region),
        )
    )

    settings = target.settings
    if settings is None:
        return [*checks, *_skip_deployment("needs the stack's outputs")]
    needs = readiness.vcpu_needs(settings.config, catalog, region)
    for quota in readiness.VCPU_QUOTAS:
        checks.append(
            _read(
                readiness.quota_check_name(quota),
                lambda q=quota: readiness.check_vcpu_quota(
                    q, probe.vcpu_quota(q.code), needs.get(q.code)
                ),
            )
        )
    checks.append(
        _read(
            readiness.SUBNETS,
            lambda: readiness.check_subnets(
                settings.subnet_ids, probe.network(settings.subnet_ids), region, settings.config
            ),
        )
    )
    checks.append(_alerts(probe, settings))
    return checks


def diagnose_without_region() -> list[Check]:
    """Nothing can be read without a region: say so, and skip the rest."""
    return [readiness.no_region(), *_skip_rest("needs a region")]


def _ssm_parameters(
    probe: AccountProbe, stack: StackFacts | None, target: Target, region: str
) -> Check:
    if stack is None:
        why = "needs the stack" if target.stack_name else "needs --stack (the stack's parameters)"
        return readiness.skipped(readiness.SSM_PARAMETERS, why)
    wanted = stack.ssm_parameters
    return _read(
        readiness.SSM_PARAMETERS,
        lambda: readiness.check_ssm_parameters(
            wanted, probe.ssm_parameters(list(wanted.values())), region
        ),
    )


def _spot_role(probe: AccountProbe) -> Check:
    return readiness.check_spot_role(probe.role_exists(readiness.SPOT_ROLE_NAME))


def _alerts(probe: AccountProbe, settings: Settings) -> Check:
    topic = settings.notify_topic_arn
    if not topic:
        return readiness.check_alerts(topic, [])
    return _read(
        readiness.ALERTS, lambda: readiness.check_alerts(topic, probe.subscriptions(topic))
    )


class _Judgement(Protocol):
    def __call__(self) -> Check: ...


def _read(name: str, judge: _Judgement) -> Check:
    try:
        return judge()
    except ProbeError as exc:
        return exc.as_check(name)


_DEPLOYMENT_CHECKS = (
    *(readiness.quota_check_name(q) for q in readiness.VCPU_QUOTAS),
    readiness.SUBNETS,
    readiness.ALERTS,
)


def _skip_deployment(why: str) -> list[Check]:
    return [readiness.skipped(name, why) for name in _DEPLOYMENT_CHECKS]


def _skip_rest(why: str) -> list[Check]:
    names = (
        readiness.STACK,
        readiness.SSM_PARAMETERS,
        readiness.SPOT_ROLE,
        readiness.LAMBDA_CONCURRENCY,
    )
    return [readiness.skipped(name, why) for name in names] + _skip_deployment(why)
