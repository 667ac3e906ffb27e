"""CloudWatch's rules that moto 5.2.5 does not enforce, for the embedded account.

moto stores any `PutMetricAlarm`. CloudWatch refuses an alarm that evaluates more than a day
of periods shorter than an hour, or more than a week of longer ones (`Period` x
`EvaluationPeriods`, "PutMetricAlarm"): the same rule the config is held to
(`domain.config.alarm_window_seconds`). moto answers a `GetMetricData` of any number of
queries; CloudWatch takes at most 500 a call ("GetMetricData": `MetricDataQueries`), and
refuses more as it refuses an oversized collection, `InvalidParameterValue` ("The collection
... must not have a size greater than ..."; what it answers a PutMetricData of too many items,
quoted in aknostic/elasticsearch-cloudwatch#3). A hook at the SDK's edge (the seam `ec2_rules`
uses) answers such a request as CloudWatch would, and stores or reads nothing.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.awsrequest import AWSResponse

from gpufleet.domain.config import alarm_window_seconds
from gpufleet.domain.scaling import MAX_QUERIES_PER_CALL

_URL = "https://monitoring.us-east-1.amazonaws.com/"


def hooks() -> list[tuple[str, Any]]:
    return [
        ("before-call.cloudwatch.PutMetricAlarm", _check_window),
        ("before-call.cloudwatch.GetMetricData", _check_queries),
    ]


def _request(params: dict[str, Any]) -> dict[str, Any]:
    # botocore speaks CloudWatch's JSON protocol: the body is the request as JSON.
    body = params.get("body") or b"{}"
    return json.loads(body) if isinstance(body, (bytes, str)) else {}


def _refusal(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    parsed = {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    return AWSResponse(_URL, 400, {}, None), parsed


def _check_queries(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
    queries = _request(params).get("MetricDataQueries") or []
    if len(queries) > MAX_QUERIES_PER_CALL:
        return _refusal(
            "InvalidParameterValue",
            "The collection MetricDataQueries must not have a size greater than "
            f"{MAX_QUERIES_PER_CALL}.",
        )
    return None


def _check_window(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
    request = _request(params)
    periods = int(request.get("EvaluationPeriods", 1))
    # A metric alarm names its period; a metric-math alarm, each metric's.
    lengths = [int(request["Period"])] if "Period" in request else []
    lengths += [
        int(query["MetricStat"]["Period"])
        for query in request.get("Metrics", [])
        if isinstance(query, dict) and "MetricStat" in query
    ]
    for period in lengths:
        window = alarm_window_seconds(period)
        if period * periods > window:
            message = (
                f"The product of Period ({period}) and EvaluationPeriods ({periods}) must not "
                f"exceed {window} seconds."
            )
            return _refusal("ValidationError", message)
    return None
