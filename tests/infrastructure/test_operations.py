"""The operations dashboard and alarms: they read what the functions publish, and page the topic."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn
from infra.config import ConfigError, GpuFleetConfig
from infra.constructs.operations import DIMENSION_VALUES, Operations, metric
from infra.stack import STACK_NAME

from gpufleet import telemetry, topology
from gpufleet.domain.config import FleetConfig, MetricPolicy

if TYPE_CHECKING:
    from conftest import Synth

Widget = dict[str, Any]
SERVICE = {telemetry.SERVICE_DIMENSION: telemetry.SERVICE}
BY_NAME = {spec.name: spec for spec in telemetry.ALL}


# -- reading the template ----------------------------------------------------------------------


def _dashboard(synth: Synth) -> tuple[str, list[Widget]]:
    ((logical_id, dashboard),) = synth.of_type("AWS::CloudWatch::Dashboard").items()
    body = synth.render(dashboard["Properties"]["DashboardBody"])
    widgets: list[Widget] = json.loads(body)["widgets"]
    return logical_id, widgets


def _widget(synth: Synth, title: str) -> Widget:
    _, widgets = _dashboard(synth)
    (widget,) = [w for w in widgets if w["properties"].get("title") == title]
    return widget


def _graph(widget: Widget) -> tuple[list[tuple[str, str, dict[str, str], dict[str, Any]]], str]:
    """(namespace, name, dimensions, options) of each metric line, and all expressions."""
    metrics = []
    expressions = []
    for row in widget["properties"]["metrics"]:
        *head, options = row
        if "expression" in options:
            expressions.append(options["expression"])
            continue
        namespace, name, *dimensions = head
        metrics.append(
            (namespace, name, dict(zip(dimensions[::2], dimensions[1::2], strict=True)), options)
        )
    return metrics, "\n".join(expressions)


def _alarms(synth_doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Alarm properties by alarm name."""
    return {
        r["Properties"]["AlarmName"]: r["Properties"]
        for r in synth_doc["Resources"].values()
        if r["Type"] == "AWS::CloudWatch::Alarm"
    }


def _queries(alarm: dict[str, Any]) -> list[dict[str, Any]]:
    """The alarm's metric data queries; a single-metric alarm's metric as one query."""
    if "Metrics" in alarm:
        queries: list[dict[str, Any]] = alarm["Metrics"]
        return queries
    return [
        {
            "Id": "m",
            "ReturnData": True,
            "MetricStat": {
                "Metric": {
                    "Namespace": alarm["Namespace"],
                    "MetricName": alarm["MetricName"],
                    "Dimensions": alarm.get("Dimensions", []),
                },
                "Stat": alarm.get("Statistic") or alarm.get("ExtendedStatistic"),
                "Period": alarm["Period"],
            },
        }
    ]


def _stat_dimensions(query: dict[str, Any]) -> dict[str, Any]:
    return {d["Name"]: d["Value"] for d in query["MetricStat"]["Metric"]["Dimensions"]}


def _reads(alarm: dict[str, Any], spec: telemetry.Metric) -> list[dict[str, Any]]:
    return [
        q
        for q in _queries(alarm)
        if "MetricStat" in q
        and q["MetricStat"]["Metric"]["Namespace"] == telemetry.NAMESPACE
        and q["MetricStat"]["Metric"]["MetricName"] == spec.name
    ]


# -- the dashboard -----------------------------------------------------------------------------


def _per_value(spec: telemetry.Metric) -> list[dict[str, str]]:
    """The dimension sets the dashboard must draw for a metric: one per value, or just service."""
    if not spec.dimensions:
        return [SERVICE]
    (dimension,) = spec.dimensions
    return [{**SERVICE, dimension: value} for value in DIMENSION_VALUES[dimension]]


