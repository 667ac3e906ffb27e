"""Size limits AWS enforces and moto does not (or not as AWS computes them), for tests that check
what the control plane writes against them.

- DynamoDB: an item is at most 400 KB, counted as the DynamoDB developer guide's "Item sizes and
  formats" says (attribute names and values: strings in UTF-8 bytes, numbers one byte per two
  significant digits plus one, lists and maps 3 bytes plus one per element, ...).
- EventBridge: a PutEvents entry is at most 256 KiB, counted as "Calculating PutEvents event
  entry size" says (Time 14 bytes, Source, DetailType, Detail and each Resources entry in UTF-8
  bytes).

`AwsSizeLimits` is a botocore hook that answers an over-limit request as AWS does, so that code
which would fail in AWS fails in the embedded account too, and records the largest sizes seen.
"""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from botocore.awsrequest import AWSResponse

DYNAMODB_ITEM_LIMIT = 400 * 1024
PUT_EVENTS_ENTRY_LIMIT = 256 * 1024


def _utf8(text: str) -> int:
    return len(text.encode("utf-8"))


def _number_size(text: str) -> int:
    digits = str(abs(Decimal(text))).replace(".", "").split("E")[0].strip("0") or "0"
    return (len(digits) + 1) // 2 + 1


def attribute_size(value: Mapping[str, Any]) -> int:
    """The size of one typed attribute value (`{"S": ...}`, `{"M": {...}}`, ...)."""
    [(kind, content)] = value.items()
    if kind == "S":
        return _utf8(content)
    if kind == "N":
        return _number_size(content)
    if kind == "B":  # base64 on the wire; the raw bytes count
        return len(base64.b64decode(content)) if isinstance(content, str) else len(content)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(_utf8(s) for s in content)
    if kind == "NS":
        return sum(_number_size(n) for n in content)
    if kind == "L":
        return 3 + sum(attribute_size(v) + 1 for v in content)
    if kind == "M":
        return 3 + sum(_utf8(k) + attribute_size(v) + 1 for k, v in content.items())
    raise AssertionError(f"unknown attribute type {kind}")


def dynamodb_item_size(item: Mapping[str, Mapping[str, Any]]) -> int:
    """An item's size as DynamoDB counts it against the 400 KB limit."""
    return sum(_utf8(name) + attribute_size(value) for name, value in item.items())


def put_events_entry_size(entry: Mapping[str, Any]) -> int:
    size = 14 if entry.get("Time") is not None else 0
    size += _utf8(entry.get("Source", "")) + _utf8(entry.get("DetailType", ""))
    size += _utf8(entry.get("Detail", "")) if entry.get("Detail") is not None else 0
    return size + sum(_utf8(r) for r in entry.get("Resources", []) if r is not None)


def _refusal(code: str, message: str) -> tuple[AWSResponse, dict[str, Any]]:
    return AWSResponse("https://aws.example/", 400, {}, None), {
        "Error": {"Code": code, "Message": message},
        "ResponseMetadata": {"HTTPStatusCode": 400},
    }


class AwsSizeLimits:
    """Refuses, as AWS does, a PutEvents entry over 256 KiB (the whole request) and a DynamoDB
    PutItem over 400 KB; records the largest entry and item each saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.largest_entry = 0
        self.largest_item = 0
        self.refused: list[str] = []

    def hooks(self) -> list[tuple[str, Any]]:
        return [
            ("before-call.events.PutEvents", self._put_events),
            ("before-call.dynamodb.PutItem", self._put_item),
        ]

    def _put_events(self, params: dict[str, Any], **_: Any) -> Any:
        entries = json.loads(params["body"]).get("Entries", [])
        sizes = [put_events_entry_size(entry) for entry in entries]
        with self._lock:
            self.largest_entry = max([self.largest_entry, *sizes])
            if sum(sizes) <= PUT_EVENTS_ENTRY_LIMIT:
                return None
            self.refused.append(f"PutEvents of {sum(sizes)} bytes")
        return _refusal(
            "ValidationException", "Total size of the entries in the request is over the limit."
        )

    def _put_item(self, params: dict[str, Any], **_: Any) -> Any:
        size = dynamodb_item_size(json.loads(params["body"])["Item"])
        with self._lock:
            self.largest_item = max(self.largest_item, size)
            if size <= DYNAMODB_ITEM_LIMIT:
                return None
            self.refused.append(f"PutItem of {size} bytes")
        return _refusal("ValidationException", "Item size has exceeded the maximum allowed size")
