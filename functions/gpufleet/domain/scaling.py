"""Metric-driven decisions: which alarms watch a job, when one goes off, and how an elastic
job changes shape.

Every alarm watches a metric the node agents publish per job (`GpuFleet/Jobs`, dimension
`JobId`) over periods of `MetricPolicy.period_seconds`, and goes off when every one of its last
`periods` periods breaches. The alarms are no CloudWatch alarms (CloudWatch takes 3
`PutMetricAlarm` and 3 `DeleteAlarms` a second: a sweep of 10,000 jobs would take hours to
arm): the MetricWatch function reads every running job's series once a minute with
`GetMetricData` (`metric_batches`) and `evaluate_alarms` decides, with the semantics a
CloudWatch alarm has (missing data is not breaching; an action on each change to ALARM only).
What each alarm then does is `services/actions.py`'s business.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping, Sequence
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


# GetMetricData's limits (CloudWatch API reference, "GetMetricData"): at most 500
# MetricDataQuery structures a call, and 100,800 data points a call (more come in pages).
MAX_QUERIES_PER_CALL = 500
MAX_DATAPOINTS_PER_CALL = 100_800


class Comparison(StrEnum):
    BELOW = "LessThanThreshold"
    ABOVE = "GreaterThanThreshold"

    def breaches(self, value: float, threshold: float) -> bool:
        return value < threshold if self is Comparison.BELOW else value > threshold


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

    @property
    def lookback_periods(self) -> int:
        """The periods of data the rule reads: one more for a change (the first change needs
        a value before it)."""
        return self.periods + 1 if self.change else self.periods


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


@dataclass(frozen=True, order=True)
class SeriesQuery:
    """One series a job's rules read: a metric of the job, one statistic per period."""

    job_id: str
    metric: str
    statistic: str
    period_seconds: int


# A series as GetMetricData answers it: (epoch seconds of each period's start, value), oldest
# first; a period without data has no point.
Series = Sequence[tuple[float, float]]


def series_query(job_id: str, rule: AlarmRule) -> SeriesQuery:
    return SeriesQuery(job_id, rule.metric, rule.statistic, rule.period_seconds)


@dataclass(frozen=True)
class MetricBatch:
    """One GetMetricData call: its series over the same window, whole periods from `start` to
    `end` (epoch seconds)."""

    start: float
    end: float
    queries: tuple[SeriesQuery, ...]


def metric_batches(wanted: Mapping[SeriesQuery, int], now: float) -> tuple[MetricBatch, ...]:
    """The GetMetricData calls that read each series over the periods it needs (`wanted`: its
    rules' longest lookback): the longest windows first, each call as many series as fit its
    limits (500 queries, 100,800 points over the call's window), so none needs a second page."""
    ordered = sorted(
        wanted.items(), key=lambda item: (-item[1] * item[0].period_seconds, item[0].job_id)
    )
    batches: list[MetricBatch] = []
    chunk: list[SeriesQuery] = []
    window = points = 0
    end = 0.0
    for query, periods in ordered:
        if not chunk:
            window = periods * query.period_seconds  # the longest of the call: its first
            end = evaluated_until(now, query.period_seconds)
        # The points one series returns over the call's window (one a period, and one more
        # where the window does not start on a period boundary).
        more = math.ceil(window / query.period_seconds) + 1
        if len(chunk) == MAX_QUERIES_PER_CALL or points + more > MAX_DATAPOINTS_PER_CALL:
            batches.append(MetricBatch(end - window, end, tuple(chunk)))
            chunk, window, points = [], periods * query.period_seconds, 0
            end = evaluated_until(now, query.period_seconds)
            more = math.ceil(window / query.period_seconds) + 1
        chunk.append(query)
        points += more
    if chunk:
        batches.append(MetricBatch(end - window, end, tuple(chunk)))
    return tuple(batches)


def watched_series(jobs: Mapping[str, Sequence[AlarmRule]]) -> dict[SeriesQuery, int]:
    """Each series the jobs' rules read (rules on one metric and statistic share it), with the
    most periods any of them looks back."""
    wanted: dict[SeriesQuery, int] = {}
    for job_id, rules in jobs.items():
        for rule in rules:
            query = series_query(job_id, rule)
            wanted[query] = max(wanted.get(query, 0), rule.lookback_periods)
    return wanted


def evaluated_until(now: float, period_seconds: int) -> float:
    """The end of the last whole period before `now`: what an evaluation at `now` reads up to
    (periods start on multiples of their length, as CloudWatch aligns them; the period under
    way is not complete)."""
    return math.floor(now / period_seconds) * period_seconds


def breaching(rule: AlarmRule, series: Series, now: float) -> bool:
    """Every one of the rule's last `periods` whole periods (before `now`) has data that
    breaches, as a CloudWatch alarm with `DatapointsToAlarm` = `EvaluationPeriods` and missing
    data not breaching sees it; a change rule compares each period's change from the one before
    (the metric math `DIFF`)."""
    end = evaluated_until(now, rule.period_seconds)
    since = end - rule.lookback_periods * rule.period_seconds
    values = [value for at, value in series if since <= at < end]
    if rule.change:
        values = [after - before for before, after in itertools.pairwise(values)]
    recent = values[-rule.periods :]
    return len(recent) == rule.periods and all(
        rule.comparison.breaches(value, rule.threshold) for value in recent
    )


@dataclass(frozen=True)
class AlarmEvaluation:
    alarming: tuple[AlarmKind, ...]  # the job's alarms in ALARM now (what `Job.alarming` keeps)
    fired: tuple[AlarmKind, ...]  # those that just went into ALARM: their actions are due


def evaluate_alarms(
    job_id: str,
    rules: Sequence[AlarmRule],
    series: Mapping[SeriesQuery, Series],
    alarming: Collection[AlarmKind],
    now: float,
) -> AlarmEvaluation:
    """Which of the job's alarms are in ALARM now, and which just went there (were not in
    `alarming`, the state the last evaluation left): only a change to ALARM acts, as a
    CloudWatch alarm's state change does, so evaluating the same data again does nothing."""
    now_alarming = tuple(
        rule.kind
        for rule in rules
        if breaching(rule, series.get(series_query(job_id, rule), ()), now)
    )
    fired = tuple(kind for kind in now_alarming if kind not in alarming)
    return AlarmEvaluation(alarming=now_alarming, fired=fired)


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