REQUIRED_WIDGETS = {
    "Queue depth by priority": [telemetry.QUEUE_DEPTH],
    "Jobs by status": [
        telemetry.RUNNING_JOBS,
        telemetry.JOBS_ENDED,
        telemetry.JOBS_ACCEPTED,
        telemetry.JOBS_REJECTED,
    ],
    "GPUs held vs utilized": [telemetry.GPUS_HELD],
    "Spot vs on-demand share (launches)": [telemetry.INSTANCES_LAUNCHED],
    "Cost per hour (USD)": [telemetry.COST_PER_HOUR],
    "Spot interruptions and on-demand fallbacks": [
        telemetry.SPOT_INTERRUPTIONS,
        telemetry.ONDEMAND_FALLBACKS,
    ],
    "Queue wait (seconds)": [telemetry.WAIT_SECONDS],
    "Launch failures by category": [telemetry.LAUNCH_FAILURES],
    "Jobs flagged or stopped": [telemetry.NODE_REPORTS_DROPPED],
}


@pytest.mark.parametrize("title", REQUIRED_WIDGETS)
def test_required_widget_draws_its_metrics_per_dimension_value(synth: Synth, title: str) -> None:
    metrics, _ = _graph(_widget(synth, title))
    drawn = [(name, dims) for namespace, name, dims, _ in metrics if namespace == "GpuFleet"]
    for spec in REQUIRED_WIDGETS[title]:
        for dimensions in _per_value(spec):
            assert (spec.name, dimensions) in drawn, (spec.name, dimensions)


def test_every_gpufleet_metric_on_the_dashboard_is_one_the_functions_publish(
    synth: Synth,
) -> None:
    _, widgets = _dashboard(synth)
    seen = set()
    for widget in widgets:
        if widget["type"] != "metric":
            continue
        for namespace, name, dimensions, _ in _graph(widget)[0]:
            if namespace != telemetry.NAMESPACE:
                continue
            spec = BY_NAME[name]
            assert dimensions in _per_value(spec), (name, dimensions)
            seen.add(name)
    # Everything in telemetry is on the dashboard somewhere.
    assert seen == set(BY_NAME)


def test_the_wait_widget_shows_p95_against_the_slo(synth: Synth) -> None:
    widget = _widget(synth, "Queue wait (seconds)")
    stats = {options["stat"] for _, name, _, options in _graph(widget)[0]}
    assert "p95" in stats
    (annotation,) = widget["properties"]["annotations"]["horizontal"]
    assert annotation["value"] == GpuFleetConfig().wait_slo_seconds


@pytest.mark.parametrize(
    ("title", "measurement", "aggregate"),
    [
        ("GPUs held vs utilized", "utilization_gpu", "AVG"),
        ("GPU temperature (C)", "temperature_gpu", "MAX"),
    ],
)
def test_gpu_metrics_come_from_every_gpu_the_cloudwatch_agent_reports(
    synth: Synth, title: str, measurement: str, aggregate: str
) -> None:
    _, expressions = _graph(_widget(synth, title))
    # No schema in braces: whatever dimensions the agent attaches (InstanceId, index, name...).
    search = f'SEARCH(\'Namespace="CWAgent" MetricName="nvidia_smi_{measurement}"\''
    assert f"{aggregate}({search}" in expressions


def test_gpus_utilized_is_held_times_mean_utilization(synth: Synth) -> None:
    widget = _widget(synth, "GPUs held vs utilized")
    rows = widget["properties"]["metrics"]
    utilized = next(r[-1] for r in rows if "utilized" in r[-1].get("label", ""))
    assert utilized["expression"] == "held * utilization / 100"
    ids = {r[-1].get("id"): r for r in rows}
    assert ids["held"][:2] == ["GpuFleet", telemetry.GPUS_HELD.name]
    assert "nvidia_smi_utilization_gpu" in ids["utilization"][-1]["expression"]


def test_spot_share_divides_spot_launches_by_all_launches(synth: Synth) -> None:
    rows = _widget(synth, "Spot vs on-demand share (launches)")["properties"]["metrics"]
    ids = {r[-1]["id"]: r for r in rows if "id" in r[-1]}
    share = next(r[-1] for r in rows if "share" in r[-1].get("label", ""))
    assert share["expression"] == "100 * FILL(v_spot, 0) / launches"
    assert ids["v_spot"][:6] == [
        "GpuFleet",
        telemetry.INSTANCES_LAUNCHED.name,
        telemetry.CAPACITY_TYPE,
        "spot",
        telemetry.SERVICE_DIMENSION,
        telemetry.SERVICE,
    ]
    launches = ids["launches"][-1]["expression"]
    assert launches == "SUM([FILL(v_reserved, 0), FILL(v_spot, 0), FILL(v_on_demand, 0)])"


