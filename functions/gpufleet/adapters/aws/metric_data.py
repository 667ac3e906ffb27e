"""The series MetricWatch reads: the metrics the node agents publish per job (`GpuFleet/Jobs`,
dimension `JobId`), one `GetMetricData` call per `domain.scaling.MetricBatch` (at most 500
queries and 100,800 points: CloudWatch API reference, "GetMetricData").

CloudWatch takes 50 `GetMetricData` requests a second per account and region (CloudWatch
service quotas; 180,000 data points a second for data of the last three hours): a pass over
10,000 running jobs is about 60 calls. A call still throttled after the SDK's own retries is
tried again with jittered backoff, for up to `THROTTLE_PATIENCE_SECONDS`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import ClientError

from gpufleet.adapters.aws.transactions import Backoff
from gpufleet.domain.scaling import MetricBatch, Series, SeriesQuery
from gpufleet.topology import JOB_DIMENSION, METRICS_NAMESPACE

# How long one call keeps trying throttled requests: with the SDK's own retries, well within
# MetricWatch's timeout (`topology`).
THROTTLE_PATIENCE_SECONDS = 30.0
_BACKOFF = Backoff(base_seconds=0.1, cap_seconds=2.0)
# What CloudWatch answers past its rates (the query error code the SDK reports).
_THROTTLED = frozenset({"Throttling", "ThrottlingException"})


def metric_data_query(query_id: str, query: SeriesQuery) -> dict[str, Any]:
    """GetMetricData's query for one series (ids must start with a lower-case letter)."""
    return {
        "Id": query_id,
        "MetricStat": {
            "Metric": {
                "Namespace": METRICS_NAMESPACE,
                "MetricName": query.metric,
                "Dimensions": [{"Name": JOB_DIMENSION, "Value": query.job_id}],
            },
            "Period": query.period_seconds,
            "Stat": query.statistic,
        },
        "ReturnData": True,
    }


class CloudWatchMetricData:
    def __init__(self, client: Any, patience_seconds: float = THROTTLE_PATIENCE_SECONDS) -> None:
        self._client = client
        self._patience = patience_seconds

    def read(self, batch: MetricBatch) -> dict[SeriesQuery, Series]:
        ids = {f"q{index}": query for index, query in enumerate(batch.queries)}
        parameters: dict[str, Any] = {
            "MetricDataQueries": [metric_data_query(i, query) for i, query in ids.items()],
            "StartTime": datetime.fromtimestamp(batch.start, UTC),
            "EndTime": datetime.fromtimestamp(batch.end, UTC),
            "ScanBy": "TimestampAscending",
        }
        points: dict[SeriesQuery, list[tuple[float, float]]] = {}
        patience = _Patience(self._patience)
        while True:  # a batch fits one page (`metric_batches`); more pages are still read
            page = patience.call(self._client.get_metric_data, **parameters)
            for result in page.get("MetricDataResults", []):
                query = ids.get(str(result.get("Id")))
                if query is not None:
                    stamps = [stamp.timestamp() for stamp in result.get("Timestamps", [])]
                    values = result.get("Values", [])
                    points.setdefault(query, []).extend(zip(stamps, values, strict=True))
            token = page.get("NextToken")
            if not token:
                return {query: sorted(series) for query, series in points.items()}
            parameters["NextToken"] = token


class _Patience:
    """Calls tried again while CloudWatch throttles them, with full-jitter exponential backoff,
    until `patience_seconds` have passed since the first; then the throttle is raised."""

    def __init__(self, patience_seconds: float) -> None:
        self._deadline = time.monotonic() + patience_seconds
        self._tries = 0

    def call(self, request: Callable[..., dict[str, Any]], **parameters: Any) -> dict[str, Any]:
        while True:
            try:
                return request(**parameters)
            except ClientError as exc:
                throttled = exc.response.get("Error", {}).get("Code") in _THROTTLED
                if not throttled or time.monotonic() >= self._deadline:
                    raise
            self._tries += 1
            time.sleep(_BACKOFF.delay(self._tries))
