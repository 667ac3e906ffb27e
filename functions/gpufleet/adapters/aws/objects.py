"""Objects in the intake bucket: submitted specs, error reports and run manifests."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpufleet.ports import ObjectTooLarge


class S3ObjectStore:
    def __init__(self, client: Any, bucket: str) -> None:
        self._client = client
        self._bucket = bucket

    def put_json(self, key: str, document: Mapping[str, Any]) -> None:
        self._client.put_object(
            Bucket=self._bucket,
            Key=key,
            Body=json.dumps(document, indent=2, sort_keys=True).encode("utf-8"),
            ContentType="application/json",
        )

    def get_bytes(self, key: str, max_bytes: int) -> bytes:
        # Ask for one byte past the limit so an oversized object is refused without reading it.
        response = self._client.get_object(
            Bucket=self._bucket, Key=key, Range=f"bytes=0-{max_bytes}"
        )
        body: bytes = response["Body"].read(max_bytes + 1)
        if len(body) > max_bytes:
            total = int(str(response.get("ContentRange", "/0")).rsplit("/", 1)[-1] or 0)
            raise ObjectTooLarge(key, max(total, len(body)), max_bytes)
        return body
