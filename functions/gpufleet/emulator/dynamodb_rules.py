"""DynamoDB's BatchWriteItem limits that moto 5.2.5 does not enforce, for the embedded account.

BatchWriteItem takes at most 25 put or delete requests a call, over all its tables ("The
BatchWriteItem operation puts or deletes multiple items in one or more tables. A single call
to BatchWriteItem can transmit up to 16MB of data ... comprised of as many as 25 put or delete
requests"; more is a `ValidationException`: "There are more than 25 requests in the batch").
moto writes any number. Two requests of one key in a call, and an item over 400 KB, moto
refuses already, as DynamoDB does (`tests/integration/test_emulator_dynamodb_rules.py`). A hook
at the SDK's edge (the seam `cloudwatch_rules` uses) answers an oversized batch as DynamoDB
would, and writes nothing.
"""

from __future__ import annotations

import json
from typing import Any

from botocore.awsrequest import AWSResponse

from gpufleet.adapters.aws.transactions import MAX_BATCH_WRITE

_URL = "https://dynamodb.us-east-1.amazonaws.com/"


def hooks() -> list[tuple[str, Any]]:
    return [("before-call.dynamodb.BatchWriteItem", _check_batch_size)]


def _check_batch_size(
    params: dict[str, Any], **_: Any
) -> tuple[AWSResponse, dict[str, Any]] | None:
    # botocore speaks DynamoDB's JSON protocol: the body is the request as JSON.
    body = params.get("body") or b"{}"
    request = json.loads(body) if isinstance(body, (bytes, str)) else {}
    requests = sum(len(batch) for batch in (request.get("RequestItems") or {}).values())
    if requests <= MAX_BATCH_WRITE:
        return None
    parsed = {
        "Error": {
            "Code": "ValidationException",
            "Message": f"Too many items requested for the BatchWriteItem call: {requests}; "
            f"there are more than {MAX_BATCH_WRITE} requests in the batch",
        },
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }
    return AWSResponse(_URL, 400, {}, None), parsed
