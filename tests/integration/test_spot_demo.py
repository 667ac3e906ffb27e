"""The spot demo, run once: what it does, and the metrics it publishes against what the stack
reads. Every metric the stack reads is one the code publishes, and every one published is read.

Published, in the run of the spot demo on the embedded account (with the basic demo's event
submission and broken upload added: both intake functions, and a rejection):

- the functions' metrics: the embedded-metric-format lines Powertools prints, which the emulator
  stores in each function's log group (`emulator/metrics.py` reads them back);
- the node agents' metrics: their PutMetricData calls, kept by moto's CloudWatch;
- the CloudWatch agent's GPU metrics (`CWAgent`): from its configuration in the user data of the
  synthesized launch templates (that agent does not run in the emulator).

Read:

- by the dashboard and the stack's alarms: their metrics, `SEARCH` expressions and Metrics
  Insights queries, in the synthesized template;
- by MetricWatch: the metrics of each GetMetricData query the control plane sent in the run.

A metric is its namespace, name and dimension names: CloudWatch keys it so, and the same name
with other dimensions is another metric, which nothing draws. `AWS/` namespaces are the
services' own (Lambda errors, queue depths, executions), published by AWS.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

import pytest

from gpufleet import telemetry
from gpufleet.domain.catalog import load_bundled
from gpufleet.emulator.metrics import PublishedMetric
from tests.infrastructure.conftest import Synth
from tests.integration.demo_runs import SpotRun
from tests.integration.test_demo import by_name

pytestmark = pytest.mark.long  # whole demos: scheduled first (tests/conftest.py)

# Read by the stack, published by a path the demo does not take (or takes only when a race goes
# one way): metric -> the path. tests/unit/test_telemetry.py checks that a handler publishes it.
NOT_REACHED: dict[str, str] = {
    telemetry.OVERHEATED_JOBS.name: "MetricWatch, for a job's hot-GPU alarm (as it counts "
    "IdleJobs for the idle alarm, which the demo reaches): no demo job runs hot",
    telemetry.NODE_REPORTS_DROPPED.name: "NodeReport, for a report of no job, from an instance "
    "its job does not hold, or malformed: the demo's agents report only on their own runs "
    "(tests/integration/test_cli_queue.py forges some and reads these from NodeReport's log)",
    telemetry.ORPHANS_TERMINATED.name: "Reconcile, on every pass (a count of 0 too): its "
    "schedule fires every fifth tick of the emulator's scheduler (25 s), which a quick demo can "
    "end before (tests/unit/test_reconciler.py runs passes directly)",
    telemetry.SPOT_INTERRUPTIONS.name: "InstanceEvent, when EC2's interruption warning finds "
    "the job still on the instance: the demo's node usually checkpoints on its own notice first",
}

Dimensions = frozenset[tuple[str, str]]


@dataclasses.dataclass(frozen=True)
class Metric:
    """A metric as published or read. `dimensions` None: any (a read by SEARCH or Metrics
    Insights without a schema; the CloudWatch agent's metrics, which carry the agent's own
    dimensions). A value None: any value of that dimension (a per-job alarm's job id)."""

    namespace: str
    name: str
    dimensions: frozenset[tuple[str, str | None]] | None

    @property
    def dimension_names(self) -> frozenset[str] | None:
        return None if self.dimensions is None else frozenset(n for n, _ in self.dimensions)

    def __str__(self) -> str:
        names = "any" if self.dimension_names is None else ", ".join(sorted(self.dimension_names))
        return f"{self.namespace} {self.name} [{names}]"


def read_by(read: Metric, published: Metric) -> bool:
    """The read draws the published metric: same namespace, name and dimension names."""
    if (read.namespace, read.name) != (published.namespace, published.name):
        return False
    if read.dimensions is None:
        return True
    return published.dimensions is not None and read.dimension_names == published.dimension_names


def _not_aws(metrics: set[Metric]) -> set[Metric]:
    return {m for m in metrics if not m.namespace.startswith("AWS/")}


# -- what the demo did (conftest's `spot_demo`, shared with the least-privilege test) ---------


def test_the_spot_demo_survives_an_interruption_and_falls_back_to_on_demand(
    spot_demo: SpotRun,
) -> None:
    result = spot_demo.result
    assert result.completed and result.instances_running == 0
    assert result.rejected == 1  # the broken upload
    jobs = by_name(result)
    interrupted, fallback = jobs["interrupted-train"], jobs["no-spot-capacity"]
    assert interrupted["status"] == "SUCCEEDED"
    assert interrupted["interruptions"] == 1 and interrupted["retries"] == 0
    assert interrupted["resumed_from_checkpoint"]
    assert fallback["status"] == "SUCCEEDED"
    assert fallback["ondemand_fallback"] and fallback["capacity_type"] == "on-demand"
    assert not interrupted["ondemand_fallback"]
    for job in result.jobs:  # also over several runs on different instance types
        assert job["cost_usd"] == pytest.approx(
            job["hourly_usd"] * job["held_seconds"] / 3600 + job["storage_usd"],
            rel=1e-3,
            abs=1e-6,
        )
    # A job that leaves its GPU idle is flagged by its utilization alarm; the others are not.
    assert jobs["idle-notebook"]["flags"] == ["low-utilization"]
    assert jobs["idle-notebook"]["status"] == "SUCCEEDED"  # on_idle: flag
    assert interrupted["flags"] == fallback["flags"] == []
    # Out of GPU memory on 16 and 24 GiB GPUs: retried until it ran on GPUs with more.
    oom = jobs["oom-finetune"]
    assert oom["status"] == "SUCCEEDED" and oom["retries"] >= 1
    assert load_bundled().instance_type(oom["instance_type"]).gpu_memory_gib >= 40
    # Its own metric (samples/s, printed on stdout) stays low: scaled out to two nodes, once.
    elastic = jobs["elastic-train"]
    assert elastic["status"] == "SUCCEEDED" and elastic["flags"] == ["scaled-out"]
    assert elastic["retries"] == elastic["preemptions"] == 0
    # GPU memory growing: restarted once (its one retry), then only flagged.
    leaky = jobs["leaky-finetune"]
    assert leaky["status"] == "SUCCEEDED" and leaky["flags"] == ["memory-leak"]
    assert leaky["retries"] == 1


# -- what the code published -------------------------------------------------------------------


@pytest.fixture(scope="module")
def template(synth: Synth) -> dict[str, Any]:
    return synth.doc


def _of_type(template: Mapping[str, Any], resource_type: str) -> list[dict[str, Any]]:
    return [
        r.get("Properties", {})
        for r in template["Resources"].values()
        if r["Type"] == resource_type
    ]


def _published_metric(metric: PublishedMetric) -> Metric:
    return Metric(metric.namespace, metric.name, frozenset(metric.dimensions))


def cloudwatch_agent_metrics(template: Mapping[str, Any]) -> set[Metric]:
    """What the CloudWatch agent the launch templates configure publishes: `nvidia_smi_<field>`
    for each NVIDIA measurement (AWS's "Collect NVIDIA GPU metrics"), with dimensions of its own
    (the GPU's index, name, host) and those of `append_dimensions`."""
    metrics: set[Metric] = set()
    for properties in _of_type(template, "AWS::EC2::LaunchTemplate"):
        user_data = Synth.render(properties["LaunchTemplateData"]["UserData"]["Fn::Base64"])
        configs = re.findall(r"<<'CWAGENT'\n(.*?)\nCWAGENT\n", user_data, flags=re.DOTALL)
        assert configs, "a launch template starts no CloudWatch agent"
        for config in configs:
            section = json.loads(config)["metrics"]
            collected = section["metrics_collected"]
            assert set(collected) == {"nvidia_gpu"}, f"sections this test cannot read: {collected}"
            for field in collected["nvidia_gpu"]["measurement"]:
                name = field if field.startswith("nvidia_smi_") else f"nvidia_smi_{field}"
                metrics.add(Metric(section.get("namespace", "CWAgent"), name, None))
    return metrics


@pytest.fixture(scope="module")
def published(spot_demo: SpotRun, template: dict[str, Any]) -> set[Metric]:
    result = spot_demo.result
    return _not_aws(
        {_published_metric(m) for m in result.metrics} | cloudwatch_agent_metrics(template)
    )


# -- what the stack reads ----------------------------------------------------------------------

_SEARCH = re.compile(r"SEARCH\(\s*'([^']*)'")
_SEARCH_TERM = re.compile(r'(\w+)="([^"]*)"')
_INSIGHTS = re.compile(r"SELECT\s+\w+\((\w+)\)\s+FROM\s+(\w+)\s*$")


def expression_reads(expression: str) -> set[Metric]:
    """The metrics a metric-math expression reads itself (not through the ids it names):
    `SEARCH` terms and a Metrics Insights query, neither with a schema (any dimensions)."""
    if expression.lstrip().upper().startswith("SELECT"):
        query = _INSIGHTS.fullmatch(expression.strip())
        assert query, f"a Metrics Insights query this test cannot read: {expression}"
        return {Metric(query.group(2), query.group(1), None)}
    reads = set()
    for search in _SEARCH.findall(expression):
        assert "{" not in search, f"a SEARCH schema this test cannot read: {search}"
        terms = dict(_SEARCH_TERM.findall(search))
        reads.add(Metric(terms["Namespace"], terms["MetricName"], None))
    assert reads or "SEARCH" not in expression, f"a SEARCH this test cannot read: {expression}"
    return reads


def _stat_metric(metric: Mapping[str, Any], any_value: frozenset[str] = frozenset()) -> Metric:
    dimensions = frozenset(
        (d["Name"], None if d["Name"] in any_value else Synth.render(d["Value"]))
        for d in metric.get("Dimensions", [])
    )
    return Metric(metric["Namespace"], metric["MetricName"], dimensions)


def alarm_reads(alarm: Mapping[str, Any], any_value: frozenset[str] = frozenset()) -> set[Metric]:
    """An alarm's metrics (a template's alarm properties)."""
    if "MetricName" in alarm:
        return {_stat_metric(alarm, any_value)}
    reads: set[Metric] = set()
    for query in alarm["Metrics"]:
        if "MetricStat" in query:
            reads.add(_stat_metric(query["MetricStat"]["Metric"], any_value))
        else:
            reads |= expression_reads(query["Expression"])
    return reads


def dashboard_reads(template: Mapping[str, Any]) -> set[Metric]:
    reads: set[Metric] = set()
    for properties in _of_type(template, "AWS::CloudWatch::Dashboard"):
        body = json.loads(Synth.render(properties["DashboardBody"]))
        for widget in body["widgets"]:
            for row in widget["properties"].get("metrics", []):
                *head, options = row if isinstance(row[-1], dict) else [*row, {}]
                if "expression" in options:
                    reads |= expression_reads(options["expression"])
                    continue
                namespace, name, *pairs = head
                dimensions = frozenset(zip(pairs[::2], pairs[1::2], strict=True))
                reads.add(Metric(namespace, name, dimensions))
    return reads


@pytest.fixture(scope="module")
def stack_reads(template: dict[str, Any]) -> set[Metric]:
    alarms = _of_type(template, "AWS::CloudWatch::Alarm")
    return _not_aws(dashboard_reads(template).union(*(alarm_reads(a) for a in alarms)))


@pytest.fixture(scope="module")
def reads(spot_demo: SpotRun, stack_reads: set[Metric]) -> set[Metric]:
    """The stack's, and MetricWatch's, whose job id is any job's."""
    requests = spot_demo.metric_requests
    watched = {
        _stat_metric(query["MetricStat"]["Metric"], frozenset({"JobId"}))
        for request in requests
        for query in request["MetricDataQueries"]
    }
    return stack_reads | _not_aws(watched)


# -- the checks --------------------------------------------------------------------------------


def _listed(metrics: set[Metric]) -> str:
    return "\n  " + "\n  ".join(sorted({str(m) for m in metrics}))


def test_every_metric_the_stack_reads_is_published(
    reads: set[Metric], published: set[Metric]
) -> None:
    unpublished = {
        r
        for r in reads
        if not any(read_by(r, p) for p in published)
        and (r.namespace, r.name) not in {(telemetry.NAMESPACE, n) for n in NOT_REACHED}
    }
    assert not unpublished, "read, but nothing published them:" + _listed(unpublished)


def test_every_metric_published_is_read(reads: set[Metric], published: set[Metric]) -> None:
    unread = {p for p in published if not any(read_by(r, p) for r in reads)}
    assert not unread, "published, but nothing reads them:" + _listed(unread)


def test_every_gpufleet_series_published_is_one_the_stack_reads(
    published: set[Metric], stack_reads: set[Metric]
) -> None:
    """The dashboard and alarms read one series per dimension value (no SEARCH): a value they
    do not list is a series nobody sees."""
    ours = {p for p in published if p.namespace == telemetry.NAMESPACE}
    undrawn = {p for p in ours if p not in stack_reads}
    assert not undrawn, "published, but read by nothing:" + "".join(
        f"\n  {p} {dict(p.dimensions or ())}" for p in sorted(undrawn, key=str)
    )


def test_what_the_demo_does_not_reach_is_read_by_the_stack(stack_reads: set[Metric]) -> None:
    read_names = {r.name for r in stack_reads if r.namespace == telemetry.NAMESPACE}
    assert set(NOT_REACHED) <= read_names, set(NOT_REACHED) - read_names
