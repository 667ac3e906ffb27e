"""What the people who run gpufleet watch: one CloudWatch dashboard, and alarms on the alerts topic.

The control plane's metrics (names, units, dimensions) come from `gpufleet.telemetry`, which the
functions publish with Powertools in the `GpuFleet` namespace; GPU utilization and temperature
come from the CloudWatch agent on the nodes (`CWAgent` `nvidia_smi_*`, configured in fleet.py).
Thresholds come from the deploy context (`infra/config.py`) and, for the GPU temperature, from
the policy file (`metrics.hot_temperature_celsius`, the limit the per-job alarms use too).
What each widget and alarm means, and what to do when one fires: docs/deploy.md, "Dashboard and
alarms".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sqs as sqs
from aws_cdk import aws_stepfunctions as sfn

from constructs import Construct
from gpufleet import telemetry
from gpufleet.domain.config import FleetConfig
from gpufleet.domain.job import TERMINAL_STATUSES, DroppedReport
from gpufleet.domain.launch import CapacityType, ErrorCategory
from gpufleet.domain.spec import Priority
from gpufleet.topology import AGENT_PERIOD_SECONDS
from infra.config import GpuFleetConfig
from infra.constructs.fleet import CWAGENT_CONFIG

PERIOD = Duration.minutes(5)
# The wait SLO is judged on the p95 of the admissions of a quarter of an hour: fewer admissions
# than that make a p95 of noise.
WAIT_SLO_PERIOD = Duration.minutes(15)

# The values each dimension takes. The dashboard draws one line per value and the alarms add
# them up (an alarm cannot SEARCH), so every value a function publishes must be listed here.
DIMENSION_VALUES: dict[str, tuple[str, ...]] = {
    telemetry.PRIORITY: tuple(p.value for p in Priority),
    telemetry.STATUS: tuple(sorted(s.value for s in TERMINAL_STATUSES)),
    telemetry.CAPACITY_TYPE: tuple(c.value for c in CapacityType),
    telemetry.ERROR_CATEGORY: (
        *(c.value for c in ErrorCategory),
        telemetry.UNKNOWN_ERROR_CATEGORY,
    ),
    telemetry.REPORT_PROBLEM: tuple(p.value for p in DroppedReport),
}


def _agent_gpu_metric(measurement: str) -> str:
    """The CWAgent metric of one NVIDIA measurement the nodes' agent is configured to collect."""
    config: Any = CWAGENT_CONFIG["metrics"]
    if measurement not in config["metrics_collected"]["nvidia_gpu"]["measurement"]:
        raise ValueError(f"the nodes' CloudWatch agent does not collect {measurement}")
    return f"nvidia_smi_{measurement}"


AGENT_NAMESPACE: str = CWAGENT_CONFIG["metrics"]["namespace"]  # type: ignore[index]
GPU_UTILIZATION = _agent_gpu_metric("utilization_gpu")
GPU_TEMPERATURE = _agent_gpu_metric("temperature_gpu")


def _math_id(value: str) -> str:
    """A metric-math id (lowercase letter first, then letters, digits, _) for a value."""
    return "v_" + re.sub(r"[^a-z0-9]", "_", value.lower())


def metric(
    spec: telemetry.Metric,
    statistic: str,
    *,
    dimensions: Mapping[str, str] | None = None,
    label: str | None = None,
    period: Duration = PERIOD,
) -> cloudwatch.Metric:
    """A gpufleet metric as Powertools publishes it: `service` plus the spec's dimensions."""
    given = dict(dimensions or {})
    if set(given) != set(spec.dimensions):
        raise ValueError(f"{spec.name} has dimensions {spec.dimensions}, got {sorted(given)}")
    return cloudwatch.Metric(
        namespace=telemetry.NAMESPACE,
        metric_name=spec.name,
        dimensions_map={telemetry.SERVICE_DIMENSION: telemetry.SERVICE, **given},
        statistic=statistic,
        label=label or spec.description,
        period=period,
    )


def metrics_by_value(spec: telemetry.Metric, statistic: str) -> dict[str, cloudwatch.Metric]:
    """One metric per value of the spec's one dimension, keyed by metric-math id."""
    (dimension,) = spec.dimensions
    return {
        _math_id(value): metric(spec, statistic, dimensions={dimension: value}, label=value)
        for value in DIMENSION_VALUES[dimension]
    }


def total(metrics: Mapping[str, cloudwatch.IMetric], label: str) -> cloudwatch.MathExpression:
    """The sum of several series; a series without data in a period counts as 0."""
    terms = ", ".join(f"FILL({metric_id}, 0)" for metric_id in metrics)
    return cloudwatch.MathExpression(
        expression=f"SUM([{terms}])", using_metrics=dict(metrics), label=label, period=PERIOD
    )


