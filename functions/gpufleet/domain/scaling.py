"""Metric-driven decisions: which alarms watch a job, and how an elastic job changes shape.

Every alarm watches a metric the node agents publish per job (`GpuFleet/Jobs`, dimension
`JobId`) over periods of `MetricPolicy.period_seconds`, and goes off when every one of its last
`periods` periods breaches. What each alarm then does is `services/actions.py`'s business.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum

from gpufleet.domain.config import MetricPolicy, most_alarm_periods
from gpufleet.domain.spec import JobSpec, Resources
from gpufleet.topology import (
    GPU_MEMORY_METRIC,
    GPU_TEMPERATURE_METRIC,
    GPU_UTILIZATION_METRIC,
)


class AlarmKind(StrEnum):
    """The last part of an alarm's name (`gpufleet-<job>-<kind>`): no dashes."""

    IDLE = "idle"  # GPUs barely used: flag or release, or scale an elastic job in
    HOT = "hot"  # a GPU too hot: alert and move the job
    LEAK = "leak"  # GPU memory keeps growing: alert and restart the job
    BUSY = "busy"  # GPUs saturated: scale an elastic job out
    SCALE_ON = "scaleon"  # the job's own metric (spec `scale_on`): scale it out


class Comparison(StrEnum):
    BELOW = "LessThanThreshold"
    ABOVE = "GreaterThanThreshold"


@dataclass(frozen=True)
class AlarmRule:
    kind: AlarmKind
    description: str
    metric: str
    statistic: str  # CloudWatch statistic of each period
    comparison: Comparison
    threshold: float
    periods: int
    period_seconds: int
    # Compare each period's change from the period before (CloudWatch metric math DIFF), not
    # the value itself: "grew in every one of the last N periods".
    change: bool = False


def job_alarm_rules(spec: JobSpec, policy: MetricPolicy) -> tuple[AlarmRule, ...]:
    """The alarms a job gets when it launches, for the shape it launches with: an elastic job
    already at its largest gets no scale-out alarm."""
    if not policy.enabled:
        return ()
    period = policy.period_seconds
    rules = [
        AlarmRule(
            AlarmKind.IDLE,
            "GPUs idle",
            GPU_UTILIZATION_METRIC,
            "Average",
            Comparison.BELOW,
            policy.low_utilization_percent,
            policy.low_utilization_periods,
            period,
        ),
        AlarmRule(
            AlarmKind.HOT,
            "a GPU runs too hot",
            GPU_TEMPERATURE_METRIC,
            "Maximum",
            Comparison.ABOVE,
            policy.hot_temperature_celsius,
            policy.hot_periods,
            period,
        ),
        AlarmRule(
            AlarmKind.LEAK,
            "GPU memory keeps growing",
            GPU_MEMORY_METRIC,
            "Maximum",
            Comparison.ABOVE,
            policy.memory_leak_growth_mib,
            policy.memory_leak_periods,
            period,
            change=True,
        ),
    ]
    if scaled_out(spec.resources, policy.scale_step_nodes) is not None:
        rules.append(
            AlarmRule(
                AlarmKind.BUSY,
                "GPUs busy: more nodes would help",
                GPU_UTILIZATION_METRIC,
                "Average",
                Comparison.ABOVE,
                policy.high_utilization_percent,
                policy.high_utilization_periods,
                period,
            )
        )
        if spec.scale_on is not None:
            rule = spec.scale_on
            below = rule.below is not None
            threshold = rule.below if rule.below is not None else rule.above
            assert threshold is not None  # ScaleOn has exactly one of them
            rules.append(
                AlarmRule(
                    AlarmKind.SCALE_ON,
                    f"{rule.metric} {'below' if below else 'above'} {threshold:g}",
                    rule.metric,
                    "Average",
                    Comparison.BELOW if below else Comparison.ABOVE,
                    threshold,
                    # Whole periods, within what CloudWatch evaluates (a day of short ones).
                    min(
                        max(1, math.ceil(rule.for_minutes * 60 / period)),
                        most_alarm_periods(period),
                    ),
                    period,
                )
            )
    return tuple(rules)


def scaled_out(resources: Resources, step: int) -> Resources | None:
    """The elastic job's next larger shape, `step` nodes more (at most its max); None when it
    is not elastic or already at its max."""
    elastic = resources.elastic
    if elastic is None or resources.nodes >= elastic.max_nodes:
        return None
    return resources.model_copy(update={"nodes": min(elastic.max_nodes, resources.nodes + step)})


def scaled_in(resources: Resources, step: int) -> Resources | None:
    """The elastic job's next smaller shape, `step` nodes fewer (at least its min); None when it
    is not elastic or already at its min."""
    elastic = resources.elastic
    if elastic is None or resources.nodes <= elastic.min_nodes:
        return None
    return resources.model_copy(update={"nodes": max(elastic.min_nodes, resources.nodes - step)})
