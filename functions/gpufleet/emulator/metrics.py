"""What the code running in the embedded account published to CloudWatch, read back from it.

Two paths lead there, as in AWS: the functions print embedded-metric-format (EMF) lines, which
the emulator stores in each function's log group (CloudWatch turns each such line into metric
data; moto does not), and the node agents call PutMetricData, which moto's CloudWatch keeps.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from gpufleet.emulator.account import Account
from gpufleet.emulator.patches import EMULATOR, acting_as

LAMBDA_LOG_GROUPS = "/aws/lambda/"


@dataclass(frozen=True, order=True)
class PublishedMetric:
    """One metric as CloudWatch keys it: namespace, name and dimensions (name, value), sorted;
    the same name with other dimensions is another metric."""

    namespace: str
    name: str
    dimensions: tuple[tuple[str, str], ...]

    @property
    def dimension_names(self) -> frozenset[str]:
        return frozenset(name for name, _ in self.dimensions)


def published_metrics(account: Account) -> frozenset[PublishedMetric]:
    """Every metric the functions (EMF in their logs) and the nodes (PutMetricData) published."""
    with acting_as(EMULATOR):
        return frozenset(_from_function_logs(account)) | frozenset(_from_metric_data(account))


def emf_metrics(line: str) -> list[PublishedMetric]:
    """The metrics one log line publishes: none unless it is an EMF document, one per metric
    and dimension set of each of its directives."""
    if not line.startswith("{") or '"_aws"' not in line:
        return []
    try:
        document = json.loads(line)
    except ValueError:
        return []
    directives = document.get("_aws", {}).get("CloudWatchMetrics", [])
    return [
        PublishedMetric(
            directive["Namespace"],
            metric["Name"],
            tuple(sorted((name, str(document.get(name))) for name in dimension_set)),
        )
        for directive in directives
        for dimension_set in directive.get("Dimensions") or [[]]
        for metric in directive["Metrics"]
    ]


def _from_function_logs(account: Account) -> Iterator[PublishedMetric]:
    logs = account.client("logs")
    groups = logs.get_paginator("describe_log_groups").paginate(
        logGroupNamePrefix=LAMBDA_LOG_GROUPS
    )
    for group in (g for page in groups for g in page["logGroups"]):
        events = logs.get_paginator("filter_log_events").paginate(
            logGroupName=group["logGroupName"]
        )
        for event in (e for page in events for e in page["events"]):
            yield from emf_metrics(event["message"])


def _from_metric_data(account: Account) -> Iterator[PublishedMetric]:
    pages = account.client("cloudwatch").get_paginator("list_metrics").paginate()
    for metric in (m for page in pages for m in page["Metrics"]):
        dimensions: list[dict[str, Any]] = metric.get("Dimensions", [])
        yield PublishedMetric(
            metric["Namespace"],
            metric["MetricName"],
            tuple(sorted((d["Name"], d["Value"]) for d in dimensions)),
        )