def test_dashboard_name_and_url_are_outputs(synth: Synth) -> None:
    logical_id, _ = _dashboard(synth)
    outputs = synth.doc["Outputs"]
    assert outputs["DashboardName"]["Value"] == {"Ref": logical_id}
    url = synth.render(outputs["DashboardUrl"]["Value"])
    assert url == (
        "https://<AWS::Region>.console.aws.amazon.com/cloudwatch/home?region=<AWS::Region>"
        f"#dashboards/dashboard/<{logical_id}>"
    )
    # Dashboards are global to the account: the region in the name keeps two regions apart.
    name = synth.render(synth.props(logical_id)["DashboardName"])
    assert name == f"{STACK_NAME}-<AWS::Region>"


def test_alarm_widget_lists_every_alarm(synth: Synth) -> None:
    widget = _widget(synth, "Alarms")
    alarm_ids = set(synth.of_type("AWS::CloudWatch::Alarm"))
    assert sorted(widget["properties"]["alarms"]) == sorted(f"<{a}.Arn>" for a in alarm_ids)


# -- the alarms --------------------------------------------------------------------------------


def test_every_alarm_notifies_the_alerts_topic_when_raised_and_cleared(synth: Synth) -> None:
    topic = synth.doc["Outputs"]["AlertsTopicArn"]["Value"]
    assert synth.resources[topic["Ref"]]["Type"] == "AWS::SNS::Topic"
    alarms = synth.of_type("AWS::CloudWatch::Alarm")
    assert len(alarms) > 5
    for alarm in alarms.values():
        assert alarm["Properties"]["AlarmActions"] == [topic]
        assert alarm["Properties"]["OKActions"] == [topic]
        assert alarm["Properties"]["TreatMissingData"] == "notBreaching"


def test_one_alarm_per_queue_in_the_stack(synth: Synth) -> None:
    """Every queue in the stack is a dead-letter queue, and each has its own alarm."""
    queues = synth.of_type("AWS::SQS::Queue")
    watched: list[str] = []
    for alarm in _alarms(synth.doc).values():
        for query in _queries(alarm):
            stat = query.get("MetricStat", {})
            if stat.get("Metric", {}).get("Namespace") != "AWS/SQS":
                continue
            assert stat["Metric"]["MetricName"] == "ApproximateNumberOfMessagesVisible"
            assert alarm["Threshold"] == 1
            assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
            queue_name = _stat_dimensions(query)["QueueName"]
            watched.append(queue_name["Fn::GetAtt"][0])
    assert queues
    assert sorted(watched) == sorted(queues)


def _one_metric(alarm: dict[str, Any]) -> tuple[str, str, dict[str, Any], str, int]:
    """Namespace, name, dimensions, statistic and period of an alarm on one metric; namespace
    "" for an alarm on metric math."""
    queries = _queries(alarm)
    if len(queries) != 1 or "MetricStat" not in queries[0]:
        return "", "", {}, "", 0
    (query,) = queries
    stat = query["MetricStat"]
    return (
        stat["Metric"]["Namespace"],
        stat["Metric"]["MetricName"],
        _stat_dimensions(query),
        stat["Stat"],
        stat["Period"],
    )


def _fires_on_any(alarm: dict[str, Any]) -> bool:
    return (
        alarm["Threshold"] == 1
        and alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"
        and alarm["EvaluationPeriods"] == 1
    )


def test_every_function_has_an_alarm_on_its_errors(synth: Synth) -> None:
    """All of them, whatever topology.FUNCTIONS holds: an error in any is someone's job lost."""
    watched = []
    for alarm in _alarms(synth.doc).values():
        namespace, name, dimensions, statistic, period = _one_metric(alarm)
        if namespace != "AWS/Lambda":
            continue
        assert (name, statistic, period) == ("Errors", "Sum", 300)
        assert _fires_on_any(alarm)
        watched.append(dimensions["FunctionName"]["Ref"])
    assert sorted(watched) == sorted(synth.function_id(f.construct_id) for f in topology.FUNCTIONS)


