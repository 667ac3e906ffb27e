"""Events on gpufleet's EventBridge bus."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def put_events_entry(
    bus: str, source: str, detail_type: str, detail: Mapping[str, Any]
) -> dict[str, str]:
    """The PutEvents entry of one event, as it is sent (and as EventBridge sizes it)."""
    return {
        "EventBusName": bus,
        "Source": source,
        "DetailType": detail_type,
        "Detail": json.dumps(detail, sort_keys=True, default=str),
    }


class EventBridgePublisher:
    def __init__(self, client: Any, bus_name: str) -> None:
        self._client = client
        self._bus = bus_name

    def publish(self, source: str, detail_type: str, detail: Mapping[str, Any]) -> None:
        response = self._client.put_events(
            Entries=[put_events_entry(self._bus, source, detail_type, detail)]
        )
        if response.get("FailedEntryCount"):
            failed = response["Entries"][0]
            raise RuntimeError(
                f"EventBridge refused {detail_type}: {failed.get('ErrorCode')} "
                f"{failed.get('ErrorMessage')}"
            )