def agent_search(metric_name: str, statistic: str) -> str:
    """Every GPU's series of a CWAgent metric, whatever dimensions the agent attaches to it."""
    return (
        f'SEARCH(\'Namespace="{AGENT_NAMESPACE}" MetricName="{metric_name}"\', '
        f"'{statistic}', {int(PERIOD.to_seconds())})"
    )


class Operations(Construct):
    """The dashboard, and one alarm per condition an operator must act on."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        config: GpuFleetConfig,
        fleet_config: FleetConfig,
        alerts: sns.ITopic,
        dead_letter_queues: Mapping[str, sqs.IQueue],
        functions: Mapping[str, lambda_.IFunction],
        state_machines: Mapping[str, sfn.IStateMachine],
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        self._alarm_prefix = f"{stack.stack_name}-"
        self._action = cloudwatch_actions.SnsAction(alerts)
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        hot = fleet_config.metrics.hot_temperature_celsius

        dead_letters = {
            name: queue.metric_approximate_number_of_messages_visible(
                statistic="Maximum", period=PERIOD, label=name
            )
            for name, queue in dead_letter_queues.items()
        }
        for name, visible in dead_letters.items():
            self._alarm(
                f"DeadLetters-{name}",
                visible,
                threshold=1,
                description=(
                    f"The dead-letter queue of {name} holds messages: deliveries or invocations "
                    "that failed after every retry. Read them, fix the cause, then redrive or "
                    "delete them."
                ),
            )

        executions = self._execution_alarms(state_machines)
        function_errors = self._function_error_alarms(functions)

        launch_failures = metrics_by_value(telemetry.LAUNCH_FAILURES, "Sum")
        self._alarm(
            "LaunchFailures",
            total(launch_failures, "launch failures, all categories"),
            threshold=config.launch_failures_per_5min,
            description=(
                f"{config.launch_failures_per_5min} or more launches got no capacity in 5 "
                "minutes. The dashboard's launch-failure widget shows the category: quota (raise "
                "the EC2 quota), configuration (launch template, subnets, AMI), capacity (allow "
                "more instance types, zones or on-demand)."
            ),
        )

        wait_p95 = metric(
            telemetry.WAIT_SECONDS, "p95", label="wait p95 (15 min)", period=WAIT_SLO_PERIOD
        )
        self._alarm(
            "WaitSlo",
            wait_p95,
            threshold=config.wait_slo_seconds,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            description=(
                f"The p95 queue wait of the last 15 minutes' admissions is over the SLO of "
                f"{config.wait_slo_seconds} s. Look at queue depth by priority, GPUs held against "
                "max_gpus and team quotas, and at launch failures."
            ),
        )

        self._alarm(
            "BudgetBreaches",
            metric(telemetry.BUDGET_BREACHES, "Sum"),
            threshold=1,
            description=(
                "A job was stopped or held because its team's budget is spent. Raise the team's "
                "monthly_budget_usd in the config file or tell the team."
            ),
        )

        self._alarm(
            "OverheatedJobs",
            metric(telemetry.OVERHEATED_JOBS, "Sum"),
            threshold=1,
            description=(
                f"A job was moved off a GPU hotter than {hot:g} C. Check the instance (cooling, "
                "power draw) in the GPU temperature widget; the job was checkpointed and requeued."
            ),
        )

        gpu_period = Duration.seconds(
            max(AGENT_PERIOD_SECONDS, fleet_config.metrics.period_seconds)
        )
        # Metrics Insights, since an alarm cannot SEARCH (the query is built from constants).
        hottest_gpu = cloudwatch.MathExpression(
            expression=f"SELECT MAX({GPU_TEMPERATURE}) FROM {AGENT_NAMESPACE}",  # noqa: S608
            using_metrics={},
            label="hottest GPU",
            period=gpu_period,
        )
        self._alarm(
            "GpuTemperature",
            hottest_gpu,
            threshold=hot,
            comparison=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=fleet_config.metrics.hot_periods,
            description=(
                f"A GPU reported by the CloudWatch agent ran above {hot:g} C for "
                f"{fleet_config.metrics.hot_periods} periods of {int(gpu_period.to_seconds())} s. "
                "gpufleet moves the job off it; if it does not (OverheatedJobs stays 0), check "
                "the node agent, then cancel the job or terminate the instance."
            ),
        )

        self.dashboard = cloudwatch.Dashboard(
            self,
            "Dashboard",
            dashboard_name=f"{stack.stack_name}-{stack.region}",
            default_interval=Duration.hours(6),
        )
        self._widgets(config, hot, launch_failures, wait_p95, dead_letters)
        self._failure_widgets(executions, function_errors)
        self.dashboard_url = (
            f"https://{stack.region}.console.aws.amazon.com/cloudwatch/home?region="
            f"{stack.region}#dashboards/dashboard/{self.dashboard.dashboard_name}"
        )

    def _execution_alarms(
        self, state_machines: Mapping[str, sfn.IStateMachine]
    ) -> list[cloudwatch.IMetric]:
        """Every execution that ended without succeeding: its job may hold instances that no
        workflow will release."""
        measures: list[cloudwatch.IMetric] = []
        for name, machine in state_machines.items():
            outcomes = (
                ("ExecutionsFailed", machine.metric_failed, "failed"),
                ("ExecutionsTimedOut", machine.metric_timed_out, "timed out"),
                ("ExecutionsAborted", machine.metric_aborted, "was stopped (StopExecution)"),
            )
            for metric_name, metric_of, what in outcomes:
                measure = metric_of(statistic="Sum", period=PERIOD, label=f"{name} {what}")
                self._alarm(
                    f"{metric_name}-{name}",
                    measure,
                    threshold=1,
                    description=(
                        f"An execution of the {name} state machine {what}. Open it in the Step "
                        "Functions console (it is named after the job id): the last events say "
                        "which state and why. Its job may still hold instances: check the job "
                        "(`gpufleet status ID`) and the instances tagged with it, then fix the "
                        "cause and cancel or resubmit the job."
                    ),
                )
                measures.append(measure)
        return measures

    def _function_error_alarms(
        self, functions: Mapping[str, lambda_.IFunction]
    ) -> list[cloudwatch.IMetric]:
        """One alarm per function: an alarm on metric math may read at most 10 metrics."""
        measures: list[cloudwatch.IMetric] = []
        for name, function in functions.items():
            errors = function.metric_errors(statistic="Sum", period=PERIOD, label=name)
            self._alarm(
                f"FunctionErrors-{name}",
                errors,
                threshold=1,
                description=(
                    f"The {name} function raised an error (or timed out). Read its log group "
                    f"for the traceback; an asynchronous invocation is retried, and one that "
                    f"kept failing is in the DeadLetters-{name}Function queue."
                ),
            )
            measures.append(errors)
        return measures

    def _alarm(
        self,
        alarm_id: str,
        measure: cloudwatch.IMetric,
        *,
        threshold: float,
        description: str,
        comparison: cloudwatch.ComparisonOperator = (
            cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
        ),
        evaluation_periods: int = 1,
    ) -> None:
        alarm = cloudwatch.Alarm(
            self,
            f"{alarm_id}Alarm",
            alarm_name=f"{self._alarm_prefix}{alarm_id}",
            alarm_description=description,
            metric=measure,
            threshold=threshold,
            comparison_operator=comparison,
            evaluation_periods=evaluation_periods,
            # No data is no trouble: quiet queues and idle fleets publish nothing.
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        # OK too, so that whoever was paged also learns that it cleared.
        alarm.add_alarm_action(self._action)
        alarm.add_ok_action(self._action)
        self.alarms[alarm_id] = alarm

    def _failure_widgets(
        self, executions: list[cloudwatch.IMetric], function_errors: list[cloudwatch.IMetric]
    ) -> None:
        counts = cloudwatch.YAxisProps(min=0, show_units=False)
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Executions that did not succeed",
                left=executions,
                left_y_axis=counts,
                width=12,
            ),
            cloudwatch.GraphWidget(
                title="Function errors",
                left=function_errors,
                stacked=True,
                left_y_axis=counts,
                width=12,
            ),
        )

    def _widgets(
        self,
        config: GpuFleetConfig,
        hot: float,
        launch_failures: Mapping[str, cloudwatch.IMetric],
        wait_p95: cloudwatch.IMetric,
        dead_letters: Mapping[str, cloudwatch.IMetric],
    ) -> None:
        queue_depth = metrics_by_value(telemetry.QUEUE_DEPTH, "Maximum")
        launched = metrics_by_value(telemetry.INSTANCES_LAUNCHED, "Sum")
        spot = _math_id(CapacityType.SPOT.value)
        mean_utilization = cloudwatch.MathExpression(
            expression=f"AVG({agent_search(GPU_UTILIZATION, 'Average')})",
            using_metrics={},
            label="mean GPU utilization (%)",
        )
        counts = cloudwatch.YAxisProps(min=0, show_units=False)
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Queue depth by priority",
                left=list(queue_depth.values()),
                stacked=True,
                left_y_axis=counts,
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Jobs by status",
                left=[
                    metric(telemetry.RUNNING_JOBS, "Maximum", label="running"),
                    total(queue_depth, "queued"),
                ],
                right=[
                    metric(telemetry.JOBS_ACCEPTED, "Sum", label="accepted"),
                    metric(telemetry.JOBS_REJECTED, "Sum", label="rejected"),
                    metric(telemetry.ADMITTED, "Sum", label="admitted"),
                    *metrics_by_value(telemetry.JOBS_ENDED, "Sum").values(),
                ],
                left_y_axis=counts,
                right_y_axis=cloudwatch.YAxisProps(min=0, label="per 5 min", show_units=False),
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="GPUs held vs utilized",
                left=[
                    metric(telemetry.GPUS_HELD, "Maximum", label="GPUs held"),
                    cloudwatch.MathExpression(
                        expression="held * utilization / 100",
                        using_metrics={
                            "held": metric(telemetry.GPUS_HELD, "Maximum"),
                            "utilization": mean_utilization,
                        },
                        label="GPUs utilized (held x mean utilization)",
                    ),
                ],
                right=[mean_utilization],
                left_y_axis=counts,
                right_y_axis=cloudwatch.YAxisProps(min=0, max=100, label="%", show_units=False),
                width=8,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Spot vs on-demand share (launches)",
                left=list(launched.values()),
                right=[
                    cloudwatch.MathExpression(
                        expression=f"100 * FILL({spot}, 0) / launches",
                        using_metrics={
                            spot: launched[spot],
                            "launches": total(launched, "instances launched"),
                        },
                        label="spot share of launches (%)",
                    )
                ],
                left_y_axis=cloudwatch.YAxisProps(min=0, label="instances", show_units=False),
                right_y_axis=cloudwatch.YAxisProps(min=0, max=100, label="%", show_units=False),
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Cost per hour (USD)",
                left=[metric(telemetry.COST_PER_HOUR, "Maximum", label="USD per hour, all held")],
                right=[metric(telemetry.JOB_COST, "Sum", label="cost of jobs ended (USD)")],
                left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                right_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Queue wait (seconds)",
                left=[
                    metric(telemetry.WAIT_SECONDS, "p50", label="wait p50"),
                    wait_p95,
                ],
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(
                        value=config.wait_slo_seconds, label="wait SLO (p95)"
                    )
                ],
                left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                width=8,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="Spot interruptions and on-demand fallbacks",
                left=[
                    metric(telemetry.SPOT_INTERRUPTIONS, "Sum", label="spot interruptions"),
                    metric(telemetry.ONDEMAND_FALLBACKS, "Sum", label="on-demand fallbacks"),
                    metric(telemetry.PREEMPTED, "Sum", label="preempted for priority"),
                ],
                left_y_axis=counts,
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Launch failures by category",
                left=list(launch_failures.values()),
                stacked=True,
                left_annotations=[
                    cloudwatch.HorizontalAnnotation(
                        value=config.launch_failures_per_5min, label="alarm"
                    )
                ],
                left_y_axis=counts,
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Jobs flagged or stopped",
                left=[
                    metric(telemetry.BUDGET_BREACHES, "Sum", label="budget breaches"),
                    metric(telemetry.OVERHEATED_JOBS, "Sum", label="moved off a hot GPU"),
                    metric(telemetry.IDLE_JOBS, "Sum", label="idle GPUs"),
                    metric(telemetry.ORPHANS_TERMINATED, "Sum", label="orphans terminated"),
                    *(
                        metric(
                            telemetry.NODE_REPORTS_DROPPED,
                            "Sum",
                            dimensions={telemetry.REPORT_PROBLEM: problem.value},
                            label=f"node reports dropped: {problem.value}",
                        )
                        for problem in DroppedReport
                    ),
                ],
                left_y_axis=counts,
                width=8,
            ),
        )
        self.dashboard.add_widgets(
            cloudwatch.GraphWidget(
                title="GPU temperature (C)",
                left=[
                    cloudwatch.MathExpression(
                        expression=f"MAX({agent_search(GPU_TEMPERATURE, 'Maximum')})",
                        using_metrics={},
                        label="hottest GPU",
                    )
                ],
                left_annotations=[cloudwatch.HorizontalAnnotation(value=hot, label="hot")],
                left_y_axis=cloudwatch.YAxisProps(min=0, show_units=False),
                width=8,
            ),
            cloudwatch.GraphWidget(
                title="Dead-letter queues (messages)",
                left=list(dead_letters.values()),
                left_y_axis=counts,
                width=8,
            ),
            cloudwatch.AlarmStatusWidget(
                title="Alarms",
                alarms=list(self.alarms.values()),
                width=8,
                height=6,
            ),
        )