EXECUTION_OUTCOMES = ("ExecutionsFailed", "ExecutionsTimedOut", "ExecutionsAborted")


def test_every_state_machine_has_alarms_on_executions_that_did_not_succeed(
    synth: Synth,
) -> None:
    watched: dict[str, list[str]] = {}
    for alarm in _alarms(synth.doc).values():
        namespace, name, dimensions, statistic, period = _one_metric(alarm)
        if namespace != "AWS/States":
            continue
        assert (statistic, period) == ("Sum", 300)
        assert _fires_on_any(alarm)
        watched.setdefault(dimensions["StateMachineArn"]["Ref"], []).append(name)
    machines = synth.of_type("AWS::StepFunctions::StateMachine")
    assert len(machines) == len(topology.STATE_MACHINES)
    assert {m: sorted(names) for m, names in watched.items()} == {
        m: sorted(EXECUTION_OUTCOMES) for m in machines
    }


def test_the_dashboard_draws_failed_executions_and_function_errors(synth: Synth) -> None:
    executions, _ = _graph(_widget(synth, "Executions that did not succeed"))
    assert sorted(name for namespace, name, _, _ in executions if namespace == "AWS/States") == (
        sorted(EXECUTION_OUTCOMES * len(topology.STATE_MACHINES))
    )
    errors, _ = _graph(_widget(synth, "Function errors"))
    drawn = [name for namespace, name, _, _ in errors if namespace == "AWS/Lambda"]
    assert drawn == ["Errors"] * len(topology.FUNCTIONS)


def test_launch_failures_alarm_adds_up_every_category(synth: Synth) -> None:
    alarm = _alarms(synth.doc)[f"{STACK_NAME}-LaunchFailures"]
    reads = _reads(alarm, telemetry.LAUNCH_FAILURES)
    categories = {_stat_dimensions(q)[telemetry.ERROR_CATEGORY] for q in reads}
    assert categories == set(DIMENSION_VALUES[telemetry.ERROR_CATEGORY])
    for query in reads:
        assert _stat_dimensions(query)[telemetry.SERVICE_DIMENSION] == telemetry.SERVICE
        assert query["MetricStat"]["Stat"] == "Sum"
        assert query["MetricStat"]["Period"] == 300
    (result,) = [q for q in _queries(alarm) if q.get("ReturnData", True)]
    assert result["Expression"] == "SUM([{}])".format(
        ", ".join(f"FILL({q['Id']}, 0)" for q in reads)
    )


# -- thresholds from the deploy config ---------------------------------------------------------


def _operations_template(
    config: GpuFleetConfig, fleet_config: FleetConfig, *, stack_name: str = "OpsTest"
) -> dict[str, Any]:
    app = cdk.App()
    stack = cdk.Stack(app, stack_name)
    topic = sns.Topic(stack, "Alerts")
    queues = {name: sqs.Queue(stack, name) for name in ("OneFunction", "OneRuleTarget")}
    function = lambda_.Function(
        stack,
        "Function",
        runtime=lambda_.Runtime.PYTHON_3_12,
        handler="index.handler",
        code=lambda_.Code.from_inline("def handler(event, context):\n    return None\n"),
    )
    machine = sfn.StateMachine(
        stack, "Machine", definition_body=sfn.DefinitionBody.from_chainable(sfn.Pass(stack, "P"))
    )
    Operations(
        stack,
        "Operations",
        config=config,
        fleet_config=fleet_config,
        alerts=topic,
        dead_letter_queues=queues,
        functions={"One": function},
        state_machines={"OneMachine": machine},
    )
    template: dict[str, Any] = app.synth().get_stack_by_name(stack_name).template
    return template


@pytest.fixture(scope="module")
def custom() -> dict[str, dict[str, Any]]:
    config = GpuFleetConfig.from_context(
        {"wait_slo_seconds": "600", "launch_failures_per_5min": "12"}
    )
    policy = MetricPolicy(hot_temperature_celsius=78, hot_periods=4, period_seconds=120)
    return _alarms(_operations_template(config, FleetConfig(metrics=policy)))


