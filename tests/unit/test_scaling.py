"""Metric-driven decisions, pure: elastic shapes and their bounds, the alarms a job gets, the
warm pool's top-up and release, when an alarm goes off (a leak's: a DIFF), and how the
running jobs' series are read in GetMetricData's limits."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpufleet.domain.config import FleetConfig, MetricPolicy, WarmPool
from gpufleet.domain.scaling import (
    MAX_DATAPOINTS_PER_CALL,
    MAX_QUERIES_PER_CALL,
    AlarmEvaluation,
    AlarmKind,
    AlarmRule,
    Comparison,
    SeriesQuery,
    breaching,
    evaluate_alarms,
    job_alarm_rules,
    metric_batches,
    scaled_in,
    scaled_out,
    series_query,
    watched_series,
)
from gpufleet.domain.spec import Elastic, JobSpec, Resources, SpecError, parse_spec
from gpufleet.domain.warm_pool import IdleInstance, warm_pool_change
from gpufleet.topology import GPU_MEMORY_METRIC, GPU_UTILIZATION_METRIC

ELASTIC = Elastic(min_nodes=1, max_nodes=4)


def resources(nodes: int, elastic: Elastic | None = ELASTIC) -> Resources:
    return Resources(gpus=8, nodes=nodes, elastic=elastic)


def spec(body: str = "") -> JobSpec:
    return parse_spec(f"name: a\nteam: t\nimage: img\ncommand: [python]\n{body}")


@pytest.mark.parametrize(
    ("nodes", "step", "expected"), [(1, 1, 2), (2, 1, 3), (3, 2, 4), (2, 5, 4), (4, 1, None)]
)
def test_scale_out_adds_a_step_up_to_max_nodes(nodes: int, step: int, expected: int | None) -> None:
    larger = scaled_out(resources(nodes), step)
    assert (larger.nodes if larger else None) == expected
    if larger is not None:  # everything else about the shape stays
        assert larger.gpus == 8 and larger.elastic == ELASTIC


@pytest.mark.parametrize(
    ("nodes", "step", "expected"), [(4, 1, 3), (2, 1, 1), (4, 5, 1), (1, 1, None)]
)
def test_scale_in_removes_a_step_down_to_min_nodes(
    nodes: int, step: int, expected: int | None
) -> None:
    smaller = scaled_in(resources(nodes), step)
    assert (smaller.nodes if smaller else None) == expected


def test_a_job_that_is_not_elastic_never_changes_shape() -> None:
    fixed = Resources(gpus=8, nodes=2)
    assert scaled_out(fixed, 1) is None and scaled_in(fixed, 1) is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("resources: {gpus: 1, nodes: 5, elastic: {min_nodes: 1, max_nodes: 4}}", "within"),
        ("resources: {gpus: 1, nodes: 1, elastic: {min_nodes: 2, max_nodes: 4}}", "within"),
        ("resources: {gpus: 1, nodes: 2, elastic: {min_nodes: 3, max_nodes: 2}}", "below"),
        ("resources: {gpus: 0, nodes: 1, elastic: {min_nodes: 1, max_nodes: 2}}", "GPU"),
        ("scale_on: {metric: loss, below: 1}", "elastic"),
        (
            "resources: {gpus: 1, elastic: {max_nodes: 2}}\n"
            "scale_on: {metric: samples_per_second, below: 1, above: 2}",
            "exactly one",
        ),
        (
            "resources: {gpus: 1, elastic: {max_nodes: 2}}\nscale_on: {metric: 'a b', below: 1}",
            "pattern",
        ),
    ],
)
def test_elastic_specs_are_validated(body: str, message: str) -> None:
    with pytest.raises(SpecError) as refused:
        spec(body)
    assert any(message in field.message for field in refused.value.fields)


def test_busy_must_be_above_idle_in_the_config() -> None:
    with pytest.raises(ValidationError, match="high_utilization_percent"):
        MetricPolicy(low_utilization_percent=50, high_utilization_percent=40)
    assert FleetConfig().warm_pool is None


def kinds(job: JobSpec, policy: MetricPolicy | None = None) -> set[AlarmKind]:
    return {rule.kind for rule in job_alarm_rules(job, policy or MetricPolicy())}


def test_every_job_is_watched_for_idle_hot_and_leaking_gpus() -> None:
    assert kinds(spec()) == {AlarmKind.IDLE, AlarmKind.HOT, AlarmKind.LEAK}
    assert kinds(spec(), MetricPolicy(enabled=False)) == set()


def test_an_elastic_job_below_its_max_is_also_watched_for_busy_gpus_and_its_own_metric() -> None:
    elastic = "resources: {gpus: 1, nodes: 1, elastic: {max_nodes: 2}}\n"
    scale_on = "scale_on: {metric: samples_per_second, below: 1000, for_minutes: 10}\n"
    assert AlarmKind.BUSY in kinds(spec(elastic))
    assert AlarmKind.SCALE_ON not in kinds(spec(elastic))
    assert kinds(spec(elastic + scale_on)) >= {AlarmKind.BUSY, AlarmKind.SCALE_ON}
    at_max = "resources: {gpus: 1, nodes: 2, elastic: {max_nodes: 2}}\n"
    assert kinds(spec(at_max + scale_on)) == {AlarmKind.IDLE, AlarmKind.HOT, AlarmKind.LEAK}


def test_alarm_rules_carry_the_configured_thresholds_and_windows() -> None:
    policy = MetricPolicy(
        period_seconds=60,
        high_utilization_percent=90,
        high_utilization_periods=20,
        memory_leak_growth_mib=64,
        memory_leak_periods=12,
    )
    job = spec(
        "resources: {gpus: 1, elastic: {max_nodes: 3}}\n"
        "scale_on: {metric: samples_per_second, below: 1000, for_minutes: 2.5}\n"
    )
    rules = {rule.kind: rule for rule in job_alarm_rules(job, policy)}
    busy, leak, own = rules[AlarmKind.BUSY], rules[AlarmKind.LEAK], rules[AlarmKind.SCALE_ON]
    assert (busy.metric, busy.comparison, busy.threshold, busy.periods) == (
        GPU_UTILIZATION_METRIC,
        Comparison.ABOVE,
        90,
        20,
    )
    # A leak is memory growing by more than the threshold in each period: a change, not a level.
    assert (leak.metric, leak.change, leak.threshold, leak.periods) == (
        GPU_MEMORY_METRIC,
        True,
        64,
        12,
    )
    # 2.5 minutes of one-minute periods: three periods, so never less than asked for.
    assert (own.metric, own.comparison, own.threshold, own.periods) == (
        "samples_per_second",
        Comparison.BELOW,
        1000,
        3,
    )


@pytest.mark.parametrize(
    "fields",
    [
        # 1,440 periods of 2 minutes: two days; CloudWatch evaluates a day of short periods.
        {"period_seconds": 120, "low_utilization_periods": 1440},
        {"period_seconds": 420, "high_utilization_periods": 206},
        {"period_seconds": 3600, "memory_leak_periods": 169},  # a week and an hour
        # The stack's GpuTemperature alarm is a Metrics Insights query: 3 hours back at most.
        {"period_seconds": 60, "hot_periods": 181},
        {"period_seconds": 10, "hot_periods": 181},  # the agent samples once a minute anyway
    ],
)
def test_alarm_windows_past_cloudwatchs_are_refused(fields: dict[str, int]) -> None:
    with pytest.raises(ValidationError, match="at most"):
        MetricPolicy.model_validate(fields)


def test_alarm_windows_up_to_cloudwatchs_are_accepted() -> None:
    MetricPolicy(period_seconds=120, low_utilization_periods=720, hot_periods=90)
    MetricPolicy(period_seconds=3600, memory_leak_periods=168)
    MetricPolicy(period_seconds=30, high_utilization_periods=1440, hot_periods=180)


def test_a_scale_on_window_is_whole_periods_within_a_day() -> None:
    # 1,440 minutes of 7-minute periods is 205.7 periods: 206 would pass a day (86,520 s).
    policy = MetricPolicy(period_seconds=420)
    job = spec(
        "resources: {gpus: 1, elastic: {max_nodes: 3}}\n"
        "scale_on: {metric: samples_per_second, below: 1000, for_minutes: 1440}\n"
    )
    own = next(r for r in job_alarm_rules(job, policy) if r.kind is AlarmKind.SCALE_ON)
    assert own.periods == 205 and own.periods * own.period_seconds <= 86_400


POOL = WarmPool(instance_type="g5.xlarge", count=2, ttl_minutes=30)
TTL = 30 * 60


def test_a_pool_in_demand_is_topped_up_and_a_smaller_pool_sheds_its_oldest() -> None:
    idle = [IdleInstance("i-b", 200.0)]
    assert warm_pool_change(POOL, idle, demand_at=1000, now=1000 + TTL - 1).launch == 1
    crowd = [IdleInstance("i-c", 300.0), IdleInstance("i-a", 100.0), IdleInstance("i-b", 200.0)]
    change = warm_pool_change(POOL, crowd, demand_at=1000, now=1100)
    assert change.launch == 0 and change.release == ["i-a"]


def test_a_pool_out_of_demand_releases_what_waited_a_ttl_and_adds_nothing() -> None:
    now = 10_000.0
    idle = [IdleInstance("i-old", now - TTL), IdleInstance("i-new", now - TTL + 60)]
    change = warm_pool_change(POOL, idle, demand_at=now - TTL, now=now)
    assert change.launch == 0 and change.release == ["i-old"]
    later = warm_pool_change(POOL, idle, demand_at=now - TTL, now=now + 60)
    assert later.release == ["i-new", "i-old"]


NOW = 1_767_225_600.0  # on a period boundary
PERIOD = 60
LEAK = AlarmRule(
    AlarmKind.LEAK, "leak", GPU_MEMORY_METRIC, "Maximum", Comparison.ABOVE, 1.0, 3, PERIOD, True
)


def points(values: list[float], now: float = NOW) -> list[tuple[float, float]]:
    """One point a period (at its start), the last in the period that ends at `now`."""
    first = now - len(values) * PERIOD
    return [(first + index * PERIOD, value) for index, value in enumerate(values)]


@pytest.mark.parametrize(
    ("memory", "breaches"),
    [
        ([1000, 1100, 1250, 1400], True),  # grew in each of the last three periods
        ([1000, 1100, 1100, 1400], False),  # flat for a period: no leak
        ([1000, 1400, 1300, 1500], False),  # freed some
        ([1000, 1100, 1200], False),  # not enough data yet: missing data is not breaching
        ([900, 1000, 1100, 1200, 1200], False),  # the last period counts, not older growth
    ],
)
def test_a_leak_alarm_breaches_only_on_growth_in_every_period(
    memory: list[float], breaches: bool
) -> None:
    assert breaching(LEAK, points(memory), NOW) is breaches


def test_an_alarm_needs_every_one_of_its_last_periods_to_breach() -> None:
    idle = next(r for r in job_alarm_rules(spec(), MetricPolicy(low_utilization_periods=3)))
    assert idle.kind is AlarmKind.IDLE
    assert breaching(idle, points([5, 5, 5]), NOW)
    assert not breaching(idle, points([5, 50, 5]), NOW)
    # A period without data inside the window (a checkpoint, a reboot) is not breaching.
    gap = points([5, 5, 5])
    assert not breaching(idle, gap[:1] + gap[2:], NOW)
    # Data older than the window does not count.
    assert not breaching(idle, points([5, 5, 5], now=NOW - 3 * PERIOD), NOW)
    # Nor does the period under way: half a period on, the same three whole periods breach.
    assert breaching(idle, [*points([5, 5, 5]), (NOW, 90.0)], NOW + PERIOD / 2)


def series_of(job_id: str, rules: tuple[AlarmRule, ...], metric: str, values: list[float]):
    [query] = {series_query(job_id, r) for r in rules if r.metric == metric}
    return {query: points(values)}


def test_an_alarm_acts_once_when_it_goes_off_and_again_only_after_it_cleared() -> None:
    rules = job_alarm_rules(spec(), MetricPolicy(low_utilization_periods=3))
    idle = series_of("j-1", rules, GPU_UTILIZATION_METRIC, [5, 5, 5])
    first = evaluate_alarms("j-1", rules, idle, (), NOW)
    assert first.fired == (AlarmKind.IDLE,) and first.alarming == (AlarmKind.IDLE,)
    # The same data again (a repeated pass, or the next minute still idle): no action.
    again = evaluate_alarms("j-1", rules, idle, first.alarming, NOW)
    assert again.fired == () and again.alarming == (AlarmKind.IDLE,)
    busy = series_of("j-1", rules, GPU_UTILIZATION_METRIC, [50, 50, 50])
    cleared = evaluate_alarms("j-1", rules, busy, again.alarming, NOW)
    assert cleared == AlarmEvaluation(alarming=(), fired=())
    assert evaluate_alarms("j-1", rules, idle, cleared.alarming, NOW).fired == (AlarmKind.IDLE,)
    # Another job's series is not this job's.
    assert evaluate_alarms("j-2", rules, idle, (), NOW).fired == ()


def test_idle_and_busy_read_one_series_and_a_leak_one_period_more() -> None:
    elastic = spec("resources: {gpus: 1, nodes: 1, elastic: {max_nodes: 2}}\n")
    rules = job_alarm_rules(elastic, MetricPolicy())
    wanted = watched_series({"j-1": rules})
    utilization = SeriesQuery("j-1", GPU_UTILIZATION_METRIC, "Average", 60)
    assert len(wanted) == 3  # utilization (idle and busy), temperature, memory
    assert wanted[utilization] == 30  # the longer of idle's 30 and busy's 15 periods
    assert wanted[SeriesQuery("j-1", GPU_MEMORY_METRIC, "Maximum", 60)] == 16


def test_10000_jobs_are_read_in_60_calls_within_getmetricdatas_limits() -> None:
    rules = job_alarm_rules(spec(), MetricPolicy())
    wanted = watched_series({f"j-{index}": rules for index in range(10_000)})
    batches = metric_batches(wanted, NOW)
    assert len(batches) == 60
    assert all(len(batch.queries) <= MAX_QUERIES_PER_CALL for batch in batches)
    assert sorted(q for batch in batches for q in batch.queries) == sorted(wanted)
    # Each series over at least the periods it needs.
    for batch in batches:
        assert all(batch.start <= NOW - wanted[q] * q.period_seconds for q in batch.queries)
        assert batch.end == NOW
    # Read mid-period, the windows end at the last whole period.
    assert {b.end for b in metric_batches(wanted, NOW + 59.5)} == {NOW}


def test_long_windows_get_fewer_series_a_call_to_stay_within_the_datapoint_limit() -> None:
    long = {SeriesQuery(f"j-{index}", "m", "Average", 60): 1440 for index in range(500)}
    batches = metric_batches(long, NOW)
    # 1,441 points a series at most: 69 series fit 100,800 points.
    assert [len(b.queries) for b in batches] == [69] * 7 + [17]
    assert all(len(b.queries) * 1441 <= MAX_DATAPOINTS_PER_CALL for b in batches)
    assert metric_batches({}, NOW) == ()