def test_wait_slo_alarm_is_p95_of_wait_over_the_configured_slo(
    custom: dict[str, dict[str, Any]],
) -> None:
    alarm = custom["OpsTest-WaitSlo"]
    (query,) = _reads(alarm, telemetry.WAIT_SECONDS)
    assert query["MetricStat"]["Stat"] == "p95"
    assert _stat_dimensions(query) == SERVICE
    assert alarm["Threshold"] == 600
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_launch_failure_threshold_comes_from_the_context(
    custom: dict[str, dict[str, Any]],
) -> None:
    alarm = custom["OpsTest-LaunchFailures"]
    assert alarm["Threshold"] == 12
    assert alarm["ComparisonOperator"] == "GreaterThanOrEqualToThreshold"


@pytest.mark.parametrize(
    ("alarm_name", "spec"),
    [
        ("OpsTest-BudgetBreaches", telemetry.BUDGET_BREACHES),
        ("OpsTest-OverheatedJobs", telemetry.OVERHEATED_JOBS),
    ],
)
def test_any_breach_or_overheated_job_raises_its_alarm(
    custom: dict[str, dict[str, Any]], alarm_name: str, spec: telemetry.Metric
) -> None:
    alarm = custom[alarm_name]
    (query,) = _reads(alarm, spec)
    assert query["MetricStat"]["Stat"] == "Sum"
    assert _stat_dimensions(query) == SERVICE
    assert (alarm["Threshold"], alarm["ComparisonOperator"]) == (
        1,
        "GreaterThanOrEqualToThreshold",
    )


def test_gpu_temperature_alarm_uses_the_config_files_limit(
    custom: dict[str, dict[str, Any]],
) -> None:
    alarm = custom["OpsTest-GpuTemperature"]
    (query,) = alarm["Metrics"]
    # Metrics Insights: an alarm cannot SEARCH, but it can take the maximum over every GPU.
    assert query["Expression"] == "SELECT MAX(nvidia_smi_temperature_gpu) FROM CWAgent"
    assert query["Period"] == 120
    assert alarm["Threshold"] == 78
    assert alarm["EvaluationPeriods"] == 4
    assert alarm["ComparisonOperator"] == "GreaterThanThreshold"


def test_gpu_temperature_is_never_judged_faster_than_the_agent_samples() -> None:
    fast = FleetConfig(metrics=MetricPolicy(period_seconds=10))
    alarm = _alarms(_operations_template(GpuFleetConfig(), fast))["OpsTest-GpuTemperature"]
    assert alarm["Metrics"][0]["Period"] == 60


def test_the_given_queues_each_get_an_alarm(custom: dict[str, dict[str, Any]]) -> None:
    assert {"OpsTest-DeadLetters-OneFunction", "OpsTest-DeadLetters-OneRuleTarget"} <= set(custom)


def test_the_given_functions_and_state_machines_each_get_their_alarms(
    custom: dict[str, dict[str, Any]],
) -> None:
    assert {
        "OpsTest-FunctionErrors-One",
        *(f"OpsTest-{outcome}-OneMachine" for outcome in EXECUTION_OUTCOMES),
    } <= set(custom)


# -- helpers and config ------------------------------------------------------------------------


def test_a_metric_must_carry_exactly_its_published_dimensions() -> None:
    with pytest.raises(ValueError, match="Priority"):
        metric(telemetry.QUEUE_DEPTH, "Maximum")
    with pytest.raises(ValueError, match="dimensions"):
        metric(telemetry.GPUS_HELD, "Maximum", dimensions={telemetry.PRIORITY: "low"})


def test_alarm_thresholds_parse_from_cli_strings_and_have_defaults() -> None:
    config = GpuFleetConfig.from_context(
        {"wait_slo_seconds": "900", "launch_failures_per_5min": "3"}
    )
    assert (config.wait_slo_seconds, config.launch_failures_per_5min) == (900, 3)
    defaults = GpuFleetConfig.from_context({})
    assert (defaults.wait_slo_seconds, defaults.launch_failures_per_5min) == (1800, 5)


@pytest.mark.parametrize(
    "context",
    [{"wait_slo_seconds": "30"}, {"wait_slo_seconds": "soon"}, {"launch_failures_per_5min": "0"}],
)
def test_bad_alarm_thresholds_are_refused(context: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        GpuFleetConfig.from_context(context)
